"""The plugin nodes the fusion pass writes and the TensorRT plugins and kernels implement.

docs/plugin-nodes.md is the prose version of this module; the two must agree. Each fused node's op_type is the
TensorRT plugin name, so TensorRT's ONNX parser maps it onto the creator registered under `PLUGIN_NAMESPACE`.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

PLUGIN_NAMESPACE = "trtfuse"
PLUGIN_VERSION = "1"
# Fused nodes live in their own ONNX domain so onnx.checker accepts them; TensorRT's parser keys plugins on op_type.
ONNX_DOMAIN = "trtfuse"
ONNX_DOMAIN_VERSION = 1


class WeightMode(enum.IntEnum):
    """Where the weight multiply happens relative to the rounding of the normalised value.

    With r = rsqrt(mean(x², last axis) + eps) computed in fp32, w' = w + weight_offset in fp32, T the output dtype
    (`output_dtype`) and R the node's 16-bit dtype (x's dtype when x is 16-bit, else T; `rounding_dtype`):
    NONE         y = T(x·r)
    AFTER_CAST   y = T(R(x·r) · w')    Llama, Mistral, Qwen, Phi-3, DeepSeek, ONNX RMSNormalization: normalise, round,
                                       then scale.
    BEFORE_CAST  y = T(x·r · w')       Gemma (offset 1), OLMo2 (offset 0): scale in fp32, then round.
    When x and y are both fp32, R is fp32 and AFTER_CAST and BEFORE_CAST are the same function.
    """

    NONE = 0
    AFTER_CAST = 1
    BEFORE_CAST = 2


@dataclass(frozen=True)
class NormParams:
    """The formula's constants every fused node carries (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE).

    The match, the fused-node record, the plugin config, the kernel specs and the kernel math all embed this one
    value; epsilon and weight_offset are float32 values held exactly in Python floats."""

    epsilon: float
    weight_offset: float
    weight_mode: WeightMode

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "weight_offset", float(self.weight_offset))
        object.__setattr__(self, "weight_mode", WeightMode(self.weight_mode))


class Rotation(enum.IntEnum):
    """Which elements of a head row's rotated part (its first R) turn together, as one pair (y[a], y[b]) becoming
    (y[a]·cos - y[b]·sin, y[b]·cos + y[a]·sin) with the cos and sin of a's column (docs/plugin-nodes.md, "Rotary
    embedding")."""

    HALF_SPLIT = 0  # a = j, b = j + R/2 (j < R/2): Hugging Face's rotate_half, ONNX RotaryEmbedding interleaved=0
    INTERLEAVED = 1  # a = 2i, b = 2i + 1: GPT-J's rotate_every_two, ONNX RotaryEmbedding interleaved=1


class HeadLayout(enum.IntEnum):
    """How a rotary node's q and k hold heads and tokens (ATTR_LAYOUT): which token a head row belongs to, so which
    row of cos and sin rotates it; and how its outputs do (ATTR_OUTPUT_LAYOUT)."""

    TOKEN_MAJOR = 0  # [B, S, H, D], or [B, S, H·D] (a norm over the whole projection: OLMo2)
    HEAD_MAJOR = 1  # [B, H, S, D] (the norm after the attention's transpose: Gemma3)


@dataclass(frozen=True)
class RotaryParams:
    """The rotary embedding a node applies after its norm (ATTR_HEAD_DIM, ATTR_ROTARY_DIM, ATTR_ROTATION,
    ATTR_LAYOUT, ATTR_OUTPUT_LAYOUT): each normalised row is cut into head rows of `head_dim` D, and the first
    `rotary_dim` R elements of each are rotated by the cos and sin of the head row's token, as `rotation` pairs them.
    `output_layout` is the outputs' (None: `layout`): a token-major node may write the attention's [B, H, S, D]
    itself (HEAD_MAJOR), where the graph moves its result there before a QuantizeLinear the node takes in."""

    head_dim: int
    rotary_dim: int
    rotation: Rotation
    layout: HeadLayout
    output_layout: HeadLayout | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "rotation", Rotation(self.rotation))
        object.__setattr__(self, "layout", HeadLayout(self.layout))
        output_layout = self.layout if self.output_layout is None else self.output_layout
        object.__setattr__(self, "output_layout", HeadLayout(output_layout))

    @property
    def moves_heads(self) -> bool:
        """Whether the outputs are in another layout than the inputs: token-major rows written as [B, H, S, D]."""
        return self.output_layout is not self.layout

    def numbers(self) -> tuple[int, int, int, int, int]:
        """The fields' values, in ROTARY_FIELDS order."""
        return (self.head_dim, self.rotary_dim, int(self.rotation), int(self.layout), int(self.output_layout))


def rotary_problem(rotary: RotaryParams, hidden_sizes: tuple[int, ...]) -> tuple[str, str] | None:
    """(field, why) for rotary fields outside the contract given the node's hidden sizes, or None: R even and
    within D, D dividing every normalised width, and a head-major node normalising single head rows."""
    if not 2 <= rotary.rotary_dim <= rotary.head_dim or rotary.rotary_dim % 2:
        return ATTR_ROTARY_DIM, f"is {rotary.rotary_dim}, not an even length from 2 to head_dim {rotary.head_dim}"
    for hidden in hidden_sizes:
        if hidden % rotary.head_dim:
            return ATTR_HEAD_DIM, f"is {rotary.head_dim}, which does not divide the hidden size {hidden}"
        if rotary.layout is HeadLayout.HEAD_MAJOR and hidden != rotary.head_dim:
            return ATTR_LAYOUT, f"is 1 (HEAD_MAJOR), but hidden size {hidden} is not one head row of {rotary.head_dim}"
    if rotary.layout is HeadLayout.HEAD_MAJOR and rotary.output_layout is not HeadLayout.HEAD_MAJOR:
        return ATTR_OUTPUT_LAYOUT, "is 0 (TOKEN_MAJOR), but layout is 1 (HEAD_MAJOR): a node moves heads only forward"
    return None


# The parser looks a plugin up by these two string attributes (and the op type); the pass writes both.
ATTR_NAMESPACE = "plugin_namespace"
ATTR_VERSION = "plugin_version"
LOOKUP_ATTRIBUTES = {ATTR_NAMESPACE: PLUGIN_NAMESPACE, ATTR_VERSION: PLUGIN_VERSION}
# The fields, every one required: numbers, float32 or int32.
ATTR_EPSILON = "epsilon"  # float32
ATTR_WEIGHT_OFFSET = "weight_offset"  # float32
ATTR_WEIGHT_MODE = "weight_mode"  # int, a WeightMode
ATTR_HIDDEN = "hidden_size"  # int: length of the normalised (last) axis
ATTR_Q_HIDDEN = "q_hidden_size"
ATTR_K_HIDDEN = "k_hidden_size"
ATTR_OUTPUT_DTYPE = "output_dtype"  # int, an ONNX TensorProto code (OUTPUT_DTYPE_CODES): the normalised outputs' dtype
# The rotary embedding's fields (an op with `rotary_tables`), ints: RotaryParams.
ATTR_HEAD_DIM = "head_dim"  # D: the width of one head row, the rotation's unit
ATTR_ROTARY_DIM = "rotary_dim"  # R: the rotated leading elements of each head row (even, <= D)
ATTR_ROTATION = "rotation"  # a Rotation
ATTR_LAYOUT = "layout"  # a HeadLayout: q's and k's
ATTR_OUTPUT_LAYOUT = "output_layout"  # a HeadLayout: the outputs' (HEAD_MAJOR from a TOKEN_MAJOR layout: [B, H, S, D])
ROTARY_FIELDS = (ATTR_HEAD_DIM, ATTR_ROTARY_DIM, ATTR_ROTATION, ATTR_LAYOUT, ATTR_OUTPUT_LAYOUT)
FLOAT_FIELDS = frozenset({ATTR_EPSILON, ATTR_WEIGHT_OFFSET})  # with every quantizer's scale (below)
# `aot` (INT, 1) is the ONNX parser's node attribute that asks for a QDP's AOT implementation (fusion/aot_form.py);
# weight_mode NONE nodes built as AOT get a never-read weight of [H] zeros in this dtype, as a QDP's input count is
# fixed.
ATTR_AOT = "aot"
AOT_PLACEHOLDER_WEIGHT_DTYPE = "float32"

ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
# ONNX TensorProto element types of the output dtypes (onnx.TensorProto.FLOAT, FLOAT16, BFLOAT16).
OUTPUT_DTYPE_CODES = {"float32": 1, "float16": 10, "bfloat16": 16}
_DTYPES_BY_CODE = {code: name for name, code in OUTPUT_DTYPE_CODES.items()}


class QuantStage(str, enum.Enum):
    """Where a quantizer of a quantized op (`quantized`) acts in the formula. Each stage has its own fields, named
    `<stage>_quant_dtype`, `<stage>_quant_scale`, `<stage>_quant_saturate`, for the fake-quant stages (input and
    rsqrt ones) `<stage>_dequant_dtype` and, for the rsqrt ones, `<stage>_quant_input_dtype` (`QuantStage.fields`)."""

    INPUT = "input"  # the normalised tensor (x; the add-norm's rounded h) becomes DQ(Q(·)) before the norm reads it
    RSQRT = "rsqrt"  # each row's inverse root r becomes DQ(Q(r)) before it scales the row
    # A rotated norm's output (ModelOpt's INT8 Gemma3): y, rounded to T, becomes DQ(Q(·)) before the rotation reads
    # it. One norm's stage only as a rotary op's part stage is (q_normalised, k_normalised).
    NORMALISED = "normalised"
    # A rotation's two products (ModelOpt's FP8 and INT8 rotations): y·cos and rot(y)·sin, each rounded to T, become
    # DQ(Q(·)) before their sum. One norm's stages only as a rotary op's part stages are (q_cos_product...).
    COS_PRODUCT = "cos_product"
    SIN_PRODUCT = "sin_product"
    OUTPUT = "output"  # the normalised output becomes Q(·): the node outputs the quantized dtype
    # A QK-norm's two norms, each with its own quantizers (its own scales), each optional: q's, then k's, each the
    # stage of one norm it is named after (`norm_stage`).
    Q_INPUT = "q_input"
    Q_RSQRT = "q_rsqrt"
    Q_NORMALISED = "q_normalised"
    Q_COS_PRODUCT = "q_cos_product"
    Q_SIN_PRODUCT = "q_sin_product"
    Q_OUTPUT = "q_output"
    K_INPUT = "k_input"
    K_RSQRT = "k_rsqrt"
    K_NORMALISED = "k_normalised"
    K_COS_PRODUCT = "k_cos_product"
    K_SIN_PRODUCT = "k_sin_product"
    K_OUTPUT = "k_output"

    @property
    def norm_stage(self) -> QuantStage:
        """The stage of one norm this stage is (`input`, `rsqrt`, `normalised`, a product or `output`): a QK-norm
        part's stage is that of the part's own norm, which is what the kernels, the reference and the lowering
        compute (`norm_quant`)."""
        return _PART_STAGES.get(self, self)

    @property
    def fake(self) -> bool:
        """A fake-quant stage quantizes and dequantizes again, so the formula goes on in a float dtype."""
        return self.norm_stage in (QuantStage.INPUT, QuantStage.RSQRT, QuantStage.NORMALISED, *PRODUCT_STAGES)

    @property
    def product(self) -> bool:
        """The stage rounds a product of the rotation (`cos_product`, `sin_product`) before the sum."""
        return self.norm_stage in PRODUCT_STAGES

    @property
    def rotation_input(self) -> bool:
        """The stage rounds what the rotation reads (`normalised`, `cos_product`, `sin_product`): its DQ value is in
        T, the dtype the rotation computes in (`rotation_stage_problem`)."""
        return self.norm_stage in (QuantStage.NORMALISED, *PRODUCT_STAGES)

    @property
    def quantizes_output(self) -> bool:
        """The stage quantizes a normalised output after its rounding to T: the node stores the quantized codes."""
        return not self.fake

    @property
    def rounds_input(self) -> bool:
        """The rsqrt stage's Q reads r as the graph rounded it (`Quantizer.input_dtype`); what the other stages'
        Q reads the formula already rounds (x in its dtype, y to T)."""
        return self.norm_stage is QuantStage.RSQRT

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(name for name in self.field_slots if name is not None)

    @property
    def field_slots(self) -> tuple[str | None, ...]:
        """The names of a quantizer's five numbers (dtype, scale, saturate, dequant dtype, input dtype) as this
        stage's fields, None for those it has no field of."""
        return (self.dtype_field, self.scale_field, self.saturate_field, self.dequant_field, self.input_dtype_field)

    @property
    def dtype_field(self) -> str:
        return f"{self.value}_quant_dtype"

    @property
    def scale_field(self) -> str:
        return f"{self.value}_quant_scale"

    @property
    def saturate_field(self) -> str:
        return f"{self.value}_quant_saturate"

    @property
    def dequant_field(self) -> str | None:
        return f"{self.value}_dequant_dtype" if self.fake else None

    @property
    def input_dtype_field(self) -> str | None:
        return f"{self.value}_quant_input_dtype" if self.rounds_input else None


_PART_STAGES = {
    QuantStage.Q_INPUT: QuantStage.INPUT,
    QuantStage.Q_RSQRT: QuantStage.RSQRT,
    QuantStage.Q_NORMALISED: QuantStage.NORMALISED,
    QuantStage.Q_COS_PRODUCT: QuantStage.COS_PRODUCT,
    QuantStage.Q_SIN_PRODUCT: QuantStage.SIN_PRODUCT,
    QuantStage.Q_OUTPUT: QuantStage.OUTPUT,
    QuantStage.K_INPUT: QuantStage.INPUT,
    QuantStage.K_RSQRT: QuantStage.RSQRT,
    QuantStage.K_NORMALISED: QuantStage.NORMALISED,
    QuantStage.K_COS_PRODUCT: QuantStage.COS_PRODUCT,
    QuantStage.K_SIN_PRODUCT: QuantStage.SIN_PRODUCT,
    QuantStage.K_OUTPUT: QuantStage.OUTPUT,
}
# A rotation's product stages, as one norm's: both on or both off in a part (their dequantized values are added).
PRODUCT_STAGES = (QuantStage.COS_PRODUCT, QuantStage.SIN_PRODUCT)
QUANT_STAGES = tuple(QuantStage)  # every stage, in formula order (each op's stages are a subsequence)
# The quantized dtypes and their ONNX TensorProto element types (FLOAT8E4M3FN, INT8); a stage's dtype field is 0
# when the stage is off.
QUANT_DTYPE_CODES = {"float8_e4m3fn": 17, "int8": 3}
QUANT_OFF = 0
# What a quantized value saturates to: E4M3FN's largest finite magnitude, INT8's range. E4M3FN has no infinity: a
# value past the range is NaN unless the quantizer saturates; INT8 always saturates (ONNX's `saturate` is float8's).
FLOAT8E4M3FN_MAX = 448.0
INT8_RANGE = (-128, 127)
FLOAT_FIELDS = FLOAT_FIELDS | {stage.scale_field for stage in QUANT_STAGES}
_QUANT_DTYPES_BY_CODE = {code: name for name, code in QUANT_DTYPE_CODES.items()}


@dataclass(frozen=True)
class Quantizer:
    """One ONNX QuantizeLinear (and, for a fake-quant stage, the DequantizeLinear after it) with a constant
    per-tensor scale and zero point 0, as a fused node computes it (docs/plugin-nodes.md, "Quantization"):

    Q(v)  = saturate_to_dtype(round_half_even(float32(I(v)) / scale))  # the division in float32, IEEE
    DQ(q) = dequant_dtype(float32(q) · scale)                          # the product in float32, rounded once

    `scale` is a positive finite float32 value; `saturate` is ONNX's attribute (float8 only: past ±448 the value
    is ±448 when set, NaN when not; INT8 always clamps to [-128, 127], so it is always True there);
    `dequant_dtype` is the dtype the dequantized product is rounded to (the DequantizeLinear's scale dtype), None
    for the output stage, which does not dequantize. `input_dtype` is I, the dtype the rsqrt stage rounds the
    float32 r to before Q reads it (the graph's QuantizeLinear reads r in that dtype: float32, or the 16-bit dtype
    a graph casts r to first); None for the other stages (I is then the identity), and an rsqrt quantizer given
    none reads r as computed, in float32 (`QuantParams`)."""

    dtype: str
    scale: float
    saturate: bool = True
    dequant_dtype: str | None = None
    input_dtype: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "scale", float(self.scale))
        object.__setattr__(self, "saturate", bool(self.saturate))


