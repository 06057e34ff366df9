"""CPU/CI: every kernel code path compiles for sm_90a without a GPU, and its PTX uses the accesses it should."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.contract import NormParams, WeightMode
from trtfuse.kernels.api import QkNormKernel, RmsNormKernel
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import QkNormVariant, RmsNormVariant, compile_variant
from trtfuse.kernels.device import DeviceInfo
from trtfuse.kernels.specs import DTYPE_BYTES, QkNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import Regime, access_vector, full_vector, regime_for, row_tiling

ARCH = "sm_90a"
HOPPER = DeviceInfo(arch=ARCH, sm_count=132, has_gpu=False)
AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE


def global_accesses(ptx: str) -> list[str]:
    # Qualifiers included: cache hints such as `.L1::evict_last` sit between `.global` and the vector width.
    return re.findall(r"\b(?:ld|st)\.global(?:\.[A-Za-z0-9:_]+)+", ptx)


def compiled_ptx(variant: RmsNormVariant | QkNormVariant, folder: Path) -> str:
    compile_variant(variant, ptx_dir=folder)
    (ptx_file,) = folder.glob("*.ptx")
    return ptx_file.read_text()


def rms_variant(spec: RmsNormSpec, regime: Regime, aligned: bool = True) -> RmsNormVariant:
    return RmsNormKernel(spec, KernelCache(Path("/nonexistent")), HOPPER).variant(regime, aligned)


RMS_CASES = [
    # (spec, regime, aligned, expected: "vector" = only 128-bit global accesses, "scalar" = none, "mixed" = both)
    (RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), Regime.PREFILL, True, "vector"),
    (RmsNormSpec(4096, "float16", "float32", NormParams(1e-6, 1.0, BEFORE)), Regime.PREFILL, True, "vector"),
    (RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-5, 0.0, AFTER)), Regime.DECODE, True, "vector"),
    (RmsNormSpec(8192, "bfloat16", "float32", NormParams(1e-6, 0.0, BEFORE)), Regime.DECODE, True, "vector"),
    (RmsNormSpec(1000, "float32", None, NormParams(1e-6, 0.0, NONE)), Regime.PREFILL, True, "vector"),
    (RmsNormSpec(5120, "float32", "bfloat16", NormParams(1e-6, 1.0, AFTER)), Regime.PREFILL, True, "mixed"),
    (RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), Regime.PREFILL, False, "scalar"),
    (RmsNormSpec(1001, "float16", "float16", NormParams(1e-6, 0.0, AFTER)), Regime.PREFILL, True, "scalar"),
]


@pytest.mark.parametrize(("spec", "regime", "aligned", "expected"), RMS_CASES)
def test_rms_norm_variant_compiles_with_expected_accesses(
    spec: RmsNormSpec, regime: Regime, aligned: bool, expected: str, tmp_path: Path
) -> None:
    variant = rms_variant(spec, regime, aligned)
    accesses = global_accesses(compiled_ptx(variant, tmp_path))
    wide = [a for a in accesses if a.endswith(".v4.b32")]
    assert any(a.startswith("ld.") for a in accesses) and any(a.startswith("st.") for a in accesses)
    if expected == "vector":
        assert wide == accesses, sorted(set(accesses))
    elif expected == "scalar":
        assert not wide, sorted(set(accesses))
    else:
        # An fp32 x with a bf16 weight: x and y stay 128-bit, the 4-element bf16 weight vector is one 64-bit load.
        assert any(a.startswith("st.") for a in wide)
        assert set(accesses) - set(wide) <= {"ld.global.v2.b32", "ld.global.v4.b16"}
    if variant.tiling.warps_per_row > 1:
        assert "bar.sync" in compiled_ptx_text(tmp_path)


def compiled_ptx_text(folder: Path) -> str:
    return "".join(p.read_text() for p in folder.glob("*.ptx"))


QK_CASES = [
    QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),  # Qwen3
    QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, BEFORE)),  # Gemma3
    QkNormSpec(64, 64, "float16", None, NormParams(1e-6, 0.0, NONE)),
    QkNormSpec(4096, 1024, "float32", "float32", NormParams(1e-6, 0.0, BEFORE)),  # OLMo2 full-width norms
    QkNormSpec(8192, 5120, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),  # wide and ragged rows: x read twice
]


@pytest.mark.parametrize("spec", QK_CASES)
def test_qk_norm_compiles_head_dims_to_shuffles_only(spec: QkNormSpec, tmp_path: Path) -> None:
    kernel = QkNormKernel(spec, KernelCache(tmp_path / "cache"), HOPPER)
    ptx = compiled_ptx(kernel.variant(aligned=True), tmp_path)
    accesses = global_accesses(ptx)
    assert accesses and all(a.endswith(".v4.b32") for a in accesses), sorted(set(accesses))
    assert "shfl.sync.bfly" in ptx
    if spec.q_hidden <= 256 and spec.k_hidden <= 256:
        # A head is part of a warp: the reduction is butterfly shuffles alone, no shared memory, no barrier.
        assert "bar.sync" not in ptx and ".shared" not in ptx.split(".entry", 1)[1]


def test_qk_norm_unaligned_variant_compiles_scalar(tmp_path: Path) -> None:
    kernel = QkNormKernel(QK_CASES[0], KernelCache(tmp_path / "cache"), HOPPER)
    accesses = global_accesses(compiled_ptx(kernel.variant(aligned=False), tmp_path))
    assert accesses and not any(a.endswith(".v4.b32") for a in accesses)


def test_disk_cache_is_loaded_by_a_fresh_cache(tmp_path: Path) -> None:
    spec = RmsNormSpec(2048, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    first = RmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    first.warm_up(max_rows=4096)
    # Decode and prefill tilings, each with a 16-byte and a scalar variant.
    assert first.cache.compiled == 4 and first.cache.loaded == 0
    assert len(list(tmp_path.rglob("*.o"))) == 4
    folder = next(tmp_path.iterdir()).name
    assert folder.startswith("trtfuse-") and "cutlass-dsl-" in folder and f"_{ARCH}_src-" in folder
    second = RmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    second.warm_up(max_rows=4096)
    assert second.cache.compiled == 0 and second.cache.loaded == 4


def test_warm_up_only_builds_reachable_regimes(tmp_path: Path) -> None:
    kernel = RmsNormKernel(
        RmsNormSpec(256, "float32", None, NormParams(1e-6, 0.0, NONE)), KernelCache(tmp_path), HOPPER
    )
    kernel.warm_up(max_rows=8)
    assert kernel.cache.compiled == 2  # decode only, both alignments


@pytest.mark.parametrize("hidden", [64, 128, 1000, 1001, 2048, 4096, 5120, 8192, 16384])
@pytest.mark.parametrize("elem_bytes", [2, 4])
@pytest.mark.parametrize("regime", list(Regime))
def test_row_tiling_covers_each_row_exactly_once(hidden: int, elem_bytes: int, regime: Regime) -> None:
    for vector in {full_vector(hidden, elem_bytes), 1}:
        t = row_tiling(hidden, vector, regime)
        assert hidden % t.vector == 0
        assert t.threads_per_row & (t.threads_per_row - 1) == 0
        # Enough slots for every vector, and no thread slot entirely past the row end except in the last column.
        assert t.threads_per_row * t.vectors_per_thread >= t.vectors_per_row
        assert t.threads_per_row * (t.vectors_per_thread - 1) < t.vectors_per_row
        assert t.block_threads <= 1024 and t.block_threads % 32 == 0
        if regime is Regime.DECODE and t.vectors_per_row > 32:
            assert t.rows_per_block == 1 and t.threads_per_row >= 32


@pytest.mark.parametrize(
    ("spec", "threads", "floor"),
    [
        (RmsNormSpec(4096, "float16", "float16", NormParams(1e-6, 0.0, BEFORE)), 256, 6),
        (RmsNormSpec(2048, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER)), 256, 6),
        (RmsNormSpec(8192, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), 256, None),
        (RmsNormSpec(2048, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), 128, None),
        (RmsNormSpec(3072, "bfloat16", "float32", NormParams(1e-6, 0.0, AFTER)), 256, None),
    ],
)
def test_prefill_rows_of_256_threads_by_2_vectors_fit_6_blocks_per_sm(
    spec: RmsNormSpec, threads: int, floor: int | None, tmp_path: Path
) -> None:
    """The residency floor reaches ptxas as `.minnctapersm` (a cap of 40 registers); rows of more vectors per
    thread, 128-thread rows, ragged rows and decode have none."""
    variant = rms_variant(spec, Regime.PREFILL)
    assert variant.tiling.threads_per_row == threads
    ptx = compiled_ptx(variant, tmp_path)
    if floor is None:
        assert ".minnctapersm" not in ptx
    else:
        assert f".minnctapersm {floor}" in ptx
    assert rms_variant(spec, Regime.DECODE).tiling.min_blocks_per_sm == 0


@pytest.mark.parametrize(
    "spec",
    [
        RmsNormSpec(5120, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)),  # ragged: 640 vectors over 256 threads
        RmsNormSpec(4096, "float16", "float32", NormParams(1e-6, 1.0, BEFORE)),
        RmsNormSpec(8192, "bfloat16", None, NormParams(1e-6, 0.0, NONE)),
    ],
    ids=repr,
)
def test_prefill_reads_16_bit_x_twice_with_cache_policies(spec: RmsNormSpec, tmp_path: Path) -> None:
    """Prefill, 16-bit x in 16-byte vectors: x loaded evict-last in L1 and L2 (one `createpolicy`) before the
    reduction's barrier, loaded again evict-first after it, 16 bytes per access; the weight once, before."""
    variant = rms_variant(spec, Regime.PREFILL)
    assert variant.tiling.reread
    ptx = compiled_ptx(variant, tmp_path)
    head, body = ptx.split("bar.sync", 1)
    slots = variant.tiling.vectors_per_thread
    assert head.count("ld.global.L1::evict_last.L2::cache_hint.v4.b32") == slots
    assert body.count("ld.global.L1::evict_first.L2::cache_hint.v4.b32") == slots
    assert "createpolicy.fractional.L2::evict_last" in head and "createpolicy.fractional.L2::evict_first" in body
    assert "evict_first" not in head and "evict_last" not in body
    # The weight is loaded once, with x, by plain 16-byte loads (two per slot for an fp32 weight).
    weight_loads = {None: 0, "bfloat16": slots, "float16": slots, "float32": 2 * slots}[spec.weight_dtype]
    assert head.count("ld.global.v4.b32") == weight_loads and "ld.global.v4.b32" not in body
    # Decode, fp32 x, unaligned pointers and rows under 128 threads hold x in registers.
    assert not rms_variant(spec, Regime.DECODE).tiling.reread
    assert not rms_variant(spec, Regime.PREFILL, aligned=False).tiling.reread
    fp32 = RmsNormSpec(spec.hidden, "float32", spec.weight_dtype, NormParams(1e-6, 0.0, spec.params.weight_mode))
    assert not rms_variant(fp32, Regime.PREFILL).tiling.reread
    narrow = RmsNormSpec(1000, spec.dtype, spec.weight_dtype, NormParams(1e-6, 0.0, spec.params.weight_mode))
    assert rms_variant(narrow, Regime.PREFILL).tiling.threads_per_row == 64
    assert not rms_variant(narrow, Regime.PREFILL).tiling.reread


