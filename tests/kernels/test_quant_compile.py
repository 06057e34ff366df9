"""CPU/CI: the quantizer stages of the RMSNorm and add+norm kernels, and the QK-norm's own quantizer of each output
(docs/plugin-nodes.md, "Quantization"), compile, JIT and AOT, with the instructions the contract's arithmetic needs:
an IEEE division by the scale (div.rn.f32, never an approximation), E4M3FN's saturating round-to-nearest-even
conversion, INT8's round half to even, and 16-byte stores of 16 quantized values where the pointers are aligned."""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.contract import NormParams, Quantizer, QuantParams, WeightMode
from trtfuse.kernels.api import AddRmsNormKernel, QkNormKernel, RmsNormKernel, qk_norm_tilings, rms_norm_tiling
from trtfuse.kernels.artifacts import (
    AOT_ARCHS,
    add_rms_norm_artifact,
    add_rms_norm_tactics,
    aot_archs,
    qk_norm_artifact,
    rms_norm_artifact,
    rms_norm_tactics,
)
from trtfuse.kernels.cache import KernelCache, variant_key
from trtfuse.kernels.compiler import AddRmsNormVariant, QkNormVariant, RmsNormVariant, compile_variant
from trtfuse.kernels.declaration import Tactic, add_rms_norm_params, qk_norm_params, rms_norm_params
from trtfuse.kernels.device import DeviceInfo
from trtfuse.kernels.ptx import reciprocal_applies
from trtfuse.kernels.specs import DTYPE_BYTES, AddRmsNormSpec, QkNormSpec, RmsNormSpec, has_fp8_stage
from trtfuse.kernels.tiling import Regime

ARCH = "sm_90a"
HOPPER = DeviceInfo(arch=ARCH, sm_count=132, has_gpu=False)
LLAMA = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
GEMMA = NormParams(1e-6, 1.0, WeightMode.BEFORE_CAST)


def f32(value: float) -> float:
    return float(np.float32(value))


FP8 = Quantizer("float8_e4m3fn", f32(0.0173))
FP8_UNSATURATED = Quantizer("float8_e4m3fn", f32(0.0173), saturate=False)
INT8 = Quantizer("int8", f32(0.0311))
# ModelOpt's fake-quant pairs: the sum's (FP8, dequantized to the activations' dtype) and the inverse root's (INT8).
FP8_INPUT = Quantizer("float8_e4m3fn", f32(0.047), True, "bfloat16")
INT8_INPUT = Quantizer("int8", f32(0.047), True, "float16")
INT8_RSQRT = Quantizer("int8", f32(0.0083), True, "float32")
STAGE_SETS = {
    "out-fp8": QuantParams(output=FP8),
    "out-fp8-unsat": QuantParams(output=FP8_UNSATURATED),
    "out-int8": QuantParams(output=INT8),
    "in-fp8-out-fp8": QuantParams(input=FP8_INPUT, output=FP8),
    "in-int8-out-int8": QuantParams(input=INT8_INPUT, output=INT8),
    "in-fp8": QuantParams(input=FP8_INPUT),
    "rsqrt-out-int8": QuantParams(rsqrt=INT8_RSQRT, output=INT8),
    "all": QuantParams(input=FP8_INPUT, rsqrt=INT8_RSQRT, output=FP8_UNSATURATED),
}


def global_accesses(ptx: str) -> list[str]:
    return re.findall(r"\b(?:ld|st)\.global(?:\.[A-Za-z0-9:_]+)+", ptx)


