"""The QuantizeLinear (-> DequantizeLinear) pairs around a fused norm that its node takes in as quantizer stages
(contract.QuantStage; docs/patterns.md, "Quantized norms").

A quantizer the contract computes is a QuantizeLinear of the ONNX domain with a constant one-element scale (positive,
finite, a float32 value) and zero point 0 of FLOAT8E4M3FN or INT8, no blocked scale and no attribute beyond ONNX's;
for a fake-quant stage (input, rsqrt) the DequantizeLinear after it undoes exactly its rounding (`model.qdq`) and
gives back its input's dtype. The output stage takes a QuantizeLinear that is the norm's one real reader: Shape nodes
reading the unquantized y read the node's input instead, which has y's shape; any other reader keeps the
QuantizeLinear outside, with the reason (a quant near miss). The QuantizeLinear may read y through one layout op
(LAYOUT_OPS) that only it reads: an INT8 one is taken, the op then moving the node's codes; an FP8 one stays out.

The node divides by the scale in float32, as QuantizeLinear does up to opset 21 (onnxruntime divides a 16-bit input
in float32 there). From opset 23 QuantizeLinear divides in its `precision` attribute's dtype, by default its scale's
(onnxruntime 1.32 follows it): a quantizer whose division is 16-bit rounds the quotient to 16 bits first, which moves
codes one step where a quotient lies near a rounding boundary, so it stays outside with the reason (`division_dtype`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import onnx_graphsurgeon as gs
from onnx import TensorProto, helper

from trtfuse.contract import ACTIVATION_DTYPES, QK_NORM, QUANT_STAGES, Quantizer, QuantStage, quant_dtype_of_code
from trtfuse.fusion.patterns.matches import NearMiss, NormSearch, RmsNormMatch, TakenQuantizer
from trtfuse.fusion.patterns.queries import (
    cast_target,
    describe,
    dtype_name,
    look_through_lossless_casts,
    only_consumer,
    onnx_op,
    producer,
    qdq_mismatch,
    scalar_constant,
    unique,
)
from trtfuse.model.interface import elem_type_name

# QuantizeLinear's attributes up to opset 25; any other one means something the contract may not compute.
_KNOWN_ATTRIBUTES = ("axis", "saturate", "block_size", "output_dtype", "precision")
# The opset from which QuantizeLinear divides in its `precision` attribute's dtype, by default its scale's.
PRECISION_OPSET = 23
# Without a zero point and an output_dtype, QuantizeLinear quantizes to uint8.
_DEFAULT_CODE = TensorProto.UINT8
# Shape nodes read only y's shape: they stay correct on the node's input, which has it.
SHAPE_READER = "Shape"
# Ops that move elements without computing any (TensorRT imports each as one IShuffleLayer): a QuantizeLinear of
# one per-tensor scale and zero point 0 commutes with each exactly, Q(L(y)) = L(Q(y)), so a Q after one (DeepSeek-V3's
# kv latent: `view` -> Q in ModelOpt's exports) is the norm's output stage, L moving the node's quantized codes.
LAYOUT_OPS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Transpose")
LAYOUT_FP8 = (
    "a layout op moves INT8 codes only, as onnxruntime runs an FP8 Reshape or Transpose only from opset 21 and no FP8 "
    "Flatten, Squeeze or Unsqueeze, and TensorRT's Shuffle layer lists no FP8 in its 10.6 reference"
)


@dataclass(frozen=True)
class QdqPair:
    """A tensor computed as DQ(Q(a)): the QuantizeLinear (reading a, or a widened to float32: the contract quantizes
    float32(a)), the DequantizeLinear and, where the graph rounds the dequantized float32 value to a 16-bit dtype
    (a bfloat16 graph: onnxruntime quantizes no bfloat16), that Cast; the three are one DQ into the Cast's dtype."""

    quantize: gs.Node
    dequantize: gs.Node
    rounding: gs.Node | None = None

    @property
    def nodes(self) -> tuple[gs.Node, ...]:
        return (self.quantize, self.dequantize, *([self.rounding] if self.rounding is not None else []))

    @property
    def source(self) -> gs.Tensor:
        """a: what the QuantizeLinear reads, seen through widening Casts."""
        return look_through_lossless_casts(self.quantize.inputs[0])

    @property
    def text(self) -> str:
        return pair_text(self.quantize, self.dequantize)