@pytest.mark.parametrize(
    ("spec", "packed"),
    [
        (RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 0.0, AFTER)), "mul.f16x2"),
        (RmsNormSpec(4096, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, AFTER)), "mul.bf16x2"),
        (RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 1.0, AFTER)), None),  # Gemma's offset: w + 1 in fp32
        (RmsNormSpec(8192, "float16", "float32", NormParams(1e-6, 0.0, AFTER)), None),  # weight in another dtype
        (RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 0.0, BEFORE)), None),
    ],
    ids=repr,
)
def test_llama_weight_multiply_is_packed_in_the_output_dtype(
    spec: RmsNormSpec, packed: str | None, tmp_path: Path
) -> None:
    """AFTER_CAST with the weight in the output dtype and no offset: one packed multiply in that dtype (exact: the
    product of two 16-bit values is exact in fp32); every other case multiplies in fp32."""
    ptx = compiled_ptx(rms_variant(spec, Regime.PREFILL), tmp_path)
    products = re.findall(r"\bmul(?:\.rn)?\.(?:bf16|f16)x2\b", ptx)
    if packed is None:
        assert not products
    else:
        assert products and all(p.replace(".rn", "") == packed for p in products)


MIXED_CASES = [
    # (x dtype, weight dtype, mode, offset, y dtype, regime): every mixed pair, each weight mode, both regimes.
    ("float32", "bfloat16", AFTER, 0.0, "bfloat16", Regime.PREFILL),  # optimum fp16/bf16, fp32 residual stream
    ("float32", "float16", AFTER, 0.0, "float16", Regime.DECODE),
    ("float32", "float32", BEFORE, 1.0, "float16", Regime.PREFILL),  # Gemma with an fp32 residual stream
    ("float32", None, NONE, 0.0, "bfloat16", Regime.DECODE),
    ("bfloat16", "float32", AFTER, 0.0, "float32", Regime.PREFILL),  # opset-23 RMSNormalization, fp32 scale and Y
    ("float16", "float32", BEFORE, 0.0, "float32", Regime.DECODE),
    ("float16", "float16", AFTER, 0.0, "float32", Regime.PREFILL),
    ("bfloat16", None, NONE, 0.0, "float32", Regime.PREFILL),
]


