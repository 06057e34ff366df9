"""The spec x tactic matrix: what the CPU compile test compiles and the GPU check launches; the kernel kinds it
holds and, per kind, which buffer each pointer parameter of a row part is."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

from trtfuse.bench.aot.params import pointer_names
from trtfuse.contract import (
    ACTIVATION_DTYPES,
    WEIGHT_DTYPES,
    NormParams,
    Quantizer,
    QuantParams,
    WeightMode,
    dtype_pair_problem,
)
from trtfuse.kernels.declaration import LaunchDeclaration
from trtfuse.kernels.specs import AddRmsNormSpec, QkNormRopeSpec, QkNormSpec, RmsNormSpec, RopeParams

Spec = RmsNormSpec | AddRmsNormSpec | QkNormSpec | QkNormRopeSpec


@dataclass(frozen=True)
class PartPointers:
    """The pointer parameters of one row part by what they hold: what the check allocates, fills and compares."""

    x: str  # the activation
    weight: str
    out: str  # y
    residual: str | None = None  # add+norm: the second addend (x's shape and dtype)
    h: str | None = None  # add+norm: the rounded sum D(x + residual), an output of x's dtype

    def names(self) -> tuple[str, ...]:
        return tuple(n for n in (self.x, self.residual, self.weight, self.out, self.h) if n is not None)


@dataclass(frozen=True, eq=False)
class Kind:
    """One kernel kind of the matrix: its name in the manifest and in file names, its spec class, the pointers of
    each row part (by the declaration's part names), and the `trtfuse.kernels.artifacts` functions that build its
    artifacts, named rather than imported because that module imports CuTeDSL, which the check process may not."""

    name: str
    short: str
    spec_type: type
    parts: Mapping[str, PartPointers]
    build: str  # (spec, tactic, arch) -> KernelArtifact
    tactics: str  # (spec) -> tuple[Tactic, ...]
    shared: tuple[str, ...] = ()  # pointers of no row part: the rotary kernel's cos and sin


KINDS = (
    Kind(
        "rms_norm",
        "rms",
        RmsNormSpec,
        {"x": PartPointers("x", "weight", "y")},
        "rms_norm_artifact",
        "rms_norm_tactics",
    ),
    Kind(
        "add_rms_norm",
        "addrms",
        AddRmsNormSpec,
        {"x": PartPointers("x", "weight", "y", residual="residual", h="h")},
        "add_rms_norm_artifact",
        "add_rms_norm_tactics",
    ),
    Kind(
        "qk_norm",
        "qk",
        QkNormSpec,
        {"q": PartPointers("q", "q_weight", "q_out"), "k": PartPointers("k", "k_weight", "k_out")},
        "qk_norm_artifact",
        "qk_norm_tactics",
    ),
    Kind(
        "qk_norm_rope",
        "qkrope",
        QkNormRopeSpec,
        {"q": PartPointers("q", "q_weight", "q_out"), "k": PartPointers("k", "k_weight", "k_out")},
        "qk_norm_rope_artifact",
        "qk_norm_rope_tactics",
        shared=("cos", "sin"),
    ),
)
KIND_NAMES = tuple(kind.name for kind in KINDS)


def kind_of(spec: Spec) -> Kind:
    # By exact class: an add+norm spec has every field an RMSNorm spec has.
    (kind,) = (k for k in KINDS if type(spec) is k.spec_type)
    return kind


def kind_named(name: str) -> Kind:
    for kind in KINDS:
        if kind.name == name:
            return kind
    raise ValueError(f"kernel kind {name!r} is not one of {list(KIND_NAMES)}")


def part_pointers(spec: Spec, declaration: LaunchDeclaration) -> list[tuple[str, PartPointers]]:
    """Each declared row part's pointers, in the declaration's part order; raises when the kind's pointers are not
    exactly the declaration's, so a pointer the table misses is never launched as an unallocated 0."""
    kind = kind_of(spec)
    missing = [part.name for part in declaration.parts if part.name not in kind.parts]
    if missing:
        raise ValueError(f"{declaration.kernel_name}: no pointers known for part {missing[0]!r} of a {kind.name}")
    parts = [(part.name, kind.parts[part.name]) for part in declaration.parts]
    known = sorted([*(name for _, pointers in parts for name in pointers.names()), *kind.shared])
    declared = sorted(pointer_names(declaration))
    if known != declared:
        raise ValueError(f"{declaration.kernel_name} declares pointers {declared}, a {kind.name} has {known}")
    return parts


@dataclass(frozen=True)
class MatrixEntry:
    """One spec to compile and check; `heads` (q, k) per token for QK-norm, None for the one-part kinds."""

    spec: Spec
    heads: tuple[int, int] | None = None

    @property
    def kind(self) -> Kind:
        return kind_of(self.spec)


def add_norm_specs() -> list[AddRmsNormSpec]:
    """Add+norm specs of tests/gpu/test_add_norm_gpu.py: at H=4096 every (D, T) pair with a weight in both weight
    modes (the weight dtype rotating, so each mode meets each weight dtype) and without one for one pair per D; of
    its hidden-size grid 128 (rows packed 8 to a block, one tactic), 1000 (ragged: a row's last vectors fall short
    of its threads' slots) and 1001 (no vector divides the row: the element path alone).

    Fewer than the GPU tests run (their full product is 91 artifacts at H=4096 alone): every artifact is compiled
    for five architectures by the CPU test as well, and an add+norm artifact costs it about 1.5 RMSNorm ones. What
    the AOT launch adds to the JIT kernels the GPU tests cover is in every spec here: the five pointers' order and
    alignment test, the element path, the grid. NONE differs from BEFORE_CAST only in never reading the weight,
    which the NaN placeholder weight shows in any pair."""
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    pairs = [(d, t) for d, t in itertools.product(ACTIVATION_DTYPES, repeat=2) if dtype_pair_problem(d, t) is None]
    specs = [
        AddRmsNormSpec(4096, d, WEIGHT_DTYPES[(i + m) % len(WEIGHT_DTYPES)], NormParams(1e-6, offset, mode), t)
        for i, (d, t) in enumerate(pairs)
        for m, (mode, offset) in enumerate(((after, 0.0), (before, 1.0)))
    ]
    # One pair per D: two mixed (a narrower y, a wider y) and one plain.
    no_weight = (("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "bfloat16"))
    specs += [AddRmsNormSpec(4096, d, None, NormParams(1e-5, 0.0, none), t) for d, t in no_weight]
    bf16 = ("bfloat16", "bfloat16", "bfloat16")
    fp32_stream = ("float32", "float16", "float16")  # an fp32 residual stream with an fp16 y
    for hidden, (d, w, t) in ((128, bf16), (1000, fp32_stream), (1001, bf16)):
        specs.append(AddRmsNormSpec(hidden, d, w, NormParams(1e-6, 0.0, after), t))
    return specs


def quant_entries() -> list[MatrixEntry]:
    """Quantized specs (tests/gpu/test_quant_gpu.py holds them bit for bit): the output stage in FP8 (both saturate
    settings) and INT8 on dtype pairs and weight modes, ModelOpt's add+norm with the sum fake-quantized, the input
    stage alone, head-dim, ragged and no-vector rows; ModelOpt INT8's inverse-root stage, of r in float32 and of r
    cast to float16, at a width whose rows of exact sums of squares the check launches (`tensors.exact_square_rows`:
    r' = DQ(Q(r)) is a step function of r, which any rounding of r's sum could move across a step); QK-norms with
    each part's own output quantizer (Gemma3 INT8's q and k scales, DeepSeek-V3 FP8's latent q with k in T, both in
    FP8) or each part's own input and inverse-root stages (OLMo2 INT8's full-width q and k, fp16 and fp32, on rows of
    exact sums). An unsaturated FP8 scale large enough that no |y| / s comes near 464, where a y within tolerance
    could be NaN on one side only."""
    after, before = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST
    llama, gemma = NormParams(1e-6, 0.0, after), NormParams(1e-6, 1.0, before)
    fp8, int8 = Quantizer("float8_e4m3fn", 0.015625), Quantizer("int8", 0.03125)
    fp8_unsaturated = Quantizer("float8_e4m3fn", 0.25, saturate=False)

    def fake(dtype: str, quantized: str) -> Quantizer:
        return Quantizer(quantized, 0.046875, True, dtype)

    def rsqrt(dtype: str) -> Quantizer:
        # r of the exact-sum rows is about 3.5 to 11: levels 37 to 115, none clipped.
        return Quantizer("int8", 0.09375, True, dtype, dtype)

    out = QuantParams(output=fp8)
    fp8_sum = QuantParams(input=fake("bfloat16", "float8_e4m3fn"), output=fp8)  # ModelOpt FP8's add-norm
    int8_sum = QuantParams(input=fake("float16", "int8"), output=int8)
    specs = [
        RmsNormSpec(4096, "bfloat16", "bfloat16", llama, quant=out),
        RmsNormSpec(4096, "float16", "float32", gemma, quant=QuantParams(output=int8)),
        RmsNormSpec(4096, "float32", "bfloat16", llama, "bfloat16", QuantParams(output=fp8_unsaturated)),
        RmsNormSpec(4096, "bfloat16", "float32", gemma, "float32", QuantParams(output=int8)),
        RmsNormSpec(4096, "float16", None, NormParams(1e-5, 0.0, WeightMode.NONE), quant=QuantParams(output=int8)),
        RmsNormSpec(4096, "bfloat16", "bfloat16", llama, quant=fp8_sum),
        RmsNormSpec(128, "bfloat16", "bfloat16", llama, quant=out),
        RmsNormSpec(1001, "float16", "float16", llama, quant=QuantParams(output=int8)),
        RmsNormSpec(4096, "float32", "float32", llama, quant=QuantParams(rsqrt=rsqrt("float32"), output=int8)),
        RmsNormSpec(4096, "float16", "float16", llama, quant=QuantParams(rsqrt=rsqrt("float16"), output=int8)),
        AddRmsNormSpec(4096, "bfloat16", "bfloat16", llama, quant=fp8_sum),
        AddRmsNormSpec(4096, "float16", "float16", gemma, quant=int8_sum),
        AddRmsNormSpec(4096, "float32", "float16", llama, "float16", QuantParams(output=fp8_unsaturated)),
        AddRmsNormSpec(4096, "bfloat16", "bfloat16", llama, quant=QuantParams(input=fake("bfloat16", "float8_e4m3fn"))),
        AddRmsNormSpec(1000, "bfloat16", "bfloat16", llama, quant=QuantParams(output=int8)),
    ]
    int8_qk = QuantParams(q_output=int8, k_output=Quantizer("int8", 0.0625))  # Gemma3 INT8's two scales
    fp8_qk = QuantParams(q_output=fp8, k_output=fp8_unsaturated)

    def olmo2_int8(dtype: str) -> QuantParams:
        # Each norm's own input and inverse-root pairs; input scales of m / 128 keep the exact-sum rows exact.
        k_rsqrt = Quantizer("int8", 0.125, True, dtype, dtype)
        k_input = Quantizer("int8", 0.0234375, True, dtype)
        return QuantParams(q_input=fake(dtype, "int8"), q_rsqrt=rsqrt(dtype), k_input=k_input, k_rsqrt=k_rsqrt)

    qk = [
        (QkNormSpec(128, 128, "float16", "float16", gemma, quant=int8_qk), (32, 16)),
        (QkNormSpec(64, 64, "float16", "float16", gemma, quant=int8_qk), (8, 8)),
        (QkNormSpec(48, 32, "bfloat16", "bfloat16", llama, quant=QuantParams(q_output=fp8)), (1, 1)),
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", llama, quant=fp8_qk), (32, 8)),
        (QkNormSpec(4096, 1024, "float16", "float16", llama, quant=olmo2_int8("float16")), (1, 1)),
        (QkNormSpec(2048, 512, "float32", "float32", llama, quant=olmo2_int8("float32")), (1, 1)),
    ]
    return [MatrixEntry(spec) for spec in specs] + [MatrixEntry(spec, heads) for spec, heads in qk]


def rope_params(
    head_dim: int,
    rotary: int | None = None,
    rotation: str = "half",
    layout: str = "token_major",
    output_layout: str | None = None,
) -> RopeParams:
    """A rotation with the common choices as defaults: all of each head row rotated, half-split, token-major, its
    outputs in its inputs' layout."""
    return RopeParams(head_dim, rotary or head_dim, rotation, layout, output_layout)


def rope_entries() -> list[MatrixEntry]:
    """The QK-norm + rotary specs of tests/gpu/test_rope_gpu.py: Qwen3's (bf16 and fp32 tables), Gemma3's head-major
    rows with odd head counts, OLMo2's full-width norm, partial rotary, interleaved pairs, mixed dtypes, no weight,
    an odd R/2 (1-element vectors), and the quantized outputs (FP8 q with INT8 k; FP8 q alone, unsaturated)."""
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    llama, gemma = NormParams(1e-6, 0.0, after), NormParams(1e-6, 1.0, before)
    olmo = NormParams(1e-6, 0.0, before)

    rope = rope_params

    head_major = rope(256, layout="head_major")
    specs = [
        (QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", llama, rope=rope(128)), (32, 8)),
        (QkNormRopeSpec(128, 128, "bfloat16", "bfloat16", llama, rope=rope(128), cos_dtype="float32"), (32, 8)),
        (QkNormRopeSpec(256, 256, "bfloat16", "float32", gemma, rope=head_major, cos_dtype="float32"), (7, 3)),
        (QkNormRopeSpec(4096, 1024, "bfloat16", "bfloat16", olmo, rope=rope(128)), (1, 1)),
        (QkNormRopeSpec(128, 128, "float16", "float16", llama, rope=rope(128, 64)), (7, 3)),
        (QkNormRopeSpec(64, 64, "float32", "float32", gemma, rope=rope(64, None, "interleaved")), (5, 5)),
        (
            QkNormRopeSpec(128, 128, "float16", "float32", llama, rope=rope(128, 32, "interleaved", "head_major")),
            (4, 2),
        ),
        (QkNormRopeSpec(128, 128, "float32", "bfloat16", llama, "bfloat16", rope=rope(128)), (32, 8)),
        (QkNormRopeSpec(128, 128, "bfloat16", "float32", gemma, "float32", rope=rope(128)), (16, 4)),
        (QkNormRopeSpec(256, 256, "float32", None, NormParams(1e-5, 0.0, none), rope=rope(256, 128)), (3, 1)),
        (QkNormRopeSpec(64, 64, "bfloat16", "bfloat16", llama, rope=rope(64, 6)), (3, 3)),
    ]
    fp8, int8 = Quantizer("float8_e4m3fn", 0.015625), Quantizer("int8", 0.03125)
    for quant in (
        QuantParams(q_output=fp8, k_output=int8),
        QuantParams(q_output=Quantizer("float8_e4m3fn", 0.25, False)),
    ):
        for spec, heads in (specs[0], specs[2], specs[3]):
            specs.append((dataclasses.replace(spec, quant=quant), heads))
    # ModelOpt's FP8 Qwen3 rotation (float16): each product through an FP8 pair of its own scale, q's result alone
    # quantized (INT8 here: an FP8 one after the Transpose stays in the graph).
    qwen3_fp16 = QkNormRopeSpec(128, 128, "float16", "float16", llama, rope=rope(128))
    specs.append((dataclasses.replace(qwen3_fp16, quant=MODELOPT_FP8_PRODUCTS), (32, 8)))
    with_output = dataclasses.replace(MODELOPT_FP8_PRODUCTS, q_output=Quantizer("int8", 0.029388427734375))
    specs.append((dataclasses.replace(qwen3_fp16, quant=with_output), (32, 8)))
    # ModelOpt's INT8 rotations of Gemma3 (head-major rows, a pair on each norm's output, the products', q's result
    # quantized) and of OLMo2 (full-width rows, each norm's input and inverse-root pairs, the products').
    gemma3_fp16 = QkNormRopeSpec(64, 64, "float16", "float16", llama, rope=rope(64, layout="head_major"))
    specs.append((dataclasses.replace(gemma3_fp16, quant=MODELOPT_INT8_GEMMA3), (7, 3)))
    olmo2_fp16 = QkNormRopeSpec(4096, 1024, "float16", "float16", llama, rope=rope(128))
    specs.append((dataclasses.replace(olmo2_fp16, quant=MODELOPT_INT8_OLMO2), (1, 1)))
    # Token-major rows written as the attention's [B, H, S, D]: ModelOpt FP8's Qwen3 node with q's FP8 Q after the
    # rotation, OLMo2's full-width rows (plain and FP8 q), and a 16-bit x with an fp32 y (no paired stores).
    head_major_out = rope(128, output_layout="head_major")
    fp8_q = dataclasses.replace(MODELOPT_FP8_PRODUCTS, q_output=Quantizer("float8_e4m3fn", 0.09918212890625))
    qwen3_moving = dataclasses.replace(qwen3_fp16, rope=head_major_out)
    specs.append((qwen3_moving, (32, 8)))
    specs.append((dataclasses.replace(qwen3_moving, quant=fp8_q), (32, 8)))
    interleaved_moving = rope(64, 32, "interleaved", output_layout="head_major")
    specs.append((QkNormRopeSpec(64, 64, "float32", "bfloat16", gemma, "bfloat16", rope=interleaved_moving), (5, 3)))
    olmo2_moving = QkNormRopeSpec(4096, 1024, "bfloat16", "bfloat16", olmo, rope=head_major_out)
    specs.append((olmo2_moving, (1, 1)))
    specs.append((dataclasses.replace(olmo2_moving, quant=QuantParams(q_output=fp8)), (1, 1)))
    specs.append(
        (
            QkNormRopeSpec(
                2048, 512, "bfloat16", "float32", olmo, "float32", rope=rope(128, 64, output_layout="head_major")
            ),
            (1, 1),
        )
    )
    return [MatrixEntry(spec, heads) for spec, heads in specs]


def _product(scale: float) -> Quantizer:
    """A pair on a rotation's product as ModelOpt's float16 exports write it: FP8, a float16 scale."""
    return Quantizer("float8_e4m3fn", scale, True, "float16")


# The product stages of ModelOpt's FP8 Qwen3 export (models/fixtures/tools/qwen3-modelopt-fp8-kv.onnx's first layer).
MODELOPT_FP8_PRODUCTS = QuantParams(
    q_cos_product=_product(0.09283447265625),
    q_sin_product=_product(0.073486328125),
    k_cos_product=_product(0.09619140625),
    k_sin_product=_product(0.07275390625),
)


def _int8(scale: float, input_dtype: str | None = None) -> Quantizer:
    """A fake-quant INT8 pair as ModelOpt's float16 exports write it: a float16 scale, dequantized to float16 (an
    inverse root's reading r in `input_dtype`)."""
    return Quantizer("int8", scale, True, "float16", input_dtype)


# The pairs of ModelOpt's INT8 Gemma3 rotation (models/fixtures/tools/gemma3-modelopt-int8-fp16.onnx's first layer):
# on each norm's output, on each product, and q's result's Q.
MODELOPT_INT8_GEMMA3 = QuantParams(
    q_normalised=_int8(0.0269165039062500),
    q_cos_product=_int8(0.0270690917968750),
    q_sin_product=_int8(0.0202178955078125),
    q_output=Quantizer("int8", 0.0293884277343750),
    k_normalised=_int8(0.0261993408203125),
    k_cos_product=_int8(0.0261993408203125),
    k_sin_product=_int8(0.0200805664062500),
)
# The pairs of ModelOpt's INT8 OLMo2 rotation (models/fixtures/tools/olmo2-modelopt-int8-fp16-optimum.onnx's first
# layer): on each norm's input and inverse root (read in float16), and on each product. The input pairs' scales are
# m/128-friendly instead of the fixture's 8.8e-05 and 8.1e-05: the AOT check fills rsqrt parts with rows of m/128
# (`tensors.exact_square_rows`), whose sums of squares stay exact, so r' is the reference's, only where the input
# pair keeps them on that grid (the fixture's scales saturate them to ±127 steps of ~1e-2, whose sums of squares
# round in the kernel's order, and r' moves a step on some rows).
MODELOPT_INT8_OLMO2 = QuantParams(
    q_input=_int8(0.0078125),
    q_rsqrt=_int8(3.212890625, "float16"),
    q_cos_product=_int8(0.0301666259765625),
    q_sin_product=_int8(0.0221557617187500),
    k_input=_int8(0.0234375),
    k_rsqrt=_int8(2.904296875, "float16"),
    k_cos_product=_int8(0.0242919921875000),
    k_sin_product=_int8(0.0169677734375000),
)


def rope_shape(tokens: int) -> tuple[int, int, int]:
    """(B, S, Bc) a rotary case of `tokens` tokens launches: 4 or 3 sequences where they divide the tokens, else one;
    cos/sin of every batch (Bc = B) for an even token count, of one batch row (Bc = 1) for an odd one."""
    batch = 4 if tokens % 4 == 0 else 3 if tokens % 3 == 0 else 1
    return batch, tokens // batch, batch if tokens % 2 == 0 else 1


def matrix() -> list[MatrixEntry]:
    """Every spec of tests/gpu/test_kernels_gpu.py (dtype pairs and modes, hidden sizes, prefill re-reads, unaligned
    pointers, mixed precision, the CUDA-graph specs; QK-norm with its head counts), each once; then the add+norm
    specs of `add_norm_specs`, the quantized entries of `quant_entries` and the rotary ones of `rope_entries`."""
    after, before, none = WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST, WeightMode.NONE
    dtypes = ("float32", "float16", "bfloat16")
    hiddens = (64, 128, 1000, 2048, 4096, 5120, 8192)
    mixed_pairs = (("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32"))

    def sixteen_bit(dtype: str, out: str) -> str:
        return dtype if dtype != "float32" else out

    rms = [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode))
        for act, wdt in itertools.product(dtypes, dtypes)
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none)) for act in dtypes]
    rms += [
        RmsNormSpec(hidden, dtype, wdt, NormParams(1e-6, offset, mode))
        for hidden in hiddens
        for dtype, wdt, offset, mode in (
            ("bfloat16", "bfloat16", 0.0, after),
            ("float16", "float32", 1.0, before),
            ("float32", "bfloat16", 1.0, after),
        )
    ]
    rms += [
        RmsNormSpec(8192, "float16", "float16", NormParams(1e-6, 1.0, before)),
        RmsNormSpec(8192, "bfloat16", "float16", NormParams(1e-5, 0.0, after)),
        RmsNormSpec(8192, "float16", None, NormParams(1e-6, 0.0, none)),
        RmsNormSpec(5120, "float16", "float16", NormParams(1e-6, 1.0, after)),
        RmsNormSpec(3000, "bfloat16", None, NormParams(1e-6, 0.0, none)),
    ]
    rms += [RmsNormSpec(hidden, "bfloat16", "float32", NormParams(1e-6, 0.0, after)) for hidden in (1001, 4096)]
    rms += [RmsNormSpec(4096, "float16", "float32", NormParams(3e-6, 0.0, after))]
    rms += [
        RmsNormSpec(4096, act, wdt, NormParams(1e-6, offset, mode), out)
        for act, out in mixed_pairs
        for wdt in ("float32", sixteen_bit(act, out))
        for mode, offset in ((after, 0.0), (before, 1.0))
    ]
    rms += [RmsNormSpec(4096, act, None, NormParams(1e-5, 0.0, none), out) for act, out in mixed_pairs]
    rms += [
        RmsNormSpec(hidden, dtype, sixteen_bit(dtype, out), NormParams(1e-6, 0.0, after), out)
        for hidden in (*hiddens, 1004, 1001)
        for dtype, out in (("float32", "bfloat16"), ("bfloat16", "float32"))
    ]
    rms += [
        RmsNormSpec(4096, dtype, "float32", NormParams(1e-6, 0.0, after), out)
        for dtype, out in (("float32", "float16"), ("float16", "float32"))
    ]
    rms += [RmsNormSpec(4096, "float32", "bfloat16", NormParams(7e-6, 0.0, after), "bfloat16")]
    qk = [
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(1e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before)), (8, 4)),
        (QkNormSpec(64, 64, "float16", "float16", NormParams(1e-5, 0.0, after)), (16, 16)),
        (QkNormSpec(128, 128, "float32", None, NormParams(1e-6, 0.0, none)), (8, 2)),
        (QkNormSpec(4096, 1024, "bfloat16", "float32", NormParams(1e-6, 0.0, before)), (1, 1)),
        (QkNormSpec(8192, 5120, "float16", "float16", NormParams(1e-6, 1.0, after)), (1, 1)),
        (QkNormSpec(128, 128, "bfloat16", "bfloat16", NormParams(3e-6, 0.0, after)), (32, 8)),
        (QkNormSpec(128, 128, "float32", "bfloat16", NormParams(1e-6, 0.0, after), "bfloat16"), (32, 8)),
        (QkNormSpec(256, 256, "bfloat16", "float32", NormParams(1e-6, 1.0, before), "float32"), (32, 8)),
        (QkNormSpec(4096, 1024, "float16", "float32", NormParams(1e-6, 0.0, after), "float32"), (1, 1)),
    ]
    entries = [MatrixEntry(spec) for spec in rms] + [MatrixEntry(spec, heads) for spec, heads in qk]
    entries += [MatrixEntry(spec) for spec in add_norm_specs()]
    entries += quant_entries()
    entries += rope_entries()
    return list(dict.fromkeys(entries))


