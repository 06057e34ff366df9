"""The plugin nodes of a fused model, read once: each node's fields decoded by the contract's codec, and its tensors
checked against the op (input count for its weight mode, one activation dtype inside the contract's pairs, declared
output dtypes, hidden sizes against the activations' static last dims, one shape for the activations of one part). A
foreign or hand-edited file may hold anything; each problem is one line naming the file and the node. The lowering,
the AOT form, `check` and the node counts of every report read the nodes through here.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import onnx

from trtfuse import contract
from trtfuse.contract.codec import NodeFields, from_node
from trtfuse.contract.rotary_shapes import output_dims
from trtfuse.errors import TrtfuseError
from trtfuse.model.interface import elem_type_name


@dataclass(frozen=True)
class PluginNode:
    """One trtfuse node of a graph with its decoded fields; `dtype` is its activations' dtype (None where neither
    the graph nor shape inference says)."""

    node: onnx.NodeProto
    fields: NodeFields
    dtype: str | None
    where: str

    @property
    def op(self) -> contract.FusedOp:
        return self.fields.op

    @property
    def activations(self) -> tuple[str, ...]:
        return tuple(self.node.input[: len(self.op.activations)])

    @property
    def weights(self) -> tuple[str, ...]:
        """The weight inputs: one per part, none when weight_mode is NONE."""
        start = len(self.op.activations)
        return tuple(self.node.input[start : start + (len(self.op.weights) if self.fields.has_weight else 0)])

    @property
    def output_activations(self) -> tuple[tuple[str, str], ...]:
        """Each output with its part's (first) activation, whose shape it has (or, moving heads, whose [B, H, S, D])."""
        op = self.op
        return tuple(
            (output, self.activations[op.activation_parts.index(part)])
            for output, part in zip(self.node.output, op.output_parts, strict=True)
        )

    @property
    def tables(self) -> tuple[str, ...]:
        """A rotary op's cos and sin inputs (none for the other ops)."""
        return tuple(self.node.input[len(self.node.input) - len(self.op.rotary_tables) :]) if self.op.rotary else ()

    def output_dtype(self, index: int) -> str | None:
        """The dtype output `index` has by the contract: the normalised dtype (`output_dtype`, or the output
        quantizer's) for a normalised output, else the activations'."""
        return self.fields.normalised_dtype(index) if self.op.normalised_outputs[index] else self.dtype


def node_label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def plugin_nodes(model: onnx.ModelProto, source: str | Path = "the fused model") -> list[PluginNode]:
    """Every node of the main graph in the trtfuse domain, read and checked; `source` names the file in errors. A
    model that imports the trtfuse domain at another version than this contract's is refused: its nodes may mean
    something else."""
    for opset in model.opset_import:
        if opset.domain == contract.ONNX_DOMAIN and opset.version != contract.ONNX_DOMAIN_VERSION:
            raise TrtfuseError(
                f"{source}: imports the {contract.ONNX_DOMAIN} domain at version {opset.version}; this trtfuse reads "
                f"version {contract.ONNX_DOMAIN_VERSION} only"
            )
    types = TensorTypes(model)
    nodes = []
    for node in model.graph.node:
        if node.domain != contract.ONNX_DOMAIN:
            continue
        where = f"{source}: node '{node_label(node)}'"
        fields = from_node(node, where)
        nodes.append(_checked(node, fields, where, types))
    return nodes


def plugin_node_counts(model: onnx.ModelProto) -> dict[str, int]:
    """How many nodes of each trtfuse op the main graph holds, every op listed (0 for absent ones); not read: for a
    graph trtfuse wrote, or one `plugin_nodes` has read."""
    return op_counts(node.op_type for node in model.graph.node if node.domain == contract.ONNX_DOMAIN)


def op_counts(ops: Iterable[str]) -> dict[str, int]:
    """How many of `ops` each trtfuse op is, every op listed (0 for absent ones)."""
    counts = Counter(ops)
    return {op: counts.get(op, 0) for op in contract.FUSED_OPS}