@pytest.mark.parametrize(("dtype", "weight_dtype", "mode", "offset", "out_dtype", "regime"), MIXED_CASES)
def test_mixed_precision_variants_keep_16_byte_accesses_on_both_sides(
    dtype: str,
    weight_dtype: str | None,
    mode: WeightMode,
    offset: float,
    out_dtype: str,
    regime: Regime,
    tmp_path: Path,
) -> None:
    """x and y of different widths: vectors of 8 elements, so the 16-bit side moves each in one 16-byte access and
    the fp32 side in exactly two; every global access is 16 bytes wide, and each is where the tiling says."""
    spec = RmsNormSpec(4096, dtype, weight_dtype, NormParams(1e-6, offset, mode), out_dtype)
    variant = rms_variant(spec, regime)
    tiling = variant.tiling
    assert tiling.vector == 8 and tiling.min_blocks_per_sm == 0
    accesses = global_accesses(compiled_ptx(variant, tmp_path))
    assert accesses and all(a.endswith(".v4.b32") for a in accesses), sorted(set(accesses))

    def per_vector(name: str | None) -> int:
        return 0 if name is None else tiling.vector * DTYPE_BYTES[name] // 16

    slots = tiling.vectors_per_thread
    x_loads = per_vector(dtype) * (2 if tiling.reread else 1)
    assert sum(a.startswith("st.") for a in accesses) == slots * per_vector(out_dtype)
    assert sum(a.startswith("ld.") for a in accesses) == slots * (x_loads + per_vector(weight_dtype))


