"""The fusion pass on an in-memory model: shape inference, find the norms, rewrite them, export."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import onnx_graphsurgeon as gs
from onnx import helper
from onnx_graphsurgeon.logger import G_LOGGER

from trtfuse import contract
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.files import json_holding
from trtfuse.fusion.fused_nodes import op_counts, plugin_node_counts, plugin_nodes
from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions
from trtfuse.fusion.patterns import NearMiss, NormSearch, find_norms
from trtfuse.fusion.rewrite import FusedNode, rewrite

# inspect lists a match's quantizers and rotation as the fusion report lists its node's (the CLI reads the pass
# through here).
from trtfuse.fusion.rewrite import quantizers_json as quantizers_json
from trtfuse.fusion.rewrite import rotary_json as rotary_json

# How many rejected candidates a summary line names (`trtfuse inspect` lists them all).
SUMMARY_REASONS = 2


def norm_calls(nodes: Mapping[str, int]) -> int:
    """How many norms of the source model plugin nodes counted per op replace."""
    return sum(contract.OPS[op].norm_calls * count for op, count in nodes.items())


def listed(nodes: Mapping[str, int]) -> dict[str, int]:
    """The counts a report lists: every plain norm op, and a quantized or rotary op where there is one (a model with
    nothing quantized or rotated reports what it did before those ops existed)."""
    return {op: count for op, count in nodes.items() if count or contract.OPS[op].listed_when_absent}


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}{'s' if count > 1 else ''}"


@dataclass(frozen=True)
class FusionCounts:
    """What a fusion leaves: the plugin nodes of the model that comes out, per op (those the input already held
    included, so a model fused twice reports the same), how many of them the input held, the rejected candidates,
    the residual Adds left outside a norm that was fused alone (no rejected norm: they are counted apart), how many
    QuantizeLinear nodes the fused nodes took in, and those left outside a fused norm (None when the fusion took no
    quantizers, `fuse_quant` off), the rotations left outside a fused QK pair (None with `fuse_rope` off). `line` is
    the one summary every command and the Polygraphy loader print."""

    nodes: Mapping[str, int]
    already: Mapping[str, int]
    near_misses: tuple[NearMiss, ...]
    residual_near_misses: tuple[NearMiss, ...] = ()
    quantizers_taken: int = 0
    quant_near_misses: tuple[NearMiss, ...] | None = None
    rope_near_misses: tuple[NearMiss, ...] | None = None

    @property
    def norms(self) -> int:
        return norm_calls(self.nodes)

    def line(self, reasons: int = SUMMARY_REASONS) -> str:
        """`1 TrtfuseRmsNorm, 2 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (9 norms), 1 rejected, 1 Add kept out,
        9 Qs taken in, 1 Q kept out, 2 rotations kept out (first: NODE: REASON; NODE: REASON)`; the ops after the
        first two only where the model has them, the Adds, QuantizeLinear nodes and rotations only where there are
        any; the reasons are the rejected candidates' first, then the Adds', the QuantizeLinear nodes', the
        rotations'."""
        shown = [op for index, op in enumerate(contract.FUSED_OPS) if index < 2 or self.nodes[op]]
        counts = [f"{self.nodes[op]} {op}" for op in shown]
        text = f"{', '.join(counts[:-1])} and {counts[-1]} nodes ({self.norms} norms)"
        held = sum(self.already.values())
        if held:
            text += f", {'all' if held == sum(self.nodes.values()) else held} already in the input"
        text += f", {len(self.near_misses)} rejected"
        quant_misses = self.quant_near_misses or ()
        if self.residual_near_misses:
            text += f", {_plural(len(self.residual_near_misses), 'Add')} kept out"
        if self.quantizers_taken:
            text += f", {_plural(self.quantizers_taken, 'Q')} taken in"
        if quant_misses:
            text += f", {_plural(len(quant_misses), 'Q')} kept out"
        rope_misses = self.rope_near_misses or ()
        if rope_misses:
            text += f", {_plural(len(rope_misses), 'rotation')} kept out"
        misses = [*self.near_misses, *self.residual_near_misses, *quant_misses, *rope_misses]
        if reasons and misses:
            first = "; ".join(f"{miss.node}: {miss.reason}" for miss in misses[:reasons])
            more = f"; {len(misses) - reasons} more" if len(misses) > reasons else ""
            text += f" (first: {first}{more})"
        return text

    def to_json(self) -> dict:
        counts = {"plugin_nodes": listed(self.nodes), "already_in_input": listed(self.already)}
        if self.quant_near_misses is not None:
            counts["quantizers_taken"] = self.quantizers_taken
        return counts


@dataclass
class FuseResult:
    """The fused model, one record per fused node, and everything the matcher found or rejected; `input_nodes` counts
    the plugin nodes the input held already."""

    model: onnx.ModelProto
    fused: list[FusedNode]
    search: NormSearch
    input_nodes: Mapping[str, int] = field(default_factory=dict)

    def counts(self) -> FusionCounts:
        """The plugin nodes of the fused model (`fused_nodes.plugin_node_counts`) and the rejected candidates."""
        already = {op: self.input_nodes.get(op, 0) for op in contract.FUSED_OPS}
        search = self.search
        quant_misses = search.quant_near_misses
        return FusionCounts(
            plugin_node_counts(self.model),
            already,
            tuple(search.near_misses),
            tuple(search.residual_near_misses),
            quantizers_taken=len(search.quantizers_taken()),
            quant_near_misses=None if quant_misses is None else tuple(quant_misses),
            rope_near_misses=None if search.rope_near_misses is None else tuple(search.rope_near_misses),
        )

    def report(self) -> dict:
        """The JSON report: one entry per node fused now, their totals per node kind, the plugin nodes of the model
        that comes out, the rejected candidates, the residual Adds kept out of a norm fused alone, and (when the
        fusion takes quantizers) the QuantizeLinear nodes kept out of a fused norm and (when it takes rotations) the
        rotations kept out of a fused QK pair."""
        totals = listed({op: sum(node.kind == op for node in self.fused) for op in contract.FUSED_OPS})
        return {
            "fused": [node.as_dict() for node in self.fused],
            "totals": {**totals, "norms": norm_calls(totals)},
            **self.counts().to_json(),
            "near_misses": near_miss_json(self.search.near_misses),
            "residual_near_misses": near_miss_json(self.search.residual_near_misses),
            **quant_near_miss_json(self.search),
            **rope_near_miss_json(self.search),
        }


