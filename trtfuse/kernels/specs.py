"""What a norm kernel computes: the compile-time half of a plugin node's attributes."""

from __future__ import annotations

import dataclasses
import math
import struct
from dataclasses import dataclass

from trtfuse.contract import (
    ACTIVATION_DTYPES,
    QK_NORM,
    QK_NORM_ROPE,
    QUANT_DTYPE_CODES,
    RMS_NORM,
    WEIGHT_DTYPES,
    FusedOp,
    NormParams,
    QuantParams,
    QuantStage,
    WeightMode,
    dtype_pair_problem,
    norm_quant,
    rotation_stage_problem,
)

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "int8": 1}


def _check_common(dtype: str, out_dtype: str, weight_dtype: str | None, params: NormParams) -> None:
    if dtype not in ACTIVATION_DTYPES:
        raise ValueError(f"activation dtype {dtype!r} is not one of {ACTIVATION_DTYPES}")
    problem = dtype_pair_problem(dtype, out_dtype)
    if problem is not None:
        raise ValueError(problem)
    if params.weight_mode is WeightMode.NONE:
        if weight_dtype is not None:
            raise ValueError("weight_mode NONE takes no weight, but weight_dtype is set")
    elif weight_dtype not in WEIGHT_DTYPES:
        raise ValueError(f"weight dtype {weight_dtype!r} is not one of {WEIGHT_DTYPES}")
    if not params.epsilon >= 0.0:
        raise ValueError(f"epsilon must be a non-negative number, got {params.epsilon!r}")


def _check_hidden(name: str, hidden: int) -> None:
    if not isinstance(hidden, int) or hidden <= 0:
        raise ValueError(f"{name} must be a positive int, got {hidden!r}")


