"""How an engine built from a fused model runs its trtfuse nodes, read from its layer information (and, where given,
its per-layer profile): `analyse` -> `EngineReport`, what `trtfuse explain` prints and `compile` records.

For each trtfuse node of the fused model: the layer(s) that run it (found by the node's ONNX name in the layers'
`Metadata`, or a layer named after it), their type and tactic; the reformat / copy layers next to it and the Quantize /
Dequantize layers left standing next to it (inputs and outputs, looking through NoOp layers); and for every quantized
output, each DequantizeLinear that reads it in the fused model (directly or through layout ops, docs/engine.md "FP8
and INT8 exports"): folded into a GEMM that reads the quantized tensor itself, not folded (a dequantize or reformat
stands as a layer of its own and a float tensor feeds the GEMM), feeding no GEMM in the model (Gemma3's rotary, a
Shape: no failure), or not found in the engine. With a profile: each node's time per iteration (`site_times`' share
rule for a layer shared with other ONNX nodes) and that of the layers next to it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import onnx

from trtfuse.engine.layer_graph import (
    LayerGraph,
    Reach,
    Standing,
    quantized_reach,
    tactic_agrees,
)
from trtfuse.engine.layer_info import FLOAT_DTYPES, Layer, LayerInformation, in_profile
from trtfuse.engine.layer_profile import LayerProfile, LayerTime
from trtfuse.engine.site_times import SHARE_RULE, AttributedLayer, chosen_profile, layer_share, layer_times
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.fused_nodes import PluginNode, node_label, plugin_nodes
from trtfuse.fusion.patterns.quant import LAYOUT_OPS
from trtfuse.model.onnx_file import LoadedModel

# ONNX ops that run a matrix product, which TensorRT's explicit quantization runs in the quantized type when both
# operands come straight from a DequantizeLinear.
GEMM_OPS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum", "MatMulInteger"})
# Ops between a DequantizeLinear and its GEMM that only move or widen the dequantized tensor.
_PASSING_OPS = frozenset({*LAYOUT_OPS, "Cast"})

FOLDED = "folded"
NOT_FOLDED = "not folded"
FEEDS_NO_GEMM = "feeds no GEMM"
NOT_FOUND = "not found"


@dataclass(frozen=True)
class Dequantize:
    """A DequantizeLinear reading a quantized node output in the fused model (`through`: the layout ops between),
    the GEMM nodes it feeds (empty: none) and, where it feeds no GEMM, what it feeds instead (`op name` each)."""

    node: str
    through: tuple[str, ...]
    gemms: tuple[str, ...]
    feeds: tuple[str, ...]


class _Readers:
    """The fused model's nodes by the tensors they read."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._readers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in model.graph.node:
            for name in dict.fromkeys(node.input):
                if name:
                    self._readers[name].append(node)

    def of(self, tensor: str) -> list[onnx.NodeProto]:
        return self._readers.get(tensor, [])

    def dequantizes(self, tensor: str) -> list[Dequantize]:
        """The DequantizeLinear nodes reading `tensor`, directly or through layout ops."""
        found, pending = [], [(tensor, ())]
        while pending:
            name, through = pending.pop()
            for node in self.of(name):
                if node.op_type == "DequantizeLinear":
                    found.append(self._dequantize(node, through))
                elif node.op_type in LAYOUT_OPS and node.output:
                    pending.append((node.output[0], (*through, node_label(node))))
        return found

    def _dequantize(self, node: onnx.NodeProto, through: tuple[str, ...]) -> Dequantize:
        gemms, feeds, pending, seen = [], [], [node.output[0]], set()
        while pending:
            for reader in self.of(pending.pop()):
                label = node_label(reader)
                if reader.op_type in GEMM_OPS:
                    gemms.append(label)
                elif reader.op_type in _PASSING_OPS and reader.output and reader.output[0] not in seen:
                    seen.add(reader.output[0])
                    pending.append(reader.output[0])
                else:
                    feeds.append(f"{reader.op_type} {label}")
        return Dequantize(node_label(node), through, tuple(dict.fromkeys(gemms)), tuple(dict.fromkeys(feeds)))


