"""find_norms: every norm candidate in a graph, matched, paired into QK-norms, or rejected with a reason."""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trtfuse.patterns.decomposed import ANCHORS, match_decomposed
from trtfuse.patterns.fused_ops import is_fused_norm, match_fused
from trtfuse.patterns.matches import NormSearch, Rejected, RmsNormMatch
from trtfuse.patterns.qk import absorbed_qk_norms, pair_qk_norms


def find_norms(graph: gs.Graph) -> NormSearch:
    """Match every RMSNorm in a shape-inferred, topologically sorted graph; the graph is not modified."""
    graph_outputs = {tensor.name for tensor in graph.outputs}
    search = NormSearch()
    matches: list[RmsNormMatch] = []
    for node in graph.nodes:
        try:
            if node.op in ANCHORS and not node.domain:
                match, notes = match_decomposed(node, graph_outputs)
                search.near_misses.extend(notes)
            elif is_fused_norm(node):
                match = match_fused(node, graph_outputs)
            else:
                continue
        except Rejected as rejection:
            search.near_misses.append(rejection.near_miss)
            continue
        matches.append(match)
    search.qk_norm_pairs, search.matches = pair_qk_norms(matches, graph)
    search.near_misses.extend(absorbed_qk_norms(graph))
    return search
