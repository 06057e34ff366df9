"""The rotary embedding after a QK-norm pair, taken into the pair's node (TrtfuseQkNormRope; docs/patterns.md,
"Rotary embedding").

In every QK-norm model the rotation reads the q and k norms' outputs, directly (Gemma3: the norm runs after the
attention's transpose) or through the layout ops between them (Qwen3: a Transpose; OLMo2: a Reshape into heads and a
Transpose). The rotation commutes with those ops once its cos and sin are indexed per token, so the node rotates
its norm's output and the ops stay after it, moving the rotated values. Two spellings of the rotation are taken:

- Hugging Face's `q * cos + rotate_half(q) * sin`: a Mul by cos, two Slices of the halves, `Neg` of the second,
  `Concat(-x2, x1)`, a Mul by sin and the Add of the two products, with Casts on any branch and after the Add (a
  rotation computed in float32 and cast back), and a partial rotation (`cat(rotated first R, rest)`);
- ONNX's `RotaryEmbedding` (opset 23), with or without position ids, interleaved or not, partial or not.

Both norms must be rotated, by the same cos and sin, in the same way; each rotated tensor read by nothing but the
rotation (and Shape nodes, which read the rotated result instead: it has the same shape). Anything else stays in the
graph, the pair fused as TrtfuseQkNorm, with the reason (`NormSearch.rope_near_misses`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import numpy as np
import onnx_graphsurgeon as gs

from trtfuse.contract import (
    ACTIVATION_DTYPES,
    HeadLayout,
    QuantStage,
    RotaryParams,
    Rotation,
    dtype_pair_problem,
)
from trtfuse.fusion.patterns.index_values import index_values
from trtfuse.fusion.patterns.matches import (
    NearMiss,
    NormSearch,
    QkNormPair,
    QkNormRopeMatch,
    RmsNormMatch,
    RotaryTable,
    RotatedNorm,
    TakenQuantizer,
)
from trtfuse.fusion.patterns.qk import depends, enclosing_nodes
from trtfuse.fusion.patterns.quant import (
    LAYOUT_FP8,
    fake_quant,
    fake_quant_pair,
    pair_text,
    qdq_pair,
    quantizer_of,
    widened_reader,
)
from trtfuse.fusion.patterns.queries import (
    ONNX_DOMAINS,
    cast_target,
    describe,
    dtype_name,
    onnx_op,
    other_input,
    producer,
    small_constant,
    unique,
)
from trtfuse.fusion.patterns.shapes import Shape, Shapes, provable_dim

ROTARY_OP = "RotaryEmbedding"
# Ops between a norm and its rotation that only move elements: they stay after the fused node.
LAYOUT_OPS = ("Reshape", "Transpose")
# Attention ops that rotate q and k inside (onnxruntime-genai): (op, domain) -> the attribute that turns it on.
ROTATING_ATTENTION = {("GroupQueryAttention", "com.microsoft"): "do_rotary"}
# How far from a norm's output a Neg or RotaryEmbedding marks a rotation worth a reason when it is not taken.
_SEARCH_STEPS = 6
# Logical axes: batch, token, head, head row (D), and a token's whole width (H·D).
BATCH, TOKEN, HEAD, ROW, WIDTH = "B", "S", "H", "D", "F"
_HYPOTHESES = {4: (HeadLayout.TOKEN_MAJOR, HeadLayout.HEAD_MAJOR), 3: (HeadLayout.TOKEN_MAJOR,)}
_START_AXES = {
    (4, HeadLayout.TOKEN_MAJOR): (BATCH, TOKEN, HEAD, ROW),
    (4, HeadLayout.HEAD_MAJOR): (BATCH, HEAD, TOKEN, ROW),
    (3, HeadLayout.TOKEN_MAJOR): (BATCH, TOKEN, WIDTH),
}


class _NotTaken(Exception):
    """The rotation after a norm cannot go into the node: the reason."""


@dataclass(frozen=True)
class _Formula:
    """A rotation as found on the rotated tensor, before its axes are known: what it replaces, what it computes, the
    cos and sin operands as it reads them, and its pairing."""

    nodes: tuple[gs.Node, ...]
    result: gs.Variable
    cos: gs.Tensor
    sin: gs.Tensor
    rotary_dim: int | None
    rotation: Rotation
    op: gs.Node | None = None
    # ModelOpt's rotations: the QuantizeLinear -> DequantizeLinear pair on the cos product and on the sin product.
    products: tuple[tuple[gs.Node, gs.Node], tuple[gs.Node, gs.Node]] | None = None


def take_rotations(
    search: NormSearch, graph: gs.Graph, shapes: Shapes, graph_outputs: set[str], quant_opset: int | None
) -> None:
    """Move each QK pair whose outputs go through one rotary embedding into `search.qk_norm_ropes`, the rotation's
    output QuantizeLinear (where the search takes quantizers, in a graph of `quant_opset`) its output stages (a Q that
    stays out: `search.quant_near_misses`); record
    why any other rotation after a pair stays out, and the attention ops that rotate inside
    (`search.rope_near_misses`). In place."""
    misses: list[NearMiss] = []
    pairs: list[QkNormPair] = []
    enclosing = enclosing_nodes(graph)
    for pair in search.qk_norm_pairs:
        try:
            rope = _rope_of(pair, shapes, graph_outputs, quant_opset, search.quant_near_misses)
            if rope is not None:
                _check_no_cycle(rope, enclosing)
        except _NotTaken as reason:
            misses.append(NearMiss(pair.q.name, f"rotation not fused: {reason}; the pair was fused without it"))
            rope = None
        if rope is None:
            pairs.append(pair)
        else:
            search.qk_norm_ropes.append(rope)
    search.qk_norm_pairs = pairs
    search.rope_near_misses = [*misses, *_rotating_attention(graph)]


def _rope_of(
    pair: QkNormPair,
    shapes: Shapes,
    graph_outputs: set[str],
    quant_opset: int | None,
    quant_misses: list[NearMiss] | None,
) -> QkNormRopeMatch | None:
    """The pair with both rotations, None where neither output is rotated; _NotTaken where a rotation stays out.
    With `quant_opset` (the search takes quantizers) each rotation takes the QuantizeLinear of its result, or records
    in `quant_misses` why it stays out."""
    sides = []
    for role in ("q", "k"):
        norm = getattr(pair, role)
        if not _rotation_ahead(norm.y):
            sides.append(None)
            continue
        output = next((taken for taken in norm.quantizers if taken.stage.norm_stage is QuantStage.OUTPUT), None)
        normalised = None
        if output is not None:
            norm, normalised = _normalised_pair(norm, output, _NORMALISED_STAGES[role], graph_outputs, quant_opset)
        side = _rotated(norm, shapes, graph_outputs, quant_opset, _PRODUCT_STAGES[role])
        if normalised is not None and normalised.quantizer.dequant_dtype != side.output_dtype:
            raise _NotTaken(
                f"the pair on {norm.name}'s output ({describe(normalised.quantize)}) dequantizes to "
                f"{normalised.quantizer.dequant_dtype}, the rotation computes in {side.output_dtype}"
            )
        sides.append(replace(side, normalised=normalised))
    q, k = sides
    if q is None and k is None:
        return None
    if q is None or k is None:
        rotated, plain = (pair.q, pair.k) if k is None else (pair.k, pair.q)
        raise _NotTaken(f"only {rotated.name}'s output is rotated, not {plain.name}'s")
    _check_same_rotation(q, k)
    if quant_opset is not None and quant_misses is not None:
        # Where both layouts end in the attention's [B, H, S, D], the node can write it itself: a Q after them is
        # then taken whatever it quantizes to, and its Shape readers read the node's output.
        movable = q.moves_into_heads and k.moves_into_heads
        q, k = (
            _with_output_quantizer(side, stage, graph_outputs, quant_opset, quant_misses, movable)
            for side, stage in _output_stages(q, k)
        )
        if movable and any(side.quantizer is not None for side in (q, k)):
            rotary = replace(q.rotary, output_layout=HeadLayout.HEAD_MAJOR)
            q, k = (replace(side, rotary=rotary) for side in (q, k))
    return QkNormRopeMatch(q, k)


# Each part's stages for the Q/DQ pairs on its rotation's cos and sin products, and on its norm's output.
_PRODUCT_STAGES = {
    "q": (QuantStage.Q_COS_PRODUCT, QuantStage.Q_SIN_PRODUCT),
    "k": (QuantStage.K_COS_PRODUCT, QuantStage.K_SIN_PRODUCT),
}
_NORMALISED_STAGES = {"q": QuantStage.Q_NORMALISED, "k": QuantStage.K_NORMALISED}


def _normalised_pair(
    norm: RmsNormMatch, output: TakenQuantizer, stage: QuantStage, graph_outputs: set[str], opset: int | None
) -> tuple[RmsNormMatch, TakenQuantizer]:
    """The norm as its rotation reads it through the QuantizeLinear -> DequantizeLinear pair on its output
    (ModelOpt's INT8 Gemma3: y -> Q -> DQ -> the rotation), the QuantizeLinear being the one the quantizer search
    took as its output stage (`output`): its y that pair's dequantized value, and the pair as the part's normalised
    `stage`; _NotTaken where the pair is none the node computes."""
    quantize = output.quantize
    where = f"{norm.name}'s output is quantized ({describe(quantize)}) before the rotation reads it"
    if output.layout is not None or opset is None:
        raise _NotTaken(f"{where} after {describe(output.layout)}, not where the norm writes it")
    codes = quantize.outputs[0]
    readers = unique(codes.outputs)
    if codes.name in graph_outputs or len(readers) != 1 or onnx_op(readers[0]) != "DequantizeLinear":
        found = ", ".join(describe(node) for node in readers) or "nothing"
        raise _NotTaken(f"{where}, and its codes go to {found}, not to one DequantizeLinear")
    read = readers[0].outputs[0]
    rounding = _real_readers(read)
    if len(rounding) == 1 and onnx_op(rounding[0]) == "Cast" and read.name not in graph_outputs:
        read = rounding[0].outputs[0]
    pair = qdq_pair(read)
    if pair is None or pair.quantize is not quantize:
        raise _NotTaken(f"{where}, and dequantized by {describe(readers[0])}, which is no rounding of y")
    taken = fake_quant_pair(stage, pair, opset)
    if isinstance(taken, str):
        raise _NotTaken(f"the pair {pair.text} on {norm.name}'s output: {taken}")
    kept = tuple(quantizer for quantizer in norm.quantizers if quantizer is not output)
    return replace(norm, y=read, quantizers=kept), replace(taken, nodes=(*output.nodes, *pair.nodes[1:]))


def _output_stages(q: RotatedNorm, k: RotatedNorm) -> Iterator[tuple[RotatedNorm, QuantStage]]:
    yield q, QuantStage.Q_OUTPUT
    yield k, QuantStage.K_OUTPUT


def _rotation_ahead(y: gs.Tensor) -> bool:
    """Whether a Neg or a RotaryEmbedding reads what y becomes within a few ops: a rotation to take or to explain."""
    frontier = [y]
    for _ in range(_SEARCH_STEPS):
        readers = unique([node for tensor in frontier for node in tensor.outputs])
        if any(node.op in (ROTARY_OP, "Neg") for node in readers):
            return True
        frontier = [output for node in readers if node.op != "Shape" for output in node.outputs]
    return False


def _rotated(
    norm: RmsNormMatch,
    shapes: Shapes,
    graph_outputs: set[str],
    quant_opset: int | None,
    product_stages: tuple[QuantStage, QuantStage],
) -> RotatedNorm:
    """The norm with the rotation of its output (the pairs on its products, where the graph has them, as
    `product_stages` of a graph of `quant_opset`), or _NotTaken."""
    layout, rotated = _layout_ops(norm.y, graph_outputs)
    readers = _real_readers(rotated)
    if rotated.name in graph_outputs:
        raise _NotTaken(f"{rotated.name} is a graph output")
    if len(readers) == 1 and readers[0].op == ROTARY_OP:
        formula = _rotary_embedding(readers[0], rotated)
    else:
        formula = _rotate_half(rotated, readers, shapes, graph_outputs)
    rank = len(shapes.of(norm.y) or ())
    if rank not in _HYPOTHESES:
        raise _NotTaken(f"{norm.y.name} has rank {rank}, not 3 or 4")
    reasons = []
    for hypothesis in _HYPOTHESES[rank]:
        placed = _placed(norm, hypothesis, layout, rotated, formula, shapes)
        if isinstance(placed, str):
            reasons.append(placed)
            continue
        head_dim, tables, axes = placed
        side = _rotated_norm(norm, hypothesis, layout, rotated, formula, head_dim, tables)
        products = _product_quantizers(formula, norm, rotated, product_stages, quant_opset, head_dim)
        moves_heads = _moves_into_heads(hypothesis, layout, axes)
        return replace(side, products=products, moves_into_heads=moves_heads)
    raise _NotTaken(reasons[0])


def _layout_ops(y: gs.Tensor, graph_outputs: set[str]) -> tuple[tuple[gs.Node, ...], gs.Tensor]:
    """The Reshape / Transpose ops from y, each its tensor's one reader but for Shape nodes, and the last's output."""
    ops: list[gs.Node] = []
    tensor = y
    while len(ops) < len(LAYOUT_OPS) + 1:
        readers = _real_readers(tensor)
        if tensor.name in graph_outputs or len(readers) != 1 or onnx_op(readers[0]) not in LAYOUT_OPS:
            break
        if readers[0].inputs[0] is not tensor or len(readers[0].outputs) != 1:
            break
        ops.append(readers[0])
        tensor = readers[0].outputs[0]
    return tuple(ops), tensor


def _real_readers(tensor: gs.Tensor) -> list[gs.Node]:
    """The nodes reading `tensor` for its values: every reader but the Shape nodes."""
    return [node for node in unique(tensor.outputs) if onnx_op(node) != "Shape"]


# --- the rotation's formula ------------------------------------------------------------------------------------------


def _rotary_embedding(node: gs.Node, rotated: gs.Tensor) -> _Formula:
    """ONNX's RotaryEmbedding (opset 23) on `rotated`: its caches are half-width, gathered by its position ids."""
    if (node.domain or "") not in ONNX_DOMAINS:
        raise _NotTaken(f"{describe(node)} is {ROTARY_OP} of domain {node.domain}, not the ONNX op")
    if len(node.inputs) < 3 or node.inputs[0] is not rotated:
        raise _NotTaken(f"{describe(node)} does not rotate {rotated.name} by a cos and sin cache")
    rotary_dim = node.attrs.get("rotary_embedding_dim", 0) or None
    rotation = Rotation.INTERLEAVED if node.attrs.get("interleaved", 0) else Rotation.HALF_SPLIT
    return _Formula((node,), node.outputs[0], node.inputs[1], node.inputs[2], rotary_dim, rotation, node)


def _rotate_half(rotated: gs.Tensor, readers: list[gs.Node], shapes: Shapes, graph_outputs: set[str]) -> _Formula:
    """`x·cos + rotate_half(x)·sin` on `rotated` (x, or its first R elements, the rest concatenated after), with
    Casts where the graph puts them; _NotTaken saying which part differs."""
    nodes: list[gs.Node] = []
    base = rotated
    if len(readers) == 1 and onnx_op(readers[0]) == "Cast" and cast_target(readers[0]) in ACTIVATION_DTYPES:
        nodes.append(readers[0])
        base = readers[0].outputs[0]
        readers = _real_readers(base)
    width = shapes.last_dim(base)
    if width is None:
        raise _NotTaken(f"the last axis of {base.name} has no static length")
    passed = None
    slices = _slices(readers, base, shapes)
    cut = sorted(slices)
    if len(readers) == 2 and len(cut) == 2 and cut[0][0] == 0 and cut[0][1] == cut[1][0] and cut[1][1] == width:
        # A partial rotation: the first R elements rotated, the rest concatenated after them.
        head_node, tail_node = slices[cut[0]], slices[cut[1]]
        nodes += [head_node, tail_node]
        passed, base, width = tail_node.outputs[0], head_node.outputs[0], cut[0][1]
        readers = _real_readers(base)
        slices = _slices(readers, base, shapes)
    half = width // 2
    first, second = slices.get((0, half)), slices.get((half, width))
    others = [node for node in readers if node is not first and node is not second]
    if width % 2 or first is None or second is None or len(others) != 1:
        found = ", ".join(describe(node) for node in readers)
        raise _NotTaken(f"{base.name} is read by {found}, not by a Mul by cos and the two halves of rotate_half")
    neg = _only_reader(second.outputs[0], graph_outputs, "Neg")
    concat = _only_reader(neg.outputs[0], graph_outputs, "Concat")
    if _only_reader(first.outputs[0], graph_outputs, "Concat") is not concat or not _reads(
        concat, neg.outputs[0], first.outputs[0]
    ):
        raise _NotTaken(f"{describe(concat)} is not Concat(-second half, first half) of {base.name}")
    if concat.attrs.get("axis") not in (-1, (shapes.rank(base) or 0) - 1):
        raise _NotTaken(f"{describe(concat)} concatenates along axis {concat.attrs.get('axis')}, not the last")
    cos_mul, cos_casts = _product(base, others[0], graph_outputs)
    sin_mul, sin_casts = _product(concat.outputs[0], _only_reader(concat.outputs[0], graph_outputs), graph_outputs)
    (add, cos_pair), (sin_add, sin_pair) = (_summed(mul, graph_outputs) for mul in (cos_mul, sin_mul))
    if sin_add is not add:
        raise _NotTaken(f"{describe(cos_mul)} and {describe(sin_mul)} are not added by one Add")
    if (cos_pair is None) != (sin_pair is None):
        quantized, plain = (cos_mul, sin_mul) if sin_pair is None else (sin_mul, cos_mul)
        raise _NotTaken(
            f"the product {describe(quantized)} is quantized before the sum, {describe(plain)} is not: another formula"
        )
    products = None if cos_pair is None else (cos_pair, sin_pair)
    nodes += [first, second, neg, concat, *cos_casts, cos_mul, *sin_casts, sin_mul, add]
    # A rotation with quantized products ends at its sum, in T: Casts after it stay in the graph (the node rounds the
    # sum to the products' dtype, and a Cast of that is no rounding the contract moves into the node).
    ends = _cast_tail if products is None else _no_casts
    result, tail_casts = ends(add.outputs[0], graph_outputs)
    nodes += tail_casts
    if passed is not None:
        joined = _only_reader(result, graph_outputs, "Concat")
        if not _reads(joined, result, passed) or joined.attrs.get("axis") not in (-1, shapes.rank(base) - 1):
            raise _NotTaken(f"{describe(joined)} is not Concat(rotated part, {passed.name}) along the last axis")
        nodes.append(joined)
        result, more_casts = ends(joined.outputs[0], graph_outputs)
        nodes += more_casts
    cos = other_input(cos_mul, _cast_to(base, cos_casts))
    sin = other_input(sin_mul, _cast_to(concat.outputs[0], sin_casts))
    return _Formula(tuple(nodes), result, cos, sin, width, Rotation.HALF_SPLIT, products=products)


def _reads(node: gs.Node, *tensors: gs.Tensor) -> bool:
    """Whether `node`'s inputs are exactly `tensors`, in order."""
    return len(node.inputs) == len(tensors) and all(a is b for a, b in zip(node.inputs, tensors, strict=True))


def _slices(readers: list[gs.Node], base: gs.Tensor, shapes: Shapes) -> dict[tuple[int, int], gs.Node]:
    """The readers that are Slices of `base`'s last axis with step 1, by their (start, end) in [0, width]."""
    found: dict[tuple[int, int], gs.Node] = {}
    for node in readers:
        if onnx_op(node) == "Slice" and node.inputs[0] is base:
            bounds = _slice_bounds(node, shapes)
            if bounds is not None:
                found[bounds] = node
    return found


def _slice_bounds(node: gs.Node, shapes: Shapes) -> tuple[int, int] | None:
    """(start, end) of a Slice along the last axis of its input with step 1, clamped to the axis; else None."""
    dims = shapes.of(node.inputs[0])
    if not dims or not isinstance(dims[-1], int):
        return None
    rank, width = len(dims), dims[-1]

    def operand(index: int, attribute: str) -> tuple[int | None, ...] | None:
        if attribute in node.attrs:
            return tuple(node.attrs[attribute])
        if index < len(node.inputs) and node.inputs[index].name:
            return index_values(node.inputs[index], shapes)
        return None

    starts, ends, axes, steps = operand(1, "starts"), operand(2, "ends"), operand(3, "axes"), operand(4, "steps")
    if starts is None or ends is None or len(starts) != 1 or len(ends) != 1 or None in (*starts, *ends):
        return None
    if (axes is None and rank != 1) or (axes is not None and tuple(axes) not in ((-1,), (rank - 1,))):
        return None
    if steps is not None and tuple(steps) != (1,):
        return None
    return tuple(max(0, min(width, bound + width if bound < 0 else bound)) for bound in (starts[0], ends[0]))


def _only_reader(tensor: gs.Tensor, graph_outputs: set[str], op: str | None = None) -> gs.Node:
    """The one node reading `tensor` (of `op`, where given); _NotTaken naming what reads it otherwise."""
    readers = _real_readers(tensor)
    if tensor.name in graph_outputs:
        raise _NotTaken(f"{tensor.name} is a graph output")
    if len(readers) == 1 and (op is None or onnx_op(readers[0]) == op):
        return readers[0]
    found = ", ".join(describe(node) for node in readers) or "nothing"
    raise _NotTaken(f"{tensor.name} is read by {found}" + (f", not by one {op}" if op else ""))


def _summed(product: gs.Node, graph_outputs: set[str]) -> tuple[gs.Node, tuple[gs.Node, gs.Node] | None]:
    """The Add that sums the product `product` computes, and the QuantizeLinear -> DequantizeLinear pair it goes
    through first where it goes through one (ModelOpt's rotations round each product to a quantizer's grid), each
    the one reader of what it reads; else None."""
    value = product.outputs[0]
    readers = _real_readers(value)
    if len(readers) != 1 or onnx_op(readers[0]) != "QuantizeLinear" or value.name in graph_outputs:
        return _only_reader(value, graph_outputs, "Add"), None
    quantize = readers[0]
    dequantize = _only_reader(quantize.outputs[0], graph_outputs, "DequantizeLinear")
    return _only_reader(dequantize.outputs[0], graph_outputs, "Add"), (quantize, dequantize)


def _product(operand: gs.Tensor, reader: gs.Node, graph_outputs: set[str]) -> tuple[gs.Node, list[gs.Node]]:
    """The Mul that `reader` is (or that reads `operand` through the Casts starting at `reader`), with those Casts."""
    casts: list[gs.Node] = []
    node = reader
    while onnx_op(node) == "Cast" and cast_target(node) in ACTIVATION_DTYPES and len(casts) < 2:
        casts.append(node)
        node = _only_reader(node.outputs[0], graph_outputs)
    if onnx_op(node) != "Mul" or len(node.inputs) != 2:
        raise _NotTaken(f"{operand.name} goes to {describe(node)}, not to a Mul by cos or sin")
    return node, casts


def _cast_to(operand: gs.Tensor, casts: list[gs.Node]) -> gs.Tensor:
    """`operand` as the Casts after it leave it: what their Mul reads."""
    return casts[-1].outputs[0] if casts else operand


def _no_casts(tensor: gs.Variable, graph_outputs: set[str]) -> tuple[gs.Variable, list[gs.Node]]:
    """`tensor` itself, with no Casts taken after it."""
    return tensor, []


def _cast_tail(tensor: gs.Variable, graph_outputs: set[str]) -> tuple[gs.Variable, list[gs.Node]]:
    """`tensor` through the float Casts that are its one reader in turn (the rotation cast back to the activations'
    dtype), and those Casts."""
    casts: list[gs.Node] = []
    while tensor.name not in graph_outputs:
        readers = _real_readers(tensor)
        if len(readers) != 1 or onnx_op(readers[0]) != "Cast" or cast_target(readers[0]) not in ACTIVATION_DTYPES:
            break
        casts.append(readers[0])
        tensor = readers[0].outputs[0]
    return tensor, casts


def _product_quantizers(
    formula: _Formula,
    norm: RmsNormMatch,
    rotated: gs.Tensor,
    stages: tuple[QuantStage, QuantStage],
    opset: int | None,
    head_dim: int,
) -> tuple[TakenQuantizer, ...]:
    """The pairs on the rotation's cos and sin products as the node's product `stages` in a graph of `opset` (None:
    quantizers are not taken); _NotTaken where the node cannot compute them as the graph does: it rounds y, each
    product and their sum to one dtype T (docs/plugin-nodes.md, "Rotary embedding"). A y that differs from the
    graph's in its last bit (a norm rounded otherwise) may move a product's code one step of its grid, which `check`
    allows (docs/cli.md, "Each fused node"), but not where the rotation passes some of y's elements through."""
    if formula.products is None:
        return ()
    quantize = formula.products[0][0]
    product = describe(producer(quantize.inputs[0]))
    if opset is None:
        raise _NotTaken(
            f"the product {product} is quantized ({describe(quantize)}) before the sum, and quantizers are not taken"
        )
    if norm.rounds_otherwise is not None and formula.rotary_dim is not None and formula.rotary_dim < head_dim:
        raise _NotTaken(
            f"the product {product} is quantized ({describe(quantize)}) before the sum, {norm.name} rounds "
            f"otherwise than its node ({norm.rounds_otherwise}) and the rotation passes {head_dim - formula.rotary_dim}"
            f" of {head_dim} elements through: check judges a rotated output with quantized products element by "
            "element, and y's own elements may differ from the graph's in more than their last bit"
        )
    computed = (
        rotated,
        *(tensor for pair in formula.products for tensor in (pair[0].inputs[0], pair[1].outputs[0])),
        formula.result,
    )
    dtypes = {tensor.name: dtype_name(tensor) or "unknown" for tensor in computed}
    if len(set(dtypes.values())) != 1:
        shown = ", ".join(f"{name} {dtype}" for name, dtype in dtypes.items())
        raise _NotTaken(f"its quantized products are not rounded in one dtype with the rotated tensor ({shown})")
    taken = []
    for stage, (quantize, dequantize) in zip(stages, formula.products, strict=True):
        found = fake_quant(stage, quantize, dequantize, opset)
        if isinstance(found, str):
            raise _NotTaken(f"the pair {pair_text(quantize, dequantize)} on a product: {found}")
        taken.append(found)
    return tuple(taken)


# --- where the rotation's axes are ----------------------------------------------------------------------------------


def _placed(
    norm: RmsNormMatch,
    layout: HeadLayout,
    ops: tuple[gs.Node, ...],
    rotated: gs.Tensor,
    formula: _Formula,
    shapes: Shapes,
) -> tuple[int | None, tuple[RotaryTable, RotaryTable], tuple[str, ...]] | str:
    """Where the rotation's axes are if the norm's y has `layout`: the layout ops carry y's axes to the rotated
    tensor's, where the rotation must find one row of cos and sin per token; the head width, the tables and the
    rotated tensor's axes, or why not."""
    y_dims = shapes.of(norm.y) or ()
    axes: tuple[str, ...] = _START_AXES[(len(y_dims), layout)]
    head_dim = y_dims[-1] if len(y_dims) == 4 else None
    for op in ops:
        moved = _moved(op, axes, shapes, head_dim)
        if isinstance(moved, str):
            return moved
        axes, head_dim = moved
    if formula.op is not None:
        found = _embedding_axes(formula.op, axes, rotated, shapes, head_dim)
    else:
        found = _broadcast_axes(formula, axes, rotated, shapes)
    return found if isinstance(found, str) else (*found, axes)


def _moves_into_heads(layout: HeadLayout, ops: tuple[gs.Node, ...], axes: tuple[str, ...]) -> bool:
    """Whether the layout ops take token-major y into [B, H, S, D], which a node may then write itself
    (`RotaryParams.output_layout`): not where a Shape node reads a tensor between them, which such a node would
    leave no tensor of that shape for."""
    if layout is not HeadLayout.TOKEN_MAJOR or not ops or axes != (BATCH, HEAD, TOKEN, ROW):
        return False
    return not any(reader.op == "Shape" for op in ops[:-1] for reader in op.outputs[0].outputs)


def _rotated_norm(
    norm: RmsNormMatch,
    layout: HeadLayout,
    ops: tuple[gs.Node, ...],
    rotated: gs.Tensor,
    formula: _Formula,
    head_dim: int | None,
    tables: tuple[RotaryTable, RotaryTable],
) -> RotatedNorm:
    """The rotation as the node computes it, its axes found; _NotTaken where its widths or dtypes are none the
    node has."""
    rotary_dim = formula.rotary_dim or head_dim
    if not isinstance(head_dim, int) or norm.hidden_size % head_dim:
        raise _NotTaken(f"the head rows of {norm.y.name} have no static width dividing {norm.hidden_size}")
    if layout is HeadLayout.HEAD_MAJOR and norm.hidden_size != head_dim:
        raise _NotTaken(f"{norm.name} normalises {norm.hidden_size} elements, not one head row of {head_dim}")
    if rotary_dim % 2 or not 2 <= rotary_dim <= head_dim:
        raise _NotTaken(f"the rotation turns {rotary_dim} of {head_dim} elements per head row")
    problem = dtype_pair_problem(norm.dtype, dtype_name(formula.result) or "unknown")
    if problem is not None:
        raise _NotTaken(f"{norm.name} and its rotation cannot be one node: {problem}")
    dtypes = [dtype_name(table.tensor) for table in tables]
    for table, dtype in zip(tables, dtypes, strict=True):
        if dtype not in ("float32", norm.dtype):
            raise _NotTaken(f"{table.tensor.name} is {dtype}, neither float32 nor the activations' {norm.dtype}")
    if dtypes[0] != dtypes[1]:
        raise _NotTaken(f"cos and sin are {dtypes[0]} and {dtypes[1]}, not one dtype")
    rotary = RotaryParams(head_dim, rotary_dim, formula.rotation, layout)
    return RotatedNorm(norm, ops, formula.nodes, rotated, formula.result, *tables, rotary)


def _moved(
    op: gs.Node, axes: tuple[str, ...], shapes: Shapes, head_dim: int | None
) -> tuple[tuple[str, ...], int | None] | str:
    """The logical axes after a layout op (and the head width, which a split of a token's width into heads gives),
    or why the op is no move the rotation commutes with."""
    if op.op == "Transpose":
        perm = op.attrs.get("perm", list(range(len(axes)))[::-1])
        return tuple(axes[index] for index in perm), head_dim
    source, target = shapes.of(op.inputs[0]), shapes.of(op.outputs[0])
    if source is None or target is None or len(source) != len(axes) or abs(len(target) - len(source)) != 1:
        return f"{describe(op)} does not split a token's width into heads, or merge its heads, as far as shapes show"
    kept = len(source) - 1 if len(target) == len(source) + 1 else len(target) - 1
    if not _same_dims(source[:kept], target[:kept]):
        return f"{describe(op)} changes more than the last axes of {op.inputs[0].name}"
    if axes[-1] == WIDTH and len(target) == len(source) + 1 and isinstance(target[-1], int):
        width = source[-1]
        if isinstance(width, int) and width % target[-1] == 0:
            return (*axes[:-1], HEAD, ROW), target[-1]
    if axes[-2:] == (HEAD, ROW) and len(target) == len(source) - 1:
        return (*axes[:-2], WIDTH), head_dim
    return f"{describe(op)} does not split a token's width into heads, or merge its heads"


def _same_dims(first: Shape, second: Shape) -> bool:
    return all(provable_dim(a) is not None and a == b for a, b in zip(first, second, strict=True))


def _embedding_axes(
    node: gs.Node, axes: tuple[str, ...], rotated: gs.Tensor, shapes: Shapes, head_dim: int | None
) -> tuple[int | None, tuple[RotaryTable, RotaryTable]] | str:
    """RotaryEmbedding rotates [B, H, S, D] or [B, S, H·D] (num_heads heads); its caches are half-width, indexed by
    token (and batch) or, with position ids, by position."""
    if axes == (BATCH, HEAD, TOKEN, ROW):
        width = shapes.last_dim(rotated)
    elif axes == (BATCH, TOKEN, WIDTH) and node.attrs.get("num_heads", 0) > 0:
        total = shapes.last_dim(rotated)
        heads = node.attrs["num_heads"]
        width = total // heads if total is not None and total % heads == 0 else None
    else:
        return f"{describe(node)} rotates {rotated.name} as [B, H, S, D] or [B, S, H·D], which its axes are not"
    positions = node.inputs[3] if len(node.inputs) > 3 and node.inputs[3].name else None
    rank = 2 if positions is not None else 3
    for cache in node.inputs[1:3]:
        if shapes.rank(cache) != rank:
            return f"{cache.name} has rank {shapes.rank(cache)}, not {rank} as {describe(node)} reads it"
    if None not in (head_dim, width) and head_dim != width:
        return f"{describe(node)} rotates head rows of {width}, the layout ops make rows of {head_dim}"
    tables = tuple(RotaryTable(cache, positions=positions, half=True) for cache in node.inputs[1:3])
    return width if head_dim is None else head_dim, tables


def _broadcast_axes(
    formula: _Formula, axes: tuple[str, ...], rotated: gs.Tensor, shapes: Shapes
) -> tuple[int | None, tuple[RotaryTable, RotaryTable]] | str:
    """The decomposed rotation on [B, H, S, D] or [B, S, H, D]: cos and sin broadcast to it as one row per token
    (and batch, or one for all), 1 along the heads."""
    if len(axes) != 4 or axes[0] != BATCH or axes[3] != ROW or {axes[1], axes[2]} != {HEAD, TOKEN}:
        return f"the rotation reads {rotated.name} with axes {''.join(axes)}, not [B, H, S, D] or [B, S, H, D]"
    head_axis, token_axis = axes.index(HEAD), axes.index(TOKEN)
    dims = shapes.of(rotated) or (None,) * 4
    tables = []
    for operand in (formula.cos, formula.sin):
        table = _table(operand, head_axis, token_axis, dims, shapes)
        if isinstance(table, str):
            return table
        tables.append(table)
    return dims[3] if isinstance(dims[3], int) else None, tuple(tables)


def _table(operand: gs.Tensor, head_axis: int, token_axis: int, dims: Shape, shapes: Shapes) -> RotaryTable | str:
    """A cos or sin operand as a [Bc, S, R] table, if it broadcasts as one: 1 along the heads, the tokens' length
    (not provably another), a batch of 1 or the activations'."""
    own = shapes.of(operand)
    if own is None or not 2 <= len(own) <= 4:
        return f"{operand.name} has no known shape of rank 2 to 4"
    aligned = (1,) * (4 - len(own)) + tuple(own)
    if aligned[head_axis] != 1:
        return f"{operand.name} {_shown(own)} does not broadcast over the heads (axis {head_axis} of the rotation)"
    token, length = aligned[token_axis], dims[token_axis]
    if token_axis < 4 - len(own):
        return f"{operand.name} {_shown(own)} has no axis along the tokens"
    if isinstance(token, int) and token != length and not (token == 1 and length == 1):
        return f"{operand.name} {_shown(own)} has {token} rows along the tokens where the rotation has {length}"
    if isinstance(aligned[0], int) and aligned[0] != 1 and isinstance(dims[0], int) and aligned[0] != dims[0]:
        return f"{operand.name} {_shown(own)} has a batch of {aligned[0]} where the rotation has {dims[0]}"
    if len(own) == 4:
        source = _unsqueezed_from(operand, head_axis, shapes)
        return RotaryTable(source) if source is not None else RotaryTable(operand, squeeze=head_axis)
    if head_axis != 1:
        return f"{operand.name} {_shown(own)} holds the tokens before the heads: no table the node reads"
    return RotaryTable(operand, unsqueeze=len(own) == 2)


def _unsqueezed_from(tensor: gs.Tensor, axis: int, shapes: Shapes) -> gs.Tensor | None:
    """The rank-3 tensor `tensor` is an Unsqueeze of at `axis` (Hugging Face's `cos.unsqueeze(1)`), else None."""
    node = producer(tensor)
    if onnx_op(node) != "Unsqueeze" or shapes.rank(node.inputs[0]) != 3:
        return None
    axes = node.attrs.get("axes")
    if axes is None and len(node.inputs) > 1:
        values = small_constant(node.inputs[1])
        axes = None if values is None else values.astype(np.int64).tolist()
    return node.inputs[0] if axes is not None and [axis % 4 for axis in axes] == [axis] else None


def _shown(dims: Shape) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in dims) + "]"


