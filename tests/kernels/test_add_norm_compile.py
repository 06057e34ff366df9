"""CPU/CI: every variant of the fused residual add+RMSNorm compiles for sm_90a, with the accesses it should have."""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES, NormParams, WeightMode, dtype_pair_problem
from trtfuse.kernels.api import AddRmsNormKernel, rms_norm_tiling
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import AddRmsNormVariant, compile_variant
from trtfuse.kernels.device import DeviceInfo
from trtfuse.kernels.specs import DTYPE_BYTES, AddRmsNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import Regime

ARCH = "sm_90a"
HOPPER = DeviceInfo(arch=ARCH, sm_count=132, has_gpu=False)
AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
# The contract's (D, T) pairs: one dtype, an fp32 residual stream with a 16-bit output, a 16-bit one with fp32.
PAIRS = [(d, t) for d, t in itertools.product(ACTIVATION_DTYPES, repeat=2) if dtype_pair_problem(d, t) is None]
# The hidden sizes of the RMSNorm matrix (tests/test_kernels_gpu.py) and a row no vector divides.
HIDDENS = (64, 128, 1000, 1001, 2048, 4096, 5120, 8192)
MODES = ((AFTER, 0.0), (BEFORE, 1.0))
EVERY_PAIR_WEIGHT_AND_MODE = [
    AddRmsNormSpec(4096, d, w, NormParams(1e-6, offset, mode), t)
    for d, t in PAIRS
    for w in WEIGHT_DTYPES
    for mode, offset in MODES
] + [AddRmsNormSpec(4096, d, None, NormParams(1e-5, 0.0, NONE), t) for d, t in PAIRS]


def global_accesses(ptx: str) -> list[str]:
    return re.findall(r"\b(?:ld|st)\.global(?:\.[A-Za-z0-9:_]+)+", ptx)


def compiled_ptx(variant: AddRmsNormVariant, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    compile_variant(variant, ptx_dir=folder)
    (ptx_file,) = folder.glob("*.ptx")
    return ptx_file.read_text()


def add_variant(spec: AddRmsNormSpec, regime: Regime, aligned: bool = True) -> AddRmsNormVariant:
    return AddRmsNormKernel(spec, KernelCache(Path("/nonexistent")), HOPPER).variant(regime, aligned)


def check_accesses(variant: AddRmsNormVariant, ptx: str) -> None:
    """Aligned rows: every access of x, the residual, h and y is 16 bytes wide, as many per slot as the vector
    needs on each side (x and the residual read twice when the tiling re-reads); only a weight narrower than 16
    bytes per vector (a 16-bit weight of an fp32 row) takes narrower loads. Rows no vector divides: no 16-byte
    access at all."""
    spec, tiling = variant.spec, variant.tiling
    accesses = global_accesses(ptx)
    wide = [a for a in accesses if a.endswith(".v4.b32")]
    assert any(a.startswith("ld.") for a in accesses) and any(a.startswith("st.") for a in accesses)
    if tiling.vector == 1:
        assert not wide, sorted(set(accesses))
        return

    def per_vector(name: str | None) -> int:
        return 0 if name is None else max(1, tiling.vector * DTYPE_BYTES[name] // 16)

    slots = tiling.vectors_per_thread
    stores = [a for a in accesses if a.startswith("st.")]
    assert stores == [a for a in wide if a.startswith("st.")], sorted(set(stores))
    loads = [a for a in accesses if a.startswith("ld.")]
    narrow = [a for a in loads if not a.endswith(".v4.b32")]
    weight_bytes = tiling.vector * DTYPE_BYTES[spec.weight_dtype or spec.dtype]
    assert not narrow or weight_bytes < 16, sorted(set(narrow))
    # Counted where no slot is predicated: around a ragged row's last slot ptxas may duplicate loads per branch.
    if tiling.vectors_per_row % tiling.threads_per_row == 0:
        assert len(stores) == slots * (per_vector(spec.dtype) + per_vector(spec.out_dtype))
        inputs = 2 * per_vector(spec.dtype) * (2 if tiling.reread else 1)
        assert len(loads) == slots * (inputs + per_vector(spec.weight_dtype))
        assert len(narrow) in (0, slots)
    if tiling.warps_per_row > 1:
        assert "bar.sync" in ptx


@pytest.mark.parametrize("spec", EVERY_PAIR_WEIGHT_AND_MODE, ids=repr)
def test_every_dtype_pair_weight_and_mode_compiles(spec: AddRmsNormSpec, tmp_path: Path) -> None:
    """Both regimes and both alignments of every (D, T) pair, weight dtype and weight mode, at H=4096."""
    for regime, aligned in itertools.product(Regime, (True, False)):
        variant = add_variant(spec, regime, aligned)
        check_accesses(variant, compiled_ptx(variant, tmp_path / f"{regime.name}-{aligned}"))


@pytest.mark.parametrize("hidden", HIDDENS)
@pytest.mark.parametrize(
    ("dtype", "weight_dtype", "mode", "offset", "out_dtype"),
    [
        ("bfloat16", "bfloat16", AFTER, 0.0, "bfloat16"),
        ("float16", "float32", BEFORE, 1.0, "float16"),
        ("float32", "bfloat16", AFTER, 0.0, "bfloat16"),  # fp32 residual stream, 16-bit norm output
        ("bfloat16", None, NONE, 0.0, "float32"),
    ],
)
def test_every_hidden_size_compiles(
    hidden: int, dtype: str, weight_dtype: str | None, mode: WeightMode, offset: float, out_dtype: str, tmp_path: Path
) -> None:
    spec = AddRmsNormSpec(hidden, dtype, weight_dtype, NormParams(1e-6, offset, mode), out_dtype)
    for regime, aligned in itertools.product(Regime, (True, False)):
        variant = add_variant(spec, regime, aligned)
        check_accesses(variant, compiled_ptx(variant, tmp_path / f"{regime.name}-{aligned}"))


def test_h_is_stored_before_the_reduction_and_the_prefill_row_read_twice(tmp_path: Path) -> None:
    """Prefill bf16 at H=4096: x and the residual loaded evict-last before the reduction's barrier, h stored there
    too, then x and the residual loaded again evict-first and y stored after it."""
    spec = AddRmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER))
    variant = add_variant(spec, Regime.PREFILL)
    tiling = variant.tiling
    head, body = compiled_ptx(variant, tmp_path).split("bar.sync", 1)
    slots = tiling.vectors_per_thread
    if tiling.reread:
        assert head.count("ld.global.L1::evict_last.L2::cache_hint.v4.b32") == 2 * slots
        assert body.count("ld.global.L1::evict_first.L2::cache_hint.v4.b32") == 2 * slots
    else:
        assert "cache_hint" not in head + body
    assert head.count("st.global.v4.b32") == slots and body.count("st.global.v4.b32") == slots