@pytest.mark.parametrize(("x_bytes", "y_bytes"), [(4, 2), (2, 4)])
def test_mixed_precision_tiling(x_bytes: int, y_bytes: int) -> None:
    """Rows of fp32 <-> 16-bit in 8-element vectors take the one-dtype table's threads without its register cap; a
    16-bit x is still read twice in prefill; decode and head-dim rows follow the one-dtype table."""
    assert access_vector(4096, x_bytes, y_bytes) == 8 and access_vector(1004, x_bytes, y_bytes) == 4
    for hidden, threads, slots in ((4096, 256, 2), (8192, 256, 4), (2048, 128, 2), (5120, 256, 3)):
        t = row_tiling(hidden, 8, Regime.PREFILL, x_bytes, y_bytes)
        assert (t.threads_per_row, t.vectors_per_thread, t.rows_per_block, t.min_blocks_per_sm) == (
            threads,
            slots,
            1,
            0,
        )
        assert t.reread == (x_bytes == 2)
    for regime in Regime:
        for hidden in (128, 4096, 8192):
            same = row_tiling(hidden, 8, regime, 2)
            mixed = row_tiling(hidden, 8, regime, x_bytes, y_bytes)
            if regime is Regime.DECODE or hidden == 128:
                assert (mixed.threads_per_row, mixed.vectors_per_thread) == (
                    same.threads_per_row,
                    same.vectors_per_thread,
                )
    # One dtype on both sides: exactly the table as before.
    for hidden in (2048, 4096, 8192):
        for regime in Regime:
            assert row_tiling(hidden, 8, regime, 2, 2) == row_tiling(hidden, 8, regime, 2)


