"""The original graph's arithmetic in float32: the yardstick `check` and `compare` measure 16-bit and quantized models
against.

A 16-bit or quantized model differs from any other evaluation of itself by its own rounding: a fused norm that rounds
once where the original rounded three times, or one ulp that flips a quantization step, changes the output by as much
as the original's own error. Judging the fused model against the original alone would blame the fusion for that; a
float32 evaluation of the same ops on the same weights tells which of the two is closer to what the graph means.

`widen_to_float32` keeps every op and every weight value; it changes only where values are rounded: float16 and
bfloat16 inputs, outputs, weights, casts and constants become float32 (weights in external data through a Cast), and
an activation QuantizeLinear -> DequantizeLinear pair that only rounds (a rounding of a computed value, not of a
stored weight; `model.qdq`) becomes an identity, while one that rescales or shifts stays, and an op that quantizes
its activations on the fly computes them unrounded (`verify.dynamic_quantization`). Quantized weights stay as stored,
since their float values are all the model has.

`check` judges each fused node against another evaluation (`keep_quantizers`): the original's own ops from the
tensors the node reads to those it replaces, in float32 with every QuantizeLinear and DequantizeLinear kept, each Q
reading its input rounded as the graph last rounded it and each DQ's value rounded as the graph rounds it. The
quantizers are the graph's own rounding points, which a fused node reproduces (docs/plugin-nodes.md); between them
the evaluation computes in float32 as the node does, so a value near a quantizer's rounding boundary lands on the
side the node's lands on, and the original's own 16-bit rounding is what the evaluation measures.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

from trtfuse.model.interface import value_types
from trtfuse.model.qdq import QdqOperand, pair_difference
from trtfuse.verify.dynamic_quantization import compute_activations_unrounded

NARROW_FLOATS = frozenset({TensorProto.FLOAT16, TensorProto.BFLOAT16})
# Cast targets that round a computed value; float8 casts appear in fp8 exports outside Q/DQ.
_NARROW_CAST_TARGETS = NARROW_FLOATS | {
    TensorProto.FLOAT8E4M3FN,
    TensorProto.FLOAT8E4M3FNUZ,
    TensorProto.FLOAT8E5M2,
    TensorProto.FLOAT8E5M2FNUZ,
}
QUANTIZATION_OPS = frozenset(
    {
        "QuantizeLinear",
        "DequantizeLinear",
        "DynamicQuantizeLinear",
        "DynamicQuantizeMatMul",
        "MatMulIntegerToFloat",
        "MatMulNBits",
        "MatMulInteger",
        "QLinearMatMul",
        "QLinearConv",
    }
)
# Attributes naming the dtype an op produces.
_DTYPE_ATTRIBUTES = ("to", "dtype", "output_dtype")


def is_reduced_precision(model: onnx.ModelProto) -> bool:
    """Whether the model rounds computed values to 16-bit floats or quantizes them anywhere: in its interface, its
    tensors and constants, its casts or its ops (subgraphs and functions included)."""
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    if any(value.type.tensor_type.elem_type in NARROW_FLOATS for value in values):
        return True
    return any(_node_is_reduced(node) for node in _all_nodes(model)) or any(
        tensor.data_type in NARROW_FLOATS for tensor in graph.initializer
    )


def widen_to_float32(model: onnx.ModelProto, keep_quantizers: bool = False) -> onnx.ModelProto:
    """A copy of `model` computing the same ops on the same weights in float32, activation Q/DQ pairs removed and
    activations quantized on the fly left unrounded; with `keep_quantizers`, every QuantizeLinear and
    DequantizeLinear kept, rounded where the graph rounds their values (`_QuantizerRoundings`)."""
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    roundings = _QuantizerRoundings.of(model) if keep_quantizers else None
    _widen_graph(widened.graph, drop_quantization=not keep_quantizers)
    if roundings is not None:
        roundings.insert(widened.graph)
    else:
        compute_activations_unrounded(widened.graph)
    for function in widened.functions:
        _widen_nodes(function.node)
        if not keep_quantizers:
            _drop_activation_quantization(function.node, set(function.output), {})
    return widened


# A Cast to float32 of a float32 or 16-bit float value changes no value: the value it reads is rounded as it is.
_LOSSLESS_TO_FLOAT32 = NARROW_FLOATS | {TensorProto.FLOAT}


@dataclass(frozen=True)
class _QuantizerRoundings:
    """Where the graph rounds the values its quantizers read and write, by tensor: the 16-bit dtype each
    QuantizeLinear's input was last rounded to (seen through Casts to float32), and the 16-bit dtype each
    DequantizeLinear's value is rounded to (its own output's, or that of the one Cast that reads it)."""

    quantizer_inputs: Mapping[str, int]
    dequantized: Mapping[str, int]

    @classmethod
    def of(cls, model: onnx.ModelProto) -> _QuantizerRoundings:
        _, types = value_types(model)
        graph = model.graph
        producers = {output: node for node in graph.node for output in node.output}
        readers: dict[str, list[onnx.NodeProto]] = {}
        for node in graph.node:
            for name in node.input:
                readers.setdefault(name, []).append(node)
        quantizer_inputs, dequantized = {}, {}
        for node in graph.node:
            if node.op_type == "QuantizeLinear" and node.input:
                rounded = _last_rounded(node.input[0], producers, types)
                if types.get(rounded) in NARROW_FLOATS:
                    quantizer_inputs[node.input[0]] = types[rounded]
            elif node.op_type == "DequantizeLinear" and node.output:
                value = node.output[0]
                following = readers.get(value, [])
                if types.get(value) in NARROW_FLOATS:
                    dequantized[value] = types[value]
                elif len(following) == 1 and following[0].op_type == "Cast":
                    target = helper.get_node_attr_value(following[0], "to")
                    if target in NARROW_FLOATS:
                        dequantized[value] = target
        return cls(quantizer_inputs, dequantized)

    def insert(self, graph: onnx.GraphProto) -> None:
        """In the widened `graph`: a rounding (a Cast to the dtype and back) in front of each QuantizeLinear's input
        and after each DequantizeLinear's value."""
        nodes: list[onnx.NodeProto] = []
        rounded: dict[str, str] = {}
        for node in graph.node:
            if node.op_type == "QuantizeLinear" and node.input and node.input[0] in self.quantizer_inputs:
                value = node.input[0]
                if value not in rounded:
                    rounded[value] = f"{value}/rounded"
                    nodes += _rounding(value, rounded[value], self.quantizer_inputs[value])
                node.input[0] = rounded[value]
            nodes.append(node)
            if node.op_type == "DequantizeLinear" and node.output and node.output[0] in self.dequantized:
                value = node.output[0]
                node.output[0] = f"{value}/unrounded"
                nodes += _rounding(node.output[0], value, self.dequantized[value])
        del graph.node[:]
        graph.node.extend(nodes)