@dataclass(frozen=True)
class Neighbour:
    """A layer next to a node's layers that is no part of them: a reformat / copy, or a quantize / dequantize left
    standing (`role`), on its `side` ("input" or "output") of the node's `tensor`."""

    layer: Layer
    role: str
    side: str
    tensor: str
    time: LayerTime | None

    def to_json(self) -> dict[str, Any]:
        entry = {**self.layer.to_json(), "role": self.role, "side": self.side, "tensor": self.tensor}
        if self.time is not None:
            entry["average_ms"] = self.time.average_ms
        return entry


@dataclass(frozen=True)
class FoldVerdict:
    """One DequantizeLinear after a quantized output: its verdict (FOLDED, NOT_FOLDED, FEEDS_NO_GEMM, NOT_FOUND), the
    GEMM layers reading the quantized tensor itself, the layers standing where the GEMM should read it, whether the
    GEMMs' tactic names say they read the quantized type (None where they do not say) and the tensor's type in the
    engine."""

    tensor: str
    dtype: str
    dequantize: Dequantize
    verdict: str
    gemm_layers: tuple[Layer, ...]
    standing: tuple[Standing, ...]
    tactic_agrees: bool | None
    engine_dtype: str | None

    @property
    def failed(self) -> bool:
        return self.verdict == NOT_FOLDED

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.tensor,
            "dtype": self.dtype,
            "engine_dtype": self.engine_dtype,
            "dequantize": self.dequantize.node,
            "through": list(self.dequantize.through),
            "gemm_nodes": list(self.dequantize.gemms),
            "feeds": list(self.dequantize.feeds),
            "verdict": self.verdict,
            "gemm_layers": [layer.to_json() for layer in self.gemm_layers],
            "standing_layers": [
                {**item.layer.to_json(), "role": item.role, "gemm_layers": [gemm.name for gemm in item.gemms]}
                for item in self.standing
            ],
            "tactic_agrees": self.tactic_agrees,
        }

    def line(self) -> str:
        head = f"output {self.tensor} {self.dtype}: {self.dequantize.node}"
        if self.verdict == FEEDS_NO_GEMM:
            return f"{head} feeds no GEMM ({', '.join(self.dequantize.feeds) or 'nothing'})"
        if self.verdict == NOT_FOUND:
            return f"{head} feeds {_names(self.dequantize.gemms)}; no engine layer reads {self.tensor}"
        if self.verdict == FOLDED:
            tactic = {True: "", False: ", but its tactic names float operands", None: ""}[self.tactic_agrees]
            return f"{head} folded into {_layer_names(self.gemm_layers)}{_tactics(self.gemm_layers)}{tactic}"
        if self.engine_dtype in FLOAT_DTYPES:
            return f"{head} NOT folded: the engine holds {self.tensor} as {self.engine_dtype}"
        standing = "; ".join(
            f"{_role_text(item)}{item.layer.layer_type} '{item.layer.name}' stands"
            + (f", feeding {_layer_names(item.gemms)}{_tactics(item.gemms)}" if item.gemms else "")
            for item in self.standing
        )
        return f"{head} NOT folded: {standing}"


def _role_text(item: Standing) -> str:
    """ "dequantize " / "reformat " before a standing layer's type; nothing where the role is only the type."""
    return "" if item.role == item.layer.layer_type else f"{item.role} "


def _names(names: Iterable[str]) -> str:
    return ", ".join(names)


def _layer_names(layers: Iterable[Layer]) -> str:
    return ", ".join(f"{layer.layer_type} '{layer.name}'" for layer in layers)


def _tactics(layers: Iterable[Layer]) -> str:
    tactics = [layer.tactic for layer in layers if layer.tactic]
    return f" (tactic {', '.join(tactics)})" if tactics else ""