@dataclass(frozen=True)
class QuantParams:
    """The quantizers of one quantized node, by stage (None: the stage is off; at least one is on). An rsqrt
    quantizer without an input dtype is given float32's: Q reads r unrounded."""

    input: Quantizer | None = None
    rsqrt: Quantizer | None = None
    normalised: Quantizer | None = None
    cos_product: Quantizer | None = None
    sin_product: Quantizer | None = None
    output: Quantizer | None = None
    q_input: Quantizer | None = None
    q_rsqrt: Quantizer | None = None
    q_normalised: Quantizer | None = None
    q_cos_product: Quantizer | None = None
    q_sin_product: Quantizer | None = None
    q_output: Quantizer | None = None
    k_input: Quantizer | None = None
    k_rsqrt: Quantizer | None = None
    k_normalised: Quantizer | None = None
    k_cos_product: Quantizer | None = None
    k_sin_product: Quantizer | None = None
    k_output: Quantizer | None = None

    def __post_init__(self) -> None:
        for stage in QUANT_STAGES:
            quantizer = self.at(stage)
            if stage.rounds_input and quantizer is not None and quantizer.input_dtype is None:
                object.__setattr__(self, stage.value, dataclasses.replace(quantizer, input_dtype="float32"))

    def at(self, stage: QuantStage) -> Quantizer | None:
        return getattr(self, stage.value)

    @property
    def stages(self) -> tuple[QuantStage, ...]:
        """The stages that are on, in formula order."""
        return tuple(stage for stage in QUANT_STAGES if self.at(stage) is not None)


