"""CPU/CI: the QK-norm + rotary kernel compiles for sm_90a in every dtype pair, weight mode, layout, rotation and
quantized output stage the QK-norm has, JIT and AOT; its PTX has the 16-byte accesses where aligned (q, k, the
weights, cos, sin and the outputs), the shuffles of the register exchange, the rotation's products and sum each
rounded (mul.rn, mul.rn, add.rn: no fused multiply-add), the unsigned divisions that locate a row's cos/sin row,
the element path beside the vector path, and no local memory; its AOT entries take the declared parameters for
every architecture."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed (pip install -e .[kernels])")

from trtfuse.contract import ACTIVATION_DTYPES, NormParams, Quantizer, QuantParams, WeightMode, dtype_pair_problem
from trtfuse.kernels.api import QkNormRopeKernel, get_qk_norm_rope, shared_cache
from trtfuse.kernels.artifacts import AOT_ARCHS, aot_archs, qk_norm_rope_artifact, qk_norm_rope_tactics
from trtfuse.kernels.cache import KernelCache
from trtfuse.kernels.compiler import QkNormRopeVariant, compile_variant
from trtfuse.kernels.declaration import ROPE_EXTENTS, Tactic, qk_norm_rope_params
from trtfuse.kernels.device import DeviceInfo
from trtfuse.kernels.specs import DTYPE_BYTES, QkNormRopeSpec, QkNormSpec, RopeParams

from support.aot_ptx import check_artifact, entry_params, global_accesses

ARCH = "sm_90a"
HOPPER = DeviceInfo(arch=ARCH, sm_count=132, has_gpu=False)
AFTER, BEFORE, NONE = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
LLAMA = NormParams(1e-6, 0.0, AFTER)
GEMMA = NormParams(1e-6, 1.0, BEFORE)
QWEN3 = RopeParams(128, 128, "half", "token_major")
PAIRS = [(d, t) for d, t in itertools.product(ACTIVATION_DTYPES, repeat=2) if dtype_pair_problem(d, t) is None]


def variant_of(spec: QkNormRopeSpec) -> QkNormRopeVariant:
    return QkNormRopeKernel(spec, KernelCache(Path("/nonexistent")), HOPPER).variant()


def compiled_ptx(spec: QkNormRopeSpec, folder: Path) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    compile_variant(variant_of(spec), ptx_dir=folder)
    (ptx,) = folder.glob("*.ptx")
    return ptx.read_text()


def vector_accesses(ptx: str) -> set[str]:
    return {a for a in global_accesses(ptx) if ".v" in a}


def rotated_sums(variant: QkNormRopeVariant) -> int:
    """The rotation's sums the kernel holds: one per element of each slot the vector path rotates (where the parts
    have a vector path), one in each part's element loop (where they have one: every vector wider than 1)."""
    plans, tilings = variant.rope().plans, (variant.q_tiling, variant.k_tiling)
    vector_path = all(plan is not None for plan in plans)
    element_path = not vector_path or any(tiling.vector > 1 for tiling in tilings)
    sums = 2 * element_path
    if vector_path:
        sums += sum(t.vector * sum(s is not None for s in p.source_slots) for p, t in zip(plans, tilings, strict=True))
    return sums