# --- q against k -----------------------------------------------------------------------------------------------------


def _check_same_rotation(q: RotatedNorm, k: RotatedNorm) -> None:
    """One node rotates both by one cos and sin table, in one way, into one dtype."""
    if q.rotary != k.rotary:
        raise _NotTaken(f"q is rotated as {q.rotary}, k as {k.rotary}")
    if q.output_dtype != k.output_dtype:
        raise _NotTaken(f"the rotations end in {q.output_dtype} and {k.output_dtype}")
    for role, first, second in (("cos", q.cos, k.cos), ("sin", q.sin, k.sin)):
        same_form = (first.squeeze, first.unsqueeze, first.half) == (second.squeeze, second.unsqueeze, second.half)
        same_positions = (first.positions is None) == (second.positions is None) and (
            first.positions is None or _same_value(first.positions, second.positions)
        )
        if not (same_form and same_positions and _same_value(first.tensor, second.tensor)):
            raise _NotTaken(f"q and k are rotated by different {role} ({first.tensor.name} and {second.tensor.name})")


def _same_value(first: gs.Tensor, second: gs.Tensor, depth: int = 12) -> bool:
    """Whether two tensors hold the same values: one tensor, equal small constants, or the same ONNX op with the
    same attributes on inputs that hold the same values (dynamo's RotaryEmbedding: a Cos per layer and role)."""
    if first is second:
        return True
    values = small_constant(first), small_constant(second)
    if values[0] is not None and values[1] is not None:
        return values[0].shape == values[1].shape and bool(np.array_equal(values[0], values[1]))
    a, b = producer(first), producer(second)
    if depth == 0 or a is None or b is None or onnx_op(a) is None or onnx_op(a) != onnx_op(b):
        return False
    if a.domain != b.domain or _attributes(a) != _attributes(b) or len(a.inputs) != len(b.inputs):
        return False
    if _position(a.outputs, first) != _position(b.outputs, second):
        return False
    return all(_same_value(x, y, depth - 1) for x, y in zip(a.inputs, b.inputs, strict=True))