_SHORT_DTYPES = {"float8_e4m3fn": "fp8", "int8": "int8"}


def entry_name(entry: MatrixEntry) -> str:
    """A readable file-name stem for an entry (unique together with its index in the manifest)."""
    spec = entry.spec
    params = spec.params
    size = f"h{spec.hidden}" if entry.heads is None else f"q{spec.q_hidden}k{spec.k_hidden}"
    kind = entry.kind.short
    weight = spec.weight_dtype or "noweight"
    mode = params.weight_mode.name.lower()
    numbers = f"eps{params.epsilon:g}-off{params.weight_offset:g}"
    name = f"{kind}-{size}-{spec.dtype}-{weight}-{spec.out_dtype}-{mode}-{numbers}"
    quant = getattr(spec, "quant", None)
    if quant is not None:
        # Short dtype names: a file name has 255 bytes, and ModelOpt's rotary entries have five stages.
        name += "".join(f"-{stage.value}-{_SHORT_DTYPES[quant.at(stage).dtype]}" for stage in quant.stages)
    rope = getattr(spec, "rope", None)
    if rope is not None:
        layout = f"{rope.layout}-to-{rope.output_layout}" if rope.moves_heads else rope.layout
        name += f"-d{rope.head_dim}-r{rope.rotary_dim}-{rope.rotation}-{layout}-cos-{spec.cos_dtype}"
    return name


def part_rows(entry: MatrixEntry, tokens: int) -> tuple[int, ...]:
    """Each row part's row count for `tokens` tokens: the rows themselves (RMSNorm, add+norm), or tokens x (q heads,
    k heads)."""
    if entry.heads is None:
        return (tokens,)
    return tuple(tokens * heads for heads in entry.heads)


def part_hidden(entry: MatrixEntry) -> tuple[int, ...]:
    spec = entry.spec
    return (spec.hidden,) if entry.heads is None else (spec.q_hidden, spec.k_hidden)