def qdq_pair(tensor: gs.Tensor) -> QdqPair | None:
    """The pair `tensor` comes out of (through a Cast of the dequantized value), or None."""
    rounding = producer(tensor)
    if onnx_op(rounding) == "Cast" and rounding.inputs and cast_target(rounding) in ACTIVATION_DTYPES:
        pair = qdq_pair(rounding.inputs[0])
        return None if pair is None or pair.rounding is not None else replace(pair, rounding=rounding)
    dequantize = producer(tensor)
    if onnx_op(dequantize) != "DequantizeLinear" or not dequantize.inputs:
        return None
    quantize = producer(dequantize.inputs[0])
    if onnx_op(quantize) != "QuantizeLinear" or not quantize.inputs:
        return None
    return QdqPair(quantize, dequantize)


def pair_text(quantize: gs.Node, dequantize: gs.Node) -> str:
    return f"{describe(quantize)} -> {describe(dequantize)}"


def _elem_code(tensor: gs.Tensor) -> int | None:
    """The ONNX element type of a tensor graphsurgeon holds as a NumPy dtype or (float8, bfloat16) as the enum."""
    dtype = tensor.dtype
    if dtype is None or isinstance(dtype, int):
        return dtype or None
    try:
        return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    except (KeyError, TypeError, ValueError):
        return None


def _operand(node: gs.Node, index: int) -> gs.Tensor | None:
    if index >= len(node.inputs) or not node.inputs[index].name:
        return None
    return node.inputs[index]


def division_dtype(quantize: gs.Node, opset: int) -> str | None:
    """The dtype in which `quantize`, in a graph of `opset`, divides its input by its scale: float32 before
    PRECISION_OPSET, from it the `precision` attribute's dtype, by default the scale's (None where unknown)."""
    if opset < PRECISION_OPSET:
        return "float32"
    precision = int(quantize.attrs.get("precision", 0))
    if precision:
        return elem_type_name(precision)
    scale = _operand(quantize, 1)
    return None if scale is None else dtype_name(scale)


def quantizer_of(quantize: gs.Node, opset: int, dequantize: gs.Node | None = None) -> Quantizer | str:
    """The contract's quantizer `quantize` (and, for a fake-quant stage, `dequantize` after it) computes in a graph
    of `opset`, or why it is none (a sentence fragment)."""
    for name in quantize.attrs:
        if name not in _KNOWN_ATTRIBUTES:
            return f"its attribute {name!r} is not one of QuantizeLinear's ({', '.join(_KNOWN_ATTRIBUTES)})"
    if quantize.attrs.get("block_size", 0):
        return f"it quantizes in blocks of {quantize.attrs['block_size']}, not per tensor"
    source = quantize.inputs[0]
    if dtype_name(source) not in ACTIVATION_DTYPES:
        return f"it quantizes {source.name} of dtype {dtype_name(source) or 'unknown'}"
    scale_tensor = _operand(quantize, 1)
    scale = None if scale_tensor is None else scalar_constant(scale_tensor)
    if scale is None:
        shown = scale_tensor.name if scale_tensor is not None else "(none)"
        return f"its scale {shown} is not a one-element constant (a per-channel, blocked or computed scale)"
    if not (math.isfinite(scale) and scale > 0.0) or float(np.float32(scale)) != scale:
        return f"its scale {scale!r} is not a positive finite float32 value"
    division = division_dtype(quantize, opset)
    if division != "float32":
        how = "its precision attribute" if quantize.attrs.get("precision") else "its scale's dtype, with no precision"
        return (
            f"at opset {opset} it divides by its scale in {division or 'an unknown dtype'} ({how}), the fused node "
            "in float32"
        )
    zero_point = _operand(quantize, 2)
    if zero_point is None:
        code = int(quantize.attrs.get("output_dtype", 0)) or _DEFAULT_CODE
    else:
        if scalar_constant(zero_point) != 0.0:
            return f"its zero point {zero_point.name} is not a constant 0"
        code = _elem_code(zero_point) or 0
    dtype = quant_dtype_of_code(code)
    if dtype is None:
        shown = TensorProto.DataType.Name(code) if code else "an unknown type"
        return f"it quantizes to {shown}, not to FLOAT8E4M3FN or INT8"
    saturate = dtype == "int8" or bool(quantize.attrs.get("saturate", 1))
    if dequantize is None:
        return Quantizer(dtype, scale, saturate)
    if onnx_op(dequantize) != "DequantizeLinear":
        target = describe(dequantize) if dequantize is not None else "several readers"
        return f"it goes to {target}, not to one DequantizeLinear"
    mismatch = qdq_mismatch(quantize, dequantize)
    if mismatch is not None:
        return f"the pair is arithmetic, not a rounding ({mismatch})"
    return Quantizer(dtype, scale, saturate, dtype_name(dequantize.outputs[0]))