def _position(tensors: list[gs.Tensor], tensor: gs.Tensor) -> int:
    return next(index for index, candidate in enumerate(tensors) if candidate is tensor)


def _attributes(node: gs.Node) -> dict[str, object]:
    return {name: value for name, value in node.attrs.items() if isinstance(value, (int, float, str, list, tuple))}


def _check_no_cycle(rope: QkNormRopeMatch, enclosing: dict[int, gs.Node]) -> None:
    """The node reads the tables; none of them may be computed from what the rotation or the norms compute (a
    shape of the rotated tensor, say), or the node would feed itself."""
    tables = [
        tensor
        for side in (rope.q, rope.k)
        for table in (side.cos, side.sin)
        for tensor in (table.tensor, table.positions)
        if tensor is not None
    ]
    if depends([rope.q.norm.y, rope.k.norm.y], tables, enclosing):
        raise _NotTaken(
            "its cos or sin is computed from the normalised q or k, so one node computing both would be a cycle"
        )


# --- the Q after the rotation ---------------------------------------------------------------------------------------


def _with_output_quantizer(
    side: RotatedNorm, stage: QuantStage, graph_outputs: set[str], opset: int, misses: list[NearMiss], movable: bool
) -> RotatedNorm:
    """The side with the QuantizeLinear of its result as the node's `stage`, where the node may take it: the Q is
    the result's one reader but for Shape nodes, a quantizer of the contract, and, where layout ops stand between
    the norm and the rotation, either `movable` (the node will write their [B, H, S, D] itself) or INT8 with no Shape
    node reading the result (the ops then move the node's codes); else a quant near miss says why it stays out."""
    path = widened_reader(side.result, graph_outputs)
    if not path:
        return side
    quantize = path[-1]
    readers = [describe(node) for node in _real_readers(side.result) if node is not path[0]]
    if side.result.name in graph_outputs:
        readers.append("a graph output")
    quantizer = quantizer_of(quantize, opset)
    shape_readers = [node for tensor in (side.rotated, side.result) for node in tensor.outputs if node.op == "Shape"]
    if readers:
        reason = f"{side.result.name} is also read by {', '.join(readers)}, unquantized"
    elif side.layout and shape_readers and not movable:
        reason = f"{describe(shape_readers[0])} reads the shape of what {describe(side.layout[-1])} would move as codes"
    elif isinstance(quantizer, str):
        reason = quantizer
    elif side.layout and quantizer.dtype != "int8" and not movable:
        reason = f"the rotation's result reaches it through {describe(side.layout[-1])}, which would move "
        reason += f"FLOAT8E4M3FN codes: {LAYOUT_FP8}"
    else:
        taken = TakenQuantizer(stage, quantizer, (quantize, *path[:-1]), quantize.outputs[0])
        return replace(side, quantizer=taken)
    misses.append(NearMiss(describe(quantize), f"not taken into the rotation of {side.norm.name}: {reason}"))
    return side


# --- attention ops that rotate inside -------------------------------------------------------------------------------


def _rotating_attention(graph: gs.Graph) -> list[NearMiss]:
    """Attention ops that apply the rotary embedding inside (onnxruntime-genai's GroupQueryAttention with
    do_rotary): nothing to take, reported."""
    misses = []
    for node in graph.nodes:
        attribute = ROTATING_ATTENTION.get((node.op, node.domain))
        if attribute is not None and node.attrs.get(attribute, 0):
            misses.append(
                NearMiss(describe(node), f"the rotary embedding is inside the attention op ({attribute}=1): left alone")
            )
    return misses