def compiled_ptx(variant: RmsNormVariant | AddRmsNormVariant | QkNormVariant, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    compile_variant(variant, ptx_dir=folder)
    (ptx_file,) = folder.glob("*.ptx")
    return ptx_file.read_text()


def variant_of(spec: RmsNormSpec | AddRmsNormSpec, regime: Regime, aligned: bool) -> RmsNormVariant:
    kind = AddRmsNormKernel if isinstance(spec, AddRmsNormSpec) else RmsNormKernel
    return kind(spec, KernelCache(Path("/nonexistent")), HOPPER).variant(regime, aligned)


def immediate(value: float) -> str:
    """A float32 value as PTX writes it in an instruction: 0f and its bits in hex."""
    return "0f" + np.float32(value).tobytes()[::-1].hex().upper()


def check_quantizer_instructions(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, ptx: str) -> None:
    """Each stage's quotient is `ptx.scale_quotient`'s (a product by the scale's float32 reciprocal, then two
    fma corrections by the scale's own bits), or div.rn.f32 by the scale for one outside its range; no approximate
    division anywhere; the conversions of each quantized dtype are there; with the rsqrt stage, r is the correctly
    rounded root and reciprocal (`root_to_quotient`), else the approximate inverse root of the plain kernel. A
    QK-norm's stages are each part's own (q_output an output stage, k_rsqrt an rsqrt stage...), each at its own
    scale: the parts' rsqrt stages are read per part."""
    quant = spec.quant
    parts = [spec.part_quant(part) for part in range(2 if isinstance(spec, QkNormSpec) else 1)]
    assert not re.search(r"\bdiv\.(approx|full)\b", ptx)
    assert not re.search(r"\brcp\.approx", ptx)
    for stage in quant.stages:
        quantizer = quant.at(stage)
        scale = immediate(quantizer.scale)
        if reciprocal_applies(quantizer.scale):
            reciprocal = immediate(float(np.float32(1.0) / np.float32(quantizer.scale)))
            assert re.search(rf"\bmul\.rn\.f32\s+q0, %r\d+, {reciprocal};", ptx), (stage, reciprocal)
            assert len(re.findall(rf"\bfma\.rn\.f32\s+e, n, {scale}, %r\d+;", ptx)) >= 2, (stage, scale)
        else:
            assert re.search(rf"\bdiv\.rn\.f32\s+%r\d+, %r\d+, {scale};", ptx), (stage, scale)
    roots = [part.rsqrt for part in parts if part is not None and part.rsqrt is not None]
    if len(roots) < len(parts):
        assert "rsqrt.approx.ftz.f32" in ptx
    else:
        assert "rsqrt.approx" not in ptx
    for root in roots:
        root_to_quotient(ptx, root)
    dtypes = {quant.at(stage).dtype for stage in quant.stages}
    if "float8_e4m3fn" in dtypes:
        assert "cvt.rn.satfinite.e4m3x2.f32" in ptx
    fake_int8 = any(quant.at(stage).dtype == "int8" for stage in quant.stages if stage.fake)
    if fake_int8:
        # The level through int32 and back (the level 0 as +0, as DQ gives it), a float32 for DQ.
        assert "cvt.rni.s32.f32 i, t;" in ptx and "cvt.rn.f32.s32" in ptx
    if any(quant.at(stage).dtype == "int8" for stage in quant.stages if stage.quantizes_output):
        # Words of 4 codes: cvt.rni to int32 and cvt.pack.sat; a scalar variant's lone codes: the level.
        packed = "cvt.rni.s32.f32" in ptx and len(re.findall(r"\bcvt\.pack\.sat\.s8\.s32\.b32\b", ptx)) >= 2
        assert packed or "cvt.rn.f32.s32" in ptx
    if any(part is not None and part.input is not None and part.input.dtype == "float8_e4m3fn" for part in parts):
        assert "cvt.rn.f16x2.e4m3x2" in ptx  # DQ reads the FP8 codes back


def root_to_quotient(ptx: str, quantizer: Quantizer) -> tuple[str, str, str]:
    """The rsqrt stage's PTX from the square root of the variance to r's quotient by the scale: sqrt.rn.f32, then
    rcp.rn.f32 of it (the graph's Sqrt and Reciprocal, each correctly rounded), then what comes between r and the
    quotient (`ptx.scale_quotient`'s product by the reciprocal, or div.rn.f32). Returns (r's register, the
    instructions between, the register the quotient reads)."""
    reciprocal = immediate(float(np.float32(1.0) / np.float32(quantizer.scale)))
    found = re.search(
        rf"\bsqrt\.rn\.f32\s+(%r\d+), %r\d+;\s+rcp\.rn\.f32\s+(%r\d+), \1;(.*?)"
        rf"(?:\bdiv\.rn\.f32\s+%r\d+, (%r\d+), {immediate(quantizer.scale)};"
        rf"|\bmul\.rn\.f32\s+q0, (%r\d+), {reciprocal};)",
        ptx,
        re.S,
    )
    assert found, "no sqrt.rn -> rcp.rn -> quotient by the rsqrt scale"
    return found.group(2), found.group(3), found.group(4) or found.group(5)


def check_y_stores(variant: RmsNormVariant | AddRmsNormVariant, ptx: str) -> None:
    """Aligned 1-byte y: 16 quantized values per 16-byte store (beside h's own 16-byte stores); unaligned: y one
    byte at a time."""
    spec, tiling = variant.spec, variant.tiling
    stores = [a for a in global_accesses(ptx) if a.startswith("st.")]
    h_per_slot = tiling.vector * DTYPE_BYTES[spec.dtype] // 16 if isinstance(spec, AddRmsNormSpec) else 0
    if tiling.vector == 1:
        assert "st.global.b8" in stores
        assert not [a for a in stores if a.endswith(".v4.b32")]
    else:
        assert tiling.vector == 16
        assert stores == ["st.global.v4.b32"] * (tiling.vectors_per_thread * (1 + h_per_slot))


CASES = [
    (kind, name, regime, aligned)
    for kind, name in itertools.product(("rms", "add"), STAGE_SETS)
    for regime, aligned in ((Regime.PREFILL, True), (Regime.DECODE, True), (Regime.PREFILL, False))
]


@pytest.mark.parametrize(("kind", "name", "regime", "aligned"), CASES)
def test_every_stage_set_compiles_with_the_contracts_arithmetic(
    kind: str, name: str, regime: Regime, aligned: bool, tmp_path: Path
) -> None:
    """RMSNorm and add+norm, every stage set, prefill and decode (16-byte vectors) and the scalar path, bf16 rows of
    Llama's width."""
    spec_type = AddRmsNormSpec if kind == "add" else RmsNormSpec
    spec = spec_type(4096, "bfloat16", "bfloat16", LLAMA, quant=STAGE_SETS[name])
    variant = variant_of(spec, regime, aligned)
    ptx = compiled_ptx(variant, tmp_path)
    check_quantizer_instructions(spec, ptx)
    if spec.quant.output is not None:
        check_y_stores(variant, ptx)


@pytest.mark.parametrize(
    "spec",
    [
        RmsNormSpec(4096, "float32", "bfloat16", LLAMA, "bfloat16", QuantParams(output=FP8)),
        RmsNormSpec(4096, "float16", "float32", GEMMA, "float32", QuantParams(output=INT8)),
        RmsNormSpec(1000, "float16", "float16", GEMMA, quant=QuantParams(input=INT8_INPUT, output=FP8)),
        RmsNormSpec(128, "bfloat16", None, NormParams(1e-5, 0.0, WeightMode.NONE), quant=QuantParams(output=FP8)),
        AddRmsNormSpec(4096, "float32", "float16", LLAMA, "float16", QuantParams(input=FP8_INPUT, output=FP8)),
        AddRmsNormSpec(5120, "float16", "float16", GEMMA, quant=QuantParams(input=INT8_INPUT, output=INT8)),
        AddRmsNormSpec(1001, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(output=FP8_UNSATURATED)),
    ],
    ids=repr,
)
def test_dtype_pairs_and_row_widths_compile(spec: RmsNormSpec | AddRmsNormSpec, tmp_path: Path) -> None:
    """Mixed pairs (fp32 rows with a 16-bit T, a 16-bit row with an fp32 T), weight modes, head-dim, ragged and
    no-vector rows, both regimes and both alignments."""
    for regime, aligned in itertools.product(Regime, (True, False)):
        variant = variant_of(spec, regime, aligned)
        ptx = compiled_ptx(variant, tmp_path / f"{regime.name}-{aligned}")
        check_quantizer_instructions(spec, ptx)
        if (
            aligned
            and variant.tiling.vector == 16
            and variant.tiling.vectors_per_row % variant.tiling.threads_per_row == 0
        ):
            check_y_stores(variant, ptx)


# QK-norm: q's and k's own output quantizers (Gemma3 INT8's two scales; DeepSeek-V3 FP8's latent q alone), and
# each norm's own input and inverse-root pairs (OLMo2's INT8, at four scales).
INT8_K = Quantizer("int8", f32(0.0173))
FP8_K = Quantizer("float8_e4m3fn", f32(0.0071), saturate=False)
INT8_INPUT_K = Quantizer("int8", f32(0.0251), True, "bfloat16")
INT8_RSQRT_K = Quantizer("int8", f32(0.0117), True, "float32")
QK_STAGE_SETS = {
    "q-int8": QuantParams(q_output=INT8),
    "q-fp8": QuantParams(q_output=FP8),
    "k-int8": QuantParams(k_output=INT8),
    "k-fp8": QuantParams(k_output=FP8),
    "both-int8": QuantParams(q_output=INT8, k_output=INT8_K),
    "both-fp8": QuantParams(q_output=FP8, k_output=FP8_K),
    "olmo2-int8": QuantParams(
        q_input=Quantizer("int8", f32(0.047), True, "bfloat16"),
        q_rsqrt=INT8_RSQRT,
        k_input=INT8_INPUT_K,
        k_rsqrt=INT8_RSQRT_K,
    ),
    "k-rsqrt-q-out": QuantParams(q_output=FP8, k_rsqrt=INT8_RSQRT_K),
    "q-fp8-input-k-out": QuantParams(q_input=FP8_INPUT, k_output=INT8_K),
}
# Head dims of 128 and 64, and rows of widths no power of two, like DeepSeek-V3's latent ones (1536 and 512).
QK_WIDTHS = ((128, 128), (64, 64), (48, 32))


def qk_variant(spec: QkNormSpec, aligned: bool) -> QkNormVariant:
    return QkNormKernel(spec, KernelCache(Path("/nonexistent")), HOPPER).variant(aligned)


def qk_scalar_stores(spec: QkNormSpec) -> set[str]:
    """The element path's stores: each part's in the width of the dtype it stores (its quantizer's, else T)."""
    return {f"st.global.b{8 * DTYPE_BYTES[spec.part_y_dtype(part)]}" for part in (0, 1)}


def check_qk_stores(variant: QkNormVariant, ptx: str) -> None:
    """Each part's output in its own stored dtype: aligned, one 16-byte store per vector of each part (16 codes of
    a quantized part, 16 bytes of T of the other); unaligned, stores of exactly the parts' stored widths."""
    spec, tilings = variant.spec, (variant.q_tiling, variant.k_tiling)
    stores = [a for a in global_accesses(ptx) if a.startswith("st.")]
    if all(t.vector == 1 for t in tilings):
        assert set(stores) == qk_scalar_stores(spec)
        return
    widths = [DTYPE_BYTES[spec.part_y_dtype(part)] for part in (0, 1)]
    assert [t.vector * width for t, width in zip(tilings, widths, strict=True)] == [16, 16]
    assert stores == ["st.global.v4.b32"] * sum(t.vectors_per_thread for t in tilings)


@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("name", QK_STAGE_SETS)
@pytest.mark.parametrize("widths", QK_WIDTHS, ids=str)
def test_qk_norm_parts_compile_with_their_own_quantizers(
    widths: tuple[int, int], name: str, aligned: bool, tmp_path: Path
) -> None:
    """q's, k's or both parts' quantizers (each at its own scale), bf16 rows, the vector and element paths: each
    quantizer's arithmetic (a part's inverse root correctly rounded where its rsqrt stage is on, the other part's
    approximate), and a part without an output quantizer stores T (`check_qk_stores`)."""
    spec = QkNormSpec(*widths, "bfloat16", "bfloat16", LLAMA, quant=QK_STAGE_SETS[name])
    variant = qk_variant(spec, aligned)
    ptx = compiled_ptx(variant, tmp_path)
    check_quantizer_instructions(spec, ptx)
    check_qk_stores(variant, ptx)


@pytest.mark.parametrize(
    "spec",
    [
        QkNormSpec(128, 128, "float16", "float16", GEMMA, quant=QuantParams(q_output=INT8, k_output=INT8_K)),
        QkNormSpec(128, 128, "float32", "bfloat16", LLAMA, "bfloat16", QuantParams(q_output=INT8, k_output=FP8)),
        QkNormSpec(64, 64, "bfloat16", None, NormParams(1e-5, 0.0, WeightMode.NONE), quant=QuantParams(k_output=FP8)),
    ],
    ids=repr,
)
def test_qk_norm_dtype_pairs_and_weight_modes_compile(spec: QkNormSpec, tmp_path: Path) -> None:
    """Gemma's fp16 BEFORE_CAST, fp32 rows with a bf16 T and one part of each quantized dtype, no weight."""
    for aligned in (True, False):
        variant = qk_variant(spec, aligned)
        ptx = compiled_ptx(variant, tmp_path / str(aligned))
        check_quantizer_instructions(spec, ptx)
        check_qk_stores(variant, ptx)


def test_a_one_byte_y_takes_16_element_vectors_two_per_thread_in_prefill_and_one_in_decode() -> None:
    """The tiling table's 1-byte-y rule: vectors of 16 (one 16-byte store); prefill keeps a 16-bit row's 2 vectors
    per thread (so half its threads), decode takes 1 (twice its threads), an add+norm's prefill 1."""
    plain = RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA)
    quantized = RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(output=FP8))
    added = AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(output=FP8))
    expected = {Regime.PREFILL: (2, 128, 1), Regime.DECODE: (1, 256, 1)}
    for regime in Regime:
        ours, theirs, add = (rms_norm_tiling(s, regime, aligned=True) for s in (quantized, plain, added))
        assert (ours.vector, theirs.vector) == (16, 8)
        assert (ours.vectors_per_thread, ours.threads_per_row, ours.rows_per_block) == expected[regime]
        assert (add.vectors_per_thread, add.threads_per_row) == (1, 256)
        assert not ours.reread and not ours.paired_stores and ours.min_blocks_per_sm == 0


