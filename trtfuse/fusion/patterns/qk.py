"""QK-norm: norms applied to the q and k projections of one attention block, paired into one fused node.

A projection norm normalises (a reshaped, transposed, cast, quantised or split view of) the output of a projection
with a constant weight: the attention's q/k/v inputs. Either the projection's input is read by at least one more
projection (separate q, k, v MatMuls), or the view takes one part of the projection's output (a packed QKV MatMul
split into q, k, v, as onnxruntime-genai builds it). Layout tags: Qwen3 reshapes, normalises, then transposes
(qk-head-dim); Gemma3 reshapes and transposes first (qk-head-dim-transposed); OLMo2 normalises the whole projection
(qk-full-width); DeepSeek's MLA normalises the low-rank latent that feeds the up-projection (mla-latent).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

import onnx_graphsurgeon as gs

from trtfuse.fusion.patterns.matches import NearMiss, QkNormPair, RmsNormMatch
from trtfuse.fusion.patterns.queries import describe, dtype_name, is_constant, is_constant_value, onnx_op, producer

MS_DOMAIN = "com.microsoft"
QUANTIZE_OPS = ("QuantizeLinear", "DequantizeLinear")
# Views between a projection and its norm; Q/DQ pairs (ModelOpt) change values but not which tensor it is.
LAYOUT_OPS = ("Reshape", "Transpose", "Cast", "Identity", "Squeeze", "Unsqueeze", *QUANTIZE_OPS)
# One part of a projection's output: q, k or v out of a packed QKV projection.
PART_OPS = ("Split", "Slice", "Gather")
# Between a projection's constant weight and the projection: layout, casts, dequantisation (int8/fp8/int4 Q/DQ).
WEIGHT_OPS = ("Transpose", "Cast", "Identity", *QUANTIZE_OPS)
# Between the attention's input and each projection's activation input: casts and Q/DQ.
INPUT_OPS = ("Cast", "Identity", *QUANTIZE_OPS)
MAX_LAYOUT_STEPS = 8
# The layout tags of a projection norm: such a norm is never a residual norm (patterns/residual.py), whatever its x.
MLA_LATENT, HEAD_DIM, HEAD_DIM_TRANSPOSED, FULL_WIDTH = (
    "mla-latent",
    "qk-head-dim",
    "qk-head-dim-transposed",
    "qk-full-width",
)
PROJECTION_TAGS = frozenset({MLA_LATENT, HEAD_DIM, HEAD_DIM_TRANSPOSED, FULL_WIDTH})
# Attention ops that take the q/k norm weights as inputs and normalise inside: (op, domain) -> input indices.
ABSORBING_ATTENTION = {("GroupQueryAttention", MS_DOMAIN): (14, 15)}


@dataclass(frozen=True)
class _ProjectionNorm:
    match: RmsNormMatch
    source: gs.Tensor
    position: int


def _is_projection(node: gs.Node) -> bool:
    """MatMul / Gemm, or onnxruntime's int4 MatMulNBits, whose weight is a constant (possibly dequantised)."""
    is_matmul = onnx_op(node) in ("MatMul", "Gemm") or (node.op == "MatMulNBits" and node.domain == MS_DOMAIN)
    if not is_matmul or len(node.inputs) < 2:
        return False
    weight = node.inputs[1]
    for _ in range(MAX_LAYOUT_STEPS):
        if is_constant(weight):
            return True
        maker = producer(weight)
        if maker is None or onnx_op(maker) not in WEIGHT_OPS or not maker.inputs:
            return False
        weight = maker.inputs[0]
    return False


def _attention_input(projection: gs.Node) -> gs.Tensor:
    """The tensor a projection projects, seen through casts and the Q/DQ pair a quantiser puts before it."""
    tensor = projection.inputs[0]
    for _ in range(MAX_LAYOUT_STEPS):
        maker = producer(tensor)
        if maker is None or onnx_op(maker) not in INPUT_OPS or not maker.inputs:
            break
        tensor = maker.inputs[0]
    return tensor


