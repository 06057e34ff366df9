"""RMSNorm written out in elementary ops, matched by walking from its reduction node.

Canonical chain, every equivalent spelling accepted at each step:
    square    Pow(a, 2) | Mul(a, a)                      (ReduceSumSquare squares implicitly)
    mean      ReduceMean | ReduceSum then Mul(1/H) or Div(H), over the last axis only, keepdims=1
    + eps     Add(mean, eps), eps a one-element constant of any float dtype, either operand; absent means eps = 0
    rsqrt     Sqrt then Div(1, .) | Sqrt then Reciprocal | Pow(., -0.5); or Div(a', Sqrt(.)) directly
    scale     Mul(a', r) in either order, r possibly cast down to the activation dtype first (T5)
where a and a' are the same activation x seen through widening Casts. The epilogue (cast back, weight) follows.
A QuantizeLinear -> DequantizeLinear pair on the inverse root r (ModelOpt's INT8 of TorchScript graphs) is the rsqrt
quantizer stage of the fused node (patterns/quant.py); unless the fusion takes quantizers (`quant_opset`), or on any
other intermediate (the x only the scaling Mul reads), the pair rounds and clips a value the fused node computes in
float: the norm is left unfused, naming the pair (docs/patterns.md).
Every op must be the ONNX op (default domain); every constant must broadcast to no higher rank than the tensor it
meets, so the fused node's output has its input's shape. H is the last dim of a trusted shape (patterns/shapes.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import onnx_graphsurgeon as gs

from trtfuse.contract import ACTIVATION_DTYPES, NormParams, QuantStage, WeightMode
from trtfuse.fusion.patterns.epilogue import EndPoint, walk_epilogue
from trtfuse.fusion.patterns.matches import NearMiss, Rejected, RmsNormMatch, TakenQuantizer
from trtfuse.fusion.patterns.quant import fake_quant, qdq_pair
from trtfuse.fusion.patterns.queries import (
    constant_rank,
    describe,
    dtype_name,
    exclusively_consumed,
    look_through_lossless_casts,
    only_consumer,
    onnx_op,
    other_input,
    producer,
    qdq_mismatch,
    scalar_constant,
    small_constant,
    unique,
)
from trtfuse.fusion.patterns.shapes import Shapes

REDUCTIONS = ("ReduceMean", "ReduceSum", "ReduceSumSquare")
ALWAYS_REJECTED = {
    "ReduceL2": "L2 normalisation: ReduceL2 takes no mean over the hidden size",
    "LpNormalization": "Lp normalisation: no mean over the hidden size and no epsilon",
}
ANCHORS = REDUCTIONS + tuple(ALWAYS_REJECTED)
RELATIVE_TOLERANCE = 1e-6


@dataclass
class _Core:
    """The matched chain from the square to the normalised product x · r."""

    nodes: list[gs.Node]
    square_input: gs.Tensor
    scaled_input: gs.Tensor
    normalized: gs.Variable
    epsilon: float
    hidden: int
    tags: list[str]
    quantizers: tuple[TakenQuantizer, ...] = ()


class _Walk:
    """Steps along a chain of single-consumer tensors, rejecting the anchor when a step fails."""

    def __init__(self, anchor: gs.Node, graph_outputs: set[str], shapes: Shapes, quant_opset: int | None) -> None:
        self.anchor = anchor
        self.graph_outputs = graph_outputs
        self.shapes = shapes
        self.quant_opset = quant_opset

    def reject(self, reason: str) -> Rejected:
        return Rejected(self.anchor, reason)

    def next_node(self, tensor: gs.Tensor) -> gs.Node:
        """The one consumer of an intermediate tensor; a second reader or a graph output ends the match."""
        if tensor.name in self.graph_outputs:
            raise self.reject(f"intermediate {tensor.name} is a graph output")
        consumer = only_consumer(tensor, self.graph_outputs)
        if consumer is None:
            readers = ", ".join(describe(node) for node in tensor.outputs) or "nothing"
            raise self.reject(f"intermediate {tensor.name} is read by {readers}, not by one node")
        self.require_onnx(consumer)
        return consumer

    def reject_qdq(self, quantize: gs.Node, dequantize: gs.Node | None, where: str, why: str | None = None) -> Rejected:
        """A QuantizeLinear (→ DequantizeLinear) on an intermediate of the chain that the node does not take in.

        An exact pair rounds and clips `where` to its calibrated range, which a fused node computing in float
        cannot: dropping it is no "removal of a rounding" where the inputs leave that range (ModelOpt int8 OLMo2's
        clipped inverse root, off by O(1)). `why` says why an exact pair on the inverse root is no rsqrt quantizer.
        A pair whose DequantizeLinear does not undo its QuantizeLinear rescales or shifts the value: arithmetic, not
        a norm.
        """
        if onnx_op(dequantize) != "DequantizeLinear":
            target = describe(dequantize) if dequantize is not None else "several readers"
            return self.reject(f"{describe(quantize)} inside the chain goes to {target}, not DequantizeLinear")
        pair = f"the pair {describe(quantize)} -> {describe(dequantize)}"
        mismatch = qdq_mismatch(quantize, dequantize)
        if mismatch is not None:
            return self.reject(f"{pair} on {where} is arithmetic, not a rounding ({mismatch}): not a norm")
        if why is not None:
            return self.reject(f"{pair} on {where} is no quantizer of a fused node ({why}): left unfused")
        return self.reject(
            f"{pair} rounds and clips {where} to its calibrated range inside the chain, which the fused node "
            "cannot do: left unfused"
        )

    def require_onnx(self, node: gs.Node) -> None:
        """A same-named op of another domain computes whatever that domain says: never part of a norm."""
        if onnx_op(node) is None:
            raise self.reject(f"{describe(node)} is {node.op} of domain {node.domain}, not the ONNX op")

    def scalar(self, node: gs.Node, constant: gs.Tensor, operand: gs.Tensor) -> float | None:
        """The value of a one-element constant that `node` combines with `operand`, None when not a constant.

        A constant of higher rank than the operand (a [1, 1, 1, 1] epsilon on a rank-3 mean) would broadcast the
        result to that rank: numerically the same values, but not the shape the fused node writes.
        """
        value = scalar_constant(constant)
        if value is None:
            return None
        constant_dims, operand_rank = constant_rank(constant), self.shapes.rank(operand)
        if constant_dims is None or operand_rank is None or constant_dims > operand_rank:
            raise self.reject(
                f"the constant {constant.name} of {describe(node)} would broadcast {operand.name} to a higher rank"
            )
        return value


def _reduction_axes(node: gs.Node) -> list[int] | None:
    if "axes" in node.attrs:
        return list(node.attrs["axes"])
    if len(node.inputs) > 1 and node.inputs[1].name:
        values = small_constant(node.inputs[1])
        return None if values is None else [int(axis) for axis in values.reshape(-1)]
    return []


def _check_last_axis(walk: _Walk, reduced: gs.Tensor) -> None:
    node = walk.anchor
    if node.attrs.get("keepdims", 1) != 1:
        raise walk.reject("keepdims=0: the reduction drops the normalised axis")
    axes = _reduction_axes(node)
    if axes is None:
        raise walk.reject("the reduction axes are not a constant")
    if not axes:
        if node.attrs.get("noop_with_empty_axes", 0):
            raise walk.reject("the reduction has no axes (a no-op)")
        raise walk.reject("the reduction runs over every axis, not only the last")
    if len(axes) != 1:
        raise walk.reject(f"the reduction runs over several axes {axes}")
    input_rank = walk.shapes.rank(reduced)
    if axes[0] != -1 and (input_rank is None or axes[0] != input_rank - 1):
        raise walk.reject(f"the reduction runs over axis {axes[0]}, not the last axis")


def _square_base(walk: _Walk, reduced: gs.Tensor) -> tuple[gs.Tensor, list[gs.Node], str]:
    if walk.anchor.op == "ReduceSumSquare":
        return reduced, [], "reduce-sum-square"
    square = producer(reduced)
    if square is not None:
        walk.require_onnx(square)
    if onnx_op(square) not in ("Pow", "Mul"):
        raise walk.reject("the reduced tensor is not a square (Pow(x, 2) or Mul(x, x))")
    walk.next_node(reduced)
    if onnx_op(square) == "Pow":
        exponent = walk.scalar(square, square.inputs[1], square.inputs[0])
        if exponent is None:
            raise walk.reject(f"the exponent of {describe(square)} is not a constant")
        if exponent != 2.0:
            raise walk.reject(f"{describe(square)} raises to the power {exponent:g}, not 2")
        return square.inputs[0], [square], "pow"
    first, second = square.inputs
    if first is second or _same_value(first, second):
        return first, [square], "mul"
    raise walk.reject("the reduced tensor is not a square (Pow(x, 2) or Mul(x, x))")


def _same_value(first: gs.Tensor, second: gs.Tensor) -> bool:
    return dtype_name(first) == dtype_name(second) and (
        look_through_lossless_casts(first) is look_through_lossless_casts(second)
    )


def _is_mean(tensor: gs.Tensor) -> bool:
    """ReduceMean(a), or ReduceSum(a) scaled by a constant (·(1/H) or /H): a mean however it is spelled."""
    node = producer(look_through_lossless_casts(tensor))
    if onnx_op(node) == "ReduceMean":
        return True
    if onnx_op(node) not in ("Mul", "Div") or len(node.inputs) != 2:
        return False
    total = next((operand for operand in node.inputs if onnx_op(producer(operand)) == "ReduceSum"), None)
    return total is not None and scalar_constant(other_input(node, total)) is not None


def _reject_layer_norm(walk: _Walk, base: gs.Tensor) -> None:
    centred = producer(look_through_lossless_casts(base))
    if onnx_op(centred) == "Sub" and _is_mean(centred.inputs[1]):
        raise walk.reject("LayerNorm: the squared tensor is x - mean(x)")


def _mean(walk: _Walk, hidden: int) -> tuple[gs.Tensor, list[gs.Node], str]:
    reduced_out = walk.anchor.outputs[0]
    if walk.anchor.op == "ReduceMean":
        return reduced_out, [], "reduce-mean"
    scale = walk.next_node(reduced_out)
    factor = None
    if onnx_op(scale) == "Mul":
        factor = walk.scalar(scale, other_input(scale, reduced_out), reduced_out)
    elif onnx_op(scale) == "Div" and scale.inputs[0] is reduced_out:
        divisor = walk.scalar(scale, scale.inputs[1], reduced_out)
        factor = 1.0 / divisor if divisor else None
    if factor is None or not math.isclose(factor, 1.0 / hidden, rel_tol=RELATIVE_TOLERANCE):
        raise walk.reject(f"L2 normalisation: the sum of squares is not divided by the hidden size {hidden}")
    return scale.outputs[0], [scale], "reduce-sum"


def _add_epsilon(walk: _Walk, mean: gs.Tensor) -> tuple[gs.Tensor, list[gs.Node], float | None]:
    """variance + epsilon, its Add node and epsilon; without an epsilon Add, the mean itself and None."""
    add = walk.next_node(mean)
    if onnx_op(add) == "Sqrt":
        after = only_consumer(add.outputs[0], walk.graph_outputs)
        if onnx_op(after) == "Add":
            raise walk.reject("epsilon is added outside the square root: x / (rms + eps)")
    if onnx_op(add) in ("Sqrt", "Pow") and add.inputs[0] is mean:
        return mean, [], None
    if onnx_op(add) != "Add":
        raise walk.reject(f"the mean of squares goes to {describe(add)}, not to Add(epsilon) or the root")
    epsilon = walk.scalar(add, other_input(add, mean), mean)
    if epsilon is None:
        raise walk.reject(f"{describe(add)} does not add a one-element constant epsilon")
    # The fused node holds epsilon as float32: a float64 constant beyond its range would become inf there.
    if not math.isfinite(epsilon_float32(epsilon)) or epsilon < 0:
        raise walk.reject(f"epsilon {epsilon} is negative or not finite")
    return add.outputs[0], [add], epsilon


def _inverse_root(walk: _Walk, variance: gs.Tensor) -> tuple[gs.Node, list[gs.Node], str, tuple[TakenQuantizer, ...]]:
    """The nodes from variance+eps to the normalising product, that product's node (a Mul or a Div), and the rsqrt
    quantizer the node takes in (a Q -> DQ pair on r, where the walk takes quantizers)."""
    root = walk.next_node(variance)
    if onnx_op(root) == "Pow":
        if root.inputs[0] is not variance:
            raise walk.reject(f"{describe(root)} uses the variance as its exponent")
        exponent = walk.scalar(root, root.inputs[1], variance)
        if exponent != -0.5:
            raise walk.reject(f"{describe(root)} raises to the power {exponent}, not -0.5")
        nodes, tag = [root], "pow-half"
    elif onnx_op(root) == "Sqrt":
        roots = [root]
        after = walk.next_node(root.outputs[0])
        if onnx_op(after) == "Cast" and look_through_lossless_casts(after.outputs[0]) is root.outputs[0]:
            # ModelOpt AutoCast: the root in fp16, widened for an fp32 reciprocal.
            roots.append(after)
            after = walk.next_node(after.outputs[0])
        rooted = roots[-1].outputs[0]
        if onnx_op(after) == "Reciprocal":
            nodes, tag = [*roots, after], "reciprocal"
        elif onnx_op(after) == "Div" and after.inputs[1] is rooted:
            numerator = walk.scalar(after, after.inputs[0], rooted)
            if numerator is None:
                return after, roots, "div-sqrt", ()
            if numerator != 1.0:
                raise walk.reject(f"{describe(after)} divides {numerator:g}, not 1, by the root")
            nodes, tag = [*roots, after], "div-one"
        else:
            raise walk.reject(f"the square root goes to {describe(after)}, not to Div or Reciprocal")
    else:
        raise walk.reject(f"variance + eps goes to {describe(root)}, not to Sqrt or Pow(-0.5)")
    product = walk.next_node(nodes[-1].outputs[0])
    if onnx_op(product) == "Cast":
        # r rounded (T5; ModelOpt fp16): a pair after it quantizes the rounded r, the dtype its rsqrt stage records.
        nodes.append(product)
        tag = f"{tag}+rsqrt-cast"
        product = walk.next_node(product.outputs[0])
    quantizers: tuple[TakenQuantizer, ...] = ()
    if onnx_op(product) == "QuantizeLinear":
        quantize, dequantize = product, only_consumer(product.outputs[0], walk.graph_outputs)
        opset = walk.quant_opset
        taken = fake_quant(QuantStage.RSQRT, quantize, dequantize, opset) if opset is not None else None
        if not isinstance(taken, TakenQuantizer):
            raise walk.reject_qdq(quantize, dequantize, f"the inverse root {quantize.inputs[0].name}", taken)
        nodes += [quantize, dequantize]
        tag = f"{tag}+rsqrt-quant"
        quantizers = (taken,)
        product = walk.next_node(dequantize.outputs[0])
    if onnx_op(product) != "Mul":
        raise walk.reject(f"the inverse root goes to {describe(product)}, not to Mul(x, r)")
    return product, nodes, tag, quantizers


def _core(walk: _Walk) -> _Core:
    anchor = walk.anchor
    if anchor.op in ALWAYS_REJECTED:
        raise walk.reject(ALWAYS_REJECTED[anchor.op])
    reduced = anchor.inputs[0]
    base, square_nodes, square_tag = _square_base(walk, reduced)
    _reject_layer_norm(walk, base)
    _check_last_axis(walk, reduced)
    hidden = walk.shapes.last_dim(reduced)
    if hidden is None:
        raise walk.reject(f"the normalised axis of {reduced.name} has no static length the graph proves")
    mean, mean_nodes, mean_tag = _mean(walk, hidden)
    variance, add_nodes, epsilon = _add_epsilon(walk, mean)
    product, root_nodes, root_tag, quantizers = _inverse_root(walk, variance)
    inverse = root_nodes[-1].outputs[0]
    scaled = product.inputs[0] if onnx_op(product) == "Div" else other_input(product, inverse)
    if look_through_lossless_casts(scaled) is not look_through_lossless_casts(base):
        pair = qdq_pair(look_through_lossless_casts(scaled))
        source = pair.source if pair else scaled
        if look_through_lossless_casts(source) is not look_through_lossless_casts(base):
            raise walk.reject(f"{describe(product)} scales {scaled.name}, not the squared tensor {base.name}")
        # The square reads x, the scaling Mul its quantized copy: no norm of either.
        where = f"the x that {describe(product)} reads (the square reads it unquantized)"
        raise walk.reject_qdq(pair.quantize, pair.dequantize, where)
    tags = [square_tag, mean_tag, root_tag] + (["no-epsilon"] if epsilon is None else [])
    return _Core(
        nodes=[*square_nodes, anchor, *mean_nodes, *add_nodes, *root_nodes, product],
        square_input=base,
        scaled_input=scaled,
        normalized=product.outputs[0],
        epsilon=epsilon or 0.0,
        hidden=hidden,
        tags=tags,
        quantizers=quantizers,
    )


def _cast_chain(tensor: gs.Tensor) -> list[tuple[gs.Tensor, gs.Node | None]]:
    """`tensor` and each tensor it was converted from through widening Casts: (tensor, the node producing it)."""
    chain = [(tensor, producer(tensor))]
    while look_through_lossless_casts(tensor) is not tensor:
        tensor = producer(tensor).inputs[0]
        chain.append((tensor, producer(tensor)))
    return chain


def supported_dtypes(x_dtype: str | None, y_dtype: str | None) -> bool:
    """The input/output dtype pairs of the contract: equal, or float32 on one side and float16/bfloat16 on the other."""
    if x_dtype not in ACTIVATION_DTYPES or y_dtype not in ACTIVATION_DTYPES:
        return False
    return x_dtype == y_dtype or "float32" in (x_dtype, y_dtype)


def _input_for(chain: list[tuple[gs.Tensor, gs.Node | None]], dtype: str) -> gs.Tensor:
    """The earliest tensor of the output dtype on the input side; when the input never has it, the earliest the
    contract pairs with it (float16 widened to float32 for a bfloat16 output: the widening Cast stays outside); else
    the input itself."""
    earliest_first = [tensor for tensor, _ in reversed(chain)]
    return next(
        (tensor for tensor in earliest_first if dtype_name(tensor) == dtype),
        next((tensor for tensor in earliest_first if supported_dtypes(dtype_name(tensor), dtype)), chain[-1][0]),
    )


def _choose_end(
    end_points: list[EndPoint], chain: list[tuple[gs.Tensor, gs.Node | None]]
) -> tuple[EndPoint, gs.Tensor] | None:
    """The furthest end point whose output dtype the contract pairs with the input's, and that input."""
    for end in reversed(end_points):
        if end.rounded_to is not None:
            # Rounded to 16 bits, widened, then weighted in float32: AFTER_CAST with the input in the rounded dtype.
            x = _input_for(chain, end.rounded_to)
            if end.weight is not None and dtype_name(x) == end.rounded_to:
                return end, x
            continue
        x = _input_for(chain, dtype_name(end.y))
        if supported_dtypes(dtype_name(x), dtype_name(end.y)):
            return end, x
    return None