def test_the_tiling_is_the_rms_norm_table_with_a_residual() -> None:
    """`row_tiling`'s residual rule (docs/kernels.md, "Fused residual add + RMSNorm"): the threads, vectors, rows
    per block and second read of the RMSNorm of the same row, in both regimes and alignments, without its cap."""
    pairs = [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"), ("float32", "bfloat16")]
    for hidden, (dtype, out) in itertools.product((128, 1000, 2048, 4096, 5120, 8192), pairs):
        for regime, aligned in itertools.product(Regime, (True, False)):
            params = NormParams(1e-6, 0.0, AFTER)
            add = rms_norm_tiling(AddRmsNormSpec(hidden, dtype, "float32", params, out), regime, aligned)
            norm = rms_norm_tiling(RmsNormSpec(hidden, dtype, "float32", params, out), regime, aligned)
            shape = ("vector", "threads_per_row", "vectors_per_thread", "rows_per_block", "reread", "paired_stores")
            assert [getattr(add, f) for f in shape] == [getattr(norm, f) for f in shape]
            # No register cap: the residual's slots would spill under it (BEFORE_CAST, fp32 weights).
            assert add.min_blocks_per_sm == 0


def test_warm_up_builds_every_reachable_variant_once(tmp_path: Path) -> None:
    spec = AddRmsNormSpec(2048, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    kernel = AddRmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    kernel.warm_up(max_rows=4096)
    assert kernel.cache.compiled == 4
    again = AddRmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    again.warm_up(max_rows=4096)
    assert again.cache.compiled == 0 and again.cache.loaded == 4
    decode_only = AddRmsNormKernel(spec, KernelCache(tmp_path / "decode"), HOPPER)
    decode_only.warm_up(max_rows=8)
    assert decode_only.cache.compiled == 2


def test_launch_picks_the_variant_from_rows_and_every_pointer(tmp_path: Path) -> None:
    """Per call: decode up to the SM count; the 16-byte variant only when x, the residual, h, y (to the stricter of
    D's and T's vector alignment) and the weight all allow it."""
    spec = AddRmsNormSpec(4096, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    kernel = AddRmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    picked: list[tuple[bool, ...]] = []
    for key in itertools.product((True, False), repeat=2):
        kernel._functions[key] = lambda *args, key=key: picked.append((*key, len(args)))
    base = [0x7F0000000000 + i * 0x100000 for i in range(5)]  # x, residual, w, y, h
    kernel.launch(*base, 1, 0)
    kernel.launch(*base, 133, 0)
    for i, step in enumerate((16, 16, 8, 8, 16)):
        shifted = list(base)
        shifted[i] += step // 2
        kernel.launch(*shifted, 1, 0)
    shifted = list(base)
    shifted[3] += 16  # y one 16-byte vector on: still aligned
    kernel.launch(*shifted, 1, 0)
    assert picked == [(True, True, 7), (False, True, 7)] + [(True, False, 7)] * 5 + [(True, True, 7)]


def test_specs_reject_bad_fields() -> None:
    with pytest.raises(ValueError, match="two different 16-bit dtypes"):
        AddRmsNormSpec(4096, "float16", "float16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    with pytest.raises(ValueError, match="weight_dtype"):
        AddRmsNormSpec(4096, "float16", "float16", NormParams(1e-6, 0.0, NONE))
    with pytest.raises(ValueError, match="hidden"):
        AddRmsNormSpec(0, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    spec = AddRmsNormSpec(4096, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    assert spec.norm() == RmsNormSpec(4096, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    assert AddRmsNormSpec(64, "bfloat16", None, NormParams(1e-6, 0.0, NONE)).out_dtype == "bfloat16"