def norm_quant(quant: QuantParams | None, stages: tuple[QuantStage, ...]) -> QuantParams | None:
    """One norm's quantizers out of a node's: those of `stages` (its part's, `FusedOp.part_stages`), each as the
    stage of a single norm it is (`QuantStage.norm_stage`: a QK-norm's q_rsqrt as rsqrt...); None where the norm
    quantizes nothing. What a kernel's problem, the reference and the lowering compute per norm."""
    if quant is None:
        return None
    quantizers = {stage.norm_stage.value: quant.at(stage) for stage in stages if quant.at(stage) is not None}
    return QuantParams(**quantizers) if quantizers else None


def rotation_stage_problem(
    quant: QuantParams | None, part_stages: tuple[tuple[QuantStage, ...], ...], output_dtype: str
) -> tuple[str, str] | None:
    """(field, why) where a node's rotation stages are outside the contract, or None: in each part the cos and sin
    products are quantized together or not at all (their dequantized values are what the rotation adds), and each
    stage that rounds what the rotation reads (the normalised y, the products) dequantizes to T (`output_dtype`), the
    dtype the graph's rotation computes in and its result's."""
    if quant is None:
        return None
    for stages in part_stages:
        products = [stage for stage in stages if stage.product]
        on = [stage for stage in products if quant.at(stage) is not None]
        if on and len(on) != len(products):
            off = next(stage for stage in products if quant.at(stage) is None)
            return (
                off.dtype_field,
                f"is 0 (off), but {on[0].value} is on: a rotation's two products are quantized together",
            )
        for stage in stages:
            dequant = None if quant.at(stage) is None or not stage.rotation_input else quant.at(stage).dequant_dtype
            if dequant is not None and dequant != output_dtype:
                return stage.dequant_field, (
                    f"is {OUTPUT_DTYPE_CODES.get(dequant, dequant)} ({dequant}), not output_dtype's "
                    f"{OUTPUT_DTYPE_CODES[output_dtype]} ({output_dtype}): the rotation computes in T"
                )
    return None


