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
"""

from __future__ import annotations

from collections.abc import Mapping

import onnx
from onnx import TensorProto, external_data_helper, helper, numpy_helper

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


def widen_to_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of `model` computing the same ops on the same weights in float32, activation Q/DQ pairs removed and
    activations quantized on the fly left unrounded."""
    widened = onnx.ModelProto()
    widened.CopyFrom(model)
    _widen_graph(widened.graph)
    compute_activations_unrounded(widened.graph)
    for function in widened.functions:
        _widen_nodes(function.node)
        _drop_activation_quantization(function.node, set(function.output), {})
    return widened


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


def _widen_graph(graph: onnx.GraphProto) -> None:
    for value in [*graph.input, *graph.output]:
        _widen_value(value)
    # Recorded types of intermediate values would contradict the widened ops; onnxruntime infers them again.
    del graph.value_info[:]
    _widen_nodes(graph.node)
    _widen_initializers(graph)
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