def _checked(node: onnx.NodeProto, fields: NodeFields, where: str, types: TensorTypes) -> PluginNode:
    op = fields.op
    inputs = op.inputs(fields.has_weight)
    given = [name for name in node.input]
    if len(given) != len(inputs) or not all(given) or len(node.output) != len(op.outputs):
        raise TrtfuseError(
            f"{where}: {op.name} with weight_mode {fields.params.weight_mode.name} takes {len(inputs)} input(s) "
            f"({', '.join(inputs)}) and gives {len(op.outputs)} output(s), not {len(given)} and {len(node.output)}"
        )
    known = {name: dtype for name in given[: len(op.activations)] if (dtype := types.dtype(name)) is not None}
    for name, dtype in known.items():
        if dtype not in contract.ACTIVATION_DTYPES:
            raise TrtfuseError(
                f"{where}: input '{name}' is {dtype}, not one of {', '.join(contract.ACTIVATION_DTYPES)}"
            )
    if len(set(known.values())) > 1:
        described = ", ".join(f"'{name}' {dtype}" for name, dtype in known.items())
        raise TrtfuseError(f"{where}: its activations must share one dtype, got {described}")
    dtype = next(iter(known.values()), None)
    if dtype is not None:
        problem = contract.dtype_pair_problem(dtype, fields.output_dtype)
        if problem is not None:
            raise TrtfuseError(f"{where}: {problem}")
    plugin = PluginNode(node, fields, dtype, where)
    for index, output in enumerate(node.output):
        declared, expected = types.dtype(output), plugin.output_dtype(index)
        if declared is not None and expected is not None and declared != expected:
            rule = _output_rule(fields, index) if op.normalised_outputs[index] else "its activations' dtype"
            raise TrtfuseError(f"{where}: output '{output}' is declared {declared}, but {rule} is {expected}")
    for position, name in enumerate(given[: len(given) - len(op.rotary_tables)]):
        part = op.activation_parts[position] if position < len(op.activations) else position - len(op.activations)
        hidden = fields.hidden_sizes[part]
        last = types.last_dim(name)
        if last is not None and last != hidden:
            what = "last dim" if position < len(op.activations) else "length"
            raise TrtfuseError(f"{where}: {op.hidden_fields[part]} is {hidden}, but input '{name}' has {what} {last}")
    _check_part_shapes(op, given[: len(op.activations)], where, types)
    check_output_shapes(plugin, types)
    if fields.rotary is not None:
        _check_rotary(plugin, types)
    return plugin


# The ranks a rotary op's activations may have in each layout: [B, S, H, D] or [B, S, H·D]; [B, H, S, D].
_ROTARY_RANKS = {contract.HeadLayout.TOKEN_MAJOR: (3, 4), contract.HeadLayout.HEAD_MAJOR: (4,)}


def _check_rotary(plugin: PluginNode, types: TensorTypes) -> None:
    """A rotary op's activations have a rank of their layout (and D as the last dim where it is 4), and its cos and
    sin tables are [Bc, S, R] in float32 or the activations' dtype."""
    rotary, where = plugin.fields.rotary, plugin.where
    for name in plugin.activations:
        dims = types.dims(name)
        if dims is None:
            continue
        ranks = _ROTARY_RANKS[rotary.layout]
        if len(dims) not in ranks:
            shown = " or ".join(map(str, ranks))
            raise TrtfuseError(
                f"{where}: input '{name}' has rank {len(dims)}, not {shown} as layout {rotary.layout.name}"
            )
        if len(dims) == 4 and isinstance(dims[-1], int) and dims[-1] != rotary.head_dim:
            raise TrtfuseError(f"{where}: head_dim is {rotary.head_dim}, but input '{name}' has last dim {dims[-1]}")
    allowed = {"float32", plugin.dtype} if plugin.dtype is not None else set(contract.ACTIVATION_DTYPES)
    dtypes = {name: dtype for name in plugin.tables if (dtype := types.dtype(name)) is not None}
    if len(set(dtypes.values())) > 1:
        described = ", ".join(f"'{name}' {dtype}" for name, dtype in dtypes.items())
        raise TrtfuseError(f"{where}: its cos and sin tables must share one dtype, got {described}")
    for name in plugin.tables:
        dtype, dims = types.dtype(name), types.dims(name)
        if dtype is not None and dtype not in allowed:
            raise TrtfuseError(f"{where}: table '{name}' is {dtype}, not float32 or its activations' dtype")
        if dims is not None and len(dims) != 3:
            raise TrtfuseError(f"{where}: table '{name}' has rank {len(dims)}, not 3 ([batch, tokens, rotary_dim])")
        if dims is not None and isinstance(dims[-1], int) and dims[-1] != rotary.rotary_dim:
            raise TrtfuseError(
                f"{where}: rotary_dim is {rotary.rotary_dim}, but table '{name}' has last dim {dims[-1]}"
            )