@dataclass(frozen=True)
class NodeReport:
    """One trtfuse node: the layers that run it (none: not found in the engine), the layers next to them, and a
    verdict per DequantizeLinear after each quantized output."""

    name: str
    op: str
    quantized: bool
    layers: tuple[AttributedLayer, ...]
    neighbours: tuple[Neighbour, ...]
    folds: tuple[FoldVerdict, ...]
    timed: bool

    @property
    def found(self) -> bool:
        return bool(self.layers)

    @property
    def unfolded(self) -> tuple[FoldVerdict, ...]:
        return tuple(fold for fold in self.folds if fold.failed)

    @property
    def average_ms(self) -> float | None:
        """The node's own layers' time per iteration (shared layers by their share); None without a profile."""
        return sum(layer.average_ms or 0.0 for layer in self.layers) if self.timed else None

    @property
    def neighbour_ms(self) -> float | None:
        """The time per iteration of the reformats and standing quantize / dequantize layers next to it."""
        return sum(item.time.average_ms for item in self.neighbours if item.time) if self.timed else None

    def to_json(self) -> dict[str, Any]:
        entry = {
            "name": self.name,
            "op": self.op,
            "found": self.found,
            "layers": [layer.to_json() for layer in self.layers],
            "neighbours": [item.to_json() for item in self.neighbours],
            "outputs": [fold.to_json() for fold in self.folds],
        }
        if self.timed:
            entry["average_ms"] = self.average_ms
            entry["neighbour_ms"] = self.neighbour_ms
        return entry

    def lines(self) -> list[str]:
        if not self.found:
            return [f"  {self.name}: no layer of the engine names it"]
        layers = "; ".join(_attributed_text(layer) for layer in self.layers)
        time = f", {self.average_ms:.4f} ms" if self.timed else ""
        lines = [f"  {self.name}: {layers}{time}"]
        for item in self.neighbours:
            when = f" {item.time.average_ms:.4f} ms" if item.time else ""
            lines.append(f"    {item.side} {item.role}: {item.layer.layer_type} '{item.layer.name}'{when}")
        lines += [f"    {fold.line()}" for fold in self.folds]
        return lines


def _attributed_text(item: AttributedLayer) -> str:
    tactic = f", tactic {item.layer.tactic}" if item.layer.tactic else ""
    shared = ""
    if item.shared:
        whole = f" of {item.time.average_ms:.4f} ms" if item.time else ""
        shared = f" (shared: {item.share:.2f}{whole})"
    return f"{item.layer.layer_type} '{item.layer.name}'{tactic}{shared}"


@dataclass(frozen=True)
class EngineReport:
    """How the engine runs the fused model's trtfuse nodes, in one optimisation profile (`engine_profile`)."""

    layer_information: str
    fused_model: str
    profile: str | None
    engine_profile: int
    layer_count: int
    nodes: tuple[NodeReport, ...]
    untimed_records: int

    @property
    def unfolded_nodes(self) -> tuple[str, ...]:
        """The quantized nodes whose output reaches a GEMM through a dequantize or reformat left standing."""
        return tuple(node.name for node in self.nodes if node.unfolded)

    @property
    def not_found(self) -> tuple[str, ...]:
        return tuple(node.name for node in self.nodes if not node.found)

    @property
    def passed(self) -> bool:
        return not self.unfolded_nodes

    def _folds(self) -> list[FoldVerdict]:
        return [fold for node in self.nodes for fold in node.folds]

    def to_json(self) -> dict[str, Any]:
        return {
            "layer_information": self.layer_information,
            "fused_model": self.fused_model,
            "profile": self.profile,
            "engine_profile": self.engine_profile,
            "layers": self.layer_count,
            "nodes": [node.to_json() for node in self.nodes],
            "not_found": list(self.not_found),
            "unfolded": list(self.unfolded_nodes),
            "untimed_profile_records": self.untimed_records if self.profile else None,
            "share_rule": SHARE_RULE,
            "passed": self.passed,
        }

    def lines(self) -> list[str]:
        """The summary: one head line, then per node its layers, neighbours and fold verdicts."""
        found = [node for node in self.nodes if node.found]
        timed = f"; timed by {self.profile}" if self.profile else ""
        head = (
            f"{self.layer_information}: engine profile {self.engine_profile}, {self.layer_count} layers; "
            f"{len(found)} of {len(self.nodes)} trtfuse nodes found{timed}"
        )
        lines = [head]
        for node in self.nodes:
            lines += node.lines()
        if self.profile and self.untimed_records:
            lines.append(f"  {self.untimed_records} profile record(s) name no layer of this profile")
        return lines

    def verdict_line(self) -> str:
        """Whether every DequantizeLinear after a quantized node that feeds a GEMM was folded into it; the nodes
        whose output reaches a GEMM through a standing dequantize or reformat, each named, where not."""
        folds = self._folds()
        if not self.passed:
            named = "; ".join(
                f"{node.name} ({', '.join(fold.dequantize.node for fold in node.unfolded)})"
                for node in self.nodes
                if node.unfolded
            )
            count = len(self.unfolded_nodes)
            return (
                f"{count} quantized node{'s reach' if count > 1 else ' reaches'} a GEMM through a dequantize or "
                f"reformat left standing: {named}"
            )
        gemm_folds = [fold for fold in folds if fold.verdict != FEEDS_NO_GEMM]
        if not folds:
            return "no trtfuse node outputs FP8 or INT8: nothing to fold"
        folded = sum(fold.verdict == FOLDED for fold in gemm_folds)
        unknown = len(gemm_folds) - folded
        missing = f", {unknown} not found in the engine" if unknown else ""
        no_gemm = len(folds) - len(gemm_folds)
        others = f", {no_gemm} feed no GEMM" if no_gemm else ""
        total = len(gemm_folds)
        return f"{folded} of {total} dequantizes after quantized nodes folded into their GEMMs{missing}{others}"