# A fusion report trtfuse wrote, which a later call may replace: a JSON object with the keys every report holds.
is_fusion_report = json_holding("fused", "totals", "plugin_nodes", "near_misses")


def near_miss_json(misses: list[NearMiss]) -> list[dict[str, str]]:
    return [{"node": miss.node, "reason": miss.reason} for miss in misses]


def quant_near_miss_json(search: NormSearch) -> dict[str, list[dict[str, str]]]:
    """The QuantizeLinear nodes kept out of a fused norm, under their key; nothing when the fusion took none."""
    if search.quant_near_misses is None:
        return {}
    return {"quant_near_misses": near_miss_json(search.quant_near_misses)}


@contextlib.contextmanager
def graphsurgeon_log_on_stderr() -> Iterator[None]:
    """While the pass runs, onnx-graphsurgeon's log (which it prints on stdout, where a command's result and its
    `--json` object go) goes to stderr, errors only: it warns about what the pass handles (every bfloat16 constant,
    which numpy lacks), never about the result."""
    with contextlib.redirect_stdout(sys.stderr), G_LOGGER.suppress(G_LOGGER.ERROR):
        yield


def rope_near_miss_json(search: NormSearch) -> dict[str, list[dict[str, str]]]:
    """The rotations kept out of a fused QK pair, under their key; nothing when the fusion took no rotations."""
    if search.rope_near_misses is None:
        return {}
    return {"rope_near_misses": near_miss_json(search.rope_near_misses)}


def import_graph(model: onnx.ModelProto) -> gs.Graph:
    """The model as an onnx-graphsurgeon graph with every shape that ONNX shape inference can work out."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
    except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError) as error:
        raise TrtfuseError(f"shape inference failed: {first_line(error)}") from None
    with graphsurgeon_log_on_stderr():
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


def search_model(model: onnx.ModelProto, options: FusionOptions = DEFAULT_FUSION) -> NormSearch:
    """Every norm candidate of the model, matched or rejected, without changing it."""
    with graphsurgeon_log_on_stderr():
        return find_norms(import_graph(model), options)


def fuse_model(
    model: onnx.ModelProto, options: FusionOptions = DEFAULT_FUSION, source: str | Path = "the model"
) -> FuseResult:
    """Replace every RMSNorm and QK-norm of `model` (and, unless `options` say not to, the residual Add in front of a
    norm with it) by a plugin node; `model` itself is left unchanged. The plugin nodes the model already holds are
    read as `check` reads them (`fused_nodes.plugin_nodes`), so a broken one (a bad epsilon, a missing input, a
    hidden size its input does not have) is refused before anything is fused. Errors name `source`."""
    already = plugin_nodes(model, source)
    with graphsurgeon_log_on_stderr():
        try:
            graph = import_graph(model)
            search = find_norms(graph, options)
            fused = rewrite(graph, search)
        except TrtfuseError as error:
            raise TrtfuseError(f"{source}: {error}") from None
        exported = gs.export_onnx(graph, opset_imports=graph.import_domains)
    exported.ir_version = model.ir_version
    if model.ir_version < 4:
        _keep_ir3_inputs(model, exported)
    inputs = {value.name for value in exported.graph.input}
    exported.graph.initializer.extend(tensor for tensor in _overridable(model) if tensor.name in inputs)
    _restore_sparse_attributes(model, exported)
    _keep_declared_types(model, exported)
    for attribute in ("producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(exported, attribute, getattr(model, attribute))
    exported.metadata_props.extend(model.metadata_props)
    input_nodes = op_counts(plugin.op.name for plugin in already)
    return FuseResult(model=exported, fused=fused, search=search, input_nodes=input_nodes)


def _keep_ir3_inputs(model: onnx.ModelProto, exported: onnx.ModelProto) -> None:
    """IR 3 lists every initializer as a graph input too, which graphsurgeon's export does not. Those inputs are part
    of the model's interface, so each one the model lists stays, with its initializer, where the fusion left it unread
    (a replaced norm's epsilon); the inputs keep the model's order, and the new initializers follow as inputs too."""
    initializers = {tensor.name: tensor for tensor in model.graph.initializer}
    taken = {tensor.name for tensor in exported.graph.initializer} | {value.name for value in exported.graph.input}
    taken |= {name for node in exported.graph.node for name in node.output}
    exported.graph.initializer.extend(
        initializers[value.name]
        for value in model.graph.input
        if value.name in initializers and value.name not in taken
    )
    declared = {value.name: value for value in exported.graph.input}
    declared.update({value.name: value for value in model.graph.input if value.name in initializers})
    for tensor in exported.graph.initializer:
        if tensor.name not in declared:
            declared[tensor.name] = helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims))
    stored = {tensor.name for tensor in exported.graph.initializer} | {value.name for value in exported.graph.input}
    first = [value.name for value in model.graph.input if value.name in stored]
    order = first + [name for name in declared if name in stored and name not in first]
    del exported.graph.input[:]
    exported.graph.input.extend(declared[name] for name in order)


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
