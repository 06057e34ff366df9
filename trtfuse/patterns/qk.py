"""QK-norm: norms applied to the q and k projections of one attention block, paired into one fused node.

A projection norm normalises (a reshaped, transposed, cast or split view of) the output of a MatMul/Gemm with a
constant weight, whose input is also read by at least one more such projection: the attention's q/k/v inputs.
Layout tags: Qwen3 reshapes, normalises, then transposes (qk-head-dim); Gemma3 reshapes and transposes first
(qk-head-dim-transposed); OLMo2 normalises the whole projection (qk-full-width); DeepSeek's MLA normalises the
low-rank latent that feeds the up-projection (mla-latent).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import onnx_graphsurgeon as gs

from trtfuse.patterns.matches import QkNormPair, RmsNormMatch
from trtfuse.patterns.queries import dtype_name, is_constant, producer

LAYOUT_OPS = ("Reshape", "Transpose", "Cast", "Split", "Slice", "Identity", "Squeeze", "Unsqueeze")
PROJECTIONS = ("MatMul", "Gemm")
MAX_LAYOUT_STEPS = 8


@dataclass(frozen=True)
class _ProjectionNorm:
    match: RmsNormMatch
    source: gs.Tensor
    position: int


def _is_projection(node: gs.Node) -> bool:
    if node.op not in PROJECTIONS or len(node.inputs) < 2:
        return False
    weight = node.inputs[1]
    while not is_constant(weight):
        maker = producer(weight)
        if maker is None or maker.op not in ("Transpose", "Cast", "Identity"):
            return False
        weight = maker.inputs[0]
    return True


def _projection_behind(x: gs.Tensor) -> tuple[gs.Node, list[str]] | None:
    """The projection x is a view of, and the layout ops from it to x in data order."""
    ops: list[str] = []
    tensor = x
    bias_seen = False
    for _ in range(MAX_LAYOUT_STEPS):
        node = producer(tensor)
        if node is None:
            return None
        if _is_projection(node):
            return node, ops[::-1]
        if node.op in LAYOUT_OPS:
            ops.append(node.op)
            tensor = node.inputs[0]
        elif node.op == "Add" and not bias_seen and sum(map(is_constant, node.inputs)) == 1:
            bias_seen = True
            tensor = next(operand for operand in node.inputs if not is_constant(operand))
        else:
            return None
    return None


def _projection_readers(source: gs.Tensor) -> int:
    return sum(1 for node in source.outputs if _is_projection(node) and node.inputs[0] is source)


def _feeds_projection(y: gs.Tensor) -> bool:
    """Whether y, directly or through layout ops (a Reshape, a Cast...), is the input of a projection."""
    frontier = [y]
    for _ in range(MAX_LAYOUT_STEPS):
        readers = [node for tensor in frontier for node in tensor.outputs]
        if any(_is_projection(node) and node.inputs[0] in frontier for node in readers):
            return True
        frontier = [node.outputs[0] for node in readers if node.op in LAYOUT_OPS]
        if not frontier:
            return False
    return False


def _layout_tag(match: RmsNormMatch, ops: list[str]) -> str:
    if _feeds_projection(match.y):
        return "mla-latent"
    if "Reshape" in ops:
        return "qk-head-dim-transposed" if "Transpose" in ops else "qk-head-dim"
    return "qk-full-width"


def _reaches(start: gs.Tensor, target: gs.Tensor) -> bool:
    seen = {id(start)}
    queue = deque([start])
    while queue:
        tensor = queue.popleft()
        if tensor is target:
            return True
        for node in tensor.outputs:
            for output in node.outputs:
                if id(output) not in seen:
                    seen.add(id(output))
                    queue.append(output)
    return False


def _compatible(q: RmsNormMatch, k: RmsNormMatch) -> bool:
    same_numerics = (
        q.epsilon == k.epsilon
        and q.weight_offset == k.weight_offset
        and q.weight_mode == k.weight_mode
        and q.dtype == k.dtype
        and (q.weight is None) == (k.weight is None)
        and (q.weight is None or dtype_name(q.weight) == dtype_name(k.weight))
    )
    return same_numerics and not _reaches(q.y, k.x) and not _reaches(k.y, q.x)


def pair_qk_norms(
    matches: list[RmsNormMatch], positions: dict[int, int]
) -> tuple[list[QkNormPair], list[RmsNormMatch]]:
    """Tag projection norms and pair them per attention block; returns the pairs and every unpaired match."""
    projection_norms: list[_ProjectionNorm] = []
    tagged: list[RmsNormMatch] = []
    for match in matches:
        found = None if match.skip_inputs else _projection_behind(match.x)
        if found is None or _projection_readers(found[0].inputs[0]) < 2:
            tagged.append(match)
            continue
        projection, ops = found
        match = replace(match, tags=(*match.tags, _layout_tag(match, ops)))
        tagged.append(match)
        source = projection.inputs[0]
        projection_norms.append(_ProjectionNorm(match, source, min(positions[id(node)] for node in match.nodes)))
    projection_norms.sort(key=lambda norm: norm.position)
    pairs: list[QkNormPair] = []
    paired: set[int] = set()
    for index, first in enumerate(projection_norms):
        if id(first.match) in paired:
            continue
        for second in projection_norms[index + 1 :]:
            if id(second.match) in paired or second.source is not first.source:
                continue
            if _compatible(first.match, second.match):
                pairs.append(QkNormPair(q=first.match, k=second.match))
                paired.update((id(first.match), id(second.match)))
                break
    return pairs, [match for match in tagged if id(match) not in paired]