def analyse(
    info: LayerInformation,
    fused: LoadedModel,
    profile: LayerProfile | None = None,
    engine_profile: int | None = None,
) -> EngineReport:
    """The report on `fused`'s trtfuse nodes in the engine `info` describes, in optimisation profile `engine_profile`
    (default: the one `profile`'s names carry, else 0). One line for a model without trtfuse nodes, for layer
    information that names none of them, and for a profile that times none of its layers."""
    plugins = plugin_nodes(fused.model, fused.path)
    if not plugins:
        raise TrtfuseError(f"{fused.path}: holds no trtfuse node; give the fused model (trtfuse fuse or compile)")
    chosen = chosen_profile(info, profile, engine_profile)
    times = layer_times(info, profile)
    graph = LayerGraph(info.in_profile(chosen), {node_label(node): node.op_type for node in fused.model.graph.node})
    readers = _Readers(fused.model)
    nodes = tuple(_node_report(plugin, graph, chosen, readers, times, profile is not None) for plugin in plugins)
    if not any(node.found for node in nodes):
        raise TrtfuseError(
            f"{info.source}: names none of the {len(nodes)} trtfuse nodes of {fused.path} (first: '{nodes[0].name}'); "
            "give the layer information of an engine built from this fused model"
        )
    return EngineReport(
        layer_information=info.source,
        fused_model=str(fused.path),
        profile=profile.source if profile else None,
        engine_profile=chosen,
        layer_count=len(graph.layers),
        nodes=nodes,
        untimed_records=len(profile.layers) - len(times) if profile else 0,
    )


def _node_report(
    plugin: PluginNode,
    graph: LayerGraph,
    profile_index: int,
    readers: _Readers,
    times: Mapping[int, LayerTime],
    timed: bool,
) -> NodeReport:
    name = node_label(plugin.node)
    own = tuple(
        AttributedLayer(layer, share, times.get(layer.index))
        for layer in graph.layers
        if (share := layer_share(layer, {name})) > 0
    )
    own_layers = tuple(item.layer for item in own)
    folds = tuple(
        fold
        for index, tensor in enumerate(plugin.node.output)
        if (quantizer := plugin.fields.output_quantizer(index)) is not None
        for fold in _folds(graph, own_layers, index, tensor, profile_index, quantizer.dtype, readers)
    )
    return NodeReport(
        name=name,
        op=plugin.op.name,
        quantized=plugin.op.quantized,
        layers=own,
        neighbours=_neighbours(graph, own_layers, times),
        folds=folds,
        timed=timed,
    )


