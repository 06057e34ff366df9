"""The plugin instances the harness drives: fields, dtypes, optimisation profile and the runs that follow.

A case describes its tensors through its op's tables (`contract.FusedOp`), so nothing here branches on the op: shapes
are given per part (the activations of one part, the add-norm's x and residual, share one shape), and the
op's tables say which activation, weight and output each part has, and which outputs are normalised. A quantized op
(`contract.quantized`) is a case of its plain op with the node's quantizers: the same tensors, the normalised
outputs in the output stage's dtype when it is on. A rotary op's cos and sin (`FusedOp.rotary_tables`) follow from
the first activation's shape and the node's rotation (`RotaryTables`): [1 or B, S, R]."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from trtfuse.contract import (
    ADD_RMS_NORM,
    QK_NORM,
    QK_NORM_ROPE,
    QUANT_STAGES,
    QUANTIZED_OPS,
    RMS_NORM,
    FusedOp,
    HeadLayout,
    NormParams,
    Quantizer,
    QuantParams,
    RotaryParams,
    Rotation,
    WeightMode,
)
from trtfuse.contract.codec import NodeFields
from trtfuse.contract.rotary_shapes import TOKEN_AXIS, output_dims
from trtfuse.plugins.kernel_specs import kernel_spec

Shape = tuple[int, ...]
# What a case's sizes are given in: a row op's leading dims, a QK-norm's token count.
S = TypeVar("S")


@dataclass(frozen=True)
class RotaryTables:
    """A rotary case's cos and sin: their dtype (float32 or the activations'), whether each batch row has its own
    (Bc = B, optimum's tables from position_ids) or one serves the batch (Bc = 1), and the base theta of their
    angles (`bench.reference.rotary_tables`)."""

    dtype: str
    per_batch: bool
    theta: float


@dataclass(frozen=True)
class NormCase:
    """One plugin instance: its fields, its dtypes, the part shapes of its optimisation profile, and the part shapes
    of the runs that follow (each run is one on_shape_change, then enqueues). A part's shape is that of each of its
    activations and of each of its outputs; for RMSNorm and QK-norm the parts are the activations."""

    config: NodeFields
    dtype: str
    weight_dtype: str | None
    min_shapes: tuple[Shape, ...]
    opt_shapes: tuple[Shape, ...]
    max_shapes: tuple[Shape, ...]
    runs: tuple[tuple[Shape, ...], ...]
    tables: RotaryTables | None = None  # a rotary op's cos and sin (None for the other ops)

    @property
    def name(self) -> str:
        weight = self.weight_dtype or "none"
        out = f"-to-{self.config.output_dtype}" if self.config.output_dtype != self.dtype else ""
        quant = self.config.quant or QuantParams()
        stages = "".join(
            f"-q{stage.value}-{_quantizer_label(quantizer)}"
            for stage in QUANT_STAGES
            if (quantizer := quant.at(stage)) is not None
        )
        return (
            f"{self.config.op.name}-{self.dtype}{out}-w{weight}-{self.config.params.weight_mode.name}-"
            f"h{'x'.join(map(str, self.config.hidden_sizes))}-off{self.config.params.weight_offset:g}"
            f"{self._rotary_label}{stages}"
        )

    @property
    def _rotary_label(self) -> str:
        rotary, tables = self.config.rotary, self.tables
        if rotary is None or tables is None:
            return ""
        layout = f"{rotary.layout.name}-to-{rotary.output_layout.name}" if rotary.moves_heads else rotary.layout.name
        return (
            f"-rope-d{rotary.head_dim}r{rotary.rotary_dim}-{rotary.rotation.name}-{layout}"
            f"-cos{tables.dtype}-bc{'B' if tables.per_batch else '1'}"
        )

    @property
    def op(self) -> FusedOp:
        return self.config.op

    @property
    def output_dtype(self) -> str:
        """The dtype T the norm is computed to (the node's `output_dtype`)."""
        return self.config.output_dtype

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        """By input position: every activation in the activations' dtype, then (unless NONE) every weight in the
        weight dtype, then a rotary op's tables in theirs."""
        weights = (self.weight_dtype,) * len(self.op.weights) if self.config.has_weight else ()
        tables = (self.tables.dtype,) * len(self.op.rotary_tables) if self.tables is not None else ()
        return (self.dtype,) * len(self.op.activations) + weights + tables

    @property
    def table_count(self) -> int:
        """How many inputs, at the end, are a rotary op's tables rather than random activations and weights."""
        return len(self.op.rotary_tables)

    @property
    def kernel_spec(self) -> Any:
        """The spec of the kernel the plugin builds for this case (`plugins.kernel_specs.kernel_spec`)."""
        table_dtype = self.tables.dtype if self.tables is not None else None
        return kernel_spec(self.config, self.dtype, self.weight_dtype, table_dtype)

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        """By output position: the normalised dtype for a normalised output, the activations' dtype for the others
        (h)."""
        return self.config.output_dtypes(self.dtype)

    def input_shapes(self, part_shapes: Sequence[Shape]) -> list[Shape]:
        """By input position: each activation has its part's shape, each weight is [its part's hidden size], each
        of a rotary op's tables is [Bc, S, R] (`table_shape`)."""
        activations = [tuple(part_shapes[part]) for part in self.op.activation_parts]
        weights = [(hidden,) for hidden in self.config.hidden_sizes] if self.config.has_weight else []
        tables = [self.table_shape(part_shapes)] * self.table_count if self.table_count else []
        return [*activations, *weights, *tables]

    def table_shape(self, part_shapes: Sequence[Shape]) -> Shape:
        """cos's and sin's shape [Bc, S, R]: B and S are the first activation's batch and tokens (its token axis is
        the layout's, `contract.rotary_shapes.TOKEN_AXIS`), Bc is B or 1 as the tables say."""
        rotary, tables = self.config.rotary, self.tables
        if rotary is None or tables is None:
            raise ValueError(f"{self.name}: not a rotary case")
        first = part_shapes[0]
        return (first[0] if tables.per_batch else 1, first[TOKEN_AXIS[rotary.layout]], rotary.rotary_dim)

    def output_shapes(self, part_shapes: Sequence[Shape]) -> list[Shape]:
        """By output position: each output has its part's shape (its [B, H, S, D] where a rotary node moves heads,
        `contract.rotary_shapes.output_dims`)."""
        config = self.config
        return [
            tuple(output_dims(config.rotary, config.hidden_sizes[part], part_shapes[part]))
            for part in self.op.output_parts
        ]


def _quantizer_label(quantizer: Quantizer) -> str:
    saturate = "" if quantizer.saturate else "-nosat"
    dequant = f"-to-{quantizer.dequant_dtype}" if quantizer.dequant_dtype else ""
    return f"{quantizer.dtype}-s{quantizer.scale:g}{saturate}{dequant}"


def _float32_params(epsilon: float, weight_offset: float, weight_mode: WeightMode) -> NormParams:
    """The constants as a node's float32 attributes hold them."""
    return NormParams(float(np.float32(epsilon)), float(np.float32(weight_offset)), weight_mode)


def row_case(
    op: FusedOp,
    hidden: int,
    dtype: str,
    weight_dtype: str | None,
    weight_mode: WeightMode = WeightMode.AFTER_CAST,
    weight_offset: float = 0.0,
    epsilon: float = 1e-6,
    max_leading: Shape = (4, 256),
    runs: Sequence[Shape] = ((4, 256), (1, 3), (1, 1)),
    output_dtype: str | None = None,
    quant: QuantParams | None = None,
) -> NormCase:
    """A case of a one-part op (`rms_case`: RMSNorm; `add_case`: the residual add + RMSNorm, x and residual both
    [*leading, hidden] in `dtype` and h = D(x + residual) in `dtype`) over rows [*leading, hidden]; `runs` are the
    leading dims of successive runs. The defaults go from prefill (1024 rows: more rows than an H200 has SMs, the
    prefill kernel) to decode (3 rows, then 1). `output_dtype` is the node's attribute (None: the activation's
    dtype); `quant` makes it a case of the quantized op (TrtfuseRmsNormQuant, TrtfuseAddRmsNormQuant; h is never
    quantized)."""
    params = _float32_params(epsilon, weight_offset, weight_mode)
    node_op = op if quant is None else QUANTIZED_OPS[op.name]
    config = NodeFields(node_op, params, (hidden,), output_dtype or dtype, quant)

    def shapes(leading: Shape) -> tuple[Shape, ...]:
        return ((*leading, hidden),)

    return _case(config, dtype, weight_dtype, shapes, (1,) * len(max_leading), max_leading, runs)


rms_case = functools.partial(row_case, RMS_NORM)
add_case = functools.partial(row_case, ADD_RMS_NORM)


def qk_case(
    q_heads: int,
    k_heads: int,
    head_dim: int,
    dtype: str,
    weight_dtype: str | None,
    weight_mode: WeightMode = WeightMode.AFTER_CAST,
    weight_offset: float = 0.0,
    epsilon: float = 1e-6,
    max_tokens: int = 64,
    runs: Sequence[int] = (64, 5, 1),
    quant: QuantParams | None = None,
) -> NormCase:
    """A QK-norm over q [1, tokens, q_heads, head_dim] and k [1, tokens, k_heads, head_dim] (Qwen3's layout);
    `quant` (each part's stages: q_input, q_rsqrt, q_output and k's) makes it a case of TrtfuseQkNormQuant."""
    params = _float32_params(epsilon, weight_offset, weight_mode)
    op = QK_NORM if quant is None else QUANTIZED_OPS[QK_NORM.name]
    config = NodeFields(op, params, (head_dim, head_dim), dtype, quant)

    def shapes(tokens: int) -> tuple[Shape, ...]:
        return ((1, tokens, q_heads, head_dim), (1, tokens, k_heads, head_dim))

    return _case(config, dtype, weight_dtype, shapes, 1, max_tokens, runs)


def rope_case(
    q_heads: int,
    k_heads: int,
    head_dim: int,
    dtype: str,
    weight_dtype: str | None,
    weight_mode: WeightMode = WeightMode.AFTER_CAST,
    weight_offset: float = 0.0,
    epsilon: float = 1e-6,
    rotary_dim: int | None = None,
    rotation: Rotation = Rotation.HALF_SPLIT,
    layout: HeadLayout = HeadLayout.TOKEN_MAJOR,
    full_width: bool = False,
    tables: RotaryTables | None = None,
    max_size: tuple[int, int] = (2, 32),
    runs: Sequence[tuple[int, int]] = ((2, 32), (2, 1), (1, 1)),
    quant: QuantParams | None = None,
    output_layout: HeadLayout | None = None,
) -> NormCase:
    """A QK-norm + rotary embedding (TrtfuseQkNormRope) over q and k of `layout` (its outputs of `output_layout`,
    default the same): TOKEN_MAJOR [B, S, H, D] (Qwen3),
    or with `full_width` [B, S, H·D] normalised over a token's whole width (OLMo2); HEAD_MAJOR [B, H, S, D] (Gemma3).
    The first `rotary_dim` R (default D) of each head row rotate, paired as `rotation` says, by `tables` (default:
    the activations' dtype, one row for the batch, Qwen3's theta 1e6). Sizes are (B, S): the profile from (1, 1) to
    `max_size`, then `runs` (prefill, then decode of B tokens and of one). `quant` (each part's product stages and
    output stage) makes it a case of TrtfuseQkNormRopeQuant."""
    params = _float32_params(epsilon, weight_offset, weight_mode)
    op = QK_NORM_ROPE if quant is None else QUANTIZED_OPS[QK_NORM_ROPE.name]
    widths = (q_heads * head_dim, k_heads * head_dim) if full_width else (head_dim, head_dim)
    rotary = RotaryParams(head_dim, rotary_dim or head_dim, rotation, layout, output_layout)
    config = NodeFields(op, params, widths, dtype, quant, rotary)

    def shapes(size: tuple[int, int]) -> tuple[Shape, ...]:
        batch, tokens = size
        if full_width:
            return tuple((batch, tokens, width) for width in widths)
        if layout is HeadLayout.HEAD_MAJOR:
            return tuple((batch, heads, tokens, head_dim) for heads in (q_heads, k_heads))
        return tuple((batch, tokens, heads, head_dim) for heads in (q_heads, k_heads))

    tables = tables or RotaryTables(dtype, per_batch=False, theta=1e6)
    return _case(config, dtype, weight_dtype, shapes, (1, 1), max_size, runs, tables)


def _case(
    config: NodeFields,
    dtype: str,
    weight_dtype: str | None,
    shapes: Callable[[S], tuple[Shape, ...]],
    smallest: S,
    largest: S,
    runs: Sequence[S],
    tables: RotaryTables | None = None,
) -> NormCase:
    """The case of `config`: its part shapes `shapes(size)`, the profile from `smallest` to `largest` (OPT and MAX),
    then one run per size in `runs`; no weight dtype in WeightMode.NONE; a rotary op's `tables`."""
    return NormCase(
        config=config,
        dtype=dtype,
        weight_dtype=weight_dtype if config.params.weight_mode is not WeightMode.NONE else None,
        min_shapes=shapes(smallest),
        opt_shapes=shapes(largest),
        max_shapes=shapes(largest),
        runs=tuple(shapes(size) for size in runs),
        tables=tables,
    )


def _per_dtype_cases(factory: Callable[..., NormCase]) -> list[NormCase]:
    """Every activation dtype with an fp32 and a same-dtype weight (AFTER_CAST, hidden 4096), Gemma's BEFORE_CAST
    with offset 1 (hidden 2048), and NONE at an odd hidden size (1000), for a one-part row op's case factory."""
    cases = []
    for dtype in ("float32", "float16", "bfloat16"):
        for weight_dtype in sorted({dtype, "float32"}):
            cases.append(factory(4096, dtype, weight_dtype, WeightMode.AFTER_CAST))
        cases.append(factory(2048, dtype, "float32", WeightMode.BEFORE_CAST, weight_offset=1.0))
        cases.append(factory(1000, dtype, None, WeightMode.NONE))
    return cases


def default_cases() -> list[NormCase]:
    """Every activation dtype with an fp32 and a same-dtype weight, every weight mode, Gemma's offset, an odd hidden
    size, Qwen3- and Gemma-like QK-norms, and fp32 -> bf16 and bf16 -> fp32 norms; then the same for the residual
    add + RMSNorm (RMSNorm's and QK-norm's cases first, in their earlier order); then the QK-norm + rotary ones
    (`rope_cases`); then the quantized ops' (`quant_cases`)."""
    cases = _per_dtype_cases(rms_case)
    cases.append(qk_case(32, 8, 128, "bfloat16", "bfloat16"))
    cases.append(qk_case(8, 4, 256, "float16", "float32", WeightMode.BEFORE_CAST, weight_offset=1.0))
    cases.append(qk_case(16, 16, 64, "float32", None, WeightMode.NONE))
    # Mixed precision (output_dtype): an optimum fp16/bf16 norm on an fp32 residual stream, and its reverse.
    cases.append(rms_case(4096, "float32", "bfloat16", WeightMode.AFTER_CAST, output_dtype="bfloat16"))
    cases.append(rms_case(4096, "bfloat16", "float32", WeightMode.AFTER_CAST, output_dtype="float32"))
    cases.extend(_per_dtype_cases(add_case))
    # An fp32 residual stream (x, residual and h fp32) feeding a bf16 layer, and its reverse.
    cases.append(add_case(4096, "float32", "bfloat16", WeightMode.AFTER_CAST, output_dtype="bfloat16"))
    cases.append(add_case(4096, "bfloat16", "float32", WeightMode.AFTER_CAST, output_dtype="float32"))
    cases.extend(rope_cases())
    cases.extend(quant_cases())
    return cases


def rope_cases() -> list[NormCase]:
    """The QK-norm + rotary embedding as the QK-norm models put it (docs/plugin-nodes.md, "Rotary embedding"):
    Qwen3's token-major heads with bf16 tables for the batch, and with optimum's fp32 tables per batch row
    (Bc = B); Gemma3's head-major heads (BEFORE_CAST, offset 1, theta 1e4); OLMo2's norm over the full width, cut
    into heads after it (theta 5e5); a partial rotation (R = D/2: the rest passes through) without a weight; and
    GPT-J's interleaved pairs."""
    per_batch_fp32 = RotaryTables("float32", per_batch=True, theta=1e6)
    return [
        rope_case(32, 8, 128, "bfloat16", "bfloat16"),
        rope_case(32, 8, 128, "float16", "float32", tables=per_batch_fp32),
        rope_case(
            8,
            4,
            256,
            "bfloat16",
            "float32",
            WeightMode.BEFORE_CAST,
            1.0,
            layout=HeadLayout.HEAD_MAJOR,
            tables=RotaryTables("float32", per_batch=False, theta=1e4),
        ),
        rope_case(
            16,
            16,
            128,
            "float32",
            "float32",
            WeightMode.BEFORE_CAST,
            full_width=True,
            tables=RotaryTables("float32", per_batch=True, theta=5e5),
        ),
        rope_case(16, 4, 128, "float16", None, WeightMode.NONE, rotary_dim=64),
        rope_case(16, 4, 64, "bfloat16", "float32", rotation=Rotation.INTERLEAVED, tables=per_batch_fp32),
    ]


def _scale(value: float) -> float:
    """A quantizer scale as a node's float32 attribute holds it."""
    return float(np.float32(value))


def fp8(scale: float, saturate: bool = True, dequant_dtype: str | None = None) -> Quantizer:
    return Quantizer("float8_e4m3fn", _scale(scale), saturate, dequant_dtype)


def int8(scale: float, dequant_dtype: str | None = None) -> Quantizer:
    return Quantizer("int8", _scale(scale), True, dequant_dtype)


def quant_cases() -> list[NormCase]:
    """The quantized ops as ModelOpt's exports put them (docs/plugin-nodes.md, "Quantization"): an FP8 or INT8
    output, E4M3FN saturating and not (past ±448: ±448, NaN), the add-norm's FP8 and INT8 input fake-quant with and
    without the output stage, INT8's rsqrt stage, an fp32 residual stream into a bf16 layer, every weight mode, and
    the QK-norm's outputs each at its own scale (Gemma3's INT8) or one alone (DeepSeek-V3's FP8 latent). The scales
    put part of each output past the quantized range, so saturation is exercised; and the QK-norm's norms each with
    its own input and inverse-root pairs (OLMo2's INT8), or FP8 input pairs; then the QK-norm + rotary's
    (`rope_quant_cases`)."""
    return [
        rms_case(4096, "bfloat16", "bfloat16", quant=QuantParams(output=fp8(1 / 64))),
        rms_case(2048, "float16", "float32", WeightMode.BEFORE_CAST, 1.0, quant=QuantParams(output=fp8(1 / 128))),
        rms_case(1000, "float16", None, WeightMode.NONE, quant=QuantParams(output=fp8(1 / 128, saturate=False))),
        rms_case(4096, "float16", "float32", quant=QuantParams(output=int8(2 / 127))),
        rms_case(4096, "float16", "float16", quant=QuantParams(rsqrt=int8(2 / 127, "float16"), output=int8(4 / 127))),
        rms_case(4096, "float32", "float32", output_dtype="bfloat16", quant=QuantParams(output=fp8(1 / 64))),
        add_case(
            4096,
            "bfloat16",
            "bfloat16",
            quant=QuantParams(input=fp8(1 / 64, dequant_dtype="bfloat16"), output=fp8(1 / 64)),
        ),
        add_case(4096, "float16", "float16", quant=QuantParams(input=fp8(1 / 32, dequant_dtype="float16"))),
        add_case(
            4096,
            "float16",
            "float32",
            quant=QuantParams(input=int8(6 / 127, "float16"), rsqrt=int8(2 / 127, "float16"), output=int8(4 / 127)),
        ),
        add_case(2048, "bfloat16", "float32", WeightMode.BEFORE_CAST, 1.0, quant=QuantParams(output=int8(8 / 127))),
        add_case(
            1000, "float32", None, WeightMode.NONE, output_dtype="bfloat16", quant=QuantParams(output=fp8(1 / 128))
        ),
        qk_case(
            8,
            4,
            256,
            "float16",
            "float32",
            WeightMode.BEFORE_CAST,
            1.0,
            quant=QuantParams(q_output=int8(4 / 127), k_output=int8(6 / 127)),
        ),
        qk_case(32, 8, 128, "bfloat16", "bfloat16", quant=QuantParams(q_output=fp8(1 / 64))),
        qk_case(
            16,
            8,
            128,
            "float32",
            "float32",
            quant=QuantParams(
                q_input=int8(6 / 127, "float32"),
                q_rsqrt=int8(2 / 127, "float32"),
                k_input=int8(4 / 127, "float32"),
                k_rsqrt=int8(3 / 127, "float32"),
            ),
        ),
        qk_case(
            16,
            4,
            64,
            "float16",
            "float16",
            quant=QuantParams(
                q_input=fp8(1 / 32, dequant_dtype="float16"),
                k_input=fp8(1 / 16, dequant_dtype="float16"),
                k_output=int8(4 / 127),
            ),
        ),
        *rope_quant_cases(),
    ]


def rope_quant_cases() -> list[NormCase]:
    """The QK-norm + rotary's quantizers as ModelOpt's exports put them: FP8 attention inputs (a Q on each rotated
    output), INT8 ones at their own scales on head-major heads, and the rotation's products each through a Q/DQ
    pair before the sum (FP8 with per-batch fp32 tables, each norm's output through an FP8 pair before the rotation;
    INT8 on OLMo2's full width, q's output also quantized), and the norms' own pairs of ModelOpt's INT8 rotations:
    OLMo2's on each norm's input and inverse root, Gemma3's on each norm's output before the rotation (head-major).
    A product or normalised stage dequantizes to T (`contract.rotation_stage_problem`)."""

    def products(quantize: Callable[..., Quantizer], q_scale: float, k_scale: float, dtype: str) -> dict[str, Any]:
        return {
            "q_cos_product": quantize(q_scale, dequant_dtype=dtype),
            "q_sin_product": quantize(q_scale, dequant_dtype=dtype),
            "k_cos_product": quantize(k_scale, dequant_dtype=dtype),
            "k_sin_product": quantize(k_scale, dequant_dtype=dtype),
        }

    return [
        rope_case(32, 8, 128, "bfloat16", "bfloat16", quant=QuantParams(q_output=fp8(1 / 64), k_output=fp8(1 / 32))),
        # ModelOpt FP8's Qwen3 node: q's FP8 Q after the rotation, both outputs written as the attention's [B, H, S, D].
        rope_case(
            32,
            8,
            128,
            "float16",
            "float16",
            quant=QuantParams(q_output=fp8(1 / 64)),
            output_layout=HeadLayout.HEAD_MAJOR,
        ),
        rope_case(
            8,
            4,
            256,
            "float16",
            "float32",
            WeightMode.BEFORE_CAST,
            1.0,
            layout=HeadLayout.HEAD_MAJOR,
            quant=QuantParams(q_output=int8(4 / 127), k_output=int8(6 / 127)),
        ),
        rope_case(
            32,
            8,
            128,
            "bfloat16",
            "bfloat16",
            tables=RotaryTables("float32", per_batch=True, theta=1e6),
            quant=QuantParams(
                **products(fp8, 1 / 64, 1 / 32, "bfloat16"),
                q_normalised=fp8(1 / 128, dequant_dtype="bfloat16"),
                k_normalised=fp8(1 / 64, dequant_dtype="bfloat16"),
            ),
        ),
        rope_case(
            16,
            16,
            128,
            "float16",
            "float32",
            WeightMode.BEFORE_CAST,
            full_width=True,
            quant=QuantParams(**products(int8, 4 / 127, 6 / 127, "float16"), q_output=int8(4 / 127)),
        ),
        rope_case(
            16,
            8,
            128,
            "float16",
            "float16",
            full_width=True,
            quant=QuantParams(
                **products(int8, 4 / 127, 6 / 127, "float16"),
                q_input=int8(6 / 127, "float16"),
                q_rsqrt=int8(2 / 127, "float16"),
                k_input=int8(5 / 127, "float16"),
                k_rsqrt=int8(3 / 127, "float16"),
            ),
        ),
        rope_case(
            8,
            4,
            64,
            "float16",
            "float16",
            layout=HeadLayout.HEAD_MAJOR,
            quant=QuantParams(
                **products(int8, 4 / 127, 3 / 127, "float16"),
                q_normalised=int8(3.4 / 127, "float16"),
                k_normalised=int8(3.3 / 127, "float16"),
                q_output=int8(4 / 127),
            ),
        ),
    ]
