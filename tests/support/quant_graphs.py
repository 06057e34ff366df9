"""Quantized decoder graphs as TensorRT Model Optimizer's ONNX PTQ writes them: a QuantizeLinear -> DequantizeLinear
pair on each norm's input (the residual sum, or the embedding for the first norm), a QuantizeLinear (scalar scale,
zero point 0) on each norm's output whose DequantizeLinear feeds the next projection, and, in its INT8 exports of
TorchScript graphs, a pair on the inverse root r = 1 / sqrt(mean + eps).

A bfloat16 graph quantizes through float32 (onnxruntime has no bfloat16 QuantizeLinear): Cast -> Q -> DQ(float32) ->
Cast back. Each output QuantizeLinear's value is also a graph output (cast to float32, exactly), so a test can compare
the FP8 / INT8 values the fused node writes with the original graph's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto

from support.graphs import BATCH, ELEM_TYPES, HIDDEN, SEQUENCE, Builder, NormSpec, rms_norm

QUANT_TYPES = {"int8": TensorProto.INT8, "float8_e4m3fn": TensorProto.FLOAT8E4M3FN}
# The largest magnitude of each quantized dtype: a scale of RANGE / QMAX maps [-RANGE, RANGE] onto the dtype.
QMAX = {"int8": 127.0, "float8_e4m3fn": 448.0}
# The calibrated ranges: a few values of each norm's output and sum lie past them (clipped or saturated).
OUTPUT_RANGE, SUM_RANGE, RSQRT_RANGE = 2.5, 3.0, 1.5


@dataclass(frozen=True)
class QuantSpec:
    """One quantized export: the activation dtype, the quantized dtype, the QuantizeLinear's `saturate` (None: the
    attribute is absent, ONNX's default 1) and `precision` (opset 23; None: absent), the opset, which pairs it has
    and, with inverse-root pairs, the dtype of the r they read (`rsqrt_root`: "float32", "rounded" or "core", as
    `rsqrt_quantized_norm` takes it)."""

    dtype: str = "float16"
    quant: str = "int8"
    saturate: int | None = None
    precision: int | None = None
    opset: int = 19
    input_pairs: bool = True
    rsqrt_pairs: bool = False
    rsqrt_root: str = "float32"
    rsqrt_range: float = RSQRT_RANGE
    layers: int = 1

    @property
    def scale_dtype(self) -> str:
        """The dtype the graph quantizes in: the activations', float32 for bfloat16."""
        return "float32" if self.dtype == "bfloat16" else self.dtype


class Quantizer:
    def __init__(self, b: Builder, spec: QuantSpec) -> None:
        self.b = b
        self.spec = spec

    def quantize(self, tensor: str, value_range: float, dtype: str | None = None) -> tuple[str, str]:
        """Q(tensor) in the quantized dtype, and its scale: in the scale dtype of the graph, or in `dtype` (a float32
        inverse root); a tensor of another dtype than the scale's is widened."""
        b, spec = self.b, self.spec
        scale_dtype = dtype or spec.scale_dtype
        if (dtype or spec.dtype) != scale_dtype:
            tensor = b.cast(tensor, scale_dtype)
        scale = b.constant(value_range / QMAX[spec.quant], scale_dtype, base="scale")
        zero = self.zero_point()
        attrs = {} if spec.saturate is None else {"saturate": spec.saturate}
        if spec.precision is not None:
            attrs["precision"] = spec.precision
        return b.op("QuantizeLinear", tensor, scale, zero, **attrs), scale

    def zero_point(self) -> str:
        name = self.b.fresh("zero_point")
        self.b.initializers.append(onnx.helper.make_tensor(name, QUANT_TYPES[self.spec.quant], [], [0]))
        return name

    def dequantize(self, quantized: str, scale: str, dtype: str | None = None) -> str:
        b, spec = self.b, self.spec
        dequantized = b.op("DequantizeLinear", quantized, scale, self.zero_point())
        return dequantized if dtype is not None or spec.dtype == spec.scale_dtype else b.cast(dequantized, spec.dtype)

    def fake(self, tensor: str, value_range: float, dtype: str | None = None) -> str:
        return self.dequantize(*self.quantize(tensor, value_range, dtype), dtype)