def check_rotated_ptx(spec: QkNormRopeSpec, ptx: str) -> None:
    """Both paths, the exchange and the rounding the kernel promises, nothing in local memory."""
    variant = variant_of(spec)
    plans = variant.rope().plans
    # The vector path's accesses are 16 bytes wide, never 8 or 4 bytes of several elements.
    assert vector_accesses(ptx) <= {"st.global.v4.b32", "ld.global.v4.b32"} | {
        a for a in global_accesses(ptx) if "L2::cache_hint" in a
    }, global_accesses(ptx)
    assert not any(".v2." in a for a in global_accesses(ptx))
    if all(plan is not None for plan in plans) and min(variant.q_tiling.vector, variant.k_tiling.vector) > 1:
        assert "ld.global.v4.b32" in global_accesses(ptx) and "st.global.v4.b32" in global_accesses(ptx)
    # One shuffle per element of every slot the plan exchanges across lanes, in each part.
    shuffles = sum(
        plan.shuffles.count(True) * tiling.vector
        for plan, tiling in zip(plans, (variant.q_tiling, variant.k_tiling), strict=True)
        if plan is not None
    )
    assert len(re.findall(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, %r\d+", ptx)) == shuffles
    # Two products and their sum, each rounded (never one fma): per rotated element of the vector path's slots,
    # and once in each part's element loop. (The quantizers round their own arithmetic too: counted without them.)
    if spec.quant is None:
        assert len(re.findall(r"\badd\.rn\.f32", ptx)) == rotated_sums(variant)
        assert len(re.findall(r"\bmul\.rn\.f32", ptx)) == 2 * rotated_sums(variant)
    assert re.search(r"\bdiv\.u32\b", ptx) and not re.search(r"\bdiv\.s32\b", ptx)
    assert ".local" not in ptx, "spilled to local memory"


QWEN3_SPEC = QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", LLAMA, rope=QWEN3)
GEMMA3_SPEC = QkNormRopeSpec(256, 256, "bfloat16", "float32", GEMMA, rope=RopeParams(256, 256, "half", "head_major"))
OLMO2_SPEC = QkNormRopeSpec(4096, 1024, "bfloat16", "bfloat16", GEMMA, rope=QWEN3)  # full width, x read twice
FP32_HEAD256_SPEC = QkNormRopeSpec(
    256, 256, "float32", "float32", GEMMA, rope=RopeParams(256, 256, "half", "token_major")
)
CASES = [
    # Every (x, T) pair in both weight modes with a weight of the 16-bit side, Qwen3's heads.
    QkNormRopeSpec(128, 128, d, t if d == "float32" else d, NormParams(1e-6, offset, mode), t, rope=QWEN3)
    for (d, t), (mode, offset) in zip(PAIRS, itertools.cycle(((AFTER, 0.0), (BEFORE, 1.0))))
] + [
    QWEN3_SPEC,
    GEMMA3_SPEC,
    OLMO2_SPEC,
    FP32_HEAD256_SPEC,
    QkNormRopeSpec(128, 128, "bfloat16", None, NormParams(1e-5, 0.0, NONE), rope=QWEN3),
    QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", LLAMA, rope=QWEN3, cos_dtype="float32"),
    QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=RopeParams(128, 64, "half", "token_major")),
    QkNormRopeSpec(64, 64, "float32", "float32", GEMMA, rope=RopeParams(64, 64, "interleaved", "token_major")),
    QkNormRopeSpec(128, 128, "float16", "float32", LLAMA, rope=RopeParams(128, 32, "interleaved", "head_major")),
    QkNormRopeSpec(64, 64, "bfloat16", "bfloat16", LLAMA, rope=RopeParams(64, 6, "half", "token_major")),
]


@pytest.mark.parametrize("spec", CASES, ids=repr)
def test_every_variant_compiles_with_its_accesses_exchange_and_rounding(spec: QkNormRopeSpec, tmp_path: Path) -> None:
    check_rotated_ptx(spec, compiled_ptx(spec, tmp_path))


def test_the_rotated_width_and_head_layout_reach_the_code(tmp_path: Path) -> None:
    """Partial rotary tests each slot's head position (select on a compare of the lane's vector); a full one does
    not; rows locate their cos row with the divisions their layout needs and no more (the rows per token come from
    the launch)."""
    full = compiled_ptx(QWEN3_SPEC, tmp_path / "full")
    partial = compiled_ptx(
        dataclasses.replace(QWEN3_SPEC, rope=RopeParams(128, 64, "half", "token_major")), tmp_path / "p"
    )
    head_major = compiled_ptx(
        dataclasses.replace(QWEN3_SPEC, rope=RopeParams(128, 128, "half", "head_major")), tmp_path / "hm"
    )
    assert full != partial != head_major
    divisions = [len(re.findall(r"\b(?:div|rem)\.u32\b", ptx)) for ptx in (full, head_major)]
    # Per part and path (q and k, the vector and the element path: 4): token-major row / H where rows · H passes
    # 2^30 (else a multiply-shift), then t mod S for tables shared by several sequences; head-major row mod S,
    # then row / (H·S) for per-batch tables.
    assert divisions == [8, 8]


def test_fp32_heads_of_256_exchange_through_registers(tmp_path: Path) -> None:
    spec = FP32_HEAD256_SPEC
    plans = variant_of(spec).rope().plans
    assert all(plan.shuffles == (False, False) for plan in plans)
    assert not re.search(r"shfl\.sync\.idx\.b32\s+%r\d+, %r\d+, %r\d+", compiled_ptx(spec, tmp_path))


QUANTS = {
    "fp8-q-int8-k": QuantParams(q_output=Quantizer("float8_e4m3fn", 0.015625), k_output=Quantizer("int8", 0.03125)),
    "fp8-q-unsaturated": QuantParams(q_output=Quantizer("float8_e4m3fn", 0.25, saturate=False)),
    "int8-k": QuantParams(k_output=Quantizer("int8", 0.0625)),
}


@pytest.mark.parametrize("stages", QUANTS)
@pytest.mark.parametrize("base", [QWEN3_SPEC, GEMMA3_SPEC], ids=["qwen3", "gemma3-head-major"])
def test_quantized_outputs_compile_with_16_code_vectors(stages: str, base: QkNormRopeSpec, tmp_path: Path) -> None:
    spec = dataclasses.replace(base, quant=QUANTS[stages])
    ptx = compiled_ptx(spec, tmp_path)
    check_rotated_ptx(spec, ptx)
    variant = variant_of(spec)
    for part, tiling in enumerate((variant.q_tiling, variant.k_tiling)):
        quantized = spec.part_quant(part) is not None
        assert tiling.vector == (16 if quantized else 16 // DTYPE_BYTES[spec.dtype])
    if any(spec.part_quant(part).output.dtype == "int8" for part in (0, 1) if spec.part_quant(part)):
        assert "cvt.pack.sat.s8" in ptx
    if spec.quant.q_output is not None:
        assert "e4m3x2" in ptx


def test_one_variant_serves_every_alignment_and_row_count() -> None:
    """The kernel tests its pointers itself: `launch` calls the one compiled function with the arguments in its
    order, whatever the pointers' alignment and the row counts."""
    spec = dataclasses.replace(QWEN3_SPEC, params=NormParams(2e-6, 0.0, AFTER))
    kernel = get_qk_norm_rope(spec)
    assert kernel is get_qk_norm_rope(spec)
    calls = []
    kernel._functions[None] = lambda *args: calls.append(args)
    kernel.launch(16, 32, 48, 64, 80, 96, 112, 128, 320, 80, 2, 5, 1, 7)
    kernel.launch(17, 33, 49, 65, 81, 97, 113, 129, 32, 8, 1, 1, 1, 7)
    assert calls == [
        (16, 32, 48, 64, 80, 96, 112, 128, 320, 80, 2, 5, 1, 7),
        (17, 33, 49, 65, 81, 97, 113, 129, 32, 8, 1, 1, 1, 7),
    ]
    assert shared_cache().compiled == 0, "launch with a compiled function at hand compiles nothing"


@pytest.mark.parametrize("arch", AOT_ARCHS)
def test_artifacts_compile_for_every_architecture_with_the_declared_entry(arch: str, tmp_path: Path) -> None:
    """The artifact is the JIT's kernel (same tiling), its entry's parameters are the declaration's, the extents
    are q's batch and cos's shape, and an FP8 part compiles only where FP8 conversions exist."""
    specs = [QWEN3_SPEC, GEMMA3_SPEC, OLMO2_SPEC, dataclasses.replace(QWEN3_SPEC, quant=QUANTS["fp8-q-int8-k"])]
    for spec in specs:
        if arch not in aot_archs(spec):
            assert arch in ("sm_80", "sm_86")
            continue
        assert qk_norm_rope_tactics(spec) == (Tactic.PREFILL,)
        artifact = qk_norm_rope_artifact(spec, Tactic.PREFILL, arch, tmp_path)
        check_artifact(artifact, arch)
        declaration = artifact.declaration
        assert declaration.params == qk_norm_rope_params() and declaration.extents == ROPE_EXTENTS
        variant = variant_of(spec)
        tilings = (variant.q_tiling, variant.k_tiling)
        assert [p.rows_per_block for p in declaration.parts] == [t.rows_per_block for t in tilings]
        assert declaration.block_threads == variant.q_tiling.block_threads
        params = entry_params(artifact.ptx)[1]
        assert len(params) == 18 and ".align 16" not in params[0]
        assert {"ld.global.v4.b32", "st.global.v4.b32"} <= global_accesses(artifact.ptx)


def test_modelopt_product_stages_compile_rounded_and_fake_quantized(tmp_path: Path) -> None:
    """ModelOpt's FP8 Qwen3 rotation (every product through an FP8 pair, q's result quantized to INT8): y and each
    product rounded to float16, each product's FP8 code formed and dequantized in float16, the products and their
    sum still each rounded (mul.rn, add.rn: no fma in the rotation), JIT and AOT; without the stages none of it."""
    from trtfuse.bench.aot.matrix import MODELOPT_FP8_PRODUCTS

    plain = QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=QWEN3)
    spec = dataclasses.replace(
        plain, quant=dataclasses.replace(MODELOPT_FP8_PRODUCTS, q_output=Quantizer("int8", 0.25))
    )
    ptx = compiled_ptx(spec, tmp_path / "products")
    check_rotated_ptx(spec, ptx)
    variant = variant_of(spec)
    assert len(re.findall(r"\badd\.rn\.f32", ptx)) == rotated_sums(variant)
    # Each rotated element forms two FP8 codes (cvt ... e4m3x2) and reads them back; the plain kernel none.
    assert "e4m3x2" in ptx and "e4m3x2" not in compiled_ptx(plain, tmp_path / "plain")
    assert "cvt.rn.f16x2.f32" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx and "cvt.pack.sat.s8" in ptx
    artifact = qk_norm_rope_artifact(spec, Tactic.PREFILL, ARCH, tmp_path / "aot")
    check_artifact(artifact, ARCH)
    assert "e4m3x2" in artifact.ptx


def test_a_parts_products_are_quantized_together_and_dequantized_to_t() -> None:
    one = QuantParams(q_cos_product=Quantizer("float8_e4m3fn", 0.25, True, "float16"))
    with pytest.raises(ValueError, match="products are quantized together"):
        QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=QWEN3, quant=one)
    both = dataclasses.replace(one, q_sin_product=Quantizer("float8_e4m3fn", 0.25, True, "float32"))
    with pytest.raises(ValueError, match="the rotation computes in T"):
        QkNormRopeSpec(128, 128, "float16", "float16", LLAMA, rope=QWEN3, quant=both)
    with pytest.raises(ValueError, match="q_cos_product"):
        QkNormSpec(
            128, 128, "float16", "float16", LLAMA, quant=dataclasses.replace(both, q_sin_product=one.q_cos_product)
        )