# The conversions that round a float32 r to each 16-bit dtype and back.
ROUNDINGS = {"float16": ("cvt.rn.f16x2.f32", "cvt.f32.f16"), "bfloat16": ("cvt.rn.bf16.f32", "cvt.f32.bf16")}


@pytest.mark.parametrize("input_dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(("regime", "aligned"), [(Regime.PREFILL, True), (Regime.DECODE, False)])
def test_the_rsqrt_stage_rounds_r_to_its_input_dtype_before_the_quantizer(
    input_dtype: str, regime: Regime, aligned: bool, tmp_path: Path
) -> None:
    """A graph that casts r to 16 bits before its QuantizeLinear: r goes from rcp.rn to that dtype and back, and
    the division by the scale reads the widened value; with float32, the division reads r itself. float32 rows and
    weights, so that no other conversion of either 16-bit dtype is in the kernel."""
    quantizer = Quantizer("int8", f32(0.0083), True, "float16", input_dtype)
    spec = AddRmsNormSpec(4096, "float32", "float32", LLAMA, quant=QuantParams(rsqrt=quantizer, output=INT8))
    ptx = compiled_ptx(variant_of(spec, regime, aligned), tmp_path)
    check_quantizer_instructions(spec, ptx)
    r, between, read = root_to_quotient(ptx, quantizer)
    if input_dtype == "float32":
        assert read == r and "cvt." not in between
        return
    narrow, widen = ROUNDINGS[input_dtype]
    assert re.search(rf"\b{re.escape(narrow)}\s+%r\w+, (%r\d+, )?{r};", between), between
    assert re.search(rf"\b{re.escape(widen)}\s+{read}, %rs\d+;", between), between


def test_the_spec_says_y_is_stored_in_the_output_quantizers_dtype() -> None:
    spec = RmsNormSpec(4096, "float32", "bfloat16", LLAMA, "bfloat16", QuantParams(output=INT8))
    assert (spec.out_dtype, spec.y_dtype) == ("bfloat16", "int8")
    fake = AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(input=FP8_INPUT))
    assert fake.y_dtype == "bfloat16"
    assert fake.norm().quant == fake.quant
    assert (spec.part_quant(0), spec.part_y_dtype(0)) == (spec.quant, "int8")
    with pytest.raises(ValueError, match="no row part 1"):
        spec.part_quant(1)