def fake_quant(stage: QuantStage, quantize: gs.Node, dequantize: gs.Node | None, opset: int) -> TakenQuantizer | str:
    """The pair as the quantizer of a fake-quant `stage` in a graph of `opset`, or why it is none. The rsqrt stage
    records the dtype its QuantizeLinear reads r in, seen through widening Casts: the dtype the graph last rounded r
    to (a Cast to 16 bits in front of the Q, or a root computed in 16 bits)."""
    quantizer = quantizer_of(quantize, opset, dequantize)
    if isinstance(quantizer, str):
        return quantizer
    if stage.rounds_input:
        quantizer = replace(quantizer, input_dtype=dtype_name(look_through_lossless_casts(quantize.inputs[0])))
    return TakenQuantizer(stage, quantizer, (quantize, dequantize))


def fake_quant_pair(stage: QuantStage, pair: QdqPair, opset: int) -> TakenQuantizer | str:
    """`pair`, with the Cast of its dequantized value where there is one, as the quantizer of `stage`."""
    taken = fake_quant(stage, pair.quantize, pair.dequantize, opset)
    if isinstance(taken, str) or pair.rounding is None:
        return taken
    if dtype_name(pair.dequantize.outputs[0]) != "float32":
        return f"{describe(pair.rounding)} rounds its {dtype_name(pair.dequantize.outputs[0])} value again"
    quantizer = replace(taken.quantizer, dequant_dtype=cast_target(pair.rounding))
    return replace(taken, quantizer=quantizer, nodes=pair.nodes)


def in_stage_order(quantizers: tuple[TakenQuantizer, ...]) -> tuple[TakenQuantizer, ...]:
    return tuple(sorted(quantizers, key=lambda taken: QUANT_STAGES.index(taken.stage)))


def _kept_out(quantize: gs.Node, norm: str, reason: str) -> NearMiss:
    return NearMiss(describe(quantize), f"not taken into the norm {norm}: {reason}")


def _output_quantizer(match: RmsNormMatch, graph_outputs: set[str], opset: int) -> TakenQuantizer | NearMiss | None:
    """The QuantizeLinear of the norm's output the node takes in; a near miss when one reads y (or a layout op's
    move of y) but stays out; None when none does."""
    y = match.y
    path, layout = _quantize_path(y, graph_outputs)
    if not path:
        return None
    quantize = path[-1]
    reader = layout or path[0]
    readers = [describe(node) for node in unique(y.outputs) if node is not reader and onnx_op(node) != SHAPE_READER]
    if y.name in graph_outputs:
        readers.append("a graph output")
    if readers:
        return _kept_out(quantize, match.name, f"{y.name} is also read by {', '.join(readers)}, unquantized")
    through = "" if layout is None else f"it reads {y.name} through {describe(layout)}, "
    if layout is not None:
        moved = layout.outputs[0]
        others = [describe(node) for node in unique(moved.outputs) if node is not path[0]]
        if moved.name in graph_outputs:
            others.append("a graph output")
        if others:
            reason = f"{through}whose output {moved.name} is also read by {', '.join(others)}, unquantized"
            return _kept_out(quantize, match.name, reason)
    quantizer = quantizer_of(quantize, opset)
    if isinstance(quantizer, str):
        return _kept_out(quantize, match.name, f"{through}{quantizer}")
    if layout is not None and quantizer.dtype != "int8":
        return _kept_out(quantize, match.name, f"{through}which would move FLOAT8E4M3FN codes: {LAYOUT_FP8}")
    return TakenQuantizer(QuantStage.OUTPUT, quantizer, (quantize, *path[:-1]), quantize.outputs[0], layout)


def _quantize_path(y: gs.Tensor, graph_outputs: set[str]) -> tuple[list[gs.Node], gs.Node | None]:
    """The QuantizeLinear reading y with the widening Casts before it (`widened_reader`) and the layout op reading
    y that the path starts after, if any; ([], None) when no QuantizeLinear reads y or one layout op's output."""
    path = widened_reader(y, graph_outputs)
    if path:
        return path, None
    for layout in y.outputs:
        if onnx_op(layout) in LAYOUT_OPS and layout.inputs[0] is y and len(layout.outputs) == 1:
            path = widened_reader(layout.outputs[0], graph_outputs)
            if path:
                return path, layout
    return [], None