def _normalise(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> None:
    if spec.out_dtype is None:
        object.__setattr__(spec, "out_dtype", spec.dtype)
    _check_common(spec.dtype, spec.out_dtype, spec.weight_dtype, spec.params)


def _check_quant(quant: QuantParams | None, stages: tuple[QuantStage, ...]) -> None:
    """The quantizers a kernel can compile: the contract's (docs/plugin-nodes.md, "Quantization"), in the `stages`
    of its op (`FusedOp.quantizable`)."""
    if quant is None:
        return
    if not quant.stages:
        raise ValueError("quant has every stage off: use quant=None for a plain kernel")
    for stage in quant.stages:
        if stage not in stages:
            raise ValueError(f"{stage.value} is not a stage of this kernel ({', '.join(s.value for s in stages)})")
        quantizer = quant.at(stage)
        if quantizer.dtype not in QUANT_DTYPE_CODES:
            raise ValueError(
                f"{stage.value} quantizer dtype {quantizer.dtype!r} is not one of {tuple(QUANT_DTYPE_CODES)}"
            )
        scale = quantizer.scale
        if not (math.isfinite(scale) and scale > 0.0 and struct.unpack("f", struct.pack("f", scale))[0] == scale):
            raise ValueError(f"{stage.value} quantizer scale {scale!r} is not a positive finite float32 value")
        if quantizer.dtype == "int8" and not quantizer.saturate:
            raise ValueError(f"{stage.value} quantizer: INT8 always saturates, saturate=False is not a quantizer")
        float_dtypes = (
            ("dequant", quantizer.dequant_dtype, stage.fake, "a dequant dtype exactly for the fake-quant stages"),
            ("input", quantizer.input_dtype, stage.rounds_input, "an input dtype exactly for the rsqrt stage"),
        )
        for name, dtype, has_it, rule in float_dtypes:
            if has_it != (dtype is not None):
                raise ValueError(f"{stage.value} quantizer: {rule}")
            if has_it and dtype not in ACTIVATION_DTYPES:
                raise ValueError(f"{stage.value} {name} dtype {dtype!r} is not one of {ACTIVATION_DTYPES}")


def has_fp8_stage(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> bool:
    """Whether a stage of `spec` quantizes to FP8, whose conversion (cvt...e4m3x2) needs sm_89 or newer."""
    quant = getattr(spec, "quant", None)
    return quant is not None and any(quant.at(stage).dtype == "float8_e4m3fn" for stage in quant.stages)


def _check_part(part: int, parts: int) -> None:
    if not 0 <= part < parts:
        raise ValueError(f"no row part {part} in a kernel of {parts}")


def _repr_without_plain_quant(spec: object) -> str:
    """The dataclass repr, with `quant` only when set: a plain spec's repr (the compile cache's and the AOT entry
    names' key) stays what it was before quantizers, so plain kernels keep their PTX byte for byte."""
    fields = [f for f in dataclasses.fields(spec) if f.name != "quant" or spec.quant is not None]
    return f"{type(spec).__qualname__}({', '.join(f'{f.name}={getattr(spec, f.name)!r}' for f in fields)})"


@dataclass(frozen=True, repr=False)
class _RowsSpec:
    """The fields of an RMSNorm-grid kernel's spec: rows of `hidden` elements of `dtype`, a weight of
    `weight_dtype` (None for weight_mode NONE), `params`, the normalised value's T (`out_dtype`, None: `dtype`) and
    the quantizer stages (`quant`, None: none), compile-time constants as epsilon is."""

    hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("hidden", self.hidden)
        _normalise(self)
        _check_quant(self.quant, RMS_NORM.quantizable)

    __repr__ = _repr_without_plain_quant

    @property
    def y_dtype(self) -> str:
        """The dtype y is stored in: the output quantizer's when that stage is on, else T."""
        output = None if self.quant is None else self.quant.output
        return self.out_dtype if output is None else output.dtype

    def part_quant(self, part: int) -> QuantParams | None:
        """The quantizers of row part `part` of this one-part kernel (0): `quant`; `QkNormSpec.part_quant`'s
        counterpart, so that code over any spec's parts reads each part's quantizers one way."""
        _check_part(part, 1)
        return self.quant

    def part_y_dtype(self, part: int) -> str:
        """The dtype row part `part` (0) stores y in: `y_dtype`."""
        _check_part(part, 1)
        return self.y_dtype


@dataclass(frozen=True, repr=False)
class RmsNormSpec(_RowsSpec):
    """y = x · rsqrt(mean(x², last axis) + epsilon) · (w + weight_offset) over rows of `hidden` elements, per `params`.

    `dtype` is x's, `out_dtype` the normalised value's T (None: x's), as the contract's pairs allow. `quant` (None:
    none) holds the quantizer stages: x fake-quantized before the norm reads it, r per row, and y quantized after its
    rounding to T, so that y is stored in `y_dtype`."""


@dataclass(frozen=True, repr=False)
class AddRmsNormSpec(_RowsSpec):
    """The fused residual add+RMSNorm: h = D(x + residual), rounded once to D = `dtype`, and y = the RMSNorm of h
    (exactly `RmsNormSpec`'s with h as its x, its quantizers included: the input stage fake-quantizes h for the
    norm, h itself is output as it is). x, residual and h are D, y is `y_dtype` (T = `out_dtype`, None: D)."""

    def norm(self) -> RmsNormSpec:
        """The RMSNorm of h this computes (the same fields)."""
        return RmsNormSpec(self.hidden, self.dtype, self.weight_dtype, self.params, self.out_dtype, self.quant)


@dataclass(frozen=True, repr=False)
class QkNormSpec:
    """Two RMSNorms in one launch: q rows of `q_hidden` and k rows of `k_hidden`, each with its own weight. `quant`
    (None: none) holds each norm's own quantizers (stages q_input, q_rsqrt, q_output and k_input, k_rsqrt,
    k_output, each optional; `part_quant`): a quantized output is stored in its quantizer's dtype after its
    rounding to T."""

    q_hidden: int
    k_hidden: int
    dtype: str
    weight_dtype: str | None
    params: NormParams
    out_dtype: str | None = None  # T of q_out and k_out; None: q's and k's
    quant: QuantParams | None = None

    def __post_init__(self) -> None:
        _check_hidden("q_hidden", self.q_hidden)
        _check_hidden("k_hidden", self.k_hidden)
        _normalise(self)
        _check_quant(self.quant, self.fused_op.quantizable)
        problem = rotation_stage_problem(self.quant, self.fused_op.part_stages, self.out_dtype)
        if problem is not None:
            raise ValueError(" ".join(problem))

    __repr__ = _repr_without_plain_quant

    @property
    def fused_op(self) -> FusedOp:
        """The plugin op this kernel computes: its part stages are the quantizers it may have."""
        return QK_NORM

    def part_quant(self, part: int) -> QuantParams | None:
        """Part `part`'s (0: q, 1: k) quantizers as one norm's stages (`contract.norm_quant`)."""
        _check_part(part, 2)
        return norm_quant(self.quant, self.fused_op.part_stages[part])

    def part_y_dtype(self, part: int) -> str:
        """The dtype part `part`'s output is stored in: its output quantizer's where it has one, else T."""
        quant = self.part_quant(part)
        return self.out_dtype if quant is None or quant.output is None else quant.output.dtype


# The rotations of the rotary embedding: "half" pairs element j with j + R/2 (Hugging Face's rotate_half, ONNX
# RotaryEmbedding's default), "interleaved" pairs 2i with 2i + 1 (GPT-J, ONNX RotaryEmbedding's interleaved=1).
ROTATIONS = ("half", "interleaved")
# Where a head row sits: "token_major" q [B, S, H, D] (or [B, S, H*D], one row per token for a norm over H*D),
# "head_major" q [B, H, S, D] (Gemma3's norm after the transpose).
HEAD_LAYOUTS = ("token_major", "head_major")


@dataclass(frozen=True)
class RopeParams:
    """The rotation applied to each head row of `head_dim` (D) elements after its norm (docs/kernels.md, "QK-norm
    + rotary embedding"): with y the normalised value in float32 and c, s the row's cos and sin,
    out[j] = y[j]·c[j] + rot(y)[j]·s[j] for j < `rotary_dim` (R), out[j] = y[j] beyond it; `rotation` is one of
    ROTATIONS, `layout` one of HEAD_LAYOUTS, and `output_layout` the outputs' (None: `layout`): "head_major" from a
    "token_major" layout writes each head row at [b, h, s] of [B, H, S, D] (the attention's layout)."""

    head_dim: int
    rotary_dim: int
    rotation: str
    layout: str
    output_layout: str | None = None

    def __post_init__(self) -> None:
        if self.output_layout is None:
            object.__setattr__(self, "output_layout", self.layout)
        if self.output_layout not in HEAD_LAYOUTS or (self.layout, self.output_layout) == ("head_major", "token_major"):
            raise ValueError(f"output_layout {self.output_layout!r} is not one of {HEAD_LAYOUTS} after {self.layout!r}")
        _check_hidden("head_dim", self.head_dim)
        if not isinstance(self.rotary_dim, int) or self.rotary_dim < 2 or self.rotary_dim % 2:
            raise ValueError(f"rotary_dim must be a positive even int, got {self.rotary_dim!r}")
        if self.rotary_dim > self.head_dim:
            raise ValueError(f"rotary_dim {self.rotary_dim} is wider than head_dim {self.head_dim}")
        if self.rotation not in ROTATIONS:
            raise ValueError(f"rotation {self.rotation!r} is not one of {ROTATIONS}")
        if self.layout not in HEAD_LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is not one of {HEAD_LAYOUTS}")

    @property
    def moves_heads(self) -> bool:
        """Whether token-major rows are written in the attention's [B, H, S, D]."""
        return self.output_layout != self.layout


@dataclass(frozen=True, repr=False)
class QkNormRopeSpec(QkNormSpec):
    """The QK-norm of `QkNormSpec`'s fields (its quantized outputs included), each head row then rotated by `rope`
    before its one rounding to T (or its quantizer): q and k are read once and written once. cos and sin are
    [Bc, S, R] of `cos_dtype` (float32 or the activations' dtype; None: the activations'), Bc 1 or q's batch.
    A part's rows are head rows (hidden = D) or, for a norm over all of a token's heads (OLMo2), whole tokens
    (hidden = H·D, token-major only)."""

    rope: RopeParams = dataclasses.field(kw_only=True)
    cos_dtype: str | None = dataclasses.field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.cos_dtype is None:
            object.__setattr__(self, "cos_dtype", self.dtype)
        if self.cos_dtype not in ("float32", self.dtype):
            raise ValueError(f"cos/sin dtype {self.cos_dtype!r} is neither float32 nor the activations' {self.dtype}")
        head_dim = self.rope.head_dim
        for name, hidden in (("q_hidden", self.q_hidden), ("k_hidden", self.k_hidden)):
            if hidden % head_dim:
                raise ValueError(f"{name} {hidden} is not a whole number of heads of head_dim {head_dim}")
            if self.rope.layout == "head_major" and hidden != head_dim:
                raise ValueError(f"a head-major {name} must be one head ({head_dim}), got {hidden}")

    @property
    def fused_op(self) -> FusedOp:
        return QK_NORM_ROPE

    def norm(self) -> QkNormSpec:
        """The QK-norm this rotates the outputs of (the same fields, no rotation, and the quantizers a QK-norm has:
        not the rotation's normalised and product stages)."""
        fields = (self.q_hidden, self.k_hidden, self.dtype, self.weight_dtype, self.params, self.out_dtype)
        own = QK_NORM.quantizable
        kept = {} if self.quant is None else {s.value: self.quant.at(s) for s in self.quant.stages if s in own}
        return QkNormSpec(*fields, QuantParams(**kept) if kept else None)