def test_each_qk_norm_part_computes_its_own_norms_stages() -> None:
    """A part's stages are that part's norm's (q_rsqrt as rsqrt...): what each part's NormMath compiles."""
    spec = QkNormSpec(64, 32, "bfloat16", "bfloat16", LLAMA, quant=QK_STAGE_SETS["k-rsqrt-q-out"])
    assert (spec.part_quant(0), spec.part_quant(1)) == (QuantParams(output=FP8), QuantParams(rsqrt=INT8_RSQRT_K))
    assert (spec.part_y_dtype(0), spec.part_y_dtype(1)) == ("float8_e4m3fn", "bfloat16")
    olmo2 = QkNormSpec(64, 32, "bfloat16", "bfloat16", LLAMA, quant=QK_STAGE_SETS["olmo2-int8"])
    assert olmo2.part_quant(1) == QuantParams(input=INT8_INPUT_K, rsqrt=INT8_RSQRT_K)
    assert (olmo2.part_y_dtype(0), olmo2.part_y_dtype(1)) == ("bfloat16", "bfloat16")


def test_each_qk_norm_part_is_stored_in_its_own_quantizers_dtype_or_in_t() -> None:
    spec = QkNormSpec(48, 32, "bfloat16", "float32", LLAMA, "bfloat16", QuantParams(q_output=FP8))
    assert (spec.part_quant(0), spec.part_quant(1)) == (QuantParams(output=FP8), None)
    assert (spec.part_y_dtype(0), spec.part_y_dtype(1)) == ("float8_e4m3fn", "bfloat16")
    both = QkNormSpec(128, 128, "float16", "float16", GEMMA, quant=QuantParams(q_output=INT8, k_output=INT8_K))
    assert both.part_quant(1) == QuantParams(output=INT8_K) and both.part_y_dtype(1) == "int8"
    q, k = qk_norm_tilings(spec, aligned=True)
    assert (q.vector, k.vector) == (16, 8)  # 16 codes, 8 bf16: 16 bytes each


