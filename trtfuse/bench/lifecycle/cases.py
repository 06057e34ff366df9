"""The plugin instances the harness drives: fields, dtypes, optimisation profile and the runs that follow.

A case describes its tensors through its op's tables (`contract.FusedOp`), so nothing here branches on the op: shapes
are given per part (the activations of one part, the add-norm's x and residual, share one shape), and the
op's tables say which activation, weight and output each part has, and which outputs are normalised. A quantized op
(`contract.quantized`) is a case of its plain op with the node's quantizers: the same tensors, the normalised
outputs in the output stage's dtype when it is on."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from trtfuse.contract import (
    ADD_RMS_NORM,
    QK_NORM,
    QUANT_STAGES,
    QUANTIZED_OPS,
    RMS_NORM,
    FusedOp,
    NormParams,
    Quantizer,
    QuantParams,
    WeightMode,
)
from trtfuse.contract.codec import NodeFields

Shape = tuple[int, ...]
# What a case's sizes are given in: a row op's leading dims, a QK-norm's token count.
S = TypeVar("S")


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
            f"h{'x'.join(map(str, self.config.hidden_sizes))}-off{self.config.params.weight_offset:g}{stages}"
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
        weight dtype."""
        weights = (self.weight_dtype,) * len(self.op.weights) if self.config.has_weight else ()
        return (self.dtype,) * len(self.op.activations) + weights

    @property
    def output_dtypes(self) -> tuple[str, ...]:
        """By output position: the normalised dtype for a normalised output, the activations' dtype for the others
        (h)."""
        return self.config.output_dtypes(self.dtype)

    def input_shapes(self, part_shapes: Sequence[Shape]) -> list[Shape]:
        """By input position: each activation has its part's shape, each weight is [its part's hidden size]."""
        activations = [tuple(part_shapes[part]) for part in self.op.activation_parts]
        weights = [(hidden,) for hidden in self.config.hidden_sizes] if self.config.has_weight else []
        return [*activations, *weights]

    def output_shapes(self, part_shapes: Sequence[Shape]) -> list[Shape]:
        """By output position: each output has its part's shape."""
        return [tuple(part_shapes[part]) for part in self.op.output_parts]


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


def _case(
    config: NodeFields,
    dtype: str,
    weight_dtype: str | None,
    shapes: Callable[[S], tuple[Shape, ...]],
    smallest: S,
    largest: S,
    runs: Sequence[S],
) -> NormCase:
    """The case of `config`: its part shapes `shapes(size)`, the profile from `smallest` to `largest` (OPT and MAX),
    then one run per size in `runs`; no weight dtype in WeightMode.NONE."""
    return NormCase(
        config=config,
        dtype=dtype,
        weight_dtype=weight_dtype if config.params.weight_mode is not WeightMode.NONE else None,
        min_shapes=shapes(smallest),
        opt_shapes=shapes(largest),
        max_shapes=shapes(largest),
        runs=tuple(shapes(size) for size in runs),
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
    add + RMSNorm (RMSNorm's and QK-norm's cases first, in their earlier order); then the quantized ops'
    (`quant_cases`)."""
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
    cases.extend(quant_cases())
    return cases


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
    its own input and inverse-root pairs (OLMo2's INT8), or FP8 input pairs."""
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
    ]