def rsqrt_quantized_norm(
    b: Builder, quantizer: Quantizer, x: str, spec: NormSpec, root: str, rsqrt_range: float = RSQRT_RANGE
) -> str:
    """A Llama norm (TorchScript's spelling) over `spec.hidden` with a pair on r between the root and the normalising
    Mul, of range `rsqrt_range`. `root`: "float32" (the chain in float32, the pair on the float32 r), "rounded" (the
    float32 r cast to the activations' dtype before its pair; the pair and Mul(x, r') in that dtype: `+rsqrt-cast`)
    or "core" (the whole chain in the activations' dtype: `core-<dtype>`)."""
    core = spec.dtype if root == "core" else "float32"
    x_core = x if spec.dtype == core else b.cast(x, core)
    mean = b.reduce("ReduceMean", b.op("Pow", x_core, b.constant(2.0)), [-1])
    inverse = b.op("Div", b.constant(1.0, core), b.op("Sqrt", b.op("Add", mean, b.constant(spec.epsilon, core))))
    if root == "float32":
        normalized = b.op("Mul", x_core, quantizer.fake(inverse, rsqrt_range, "float32"))
        rounded = normalized if spec.dtype == "float32" else b.cast(normalized, spec.dtype)
    else:
        rounded = b.op(
            "Mul", x, quantizer.fake(inverse if root == "core" else b.cast(inverse, spec.dtype), rsqrt_range)
        )
    return b.op("Mul", rounded, b.weight(spec.hidden, spec.dtype))


def quantized_decoder(spec: QuantSpec) -> onnx.ModelProto:
    """x -> [fake-quant] -> norm -> Q (an output) -> DQ -> projection -> residual Add -> [fake-quant] -> norm -> ...;
    2·layers residual Adds, 2·layers + 1 norms, the last reading the final sum directly (ModelOpt quantizes no input
    of the final norm)."""
    b = Builder(opset=spec.opset)
    quantizer = Quantizer(b, spec)
    stream = b.input("x", [BATCH, SEQUENCE, HIDDEN], spec.dtype)
    norms = 2 * spec.layers + 1
    for index in range(norms):
        last = index == norms - 1
        x = quantizer.fake(stream, SUM_RANGE) if spec.input_pairs and not last else stream
        y = _norm(b, quantizer, x, spec)
        quantized, scale = quantizer.quantize(y, OUTPUT_RANGE)
        b.output(quantized, [BATCH, SEQUENCE, HIDDEN])
        dequantized = quantizer.dequantize(quantized, scale)
        projection = b.constant(b.rng.normal(0.0, 0.5, HIDDEN), spec.dtype, base="proj")
        projected = b.op("Mul", dequantized, projection)
        if last:
            b.output(projected, [BATCH, SEQUENCE, HIDDEN])
        else:
            stream = b.op("Add", stream, projected)
    return b.model()


def _norm(b: Builder, quantizer: Quantizer, x: str, spec: QuantSpec) -> str:
    norm_spec = NormSpec(dtype=spec.dtype)
    if spec.rsqrt_pairs:
        return rsqrt_quantized_norm(b, quantizer, x, norm_spec, spec.rsqrt_root, spec.rsqrt_range)
    return rms_norm(b, x, norm_spec)


LM_VOCAB = 97


