"""Attention blocks whose q/k norms the rotary embedding reads, in each spelling the exporters write it (docs/
patterns.md, "Rotary embedding"), and in forms one fused node must not take.

The q and k projections of one input are reshaped into heads and normalised as `AttentionSpec.layout` says (Qwen3:
norm, then Transpose; Gemma3: Transpose, then norm; OLMo2: norm over the projection, Reshape, Transpose), then rotated
by cos and sin computed from a `positions` input (float32, [1 or B, S]). Graph inputs and outputs are float32, cast
inside; the rotated q and k (or their quantized values, dequantized) are the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, helper

from support.graphs import BATCH, HIDDEN, SEQUENCE, AttentionSpec, Builder, NormSpec, norm_heads
from support.quant_graphs import QMAX, QUANT_TYPES, Quantizer, QuantSpec, rsqrt_quantized_norm

HEAD_DIM = 16
Q_HEADS, KV_HEADS = 4, 2
# Positions up to this bound index a RotaryEmbedding cache.
MAX_POSITION = 32


@dataclass(frozen=True)
class RopeSpec:
    """One rotated attention block. `spelling`: rotate-half (Hugging Face's, constant slice bounds), rotate-half-
    shapes (TorchScript's: bounds computed from Shape), rotary-embedding (ONNX's op, opset 23). `table_dtype`: the
    dtype the rotation multiplies in, where not the activations' (OLMo2's float32 cos and sin: Casts around it).
    `case` names a form the node must not take (ROPE_NEAR_MISSES)."""

    layout: str = "qk-head-dim"
    dtype: str = "float32"
    spelling: str = "rotate-half"
    positions: bool = False
    interleaved: bool = False
    rotary_dim: int | None = None
    table_dtype: str | None = None
    per_batch: bool = False
    weight: str = "after-cast"  # the q/k norms' weight mode (NormSpec.weight)
    quant: str | None = None
    products: str | None = None  # ModelOpt's rotation: a Q/DQ pair of this dtype on each product (PRODUCT_SCALES)
    core_dtype: str | None = None  # the dtype the q/k norms compute in, where not the activations' (NormSpec)
    # ModelOpt's INT8 q/k norms: OLMo2's "input-rsqrt" (qk-full-width: a pair on each norm's input and one on its
    # float32 inverse root), Gemma3's "normalised" (a pair on each norm's output before the rotation reads it).
    norm_pairs: str | None = None
    case: str | None = None

    @property
    def opset(self) -> int:
        quantized = self.quant or self.products or self.norm_pairs or self.case == "normalised-read-again"
        return 23 if self.spelling == "rotary-embedding" else 19 if quantized else 17


# The scales of the pairs on the cos and sin products (ModelOpt's: float16 values, each product its own).
PRODUCT_SCALES = {"float8_e4m3fn": (0.0928, 0.0735), "int8": (0.0271, 0.0202)}


# case -> what the rope near miss says
ROPE_NEAR_MISSES = {
    "only-q": "only ",
    "other-cos": "q and k are rotated by different cos",
    "extra-reader": "is read by",
    "swapped-halves": "not Concat(-second half, first half)",
    "subtracted": "not by one Add",
    "quantized-product": "is quantized before the sum, Mul",
    "quantized-product-read-again": "is read by",
    "quantized-product-per-channel": "is not a one-element constant",
}
# The ranges of ModelOpt's INT8 pairs on a q or k norm's input, inverse root and output (the normalised stage).
NORM_PAIR_RANGES = {"q": (3.0, 1.5, 3.4), "k": (2.0, 1.25, 3.3)}


def rope_block(spec: RopeSpec) -> onnx.ModelProto:
    b = Builder(opset=spec.opset)
    dtype = spec.dtype
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    batch = BATCH if spec.per_batch else 1
    positions = b.input("positions", [batch, SEQUENCE])
    attention = AttentionSpec(spec.layout, dtype=dtype, q_heads=Q_HEADS, kv_heads=KV_HEADS, head_dim=HEAD_DIM)
    norm = NormSpec(dtype=dtype, weight=spec.weight, core_dtype=spec.core_dtype or "float32")
    projected = [_project(b, x, heads * HEAD_DIM, dtype) for heads in (Q_HEADS, KV_HEADS, KV_HEADS)]
    q, k = (
        _quantized_norm_heads(b, spec, role, tensor, heads)
        if spec.norm_pairs == "input-rsqrt"
        else norm_heads(b, tensor, heads, attention, norm)
        for role, tensor, heads in (("q", projected[0], Q_HEADS), ("k", projected[1], KV_HEADS))
    )
    if spec.norm_pairs == "normalised" or spec.case == "normalised-read-again":
        q, k = (
            _fake_quantized(b, tensor, "int8", NORM_PAIR_RANGES[role][2] / QMAX["int8"], dtype)
            for role, tensor in (("q", q), ("k", k))
        )
        if spec.case == "normalised-read-again":
            b.output(k)
    tables = _Tables(b, spec, positions)
    for role, tensor in (("q", q), ("k", k)):
        if spec.case == "only-q" and role == "k":
            b.output(tensor)
            continue
        if spec.case == "extra-reader" and role == "k":
            b.output(tensor)
        frequency = 2.0 if spec.case == "other-cos" and role == "k" else 1.0
        rotated = _rotate(b, spec, tensor, tables, frequency)
        b.output(_quantized(b, spec, rotated) if spec.quant else rotated)
    b.output(projected[2])
    return b.model()


def _quantized_norm_heads(b: Builder, spec: RopeSpec, role: str, projected: str, heads: int) -> str:
    """OLMo2's norm over a whole projection as ModelOpt's INT8 writes it (`MatMul -> Q -> DQ -> norm`, a pair on its
    float32 inverse root), reshaped to heads and transposed: [B, heads, S, D]."""
    quantizer = Quantizer(b, QuantSpec(dtype=spec.dtype, rsqrt_pairs=True))
    input_range, rsqrt_range, _ = NORM_PAIR_RANGES[role]
    norm = NormSpec(dtype=spec.dtype, hidden=heads * HEAD_DIM)
    y = rsqrt_quantized_norm(b, quantizer, quantizer.fake(projected, input_range), norm, "float32", rsqrt_range)
    shape = b.constant([BATCH, SEQUENCE, heads, HEAD_DIM], "int64", base="shape")
    return b.op("Transpose", b.op("Reshape", y, shape), perm=[0, 2, 1, 3])


def _project(b: Builder, x: str, width: int, dtype: str) -> str:
    return b.op("MatMul", x, b.constant(b.rng.normal(0, HIDDEN**-0.5, (HIDDEN, width)), dtype, base="proj"))


class _Tables:
    """cos and sin of positions · inv_freq (scaled by `frequency`), made once per frequency: [Bc, 1, S, R] in the
    rotation's dtype for rotate-half, [Bc, S, R/2] (or a [MAX_POSITION, R/2] cache and position ids) for
    RotaryEmbedding."""

    def __init__(self, b: Builder, spec: RopeSpec, positions: str) -> None:
        self.b, self.spec, self.positions = b, spec, positions
        self.made: dict[float, tuple[str, str]] = {}
        self.position_ids: str | None = None

    @property
    def rotary_dim(self) -> int:
        return self.spec.rotary_dim or HEAD_DIM

    def pair(self, frequency: float) -> tuple[str, str]:
        if frequency not in self.made:
            self.made[frequency] = self._make(frequency)
        return self.made[frequency]

    def _make(self, frequency: float) -> tuple[str, str]:
        b, spec = self.b, self.spec
        half = self.rotary_dim // 2
        inv_freq = frequency / 10000.0 ** (np.arange(half) / half)
        if spec.spelling == "rotary-embedding" and spec.positions:
            angles = np.arange(MAX_POSITION)[:, None] * inv_freq[None, :]
            caches = (np.cos(angles), np.sin(angles))
            return tuple(
                b.constant(cache, spec.table_dtype or spec.dtype, base=name)
                for cache, name in zip(caches, ("cos", "sin"), strict=True)
            )
        column = b.op("Unsqueeze", self.positions, b.constant([-1], "int64", base="axes"))
        angles = b.op("Mul", column, b.constant(inv_freq, "float32", base="inv_freq"))
        if spec.spelling != "rotary-embedding":
            angles = b.op("Concat", angles, angles, axis=-1)
        dtype = spec.table_dtype or spec.dtype
        made = []
        for op in ("Cos", "Sin"):
            table = b.op(op, angles)
            table = table if dtype == "float32" else b.cast(table, dtype)
            if spec.spelling != "rotary-embedding":
                table = b.op("Unsqueeze", table, b.constant([1], "int64", base="axes"))
            made.append(table)
        return made[0], made[1]

    def ids(self) -> str:
        """The int64 position ids [B, S] a RotaryEmbedding with a cache reads."""
        if self.position_ids is None:
            self.b.inputs.append(helper.make_tensor_value_info("position_ids", TensorProto.INT64, [BATCH, SEQUENCE]))
            self.position_ids = "position_ids"
        return self.position_ids


def _rotate(b: Builder, spec: RopeSpec, tensor: str, tables: _Tables, frequency: float) -> str:
    """`tensor` [B, H, S, D] rotated as `spec` spells it."""
    cos, sin = tables.pair(frequency)
    rotary_dim = tables.rotary_dim
    if spec.spelling == "rotary-embedding":
        inputs = [tensor, cos, sin, *([tables.ids()] if spec.positions else [])]
        partial = {"rotary_embedding_dim": rotary_dim} if spec.rotary_dim else {}
        return b.op("RotaryEmbedding", *inputs, interleaved=int(spec.interleaved), **partial)
    turned, passed = tensor, None
    if spec.rotary_dim:
        turned, passed = _slice(b, tensor, 0, rotary_dim), _slice(b, tensor, rotary_dim, HEAD_DIM)
    half = rotary_dim // 2
    if spec.spelling == "rotate-half-shapes":
        width = b.op("Gather", b.op("Shape", turned), b.constant(-1, "int64", base="last"), axis=0)
        middle = b.op("Unsqueeze", b.op("Div", width, b.constant(2, "int64", base="two")), b.constant([0], "int64"))
        first = b.op("Slice", turned, b.constant([0], "int64"), middle, b.constant([-1], "int64"))
        second = b.op("Slice", turned, middle, b.constant([2**63 - 1], "int64"), b.constant([-1], "int64"))
    else:
        first, second = _slice(b, turned, 0, half), _slice(b, turned, half, rotary_dim)
    negated = b.op("Neg", second)
    halves = (first, negated) if spec.case == "swapped-halves" else (negated, first)
    partner = b.op("Concat", *halves, axis=-1)
    table_dtype = spec.table_dtype or spec.dtype
    if table_dtype != spec.dtype:
        turned, partner = b.cast(turned, table_dtype), b.cast(partner, table_dtype)
    products = [b.op("Mul", turned, cos), b.op("Mul", partner, sin)]
    if spec.case == "quantized-product":
        scale, zero = b.constant(0.05, table_dtype), b.constant(0, "int8")
        products[0] = b.op("DequantizeLinear", b.op("QuantizeLinear", products[0], scale, zero), scale, zero)
    if spec.case == "quantized-product-per-channel":
        scale = b.constant(np.full(rotary_dim, 0.02), table_dtype, base="scale")
        zero = b.constant(np.zeros(rotary_dim), "int8", base="zero_point")
        channels = b.op("QuantizeLinear", products[1], scale, zero, axis=-1)
        products = [_fake_quantized(b, products[0], "int8", 0.0271, table_dtype)]
        products.append(b.op("DequantizeLinear", channels, scale, zero, axis=-1))
    elif spec.products or spec.case == "quantized-product-read-again":
        products = [
            _fake_quantized(b, product, spec.products or "int8", scale, table_dtype)
            for product, scale in zip(products, PRODUCT_SCALES[spec.products or "int8"], strict=True)
        ]
    if spec.case == "quantized-product-read-again":
        b.output(products[1])
    out = b.op("Sub" if spec.case == "subtracted" else "Add", *products)
    if table_dtype != spec.dtype:
        out = b.cast(out, spec.dtype)
    if passed is not None:
        out = b.op("Concat", out, passed, axis=-1)
    return out


def _fake_quantized(b: Builder, tensor: str, quant: str, scale: float, dtype: str) -> str:
    """DQ(Q(tensor)) at a scale of `dtype`, zero point 0 of `quant`."""
    scale_name = b.constant(scale, dtype, base="scale")
    zero = helper.make_tensor(b.fresh("zero_point"), QUANT_TYPES[quant], [], [0])
    b.initializers.append(zero)
    return b.op("DequantizeLinear", b.op("QuantizeLinear", tensor, scale_name, zero.name), scale_name, zero.name)


def _slice(b: Builder, tensor: str, start: int, end: int) -> str:
    bounds = (b.constant([start], "int64"), b.constant([end], "int64"), b.constant([-1], "int64"))
    return b.op("Slice", tensor, *bounds)


def _quantized(b: Builder, spec: RopeSpec, tensor: str) -> str:
    """Q(tensor) -> DQ, as ModelOpt quantizes an attention input: the scale in the activations' dtype (float32 for
    bfloat16, which onnxruntime does not quantize)."""
    dtype = "float32" if spec.dtype == "bfloat16" else spec.dtype
    source = tensor if dtype == spec.dtype else b.cast(tensor, dtype)
    scale = b.constant(0.02 if spec.quant == "int8" else 0.005, dtype, base="scale")
    zero = b.constant(0, "int8", base="zero_point")
    if spec.quant != "int8":
        zero_point = helper.make_tensor(b.fresh("zero_point"), QUANT_TYPES[spec.quant], [], [0])
        b.initializers.append(zero_point)
        zero = zero_point.name
    return b.op("DequantizeLinear", b.op("QuantizeLinear", source, scale, zero), scale, zero)