def quant_dtype_of_code(code: int) -> str | None:
    """The quantized dtype of an ONNX element type code, or None for a code outside QUANT_DTYPE_CODES."""
    return _QUANT_DTYPES_BY_CODE.get(code)


def dtype_of_code(code: int) -> str | None:
    """The contract dtype of an ONNX element type code, or None for a code outside OUTPUT_DTYPE_CODES."""
    return _DTYPES_BY_CODE.get(code)


def rounding_dtype(dtype: str, output_dtype: str) -> str:
    """R of the semantics: the dtype AFTER_CAST rounds the normalised value to, the node's 16-bit side."""
    return dtype if dtype != "float32" else output_dtype


def dtype_pair_problem(dtype: str, output_dtype: str) -> str | None:
    """Why an (input, output) dtype pair is outside the contract, or None when it is inside."""
    if dtype not in ACTIVATION_DTYPES:
        return f"input dtype {dtype} is not one of {', '.join(ACTIVATION_DTYPES)}"
    if output_dtype not in ACTIVATION_DTYPES:
        return f"output dtype {output_dtype} is not one of {', '.join(ACTIVATION_DTYPES)}"
    if "float32" not in (dtype, output_dtype) and dtype != output_dtype:
        return f"input dtype {dtype} and output dtype {output_dtype} are two different 16-bit dtypes"
    return None