def _projections_of(source: gs.Tensor) -> int:
    """How many projections take `source` as their input (directly or through casts / Q/DQ)."""
    projections: set[int] = set()
    frontier = [source]
    for _ in range(MAX_LAYOUT_STEPS):
        readers = [node for tensor in frontier for node in tensor.outputs]
        projections.update(id(node) for node in readers if _is_projection(node) and _attention_input(node) is source)
        frontier = [node.outputs[0] for node in readers if onnx_op(node) in INPUT_OPS and node.outputs]
        if not frontier:
            break
    return len(projections)


def _projection_behind(x: gs.Tensor) -> tuple[gs.Node, list[str]] | None:
    """The projection x is a view of, and the view ops from it to x in data order."""
    ops: list[str] = []
    tensor = x
    bias_seen = False
    for _ in range(MAX_LAYOUT_STEPS):
        node = producer(tensor)
        if node is None or not node.inputs:
            return None
        if _is_projection(node):
            return node, ops[::-1]
        if onnx_op(node) in (*LAYOUT_OPS, *PART_OPS):
            ops.append(node.op)
            tensor = node.inputs[0]
        elif onnx_op(node) == "Add" and not bias_seen and sum(map(is_constant_value, node.inputs)) == 1:
            # A projection's bias, however the exporter spelled the constant (Cast(const), Identity(const)).
            bias_seen = True
            tensor = next(operand for operand in node.inputs if not is_constant_value(operand))
        else:
            return None
    return None


def _feeds_projection(y: gs.Tensor) -> bool:
    """Whether y, directly or through view ops (a Reshape, a Cast, a Q/DQ...), is the input of a projection."""
    frontier = [y]
    for _ in range(MAX_LAYOUT_STEPS):
        readers = [node for tensor in frontier for node in tensor.outputs]
        if any(_is_projection(node) and node.inputs[0] in frontier for node in readers):
            return True
        frontier = [node.outputs[0] for node in readers if onnx_op(node) in (*LAYOUT_OPS, *PART_OPS)]
        if not frontier:
            return False
    return False


def _layout_tag(match: RmsNormMatch, ops: list[str]) -> str:
    if _feeds_projection(match.y):
        return MLA_LATENT
    if "Reshape" in ops:
        return HEAD_DIM_TRANSPOSED if "Transpose" in ops else HEAD_DIM
    return FULL_WIDTH


def enclosing_nodes(graph: gs.Graph) -> dict[int, gs.Node]:
    """For every node inside an If/Loop/Scan body (at any depth), the top-level node that holds that body.

    A body may read any outer tensor without listing it among its node's inputs: through this map, whatever
    the body reads is also read by the node that holds it.
    """
    enclosing: dict[int, gs.Node] = {}
    for node in graph.nodes:
        for body in node.subgraphs(recursive=True):
            enclosing.update((id(inner), node) for inner in body.nodes)
    return enclosing


def depends(starts: Iterable[gs.Tensor], targets: Iterable[gs.Tensor], enclosing: dict[int, gs.Node]) -> bool:
    """Whether any target is computed from any start, through any path (subgraph bodies' outer reads included)."""
    wanted = {id(tensor) for tensor in targets}
    queue = deque(starts)
    seen = {id(tensor) for tensor in queue}
    while queue:
        tensor = queue.popleft()
        if id(tensor) in wanted:
            return True
        for reader in tensor.outputs:
            for node in (reader, enclosing.get(id(reader))):
                for output in node.outputs if node is not None else ():
                    if id(output) not in seen:
                        seen.add(id(output))
                        queue.append(output)
    return False


def _fused_inputs(match: RmsNormMatch) -> list[gs.Tensor]:
    weight = [match.weight] if isinstance(match.weight, gs.Variable) else []
    return [match.x, *match.skip_inputs, *weight]


def _computed(match: RmsNormMatch) -> list[gs.Tensor]:
    """What the match's nodes compute from their inputs (a Constant node computes from nothing: no cycle through it)."""
    return [tensor for node in match.nodes if node.inputs for tensor in node.outputs]