def _last_rounded(tensor: str, producers: Mapping[str, onnx.NodeProto], types: Mapping[str, int]) -> str:
    """`tensor`, or the value it is a Cast to float32 of (through any number of them)."""
    cast = producers.get(tensor)
    while (
        cast is not None
        and cast.op_type == "Cast"
        and helper.get_node_attr_value(cast, "to") == TensorProto.FLOAT
        and types.get(cast.input[0]) in _LOSSLESS_TO_FLOAT32
    ):
        tensor = cast.input[0]
        cast = producers.get(tensor)
    return tensor


def _rounding(value: str, output: str, dtype: int) -> list[onnx.NodeProto]:
    """`value` (float32) rounded to `dtype` and back to float32, into `output`."""
    narrow = f"{output}/{TensorProto.DataType.Name(dtype).lower()}"
    return [
        helper.make_node("Cast", [value], [narrow], to=dtype, name=narrow),
        helper.make_node("Cast", [narrow], [output], to=TensorProto.FLOAT, name=f"{output}/float32"),
    ]


def _all_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    nodes = []
    graphs = [model.graph]
    while graphs:
        graph = graphs.pop()
        for node in graph.node:
            nodes.append(node)
            graphs.extend(_subgraphs(node))
    for function in model.functions:
        nodes.extend(function.node)
    return nodes


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for attribute in node.attribute:
        if attribute.HasField("g"):
            graphs.append(attribute.g)
        graphs.extend(attribute.graphs)
    return graphs


def _node_is_reduced(node: onnx.NodeProto) -> bool:
    if node.op_type in QUANTIZATION_OPS:
        return True
    for attribute in node.attribute:
        if _names_narrow_dtype(attribute):
            return True
        if attribute.HasField("t") and attribute.t.data_type in NARROW_FLOATS:
            return True
    return False


def _names_narrow_dtype(attribute: onnx.AttributeProto) -> bool:
    return (
        attribute.name in _DTYPE_ATTRIBUTES
        and attribute.type == onnx.AttributeProto.INT
        and attribute.i in _NARROW_CAST_TARGETS
    )


def _widen_graph(graph: onnx.GraphProto, drop_quantization: bool = True) -> None:
    for value in [*graph.input, *graph.output]:
        _widen_value(value)
    # Recorded types of intermediate values would contradict the widened ops; onnxruntime infers them again.
    del graph.value_info[:]
    _widen_nodes(graph.node)
    _widen_initializers(graph)
    if drop_quantization:
        _drop_activation_quantization(
            graph.node, {value.name for value in graph.output}, {tensor.name: tensor for tensor in graph.initializer}
        )