def match_decomposed(
    anchor: gs.Node, graph_outputs: set[str], shapes: Shapes, quant_opset: int | None = None
) -> tuple[RmsNormMatch, list[NearMiss]]:
    """Match the chain around a reduction node, or raise Rejected saying which condition failed. With `quant_opset`
    (the graph's opset, where the fusion takes quantizers) a Q -> DQ pair on the inverse root is the match's rsqrt
    quantizer."""
    walk = _Walk(anchor, graph_outputs, shapes, quant_opset)
    core = _core(walk)
    chain = _cast_chain(core.square_input)
    scaled_chain = _cast_chain(core.scaled_input)
    epilogue = walk_epilogue(core.normalized, core.hidden, graph_outputs, shapes)
    chosen = _choose_end(epilogue.end_points, chain)
    if chosen is None:
        raise walk.reject(f"the chain computes in {dtype_name(core.normalized)}, which no fused node reads or writes")
    end, x = chosen
    notes = list(epilogue.notes)
    if end is not epilogue.end_points[-1]:
        last = epilogue.end_points[-1]
        if last.rounded_to is not None:
            rounded = last.rounded_to
            reason = (
                f"the result is rounded to {rounded} and widened again before the weight; the input is no {rounded}"
            )
        else:
            reason = f"{dtype_name(x)} in, {dtype_name(last.y)} out is no pair a fused node takes"
        notes.append(NearMiss(describe(last.nodes[-1]), f"not fused into the norm: {reason}"))
    dtype = dtype_name(end.y)
    if isinstance(x, gs.Constant):
        raise walk.reject(f"the normalised input {x.name} is a constant")
    core_dtype = dtype_name(core.square_input)
    if core_dtype == "float64":
        raise walk.reject("the chain computes in float64; the kernels reduce in float32, which would lose precision")
    tags = ["decomposed", *core.tags]
    if core_dtype != "float32":
        tags.append(f"core-{core_dtype}")
    if dtype_name(core.normalized) == dtype and core_dtype != dtype:
        tags.append("t5")
    if end.weight is None:
        mode, weight, offset = WeightMode.NONE, None, 0.0
    else:
        weight, offset = end.weight.weight, end.weight.offset
        mode = WeightMode.AFTER_CAST if end.weight.multiply_dtype == dtype else WeightMode.BEFORE_CAST
    upcasts = _upcasts_below(x, chain) + _upcasts_below(x, scaled_chain)
    weight_nodes = list(end.weight.nodes) if end.weight else []
    required = [*core.nodes, *end.nodes]
    required_ids = {id(node) for node in required}
    optional = exclusively_consumed(unique(upcasts + weight_nodes), required_ids, graph_outputs)
    match = RmsNormMatch(
        nodes=unique(optional + required),
        x=x,
        y=end.y,
        weight=weight,
        params=NormParams(epsilon_float32(core.epsilon), offset, mode),
        hidden_size=core.hidden,
        tags=tuple(tags),
        name=describe(anchor),
        quantizers=core.quantizers,
    )
    return match, notes


def _upcasts_below(x: gs.Tensor, chain: list[tuple[gs.Tensor, gs.Node | None]]) -> list[gs.Node]:
    """The Casts between x and a tensor of the core (the chain's root is where x was produced, never a cast)."""
    nodes = []
    for tensor, node in chain[:-1]:
        if tensor is x:
            break
        nodes.append(node)
    return nodes


def epsilon_float32(value: float) -> float:
    """The epsilon as the float32 attribute stores it; exact for float16, bfloat16 and float32 constants."""
    with np.errstate(over="ignore"):
        return float(np.float32(value))