@dataclass(frozen=True)
class FusedOp:
    """One plugin op: its tensors by position and its fields in serialisation order.

    A node normalises one or more parts, each over rows of its own hidden size (`hidden_fields[i]`); every activation
    and output belongs to a part, and each part has one weight input (none when weight_mode is NONE). Every
    activation shares one dtype, every weight one dtype of its own; normalised outputs are in `output_dtype`, the
    others (a residual sum) in the activations' dtype. A part of one activation normalises it; a part of several
    (the add-norm's x and residual, of one shape) normalises their sum, computed in fp32 and rounded once to the
    activations' dtype, which is also the part's output that is not normalised."""

    name: str
    activations: tuple[str, ...]
    activation_parts: tuple[int, ...]
    weights: tuple[str, ...]
    outputs: tuple[str, ...]
    output_parts: tuple[int, ...]
    normalised_outputs: tuple[bool, ...]
    hidden_fields: tuple[str, ...]
    # Per part, the stages a quantized op of this one has for that part's norm (`quantizable`: all of them), and per
    # output the stage that quantizes it (None: never quantized); a quantized op (`quantized`) is its base op plus
    # those stages' fields; a plain op has none.
    part_stages: tuple[tuple[QuantStage, ...], ...] = ()
    output_stages: tuple[QuantStage | None, ...] = ()
    quant_stages: tuple[QuantStage, ...] = ()
    base: str | None = None
    # An op that rotates its normalised outputs (a rotary embedding after the norm) reads these tables after the
    # weights, always present, and has the ROTARY_FIELDS after output_dtype.
    rotary_tables: tuple[str, ...] = ()

    @property
    def quantizable(self) -> tuple[QuantStage, ...]:
        """Every stage a quantized op of this one has, part by part (the order of its fields)."""
        return tuple(stage for stages in self.part_stages for stage in stages)

    @property
    def fields(self) -> tuple[str, ...]:
        """Every field, in the order the plugins serialise them and tensorrt.plugin hands them to a QDP."""
        quant = tuple(name for stage in self.quant_stages for name in stage.fields)
        rotary = ROTARY_FIELDS if self.rotary else ()
        head = (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE, *self.hidden_fields, ATTR_OUTPUT_DTYPE)
        return (*head, *rotary, *quant)

    @property
    def quantized(self) -> bool:
        return bool(self.quant_stages)

    @property
    def rotary(self) -> bool:
        return bool(self.rotary_tables)

    @property
    def listed_when_absent(self) -> bool:
        """Whether reports list the op with a count of 0: the three plain norm ops. A quantized or rotary op is
        listed where a model has one, so a model without quantizers or rotations reports what it did before those
        ops existed."""
        return not (self.quantized or self.rotary)

    @property
    def norm_calls(self) -> int:
        """How many norms of the source model one node replaces: one per normalised output."""
        return sum(self.normalised_outputs)

    def inputs(self, weighted: bool) -> tuple[str, ...]:
        """The input names by position: activations, then (unless weight_mode is NONE) the weights, then a rotary
        op's cos and sin tables."""
        return self.activations + (self.weights if weighted else ()) + self.rotary_tables