def _widen_initializers(graph: onnx.GraphProto) -> None:
    """A 16-bit initializer held in the model becomes float32; one in external data (which the check never reads)
    stays as stored under a new name, and a Cast to float32 gives its old name the same values.

    Each Cast goes just before the first node that reads its tensor: onnxruntime's priority-based order
    (`verify.onnxrt.onnxruntime_session`) then makes each float32 copy when it is needed, where Casts at the front of
    the graph made every weight's copy at once (twice the 16-bit weights' bytes, alive together)."""
    inputs = {value.name for value in graph.input}
    casts: dict[str, onnx.NodeProto] = {}
    for tensor in graph.initializer:
        if tensor.data_type not in NARROW_FLOATS:
            continue
        # An initializer listed as a graph input may be fed instead, under its own name and as float32.
        if tensor.name in inputs or not external_data_helper.uses_external_data(tensor):
            tensor.CopyFrom(_widen_tensor(tensor))
            continue
        stored = f"{tensor.name}/stored"
        casts[tensor.name] = helper.make_node(
            "Cast", [stored], [tensor.name], to=TensorProto.FLOAT, name=f"{stored}/widen"
        )
        tensor.name = stored
    placed = []
    for node in graph.node:
        placed.extend(casts.pop(name) for name in sorted(_names_read(node)) if name in casts)
        placed.append(node)
    # A widened tensor no node reads (a graph output, say) is cast first, as before.
    nodes = [*casts.values(), *placed]
    del graph.node[:]
    graph.node.extend(nodes)


def _names_read(node: onnx.NodeProto) -> set[str]:
    """The values `node` reads: its inputs and those of the nodes of its subgraphs."""
    names = set(node.input)
    for subgraph in _subgraphs(node):
        for inner in subgraph.node:
            names |= _names_read(inner)
    return names


def _widen_value(value: onnx.ValueInfoProto) -> None:
    if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type in NARROW_FLOATS:
        value.type.tensor_type.elem_type = TensorProto.FLOAT


def _widen_tensor(tensor: onnx.TensorProto) -> onnx.TensorProto:
    # 16-bit floats are exactly representable in float32: the weights keep their values.
    return numpy_helper.from_array(numpy_helper.to_array(tensor).astype("float32"), tensor.name)


def _widen_nodes(nodes: list[onnx.NodeProto]) -> None:
    for node in nodes:
        for attribute in node.attribute:
            if _names_narrow_dtype(attribute) and node.op_type not in QUANTIZATION_OPS:
                attribute.i = TensorProto.FLOAT
            if attribute.HasField("t") and attribute.t.data_type in NARROW_FLOATS:
                attribute.t.CopyFrom(_widen_tensor(attribute.t))
            if attribute.HasField("g"):
                _widen_graph(attribute.g)
            for subgraph in attribute.graphs:
                _widen_graph(subgraph)


def _qdq_operand(
    node: onnx.NodeProto,
    index: int,
    producers: Mapping[str, onnx.NodeProto],
    initializers: Mapping[str, onnx.TensorProto],
) -> QdqOperand:
    """A scale or zero point of `node` with its values where an inline initializer or Constant node holds them."""
    name = node.input[index] if index < len(node.input) else ""
    if not name:
        return QdqOperand("")
    tensor = initializers.get(name)
    constant = producers.get(name)
    if tensor is None and constant is not None and constant.op_type == "Constant":
        tensor = next((entry.t for entry in constant.attribute if entry.name == "value"), None)
    if tensor is None or external_data_helper.uses_external_data(tensor):
        return QdqOperand(name)
    return QdqOperand(name, helper.tensor_dtype_to_np_dtype(tensor.data_type).name, numpy_helper.to_array(tensor))


def _drop_activation_quantization(
    nodes: list[onnx.NodeProto], graph_outputs: set[str], initializers: Mapping[str, onnx.TensorProto]
) -> None:
    """DequantizeLinear(QuantizeLinear(x)) becomes Identity(x) where the pair is a rounding and nothing more
    (`model.qdq`); a pair that rescales or shifts stays, as the arithmetic it is. A QuantizeLinear left without
    consumers goes."""
    producers = {output: node for node in nodes for output in node.output}
    for node in nodes:
        if node.op_type != "DequantizeLinear" or not node.input:
            continue
        producer = producers.get(node.input[0])
        if producer is None or producer.op_type != "QuantizeLinear" or not producer.input:
            continue
        operands = [
            [_qdq_operand(quantize, index, producers, initializers) for quantize in (producer, node)]
            for index in (1, 2)
        ]
        # axis and block_size, the only attributes the rule reads, are ints.
        attributes = tuple(
            {entry.name: entry.i for entry in pair.attribute if entry.type == onnx.AttributeProto.INT}
            for pair in (producer, node)
        )
        if pair_difference(tuple(operands[0]), tuple(operands[1]), attributes) is not None:
            continue
        replacement = helper.make_node("Identity", [producer.input[0]], [node.output[0]], name=node.name)
        node.CopyFrom(replacement)
    consumed = {name for node in nodes for name in node.input} | graph_outputs
    for subgraph_node in nodes:
        for graph in _subgraphs(subgraph_node):
            consumed.update(name for inner in graph.node for name in inner.input)
    kept = [
        node for node in nodes if node.op_type != "QuantizeLinear" or any(output in consumed for output in node.output)
    ]
    del nodes[:]
    nodes.extend(kept)