def test_a_plain_specs_repr_is_unchanged_and_quant_specs_have_their_own_keys() -> None:
    """The repr keys the compile cache and the AOT entry names: a plain spec's has no quant field (so plain kernels
    keep their PTX, tests/kernels/test_add_norm_ptx_identity.py), each stage set its own key."""
    plain = RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA)
    assert repr(plain) == (
        "RmsNormSpec(hidden=4096, dtype='bfloat16', weight_dtype='bfloat16', params=NormParams(epsilon=1e-06, "
        "weight_offset=0.0, weight_mode=<WeightMode.AFTER_CAST: 1>), out_dtype='bfloat16')"
    )
    assert "quant" not in repr(QkNormSpec(128, 128, "bfloat16", "bfloat16", LLAMA))
    keys = {variant_key(variant_of(plain, Regime.PREFILL, True))}
    for quant in STAGE_SETS.values():
        spec = RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=quant)
        assert "quant=QuantParams(" in repr(spec)
        keys.add(variant_key(variant_of(spec, Regime.PREFILL, True)))
    assert len(keys) == 1 + len(STAGE_SETS)


@pytest.mark.parametrize(
    ("quant", "problem"),
    [
        (QuantParams(), "every stage off"),
        (QuantParams(output=Quantizer("float8_e5m2", 1.0)), "dtype 'float8_e5m2'"),
        (QuantParams(output=Quantizer("int8", 0.1)), "not a positive finite float32"),
        (QuantParams(output=Quantizer("int8", -1.0)), "not a positive finite float32"),
        (QuantParams(output=Quantizer("int8", 1.0, saturate=False)), "INT8 always saturates"),
        (QuantParams(output=Quantizer("int8", 1.0, True, "float16")), "dequant dtype exactly"),
        (QuantParams(input=Quantizer("int8", 1.0)), "dequant dtype exactly"),
        (QuantParams(rsqrt=Quantizer("int8", 1.0, True, "int8")), "dequant dtype 'int8'"),
        (QuantParams(output=Quantizer("int8", 1.0, input_dtype="float16")), "an input dtype exactly for the rsqrt"),
        (QuantParams(rsqrt=Quantizer("int8", 1.0, True, "float32", "int8")), "input dtype 'int8' is not one of"),
    ],
)
def test_a_quantizer_outside_the_contract_is_refused_in_one_line(quant: QuantParams, problem: str) -> None:
    with pytest.raises(ValueError, match=re.escape(problem)):
        RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=quant)