@pytest.mark.parametrize(
    ("spec", "regime"),
    [
        (RmsNormSpec(4096, "bfloat16", "float32", NormParams(1e-6, 0.0, AFTER), "float32"), Regime.PREFILL),
        (
            RmsNormSpec(1000, "float16", None, NormParams(1e-6, 0.0, NONE), "float32"),
            Regime.PREFILL,
        ),  # ragged: 125 vectors
        (RmsNormSpec(5120, "float16", "float16", NormParams(1e-6, 1.0, BEFORE), "float32"), Regime.DECODE),
    ],
    ids=repr,
)
def test_fp32_output_of_a_16_bit_input_is_stored_in_whole_sectors(
    spec: RmsNormSpec, regime: Regime, tmp_path: Path
) -> None:
    """A 16-bit x with an fp32 y: lane pairs swap halves (one shuffle per 32-bit word, 4 per vector), then write
    two 16-byte stores per vector; fp32 -> 16-bit and one-dtype rows store without shuffles."""
    variant = rms_variant(spec, regime)
    assert variant.tiling.paired_stores
    ptx = compiled_ptx(variant, tmp_path)
    slots = variant.tiling.vectors_per_thread
    lanes = min(variant.tiling.threads_per_row, 32)
    reduction_rounds = lanes.bit_length() - 1
    assert ptx.count("shfl.sync.bfly") == reduction_rounds + 4 * slots
    assert ptx.count("st.global.v4.b32") == 2 * slots
    reverse = RmsNormSpec(spec.hidden, "float32", spec.weight_dtype, spec.params, spec.dtype)
    assert not rms_variant(reverse, regime).tiling.paired_stores
    assert not rms_variant(spec, regime, aligned=False).tiling.paired_stores


def test_after_cast_rounds_to_the_16_bit_side(tmp_path: Path) -> None:
    """bf16 x, fp32 weight and y (ONNX RMSNormalization): x·r is rounded to bf16 before the weight multiply."""
    ptx = {}
    for mode in (AFTER, BEFORE):
        folder = tmp_path / mode.name
        folder.mkdir()
        spec = RmsNormSpec(4096, "bfloat16", "float32", NormParams(1e-6, 0.0, mode), "float32")
        ptx[mode] = compiled_ptx(rms_variant(spec, Regime.DECODE), folder)
    after, before = ptx[AFTER], ptx[BEFORE]
    rounding = re.compile(r"\bcvt\.rn\.bf16(?:x2)?\.f32\b")
    assert rounding.search(after) and not rounding.search(before)


def test_head_dim_rows_are_sub_warp() -> None:
    for head_dim in (64, 128, 256):
        t = row_tiling(head_dim, 8, Regime.PREFILL)
        assert t.threads_per_row <= 32 and t.warps_per_row == 1 and t.block_threads == 128


def test_launch_picks_variant_from_rows_and_pointer_alignment(tmp_path: Path) -> None:
    """The per-call choice of `launch`, with recording stand-ins for the compiled functions (no GPU needed)."""
    spec = RmsNormSpec(4096, "bfloat16", "float32", NormParams(1e-6, 0.0, AFTER))
    kernel = RmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    picked: list[tuple[bool, bool]] = []
    for key in itertools.product((True, False), repeat=2):
        kernel._functions[key] = lambda *args, key=key: picked.append(key)
    aligned = 0x7F0000000000
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20000, 1, 0)
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20000, 132, 0)
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20000, 133, 0)
    kernel.launch(aligned + 2, aligned + 0x10000, aligned + 0x20000, 4096, 0)  # x one bf16 element off
    kernel.launch(aligned, aligned + 0x10008, aligned + 0x20000, 4096, 0)  # fp32 weight 8 bytes off
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20010, 1, 0)  # y 16 bytes off: still aligned
    assert picked == [(True, True), (True, True), (False, True), (False, False), (False, False), (True, True)]


def test_mixed_precision_launch_needs_16_bytes_on_both_sides(tmp_path: Path) -> None:
    spec = RmsNormSpec(4096, "float32", "bfloat16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    kernel = RmsNormKernel(spec, KernelCache(tmp_path), HOPPER)
    picked: list[tuple[bool, bool]] = []
    for key in itertools.product((True, False), repeat=2):
        kernel._functions[key] = lambda *args, key=key: picked.append(key)
    aligned = 0x7F0000000000
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20000, 1, 0)
    kernel.launch(aligned + 8, aligned + 0x10000, aligned + 0x20000, 1, 0)  # fp32 x 8 bytes off
    kernel.launch(aligned, aligned + 0x10000, aligned + 0x20008, 1, 0)  # bf16 y 8 bytes off
    kernel.launch(aligned, aligned + 0x10008, aligned + 0x20000, 1, 0)  # bf16 weight 8 bytes off
    assert picked == [(True, True), (True, False), (True, False), (True, False)]