RMS_NORM = FusedOp(
    name="TrtfuseRmsNorm",
    activations=("x",),
    activation_parts=(0,),
    weights=("weight",),
    outputs=("y",),
    output_parts=(0,),
    normalised_outputs=(True,),
    hidden_fields=(ATTR_HIDDEN,),
    part_stages=((QuantStage.INPUT, QuantStage.RSQRT, QuantStage.OUTPUT),),
    output_stages=(QuantStage.OUTPUT,),
)
# The q-norm and k-norm of one attention block: one launch, shared constants, each part with its own weight.
QK_NORM = FusedOp(
    name="TrtfuseQkNorm",
    activations=("q", "k"),
    activation_parts=(0, 1),
    weights=("q_weight", "k_weight"),
    outputs=("q_out", "k_out"),
    output_parts=(0, 1),
    normalised_outputs=(True, True),
    hidden_fields=(ATTR_Q_HIDDEN, ATTR_K_HIDDEN),
    # Each norm's own quantizers: Gemma3's INT8 q/k output scales differ, OLMo2's INT8 q and k norms each have their
    # own input and inverse-root pairs.
    part_stages=(
        (QuantStage.Q_INPUT, QuantStage.Q_RSQRT, QuantStage.Q_OUTPUT),
        (QuantStage.K_INPUT, QuantStage.K_RSQRT, QuantStage.K_OUTPUT),
    ),
    output_stages=(QuantStage.Q_OUTPUT, QuantStage.K_OUTPUT),
)
# A QK-norm and the rotary embedding after it (docs/plugin-nodes.md, "Rotary embedding"): TrtfuseQkNorm's tensors and
# fields, then the cos and sin tables ([Bc, S, R], Bc 1 or B) and the rotary fields; each output the rotated norm.
# Its quantized form has per part, in formula order, the norm's input and inverse-root stages (ModelOpt's INT8
# OLMo2), the normalised stage (a Q/DQ pair on the norm's output before the rotation reads it: ModelOpt's INT8
# Gemma3), the rotation's product stages (ModelOpt's FP8 and INT8 rotations round y·cos and rot(y)·sin each through
# a Q/DQ pair before the sum) and the output stage (a Q on the rotation's result).
QK_NORM_ROPE = dataclasses.replace(
    QK_NORM,
    name="TrtfuseQkNormRope",
    rotary_tables=("cos", "sin"),
    part_stages=(
        (
            QuantStage.Q_INPUT,
            QuantStage.Q_RSQRT,
            QuantStage.Q_NORMALISED,
            QuantStage.Q_COS_PRODUCT,
            QuantStage.Q_SIN_PRODUCT,
            QuantStage.Q_OUTPUT,
        ),
        (
            QuantStage.K_INPUT,
            QuantStage.K_RSQRT,
            QuantStage.K_NORMALISED,
            QuantStage.K_COS_PRODUCT,
            QuantStage.K_SIN_PRODUCT,
            QuantStage.K_OUTPUT,
        ),
    ),
)
# The residual Add in front of a decoder layer's norm, and that norm: x and residual are summed into h (the residual
# stream's next value, an output of its own), and y is the RMSNorm of h. x and residual are one part: rows of the same
# shape, normalised over the one hidden size.
ADD_RMS_NORM = FusedOp(
    name="TrtfuseAddRmsNorm",
    activations=("x", "residual"),
    activation_parts=(0, 0),
    weights=("weight",),
    outputs=("y", "h"),
    output_parts=(0, 0),
    normalised_outputs=(True, False),
    hidden_fields=(ATTR_HIDDEN,),
    part_stages=((QuantStage.INPUT, QuantStage.RSQRT, QuantStage.OUTPUT),),
    output_stages=(QuantStage.OUTPUT, None),
)


