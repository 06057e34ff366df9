"""Shapes the matcher may trust: inferred from the graph's inputs and constants alone, never from its value_info.

An exporter's or optimiser's value_info can be stale (a shape left over from before a rewrite) or absent; a hidden
size read from it could make a fused node normalise the wrong number of elements. So the matcher infers every shape
again from a copy of the graph without value_info, whose large constants become typed inputs (their shapes are what
inference needs, never their values).
"""

from __future__ import annotations

import math

import onnx
import onnx_graphsurgeon as gs
from onnx import helper
from onnx_graphsurgeon.exporters.onnx_exporter import OnnxExporter, update_import_domains
from onnx_graphsurgeon.ir.tensor import SparseValues
from onnx_graphsurgeon.logger import G_LOGGER

from trtfuse.fusion.patterns.queries import MAX_READ_ELEMENTS, constant_shape

Shape = tuple[int | str | None, ...]
# The prefix of the symbols ONNX shape inference makes up for a dim it cannot name (`unk__84`): a fresh one each time,
# so two of them say nothing about whether the dims are equal.
INVENTED_SYMBOL = "unk__"


def provable_dim(dim: int | str | None) -> int | str | None:
    """The dim as far as it says anything: a static length, or a symbol the model named; None for an unknown dim or
    one inference made up."""
    if isinstance(dim, str) and dim.startswith(INVENTED_SYMBOL):
        return None
    return dim


def _skeleton(graph: gs.Graph) -> onnx.ModelProto:
    """The graph as a model without value_info, its large constants replaced by inputs of the same type and shape."""
    inputs = [OnnxExporter.export_value_info_proto(tensor, do_type_check=False) for tensor in graph.inputs]
    initializers = []
    for tensor in graph.tensors().values():
        if not isinstance(tensor, gs.Constant):
            continue
        if isinstance(tensor._values, SparseValues) or math.prod(tensor.shape) > MAX_READ_ELEMENTS:
            inputs.append(OnnxExporter.export_value_info_proto(tensor, do_type_check=False))
        else:
            initializers.append(OnnxExporter.export_tensor_proto(tensor))
    # An output no node makes (a graph input or a constant passed through) keeps its type: declared untyped, it would
    # hide the input's type from inference, and so every shape computed from it.
    declared = {value.name for value in (*inputs, *initializers)}
    outputs = [
        OnnxExporter.export_value_info_proto(tensor, do_type_check=False)
        if tensor.name in declared
        else helper.make_tensor_value_info(tensor.name, 0, None)
        for tensor in graph.outputs
    ]
    nodes = []
    for node in graph.nodes:
        if node.op == "Constant" and not node.attrs and node.outputs:
            # graphsurgeon drops a `sparse_value` attribute; a Constant without one would fail inference for the
            # whole graph. Its output keeps the type ONNX inferred on import: a typed input in its place.
            inputs.append(OnnxExporter.export_value_info_proto(node.outputs[0], do_type_check=False))
            continue
        nodes.append(OnnxExporter.export_node(node))
    model = helper.make_model(
        helper.make_graph(nodes, "skeleton", inputs, outputs, initializers),
        opset_imports=update_import_domains(graph),
        ir_version=10,
    )
    model.functions.extend(OnnxExporter.export_function(function) for function in graph.functions)
    return model


def _shape_of(value: onnx.ValueInfoProto) -> Shape | None:
    tensor_type = value.type.tensor_type
    if not tensor_type.HasField("shape"):
        return None
    return tuple(
        dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in tensor_type.shape.dim
    )


class Shapes:
    """The trusted shape of every tensor: constants' own shapes, and what inference derives for the rest."""

    def __init__(self, graph: gs.Graph) -> None:
        self.known: dict[str, Shape] = {}
        try:
            with G_LOGGER.suppress(G_LOGGER.CRITICAL):
                inferred = onnx.shape_inference.infer_shapes(_skeleton(graph), data_prop=True)
        except Exception:
            # Inference failed on this graph: nothing is known, so no decomposed norm has a provable hidden size.
            return
        values = [*inferred.graph.input, *inferred.graph.value_info, *inferred.graph.output]
        self.known = {value.name: shape for value in values if (shape := _shape_of(value)) is not None}

    def of(self, tensor: gs.Tensor) -> Shape | None:
        shape = constant_shape(tensor)
        return shape if shape is not None else self.known.get(tensor.name)

    def rank(self, tensor: gs.Tensor) -> int | None:
        shape = self.of(tensor)
        return None if shape is None else len(shape)

    def last_dim(self, tensor: gs.Tensor) -> int | None:
        """The static length of the last axis, or None when it is symbolic, unknown or not positive."""
        shape = self.of(tensor)
        if not shape or not isinstance(shape[-1], int) or shape[-1] <= 0:
            return None
        return shape[-1]