def quantized_lm(spec: QuantSpec) -> onnx.ModelProto:
    """input_ids -> an embedding table -> `quantized_decoder`'s layers, each norm's codes dequantized into a
    projection (none of them an output, as in a real export) -> an LM head reading the last norm's -> logits: a
    logits-only model that `check` and `check --generate` (recompute mode) drive."""
    b = Builder(opset=spec.opset)
    quantizer = Quantizer(b, spec)
    elem = ELEM_TYPES[spec.dtype]
    b.inputs.append(onnx.helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"]))
    table = b.constant(b.rng.normal(0.0, 1.0, (LM_VOCAB, HIDDEN)), spec.dtype, base="embedding")
    stream = b.op("Gather", table, "input_ids")
    norms = 2 * spec.layers + 1
    for index in range(norms):
        last = index == norms - 1
        x = quantizer.fake(stream, SUM_RANGE) if spec.input_pairs and not last else stream
        dequantized = quantizer.dequantize(*quantizer.quantize(_norm(b, quantizer, x, spec), OUTPUT_RANGE))
        if last:
            head = b.constant(b.rng.normal(0.0, 0.5, (HIDDEN, LM_VOCAB)), spec.dtype, base="lm_head")
            b.op("MatMul", dequantized, head, out="logits")
            b.outputs.append(onnx.helper.make_tensor_value_info("logits", elem, ["batch", "sequence", LM_VOCAB]))
        else:
            projection = b.constant(b.rng.normal(0.0, 0.2, (HIDDEN, HIDDEN)), spec.dtype, base="proj")
            stream = b.op("Add", stream, b.op("MatMul", dequantized, projection))
    return b.model()


def quantized_norm(case: str, spec: QuantSpec = QuantSpec()) -> onnx.ModelProto:
    """One norm with a QuantizeLinear on its output. `case`: "input-pair" (and a pair on its x: both taken in),
    "shape" (a Shape node reads y besides the Q: taken in, the Shape reading the node's input), "output-dtype" (a Q
    without zero point whose `output_dtype` attribute, opset 21, says INT8: taken in); or why the
    QuantizeLinear must stay outside the fused node: "read" (the unquantized y is read by another node too),
    "per-channel" (a scale per hidden channel), "zero-point" (a zero point of 3), "uint8" (quantized to uint8)."""
    b = Builder(opset=spec.opset)
    quantizer = Quantizer(b, spec)
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], spec.dtype)
    if case == "input-pair":
        x = quantizer.fake(x, SUM_RANGE)
    y = rms_norm(b, x, NormSpec(dtype=spec.dtype))
    scale_value = OUTPUT_RANGE / QMAX[spec.quant]
    if case == "per-channel":
        scale = b.constant(np.full(HIDDEN, scale_value), spec.scale_dtype, base="scale")
        zero = b.constant(np.zeros(HIDDEN), "int8", base="zero_point")
        quantized = b.op("QuantizeLinear", y, scale, zero, axis=-1)
    elif case == "zero-point":
        scale = b.constant(scale_value, spec.scale_dtype, base="scale")
        zero = b.constant(3, "int8", base="zero_point")
        quantized = b.op("QuantizeLinear", y, scale, zero)
    elif case == "output-dtype":
        scale = b.constant(scale_value, spec.scale_dtype, base="scale")
        quantized = b.op("QuantizeLinear", y, scale, output_dtype=QUANT_TYPES[spec.quant])
    elif case == "uint8":
        scale = b.constant(scale_value, spec.scale_dtype, base="scale")
        quantized = b.op("QuantizeLinear", y, scale, b.constant(0, "uint8", base="zero_point"))
    else:
        quantized, scale = quantizer.quantize(y, OUTPUT_RANGE)
    b.output(quantized, [BATCH, SEQUENCE, HIDDEN])
    if case == "read":
        b.output(y, [BATCH, SEQUENCE, HIDDEN])
    if case == "shape":
        b.outputs.append(onnx.helper.make_tensor_value_info(b.op("Shape", y), TensorProto.INT64, [3]))
    return b.model()


# OLMo2's q and k projections (4 and 2 heads of 16) and, per norm, the ranges ModelOpt calibrated: each its own.
OLMO2_HEADS, OLMO2_HEAD_DIM = {"q": 4, "k": 2}, 16
OLMO2_RANGES = {"q": (3.0, 1.5, 2.5), "k": (2.0, 1.25, 2.0)}  # input, inverse root, output


def olmo2_attention(spec: QuantSpec, output_quantizers: bool = False) -> onnx.ModelProto:
    """OLMo2's attention as ModelOpt's INT8 writes it: q, k and v projections of one input; q's and k's norm each over
    its whole projection (of different widths), reading it through a pair (`MatMul -> Q -> DQ -> norm`), with a pair
    on its inverse root (`spec.rsqrt_root` says in which dtype), its output reshaped to heads and transposed; each
    pair at its own part's range. With `output_quantizers`, a Q on each norm's output too (each a graph output), its
    DequantizeLinear feeding the Reshape."""
    b = Builder(opset=spec.opset)
    quantizer = Quantizer(b, spec)
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], spec.dtype)
    for role in ("q", "k", "v"):
        width = OLMO2_HEADS.get(role, 2) * OLMO2_HEAD_DIM
        weight = b.constant(b.rng.normal(0.0, HIDDEN**-0.5, (HIDDEN, width)), spec.dtype, base=f"{role}_proj")
        projected = b.op("MatMul", x, weight)
        if role == "v":
            b.output(projected, [BATCH, SEQUENCE, width])
            continue
        input_range, rsqrt_range, output_range = OLMO2_RANGES[role]
        norm = NormSpec(dtype=spec.dtype, hidden=width)
        y = rsqrt_quantized_norm(
            b, quantizer, quantizer.fake(projected, input_range), norm, spec.rsqrt_root, rsqrt_range
        )
        if output_quantizers:
            quantized, scale = quantizer.quantize(y, output_range)
            b.output(quantized, [BATCH, SEQUENCE, width])
            y = quantizer.dequantize(quantized, scale)
        shape = b.constant([BATCH, SEQUENCE, OLMO2_HEADS[role], OLMO2_HEAD_DIM], "int64", base="shape")
        heads = b.op("Transpose", b.op("Reshape", y, shape), perm=[0, 2, 1, 3])
        b.output(heads, [BATCH, OLMO2_HEADS[role], SEQUENCE, OLMO2_HEAD_DIM])
    return b.model()
