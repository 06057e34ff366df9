"""A fused model's rotary nodes held to the contract's shape rule (`contract.rotary_shapes`) at the shapes a caller
feeds, before onnxruntime runs their lowering. The codec reads a node's fields alone and `fusion.fused_nodes` its
declared shapes, whose token axis is symbolic where the tables' is: a node whose layout was flipped reads its heads as
its tokens, which only concrete shapes show. Without this, onnxruntime's broadcast error inside the lowered rotation
is all a user would see.

The shapes come from ONNX shape inference on the lowered model with the fed inputs' shapes; a tensor whose shape it
cannot make concrete is left unchecked (the tables, computed from the positions, often are)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import onnx

from trtfuse.contract.rotary_shapes import table_batch, token_extents
from trtfuse.fusion.fused_nodes import PluginNode, TensorTypes, check_output_shapes, plugin_nodes
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.model.onnx_file import LoadedModel

Shapes = Mapping[str, tuple[int, ...]]


def check_rotary_shapes(fused: LoadedModel, feeds: Iterable[Shapes]) -> None:
    """Every plugin node of `fused` read (`fusion.fused_nodes.plugin_nodes`), and each rotary node's q, k, cos and
    sin fitting its layout at every one of `feeds` (each input's shape by name: `feed_shapes` of a feed); one
    TrtfuseError line naming the node and the inputs otherwise."""
    rotary = [node for node in plugin_nodes(fused.model, fused.path) if node.fields.rotary is not None]
    if not rotary:
        return
    lowered = lower_fused_nodes(fused.model, fused.path)
    declared = TensorTypes(fused.model)
    fed_shapes = {tuple(sorted((name, tuple(shape)) for name, shape in feed.items())) for feed in feeds}
    for fed in fed_shapes:
        shapes = _inferred_shapes(lowered, dict(fed))
        for node in rotary:
            _check_node(node, shapes, declared)


def feed_shapes(feed: Mapping[str, np.ndarray]) -> Shapes:
    """Each input's shape in `feed`."""
    return {name: array.shape for name, array in feed.items()}


def _check_node(node: PluginNode, shapes: Shapes, declared: TensorTypes) -> None:
    rotary = node.fields.rotary
    activations, tables = node.activations, node.tables
    if not all(name in shapes for name in activations):
        return
    batch, tokens = token_extents(rotary, node.where, activations, [shapes[name] for name in activations])
    if all(name in shapes for name in tables):
        table_batch(rotary, node.where, tables, [shapes[name] for name in tables], batch, tokens)
    check_output_shapes(node, _FedDims(declared, shapes, node))


class _FedDims:
    """Dims at the fed shapes, for `fusion.fused_nodes.check_output_shapes`: an activation's concrete shape, and
    an output's declared dims with each symbol its part's activation's declared dims share taken at its fed size. A
    token-major [B, S, H, D] node with its output_layout flipped keeps its outputs' rank, and their declared dims are
    symbols ([B', H, S', D]): only the sizes the fed shapes give those symbols show the heads where its tokens go.
    The sizes come from the output's own part alone, and a symbol they give two sizes stands for none: some
    exporters write one placeholder for every unknown dim (ModelOpt's AutoCast declares q, k and their rotations
    `[batch, unk, sequence, unk]`, heads and head dim alike), which q's heads would otherwise size in k's output."""

    def __init__(self, declared: TensorTypes, shapes: Shapes, node: PluginNode) -> None:
        self._declared = declared
        self._fed = {name: tuple(shapes[name]) for name in node.activations}
        self._sizes = {
            output: _symbol_sizes(declared.dims(activation), self._fed[activation])
            for output, activation in node.output_activations
        }

    def dims(self, tensor: str) -> tuple[int | str | None, ...] | None:
        if tensor in self._fed:
            return self._fed[tensor]
        dims, sizes = self._declared.dims(tensor), self._sizes.get(tensor, {})
        return None if dims is None else tuple(sizes.get(dim, dim) if isinstance(dim, str) else dim for dim in dims)


def _symbol_sizes(dims: tuple[int | str | None, ...] | None, shape: tuple[int, ...]) -> dict[str, int]:
    """The size `shape` gives each symbol of `dims` (an activation's declared dims), but a symbol given two."""
    sizes: dict[str, set[int]] = {}
    if dims is not None and len(dims) == len(shape):
        for dim, size in zip(dims, shape, strict=True):
            if isinstance(dim, str):
                sizes.setdefault(dim, set()).add(size)
    return {dim: found.pop() for dim, found in sizes.items() if len(found) == 1}


def _inferred_shapes(lowered: onnx.ModelProto, fed: Shapes) -> Shapes:
    """Every tensor's shape where shape inference makes it concrete with the graph inputs `fed` those shapes; none
    where it fails."""
    sized = onnx.ModelProto()
    sized.CopyFrom(lowered)
    del sized.graph.value_info[:]
    for output in sized.graph.output:
        output.type.tensor_type.ClearField("shape")
    for value in sized.graph.input:
        shape = fed.get(value.name)
        if shape is None or len(shape) != len(value.type.tensor_type.shape.dim):
            continue
        for dim, size in zip(value.type.tensor_type.shape.dim, shape, strict=True):
            dim.Clear()
            dim.dim_value = size
    try:
        inferred = onnx.shape_inference.infer_shapes(sized, data_prop=True).graph
    except Exception:
        # Shape inference raises on graphs onnxruntime still runs; their nodes are left to the run.
        return {}
    shapes = {}
    for value in [*inferred.value_info, *inferred.output, *inferred.input]:
        dims = value.type.tensor_type.shape.dim
        if value.type.tensor_type.HasField("shape") and all(dim.HasField("dim_value") for dim in dims):
            shapes[value.name] = tuple(dim.dim_value for dim in dims)
    return shapes