@pytest.mark.parametrize("name", ["gemma3", "olmo2"])
def test_modelopt_int8_norm_stages_compile_into_the_rotary_kernel(name: str, tmp_path: Path) -> None:
    """ModelOpt's INT8 rotations (the AOT matrix's entries): Gemma3's pair on each norm's output (y rounded to
    float16, its INT8 level formed and dequantized in float16 before the rotation) and OLMo2's pairs on each norm's
    input and inverse root, each with the products' pairs, JIT and AOT; the rotation's products and sums still each
    rounded (no fma), and each stage adds INT8 roundings (cvt.rni) the kernel without it lacks."""
    from trtfuse.bench.aot.matrix import MODELOPT_INT8_GEMMA3, MODELOPT_INT8_OLMO2, rope_entries

    quant = {"gemma3": MODELOPT_INT8_GEMMA3, "olmo2": MODELOPT_INT8_OLMO2}[name]
    [spec] = [entry.spec for entry in rope_entries() if entry.spec.quant == quant]
    ptx = compiled_ptx(spec, tmp_path / "stages")
    check_rotated_ptx(spec, ptx)
    assert len(re.findall(r"\badd\.rn\.f32", ptx)) == rotated_sums(variant_of(spec))
    own = {"gemma3": ("q_normalised", "k_normalised"), "olmo2": ("q_input", "q_rsqrt", "k_input", "k_rsqrt")}[name]
    products_only = dataclasses.replace(
        spec, quant=QuantParams(**{s.value: quant.at(s) for s in quant.stages if s.product})
    )
    without = compiled_ptx(products_only, tmp_path / "products")
    assert ptx.count("cvt.rni") > without.count("cvt.rni"), own
    artifact = qk_norm_rope_artifact(spec, Tactic.PREFILL, ARCH, tmp_path / "aot")
    check_artifact(artifact, ARCH)