def _numerics_differ(q: RmsNormMatch, k: RmsNormMatch) -> str | None:
    """What makes the two norms different functions, so one fused node cannot compute both; None when nothing."""
    weight_dtypes = [None if match.weight is None else dtype_name(match.weight) for match in (q, k)]
    for what, first, second in (
        ("epsilon", q.params.epsilon, k.params.epsilon),
        ("weight offset", q.params.weight_offset, k.params.weight_offset),
        ("weight mode", q.params.weight_mode.name, k.params.weight_mode.name),
        ("input dtype", q.dtype, k.dtype),
        ("output dtype", q.output_dtype, k.output_dtype),
        ("weight", *("none" if match.weight is None else "a weight" for match in (q, k))),
        ("weight dtype", *weight_dtypes),
    ):
        if first != second:
            return f"{what} {first} here, {second} there"
    return None


def _why_not_paired(q: RmsNormMatch, k: RmsNormMatch, enclosing: dict[int, gs.Node]) -> str | None:
    """Why one node cannot compute both norms (different numerics, or a path from what one computes to the other's
    inputs: the fused node would feed itself); None when it can."""
    difference = _numerics_differ(q, k)
    if difference is not None:
        return difference
    if depends([*_computed(q), *_computed(k)], [*_fused_inputs(q), *_fused_inputs(k)], enclosing):
        return "one depends on the other, so one node computing both would be a cycle"
    return None


@dataclass
class QkPairing:
    """Projection norms paired per attention block, every other match (tagged), and why candidates stayed unpaired."""

    pairs: list[QkNormPair]
    unpaired: list[RmsNormMatch]
    notes: list[NearMiss]


def pair_qk_norms(matches: list[RmsNormMatch], graph: gs.Graph) -> QkPairing:
    """Tag projection norms and pair them per attention block."""
    positions = {id(node): index for index, node in enumerate(graph.nodes)}
    projection_norms: list[_ProjectionNorm] = []
    tagged: list[RmsNormMatch] = []
    for match in matches:
        found = None if match.skip_inputs else _projection_behind(match.x)
        if found is None:
            tagged.append(match)
            continue
        projection, ops = found
        source = _attention_input(projection)
        if not any(op in PART_OPS for op in ops) and _projections_of(source) < 2:
            tagged.append(match)
            continue
        match = replace(match, tags=(*match.tags, _layout_tag(match, ops)))
        tagged.append(match)
        projection_norms.append(_ProjectionNorm(match, source, min(positions[id(node)] for node in match.nodes)))
    projection_norms.sort(key=lambda norm: norm.position)
    enclosing = enclosing_nodes(graph)
    pairs: list[QkNormPair] = []
    paired: set[int] = set()
    refusals: dict[int, str] = {}
    for index, first in enumerate(projection_norms):
        if id(first.match) in paired:
            continue
        for second in projection_norms[index + 1 :]:
            if id(second.match) in paired or second.source is not first.source:
                continue
            reason = _why_not_paired(first.match, second.match, enclosing)
            if reason is None:
                pairs.append(QkNormPair(q=first.match, k=second.match))
                paired.update((id(first.match), id(second.match)))
                break
            for this, other in ((first.match, second.match), (second.match, first.match)):
                refusals.setdefault(id(this), f"not paired with the q/k norm {other.name}: {reason}")
    notes = [
        NearMiss(norm.match.name, refusals[id(norm.match)])
        for norm in projection_norms
        if id(norm.match) not in paired and id(norm.match) in refusals
    ]
    return QkPairing(pairs, [match for match in tagged if id(match) not in paired], notes)


def absorbed_qk_norms(graph: gs.Graph) -> list[NearMiss]:
    """Attention ops that already apply the q/k norms inside (their weights are inputs): reported, left alone."""
    misses = []
    for node in graph.nodes:
        indices = ABSORBING_ATTENTION.get((node.op, node.domain), ())
        names = [node.inputs[index].name for index in indices if index < len(node.inputs) and node.inputs[index].name]
        if names:
            misses.append(
                NearMiss(
                    describe(node),
                    f"q/k norms already inside the attention op (norm weights {', '.join(names)}): left alone",
                )
            )
    return misses
