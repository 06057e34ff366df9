"""CPU/CI: the tiling choices that differ per GPU (`tiling.GpuTable`) reach the rows they were measured on, and only
those: 16-bit RMSNorm rows of 128 threads (x held in registers on the H100) and 16-bit add+norm rows wider than 256
threads' worth (512 threads on the H100)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="trtfuse.kernels needs nvidia-cutlass-dsl")

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.api import AddRmsNormKernel, RmsNormKernel, rms_norm_tiling
from trtfuse.kernels.artifacts import table_for_arch
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.device import DeviceInfo
from trtfuse.kernels.specs import AddRmsNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import H100_TABLE, H200_TABLE, Regime, gpu_table

LLAMA = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
H100 = DeviceInfo("sm_90a", 132, True, "NVIDIA H100 80GB HBM3")
H200 = DeviceInfo("sm_90a", 132, True, "NVIDIA H200")


def test_the_driver_name_picks_the_table() -> None:
    assert gpu_table("NVIDIA H100 80GB HBM3") is H100_TABLE
    assert gpu_table("NVIDIA H100 PCIe") is H100_TABLE
    assert gpu_table("NVIDIA H200") is H200_TABLE
    assert gpu_table("") is H200_TABLE  # compiling without a GPU


def test_table_for_arch_without_a_gpu_is_the_default() -> None:
    assert table_for_arch("sm_90a") is H200_TABLE


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_16_bit_rows_of_2048_are_read_once_on_the_h100_and_twice_on_the_h200(dtype: str) -> None:
    spec = RmsNormSpec(2048, dtype, dtype, LLAMA)
    on_h200, on_h100 = (rms_norm_tiling(spec, Regime.PREFILL, True, table) for table in (H200_TABLE, H100_TABLE))
    assert on_h200.reread and not on_h100.reread
    assert (on_h100.threads_per_row, on_h100.vectors_per_thread) == (on_h200.threads_per_row, 2)
    # 4096-wide rows (256 threads) are read twice on both parts; fp32 rows never.
    wide = RmsNormSpec(4096, dtype, dtype, LLAMA)
    assert all(rms_norm_tiling(wide, Regime.PREFILL, True, t).reread for t in (H200_TABLE, H100_TABLE))
    fp32 = RmsNormSpec(2048, "float32", "float32", LLAMA)
    assert rms_norm_tiling(fp32, Regime.PREFILL, True, H100_TABLE) == rms_norm_tiling(
        fp32, Regime.PREFILL, True, H200_TABLE
    )


def test_add_norm_rows_of_8192_spread_over_512_threads_on_the_h100() -> None:
    spec = AddRmsNormSpec(8192, "bfloat16", "bfloat16", LLAMA)
    on_h200, on_h100 = (rms_norm_tiling(spec, Regime.PREFILL, True, table) for table in (H200_TABLE, H100_TABLE))
    assert (on_h200.threads_per_row, on_h200.vectors_per_thread) == (256, 4)
    assert (on_h100.threads_per_row, on_h100.vectors_per_thread, on_h100.reread) == (512, 2, True)
    narrow = AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA)
    assert rms_norm_tiling(narrow, Regime.PREFILL, True, H100_TABLE) == rms_norm_tiling(
        narrow, Regime.PREFILL, True, H200_TABLE
    )
    # Rows the H100 was not measured on keep the H200's choices: an fp32 x, and decode.
    for other in (AddRmsNormSpec(8192, "float32", "float32", LLAMA),):
        assert rms_norm_tiling(other, Regime.PREFILL, True, H100_TABLE) == rms_norm_tiling(
            other, Regime.PREFILL, True, H200_TABLE
        )
    assert rms_norm_tiling(spec, Regime.DECODE, True, H100_TABLE) == rms_norm_tiling(
        spec, Regime.DECODE, True, H200_TABLE
    )


def test_the_kernels_take_their_devices_table(tmp_path: Path) -> None:
    cache = KernelCache(tmp_path)
    norm = RmsNormSpec(2048, "bfloat16", "bfloat16", LLAMA)
    assert RmsNormKernel(norm, cache, H200).variant(Regime.PREFILL, True).tiling.reread
    assert not RmsNormKernel(norm, cache, H100).variant(Regime.PREFILL, True).tiling.reread
    add = AddRmsNormSpec(8192, "bfloat16", "bfloat16", LLAMA)
    assert AddRmsNormKernel(add, cache, H100).variant(Regime.PREFILL, True).tiling.threads_per_row == 512
    assert AddRmsNormKernel(add, cache, H200).variant(Regime.PREFILL, True).tiling.threads_per_row == 256