def qk_spec(quant: QuantParams) -> QkNormSpec:
    return QkNormSpec(128, 128, "bfloat16", "bfloat16", LLAMA, quant=quant)


def rms_spec(quant: QuantParams) -> RmsNormSpec:
    return RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=quant)


@pytest.mark.parametrize(
    ("make", "quant", "problem"),
    [
        (
            qk_spec,
            QuantParams(output=INT8),
            "output is not a stage of this kernel (q_input, q_rsqrt, q_output, k_input, k_rsqrt, k_output)",
        ),
        (qk_spec, QuantParams(input=FP8_INPUT, q_output=INT8), "input is not a stage of this kernel"),
        (qk_spec, QuantParams(k_output=Quantizer("int8", 0.1)), "k_output quantizer scale 0.1 is not a positive"),
        (rms_spec, QuantParams(q_output=INT8), "q_output is not a stage of this kernel (input, rsqrt, output)"),
    ],
    ids=["qk-output", "qk-input", "qk-scale", "rms-q_output"],
)
def test_a_stage_the_kernel_does_not_have_is_refused_in_one_line(
    make: Callable[[QuantParams], object], quant: QuantParams, problem: str
) -> None:
    """A QK-norm's quantizers are each part's own stages, never a single norm's; an RMSNorm has no q or k part."""
    with pytest.raises(ValueError, match=re.escape(problem)):
        make(quant)