def quantized(op: FusedOp) -> FusedOp:
    """`op` with the Q/DQ pairs around its norm taken in (docs/plugin-nodes.md, "Quantization"): the same tensors
    and fields, then the quantizer fields of each stage it may have (`op.quantizable`); a normalised output is in
    its stage's dtype when that stage is on. Its own op name, so each plugin's field list stays fixed and a model
    with nothing quantized is written exactly as without quantization."""
    return dataclasses.replace(op, name=f"{op.name}Quant", quant_stages=op.quantizable, base=op.name)


# The norms whose Q/DQ pairs ModelOpt's exports put around them (a QK-norm's: Gemma3 INT8's q/k output Qs,
# DeepSeek-V3 FP8's latent Q).
RMS_NORM_QUANT = quantized(RMS_NORM)
ADD_RMS_NORM_QUANT = quantized(ADD_RMS_NORM)
QK_NORM_QUANT = quantized(QK_NORM)
# A Q on the rotation's result (FP8 / INT8 attention inputs): each rotated output its own quantizer.
QK_NORM_ROPE_QUANT = quantized(QK_NORM_ROPE)
OPS = {
    op.name: op
    for op in (
        RMS_NORM,
        QK_NORM,
        ADD_RMS_NORM,
        RMS_NORM_QUANT,
        ADD_RMS_NORM_QUANT,
        QK_NORM_QUANT,
        QK_NORM_ROPE,
        QK_NORM_ROPE_QUANT,
    )
}
RMS_NORM_OP = RMS_NORM.name
QK_NORM_OP = QK_NORM.name
ADD_RMS_NORM_OP = ADD_RMS_NORM.name
RMS_NORM_QUANT_OP = RMS_NORM_QUANT.name
ADD_RMS_NORM_QUANT_OP = ADD_RMS_NORM_QUANT.name
QK_NORM_QUANT_OP = QK_NORM_QUANT.name
QK_NORM_ROPE_OP = QK_NORM_ROPE.name
QK_NORM_ROPE_QUANT_OP = QK_NORM_ROPE_QUANT.name
FUSED_OPS = tuple(OPS)
# Each plain op and its quantized op, for what treats them alike (counts per norm, kernels, plugin classes).
QUANTIZED_OPS = {op.base: op for op in OPS.values() if op.base is not None}


class PluginKind(str, enum.Enum):
    """How an engine's trtfuse nodes run. AOT: TensorRT embeds the kernels and launches them itself, so the engine
    runs in any TensorRT runtime without Python. PYTHON: IPluginV3 plugins that call back into a Python process with
    trtfuse imported, registered before the engine is deserialised. Both kinds implement the nodes above under one
    name, namespace and version, so a process registers one kind."""

    AOT = "aot"
    PYTHON = "python"