def widened_reader(tensor: gs.Tensor, graph_outputs: set[str]) -> list[gs.Node]:
    """The first QuantizeLinear reading `tensor` (y, or a layout op's move of it), after the widening Casts between
    them that only it reads (the contract quantizes float32(y): a bfloat16 y goes to float32 for onnxruntime's
    QuantizeLinear), with those Casts; [] when none does."""
    for reader in tensor.outputs:
        path = [reader]
        while onnx_op(path[-1]) == "Cast" and look_through_lossless_casts(path[-1].outputs[0]) is tensor:
            following = only_consumer(path[-1].outputs[0], graph_outputs)
            if following is None:
                break
            path.append(following)
        quantized = path[-2].outputs[0] if len(path) > 1 else tensor
        if onnx_op(path[-1]) == "QuantizeLinear" and path[-1].inputs[0] is quantized:
            return path
    return []


def _input_pair(match: RmsNormMatch, graph_outputs: set[str], opset: int) -> TakenQuantizer | NearMiss | None:
    """The pair on a plain norm's x (x = DQ(Q(a)): the node then reads a), when the norm is its dequantized value's
    only reader; None when x is no such pair's output."""
    pair = qdq_pair(match.x)
    if pair is None or match.skip_inputs or dtype_name(pair.source) != dtype_name(match.x):
        return None
    inside = {id(node) for node in match.nodes}
    readers = [describe(node) for node in match.x.outputs if id(node) not in inside]
    if match.x.name in graph_outputs:
        readers.append("a graph output")
    if readers:
        reason = f"{match.x.name} is also read by {', '.join(readers)}; the node reads the dequantized x"
        return _kept_out(pair.quantize, match.name, reason)
    taken = fake_quant_pair(QuantStage.INPUT, pair, opset)
    return _kept_out(pair.quantize, match.name, taken) if isinstance(taken, str) else taken


def _with_quantizers(match: RmsNormMatch, graph_outputs: set[str], opset: int, misses: list[NearMiss]) -> RmsNormMatch:
    """`match` with its input pair and output QuantizeLinear taken in where it may take them."""
    taken = list(match.quantizers)
    x = match.x
    for found in (_input_pair(match, graph_outputs, opset), _output_quantizer(match, graph_outputs, opset)):
        if isinstance(found, NearMiss):
            misses.append(found)
        elif found is not None:
            taken.append(found)
            if found.stage is QuantStage.INPUT:
                x = look_through_lossless_casts(found.quantize.inputs[0])
    if len(taken) == len(match.quantizers):
        return match
    return replace(match, x=x, quantizers=in_stage_order(tuple(taken)))


def take_quantizers(search: NormSearch, graph_outputs: set[str], opset: int) -> None:
    """Give every fused norm of `search` the quantizers around it that its node may take in a graph of `opset`;
    record in `search.quant_near_misses` each QuantizeLinear at a fused norm that stays outside, with the reason.
    In place."""
    misses: list[NearMiss] = []
    search.matches = [_with_quantizers(match, graph_outputs, opset, misses) for match in search.matches]
    for add in search.add_norms:
        found = _output_quantizer(add.norm, graph_outputs, opset)
        if isinstance(found, NearMiss):
            misses.append(found)
        elif found is not None:
            add.norm = replace(add.norm, quantizers=in_stage_order((*add.norm.quantizers, found)))
    for pair in search.qk_norm_pairs:
        # Each norm's quantizers as a plain norm's, each in its part's own stage of the QK-norm (q_rsqrt, k_output...).
        for part, role in enumerate(("q", "k")):
            match = _with_quantizers(getattr(pair, role), graph_outputs, opset, misses)
            taken = tuple(
                replace(quantizer, stage=_part_stage(part, quantizer.stage)) for quantizer in match.quantizers
            )
            setattr(pair, role, replace(match, quantizers=taken))
    search.quant_near_misses = misses


def _part_stage(part: int, stage: QuantStage) -> QuantStage:
    """The QK-norm's stage that is `stage` of part `part`'s norm."""
    return next(own for own in QK_NORM.part_stages[part] if own.norm_stage is stage)