def test_qk_launch_needs_every_pointer_aligned(tmp_path: Path) -> None:
    kernel = QkNormKernel(QK_CASES[0], KernelCache(tmp_path), HOPPER)
    picked: list[bool] = []
    for aligned in (True, False):
        kernel._functions[aligned] = lambda *args, aligned=aligned: picked.append(aligned)
    base = [0x7F0000000000 + i * 0x10000 for i in range(6)]
    kernel.launch(*base, 32, 8, 0)
    for i in range(6):
        shifted = list(base)
        shifted[i] += 2
        kernel.launch(*shifted, 32, 8, 0)
    assert picked == [True] + [False] * 6


def test_regime_switches_at_sm_count() -> None:
    assert regime_for(1, 132) is Regime.DECODE and regime_for(132, 132) is Regime.DECODE
    assert regime_for(133, 132) is Regime.PREFILL


def test_specs_reject_bad_fields() -> None:
    with pytest.raises(ValueError, match="weight_dtype"):
        RmsNormSpec(128, "float16", "float16", NormParams(1e-6, 0.0, NONE))
    with pytest.raises(ValueError, match="weight dtype"):
        RmsNormSpec(128, "float16", None, NormParams(1e-6, 0.0, AFTER))
    with pytest.raises(ValueError, match="activation dtype"):
        QkNormSpec(128, 128, "int8", "float16", NormParams(1e-6, 0.0, AFTER))
    with pytest.raises(ValueError, match="q_hidden"):
        QkNormSpec(0, 128, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    assert RmsNormSpec(128, "float16", "float16", NormParams(1e-6, 0.0, 1)).params.weight_mode is AFTER
    with pytest.raises(ValueError, match="two different 16-bit dtypes"):
        RmsNormSpec(128, "float16", "float16", NormParams(1e-6, 0.0, AFTER), "bfloat16")
    with pytest.raises(ValueError, match="output dtype float64"):
        QkNormSpec(128, 128, "float32", "float16", NormParams(1e-6, 0.0, AFTER), "float64")
    spec = RmsNormSpec(128, "float16", "float16", NormParams(1e-6, 0.0, AFTER))
    assert spec.out_dtype == "float16" and spec == RmsNormSpec(
        128, "float16", "float16", NormParams(1e-6, 0.0, AFTER), "float16"
    )


def test_bench_command_without_gpu_says_so_in_one_line() -> None:
    torch = pytest.importorskip("torch", reason="torch is not installed")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the benchmark itself would run")
    from click.testing import CliRunner

    from trtfuse.cli.main import cli
    from trtfuse.cli.options import EXIT_MISSING_DEPENDENCY

    result = CliRunner().invoke(cli, ["bench", "kernels", "--no-torch-compile"])
    assert result.exit_code == EXIT_MISSING_DEPENDENCY
    no_gpu = "the kernel benchmark needs a CUDA GPU, and torch sees none"
    assert result.output == f"trtfuse: {no_gpu}\n"
    # The group's --json holds for the benchmark that follows.
    grouped = CliRunner().invoke(cli, ["bench", "--json", "kernels", "--no-torch-compile"])
    assert grouped.exit_code == EXIT_MISSING_DEPENDENCY
    assert json.loads(grouped.stdout) == {
        "error": "the kernel benchmark needs a CUDA GPU, and torch sees none",
        "exit": 3,
    }


@pytest.mark.parametrize("source", ["norm_kernel.py", "quant.py"])
def test_cache_folder_changes_with_the_kernel_sources(
    source: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # An edited kernel (or its quantizers) must never load the object files compiled from its previous text.
    from trtfuse.kernels import cache

    before = cache.cache_folder(tmp_path, "sm_90a")
    edited = tmp_path / "kernels"
    edited.mkdir()
    for name in cache._KERNEL_SOURCES:
        (edited / name).write_bytes((Path(cache.__file__).parent / name).read_bytes())
    (edited / source).write_text((edited / source).read_text() + "\n# edited\n")
    monkeypatch.setattr(cache, "__file__", str(edited / "cache.py"))
    cache.kernel_sources_digest.cache_clear()
    try:
        assert cache.cache_folder(tmp_path, "sm_90a") != before
    finally:
        monkeypatch.undo()
        cache.kernel_sources_digest.cache_clear()
    assert cache.cache_folder(tmp_path, "sm_90a") == before
