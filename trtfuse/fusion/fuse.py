"""The fusion pass on an in-memory model: shape inference, find the norms, rewrite them, export."""

from __future__ import annotations

from dataclasses import dataclass

import onnx
import onnx_graphsurgeon as gs
from onnx import helper
from onnx_graphsurgeon.logger import G_LOGGER

from trtfuse import contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.fusion.patterns import NormSearch, find_norms
from trtfuse.fusion.rewrite import FusedNode, rewrite


@dataclass
class FuseResult:
    """The fused model, one record per fused node, and everything the matcher found or rejected."""

    model: onnx.ModelProto
    fused: list[FusedNode]
    search: NormSearch

    def report(self) -> dict:
        """The JSON report: one entry per fused node, totals per node kind, and the rejected candidates."""
        totals = {op: sum(node.kind == op for node in self.fused) for op in contract.FUSED_OPS}
        return {
            "fused": [node.as_dict() for node in self.fused],
            "totals": {**totals, "norms": sum(contract.OPS[op].norm_calls * count for op, count in totals.items())},
            "near_misses": [{"node": miss.node, "reason": miss.reason} for miss in self.search.near_misses],
        }


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """The model as an onnx-graphsurgeon graph with every shape that ONNX shape inference can work out."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as error:
        raise TrtfuseError(f"shape inference failed: {first_line(error)}") from None
    # graphsurgeon warns on stdout about every bfloat16 constant (numpy has no such dtype); the graph is right anyway.
    with G_LOGGER.suppress(G_LOGGER.ERROR):
        graph = gs.import_onnx(inferred)
    _keep_overridable(model, graph)
    return graph


def _overridable(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    """Initializers also listed as graph inputs (IR >= 4): defaults a user may feed another value for."""
    if model.ir_version < 4:
        return []
    inputs = {value.name for value in model.graph.input}
    return [tensor for tensor in model.graph.initializer if tensor.name in inputs]


def _keep_overridable(model: onnx.ModelProto, graph: gs.Graph) -> None:
    """graphsurgeon imports an overridable initializer as a constant: make it an input again, so nothing folds it."""
    overridable = _overridable(model)
    if not overridable:
        return
    tensors = graph.tensors()
    for tensor in overridable:
        constant = tensors.get(tensor.name)
        if not isinstance(constant, gs.Constant):
            continue
        variable = gs.Variable(tensor.name, dtype=constant.dtype, shape=list(constant.shape))
        for node in list(constant.outputs):
            for index, operand in enumerate(node.inputs):
                if operand is constant:
                    node.inputs[index] = variable
        tensors[tensor.name] = variable
    kept = [tensors.get(value.name) for value in model.graph.input]
    graph.inputs = [tensor for tensor in kept if isinstance(tensor, gs.Variable)]


def search_model(model: onnx.ModelProto) -> NormSearch:
    """Every norm candidate of the model, matched or rejected, without changing it."""
    return find_norms(import_graph(model))


def fuse_model(model: onnx.ModelProto) -> FuseResult:
    """Replace every RMSNorm and QK-norm of `model` by a plugin node; `model` itself is left unchanged."""
    graph = import_graph(model)
    search = find_norms(graph)
    fused = rewrite(graph, search)
    with G_LOGGER.suppress(G_LOGGER.ERROR):
        exported = gs.export_onnx(graph, opset_imports=graph.import_domains)
    exported.ir_version = model.ir_version
    if model.ir_version < 4:
        # IR 3 requires every initializer to be a graph input too; graphsurgeon's export lists none.
        listed = {value.name for value in exported.graph.input}
        exported.graph.input.extend(
            helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
            for tensor in exported.graph.initializer
            if tensor.name not in listed
        )
    inputs = {value.name for value in exported.graph.input}
    exported.graph.initializer.extend(tensor for tensor in _overridable(model) if tensor.name in inputs)
    _restore_sparse_attributes(model, exported)
    _keep_declared_types(model, exported)
    for field in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(exported, field, getattr(model, field))
    exported.metadata_props.extend(model.metadata_props)
    return FuseResult(model=exported, fused=fused, search=search)


def _keep_declared_types(model: onnx.ModelProto, exported: onnx.ModelProto) -> None:
    """Graph inputs and outputs keep the types the model declares: shape inference may have replaced a named dim
    (`batch`) by one of its own (`unk__108`) or a number, which would change the model's interface. The fused nodes
    have their inputs' dtypes and shapes, so a declaration that still has the same element type and rank holds. One
    that declares no type (onnxruntime infers it) stays without one."""
    declared = {value.name: value.type for value in (*model.graph.input, *model.graph.output)}
    for value in (*exported.graph.input, *exported.graph.output):
        original = declared.get(value.name)
        if original is not None and original.WhichOneof("value") is None:
            value.ClearField("type")
            continue
        if original is None or not original.HasField("tensor_type") or not value.type.HasField("tensor_type"):
            continue
        same_dtype = original.tensor_type.elem_type == value.type.tensor_type.elem_type
        original_rank = len(original.tensor_type.shape.dim) if original.tensor_type.HasField("shape") else None
        rank = len(value.type.tensor_type.shape.dim) if value.type.tensor_type.HasField("shape") else None
        if same_dtype and (original_rank is None or rank is None or original_rank == rank):
            value.type.CopyFrom(original)


def _restore_sparse_attributes(model: onnx.ModelProto, exported: onnx.ModelProto) -> None:
    """graphsurgeon's export drops sparse-tensor attributes (a `Constant` with `sparse_value` comes out empty): put
    them back on the node that makes the same output."""
    sparse = {
        node.output[0]: [
            attribute for attribute in node.attribute if attribute.type == onnx.AttributeProto.SPARSE_TENSOR
        ]
        for node in model.graph.node
        if node.output
    }
    for node in exported.graph.node:
        attributes = sparse.get(node.output[0] if node.output else "", [])
        present = {attribute.name for attribute in node.attribute}
        node.attribute.extend(attribute for attribute in attributes if attribute.name not in present)