AOT_SPECS = [
    RmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(output=FP8)),
    RmsNormSpec(1001, "float16", "float32", GEMMA, quant=QuantParams(output=INT8)),
    AddRmsNormSpec(4096, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(input=FP8_INPUT, output=FP8_UNSATURATED)),
    AddRmsNormSpec(4096, "float16", "float16", LLAMA, quant=QuantParams(rsqrt=INT8_RSQRT, output=INT8)),
]


@pytest.mark.parametrize("spec", AOT_SPECS, ids=repr)
def test_quant_artifacts_compile_for_every_architecture_they_can_run_on(
    spec: RmsNormSpec | AddRmsNormSpec, tmp_path: Path
) -> None:
    """PTX and cubin (ptxas accepts the quantizers' inline PTX) of every tactic, for AOT_ARCHS less the pre-sm_89
    ones where a stage is FP8; the declaration's parameters are the plain kernel's."""
    add = isinstance(spec, AddRmsNormSpec)
    make = add_rms_norm_artifact if add else rms_norm_artifact
    archs = aot_archs(spec)
    assert archs == (AOT_ARCHS if spec.quant.output.dtype == "int8" else ("sm_89", "sm_90a", "sm_100a"))
    for arch in archs:
        for tactic in (add_rms_norm_tactics if add else rms_norm_tactics)(spec):
            artifact = make(spec, tactic, arch, tmp_path)
            assert artifact.cubin and f".target {arch}" in artifact.ptx
            check_quantizer_instructions(spec, artifact.ptx)
            assert artifact.declaration.params == (add_rms_norm_params() if add else rms_norm_params())


QK_AOT_SPECS = [
    QkNormSpec(128, 128, "float16", "float16", GEMMA, quant=QuantParams(q_output=INT8, k_output=INT8_K)),
    QkNormSpec(48, 32, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(q_output=FP8)),
    QkNormSpec(64, 64, "bfloat16", "bfloat16", LLAMA, quant=QuantParams(k_output=FP8_K)),
    # OLMo2's INT8 fp16 export: full-width q and k of different widths, each with its input and inverse-root pairs
    # (r read in float16, as its root is computed).
    QkNormSpec(
        4096,
        1024,
        "float16",
        "float16",
        LLAMA,
        quant=QuantParams(
            q_input=Quantizer("int8", f32(0.047), True, "float16"),
            q_rsqrt=Quantizer("int8", f32(0.0083), True, "float16", "float16"),
            k_input=Quantizer("int8", f32(0.0251), True, "float16"),
            k_rsqrt=Quantizer("int8", f32(0.0117), True, "float16", "float16"),
        ),
    ),
]


@pytest.mark.parametrize("spec", QK_AOT_SPECS, ids=repr)
def test_qk_norm_quant_artifacts_compile_for_every_architecture_they_can_run_on(
    spec: QkNormSpec, tmp_path: Path
) -> None:
    """PTX and cubin for AOT_ARCHS less the pre-sm_89 ones where a part is FP8; the AOT kernel holds both paths
    (it tests the pointers itself): each part's quantizer, 16-byte stores and the element path's stores in each
    part's stored dtype; the declaration's parameters are the plain QK-norm's."""
    archs = aot_archs(spec)
    assert archs == (("sm_89", "sm_90a", "sm_100a") if has_fp8_stage(spec) else AOT_ARCHS)
    for arch in archs:
        artifact = qk_norm_artifact(spec, Tactic.PREFILL, arch, tmp_path)
        assert artifact.cubin and f".target {arch}" in artifact.ptx
        check_quantizer_instructions(spec, artifact.ptx)
        stores = {a for a in global_accesses(artifact.ptx) if a.startswith("st.")}
        assert stores == {"st.global.v4.b32"} | qk_scalar_stores(spec)
        assert artifact.declaration.params == qk_norm_params()


def test_an_fp8_quantizer_before_sm_89_is_refused_in_one_line(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"an FP8 quantizer needs sm_89 or newer \(its conversions\), not sm_86"):
        rms_norm_artifact(AOT_SPECS[0], Tactic.PREFILL, "sm_86", tmp_path)
