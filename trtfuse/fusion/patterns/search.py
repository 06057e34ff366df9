"""find_norms: every norm candidate in a graph, matched, paired into QK-norms or with its residual Add, or rejected
with a reason."""

from __future__ import annotations

from collections.abc import Sequence

import onnx_graphsurgeon as gs

from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions
from trtfuse.fusion.patterns.decomposed import ANCHORS, match_decomposed
from trtfuse.fusion.patterns.fused_ops import is_fused_norm, match_fused
from trtfuse.fusion.patterns.matches import NearMiss, NormSearch, Rejected, RmsNormMatch
from trtfuse.fusion.patterns.qk import absorbed_qk_norms, pair_qk_norms
from trtfuse.fusion.patterns.quant import take_quantizers
from trtfuse.fusion.patterns.queries import ONNX_DOMAINS, describe, dtype_name
from trtfuse.fusion.patterns.residual import pair_residual_adds
from trtfuse.fusion.patterns.rope import take_rotations
from trtfuse.fusion.patterns.shapes import Shapes


def _redefined_ops(graph: gs.Graph) -> list[str]:
    """ONNX op names the model redefines as local functions: a node calling one may not compute the ONNX op."""
    return sorted({function.name for function in graph.functions if (function.domain or "") in ONNX_DOMAINS})


def _reduces_integers(node: gs.Node) -> bool:
    """A reduction over integers (an attention mask's ReduceSum into sequence lengths) is no norm candidate: listing
    it among the rejected norms only hides the real near misses."""
    dtype = dtype_name(node.inputs[0]) if node.inputs else None
    return dtype is not None and dtype.startswith(("int", "uint", "bool"))


LEFT_QK = "a q/k-norm pair left to TensorRT (--no-fuse-qk)"
LEFT_NORM = "a norm fused alone left to TensorRT (--no-fuse-norm)"

DEAD_REASON = (
    "its result reaches no graph output (dead code in the original, e.g. an exporter that took another projection "
    "for the LM head): nothing fused"
)


def live_tensors(graph: gs.Graph, also: Sequence[gs.Tensor] = ()) -> set[int]:
    """ids of the tensors some graph output (or a tensor of `also`) is computed from. A node holding an If/Loop/Scan
    body reads whatever the body reads (bodies name outer tensors without listing them as the node's inputs)."""
    live: set[int] = set()
    queue = [*graph.outputs, *also]
    while queue:
        tensor = queue.pop()
        if id(tensor) in live:
            continue
        live.add(id(tensor))
        for node in tensor.inputs:
            reads = list(node.inputs)
            for body in node.subgraphs(recursive=True):
                reads += [operand for inner in body.nodes for operand in inner.inputs]
            queue.extend(operand for operand in reads if id(operand) not in live)
    return live


def find_norms(graph: gs.Graph, options: FusionOptions = DEFAULT_FUSION) -> NormSearch:
    """Match every RMSNorm in a shape-inferred, topologically sorted graph; the graph is not modified. With
    `options.fuse_residual`, a norm that reads a residual sum is matched with its Add (`NormSearch.add_norms`); with
    `options.fuse_quant`, each fused norm takes the quantizers around it (`patterns/quant.py`); without
    `options.fuse_qk` / `options.fuse_norm`, QK pairs / norms fused alone are near misses that name the option; with
    `options.fuse_rope`, a QK pair takes the rotary embedding after it (`patterns/rope.py`)."""
    graph_outputs = {tensor.name for tensor in graph.outputs}
    # The opset whose QuantizeLinear semantics the quantizers taken in must have; None: none is taken.
    quant_opset = graph.opset if options.fuse_quant else None
    search = NormSearch()
    matches: list[RmsNormMatch] = []
    redefined = _redefined_ops(graph)
    shapes = Shapes(graph)
    for node in graph.nodes:
        is_anchor = node.op in ANCHORS and (node.domain or "") in ONNX_DOMAINS and not _reduces_integers(node)
        if redefined and (is_anchor or is_fused_norm(node)):
            reason = f"the model redefines the ONNX op(s) {', '.join(redefined)} as local functions"
            search.near_misses.append(NearMiss(describe(node), reason))
            continue
        try:
            if is_anchor:
                match, notes = match_decomposed(node, graph_outputs, shapes, quant_opset)
                search.near_misses.extend(notes)
            elif is_fused_norm(node):
                match = match_fused(node, graph_outputs, shapes)
            else:
                continue
        except Rejected as rejection:
            search.near_misses.append(rejection.near_miss)
            continue
        matches.append(match)
    # A dead norm would be matched here and then vanish with the rest of the dead code when fuse cleans the graph,
    # so inspect and fuse would disagree: it is a near miss in both, and the rewrite leaves it as it is.
    live = live_tensors(graph)
    search.dead = [match for match in matches if id(match.y) not in live]
    search.near_misses.extend(NearMiss(match.name, DEAD_REASON) for match in search.dead)
    matches = [match for match in matches if id(match.y) in live]
    pairing = pair_qk_norms(matches, graph)
    search.qk_norm_pairs, search.matches = pairing.pairs, pairing.unpaired
    search.near_misses.extend([*pairing.notes, *absorbed_qk_norms(graph)])
    if not options.fuse_qk:
        search.near_misses.extend(NearMiss(m.name, LEFT_QK) for pair in search.qk_norm_pairs for m in (pair.q, pair.k))
        search.qk_norm_pairs = []
    if options.fuse_residual:
        residual = pair_residual_adds(search.matches, graph_outputs, shapes, quant_opset)
        search.matches, search.add_norms = residual.norms, residual.add_norms
        search.residual_near_misses = residual.near_misses
    if not options.fuse_norm:
        search.near_misses.extend(NearMiss(match.name, LEFT_NORM) for match in search.matches)
        search.matches = []
    if quant_opset is not None:
        take_quantizers(search, graph_outputs, quant_opset)
    if options.fuse_rope:
        take_rotations(search, graph, shapes, graph_outputs, quant_opset)
    return search