def _output_rule(fields: NodeFields, index: int) -> str:
    stage = fields.op.output_stages[index]
    return "output_dtype" if fields.output_quantizer(index) is None else stage.dtype_field


def _check_part_shapes(op: contract.FusedOp, activations: list[str], where: str, types: TensorTypes) -> None:
    """The activations of one part (the add-norm's x and residual) are summed element by element, with no
    broadcasting: their ranks, and their dims where both are static, must agree."""
    for part in range(len(op.hidden_fields)):
        members = [name for name, owner in zip(activations, op.activation_parts, strict=True) if owner == part]
        first = types.dims(members[0])
        for other in members[1:]:
            dims = types.dims(other)
            if first is None or dims is None:
                continue
            if len(first) != len(dims) or _static_clash(first, dims):
                raise TrtfuseError(
                    f"{where}: inputs '{members[0]}' {_shape_text(first)} and '{other}' {_shape_text(dims)} must have "
                    "one shape (no broadcasting)"
                )


def check_output_shapes(plugin: PluginNode, types: TensorTypes) -> None:
    """Each output has the shape of its part's (first) activation (a rotary node that moves heads: that shape's
    [B, H, S, D], `contract.rotary_shapes.output_dims`): its declared dims, where both are static, must agree with
    it. An output declared with the other part's shape is a node whose inputs were swapped (q for k) or rewired, or
    whose output_layout was changed. `types` is anything with TensorTypes' `dims`."""
    op = plugin.op
    for (output, activation), part in zip(plugin.output_activations, op.output_parts, strict=True):
        declared, dims = types.dims(output), types.dims(activation)
        if declared is None or dims is None:
            continue
        expected = output_dims(plugin.fields.rotary, plugin.fields.hidden_sizes[part], dims)
        if len(declared) != len(expected) or _static_clash(declared, expected):
            given, written = f"'{activation}' {_shape_text(dims)}", f"'{output}' {_shape_text(declared)}"
            if expected != dims:
                raise TrtfuseError(
                    f"{plugin.where}: output {written} is not [B, H, S, D] {_shape_text(expected)} of its input "
                    f"{given} (inputs swapped?)"
                )
            raise TrtfuseError(
                f"{plugin.where}: input {given} and its output {written} must have one shape (inputs swapped?)"
            )


def _static_clash(first: tuple[int | str | None, ...], second: tuple[int | str | None, ...]) -> bool:
    """Whether two dims lists hold different static values at one axis."""
    return any(isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(first, second, strict=False))


def _shape_text(dims: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"


class TensorTypes:
    """Element types and dims of a graph's tensors: those declared, then (once, only if asked for one
    that is not) those ONNX shape inference finds; shape inference skips the trtfuse ops, whose outputs the pass
    declares."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._values = _declared(model.graph)
        self._inferred = False

    def _value(self, tensor: str) -> onnx.TypeProto.Tensor | None:
        if tensor not in self._values and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self._model)
            except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
                return None
            self._values = {**_declared(inferred.graph), **self._values}
        return self._values.get(tensor)

    def dtype(self, tensor: str) -> str | None:
        value = self._value(tensor)
        return elem_type_name(value.elem_type) if value is not None and value.elem_type else None

    def dims(self, tensor: str) -> tuple[int | str | None, ...] | None:
        """Each dim of the tensor: its value where static, its symbol where named, None where neither; None where
        the rank is unknown."""
        value = self._value(tensor)
        if value is None or not value.HasField("shape"):
            return None
        return tuple(dim.dim_value if dim.HasField("dim_value") else (dim.dim_param or None) for dim in value.shape.dim)

    def last_dim(self, tensor: str) -> int | None:
        value = self._value(tensor)
        if value is None or not value.HasField("shape") or not value.shape.dim:
            return None
        last = value.shape.dim[-1]
        return last.dim_value if last.HasField("dim_value") else None


def _declared(graph: onnx.GraphProto) -> dict[str, onnx.TypeProto.Tensor]:
    values = {
        value.name: value.type.tensor_type
        for value in [*graph.value_info, *graph.input, *graph.output]
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type
    }
    for tensor in graph.initializer:
        typed = onnx.TypeProto.Tensor(elem_type=tensor.data_type)
        typed.shape.dim.extend(onnx.TensorShapeProto.Dimension(dim_value=dim) for dim in tensor.dims)
        values[tensor.name] = typed
    return values