def _neighbours(graph: LayerGraph, own: tuple[Layer, ...], times: Mapping[int, LayerTime]) -> tuple[Neighbour, ...]:
    """The reformats and standing quantize / dequantize layers writing the node's inputs or reading its outputs
    (through NoOp layers, and along a chain of reformats)."""
    found: dict[int, Neighbour] = {}
    written = {tensor.name for layer in own for tensor in layer.outputs}
    sides = (
        ("input", [tensor.name for layer in own for tensor in layer.inputs if tensor.name not in written]),
        ("output", sorted(written)),
    )
    for side, tensors in sides:
        for tensor in dict.fromkeys(tensors):
            pending = [tensor]
            while pending:
                name = pending.pop()
                nearby = graph.writers(name) if side == "input" else graph.readers(name)
                for layer in nearby:
                    role = graph.role(layer)
                    if role is None or layer in own or layer.index in found:
                        continue
                    found[layer.index] = Neighbour(layer, role, side, tensor, times.get(layer.index))
                    if role == "reformat":
                        chain = layer.inputs if side == "input" else layer.outputs
                        pending.extend(item.name for item in chain)
    return tuple(found[index] for index in sorted(found))


def _quantized_output(own: tuple[Layer, ...], index: int, tensor: str) -> tuple[str, str | None]:
    """The engine's name and type of the node's output `index`: the tensor of that name a node layer writes, else the
    node's plugin layer's output at that position (a layer whose outputs follow the node's)."""
    for layer in own:
        for output in layer.outputs:
            if output.name == tensor:
                return tensor, output.dtype
    if len(own) == 1 and index < len(own[0].outputs):
        output = own[0].outputs[index]
        return output.name, output.dtype
    return tensor, None


def _folds(
    graph: LayerGraph,
    own: tuple[Layer, ...],
    index: int,
    tensor: str,
    profile_index: int,
    dtype: str,
    readers: _Readers,
) -> list[FoldVerdict]:
    """A verdict for each DequantizeLinear reading the node's quantized output `tensor` (its ONNX name)."""
    dequantizes = readers.dequantizes(tensor)
    if not dequantizes:
        return []
    engine_name, engine_dtype = _quantized_output(own, index, in_profile(tensor, profile_index))
    reach = quantized_reach(graph, engine_name, dtype) if own else Reach((), (), ())
    return [_verdict(tensor, dtype, dequantize, reach, engine_dtype) for dequantize in dequantizes]


def _verdict(tensor: str, dtype: str, dequantize: Dequantize, reach: Reach, engine_dtype: str | None) -> FoldVerdict:
    """FOLDED where GEMM layers read the quantized tensor (or a move of its codes) and nothing stands in the way;
    NOT_FOLDED where a layer turns it into a float tensor on the way to a GEMM (one feeding a GEMM, one naming this
    DequantizeLinear, or any where no GEMM reads the tensor), or where the engine holds the tensor as float."""

    def verdict(outcome: str, standing: tuple[Standing, ...] = (), agrees: bool | None = None) -> FoldVerdict:
        gemms = reach.gemms if outcome == FOLDED else ()
        return FoldVerdict(tensor, dtype, dequantize, outcome, gemms, standing, agrees, engine_dtype)

    if not dequantize.gemms:
        return verdict(FEEDS_NO_GEMM)
    if engine_dtype in FLOAT_DTYPES:
        return verdict(NOT_FOLDED)
    standing = tuple(
        item for item in reach.standing if item.gemms or dequantize.node in item.layer.onnx_nodes or not reach.gemms
    )
    if standing:
        return verdict(NOT_FOLDED, standing)
    if not reach.gemms:
        return verdict(NOT_FOUND)
    agreements = [tactic_agrees(layer.tactic, dtype) for layer in reach.gemms]
    agrees = False if False in agreements else (True if True in agreements else None)
    return verdict(FOLDED, agrees=agrees)
