"""What follows the normalisation: the cast back to the activation dtype and the weight multiply.

The walk records every point the chain could end at; the caller keeps the last one whose dtype is the activation
dtype, so a norm whose weight multiply cannot be fused still fuses without it (the Mul stays in the graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES
from trtfuse.fusion.patterns.matches import NearMiss
from trtfuse.fusion.patterns.queries import (
    LOSSLESS_CASTS,
    cast_target,
    constant_shape,
    describe,
    dtype_name,
    is_constant,
    is_sparse_constant,
    only_consumer,
    onnx_op,
    other_input,
    producer,
    qdq_mismatch,
    scalar_constant,
)
from trtfuse.fusion.patterns.shapes import Shapes


@dataclass(frozen=True)
class WeightPath:
    """A constant weight as the multiply sees it: `weight` (the stored constant) + `offset`, through lossless ops."""

    weight: gs.Tensor
    offset: float
    nodes: tuple[gs.Node, ...]
    multiply_dtype: str


@dataclass(frozen=True)
class EndPoint:
    """One place the fused chain may end: output tensor, the chain nodes up to it, and the weight folded in."""

    y: gs.Variable
    nodes: tuple[gs.Node, ...]
    weight: WeightPath | None
    # The 16-bit dtype the result was rounded to and then widened from again before the weight multiply: such an
    # end is the contract's AFTER_CAST only for an input of that dtype, and only with the weight.
    rounded_to: str | None = None


@dataclass
class Epilogue:
    end_points: list[EndPoint]
    notes: list[NearMiss] = field(default_factory=list)


def _is_lossless_cast(node: gs.Node) -> bool:
    return dtype_name(node.outputs[0]) in LOSSLESS_CASTS.get(dtype_name(node.inputs[0]), ())


def _narrows_to_activation(source: str | None, target: str) -> bool:
    """Only a narrowing Cast is a cast back to the activation dtype: widening the result is not part of a norm."""
    return target in ACTIVATION_DTYPES and target not in LOSSLESS_CASTS.get(source, ())


def _split_offset(add: gs.Node) -> tuple[float, int, gs.Tensor] | None:
    """For Add(c, w) or Add(w, c) with a one-element constant c: (c, the rank of c, w)."""
    for scalar, rest in (add.inputs, add.inputs[::-1]):
        shape = constant_shape(scalar)
        if shape is not None and math.prod(shape) == 1 and constant_shape(rest) != ():
            value = scalar_constant(scalar)
            if value is not None:
                return value, len(shape), rest
    return None


def trace_weight(
    operand: gs.Tensor, hidden: int, activation_rank: int | None, multiply_dtype: str | None
) -> WeightPath | str:
    """The constant weight behind a multiply operand, or the reason it is not one (a sentence fragment).

    `activation_rank` is the rank of the tensor the weight multiplies: a weight (or offset) of higher rank would
    broadcast the product to that rank, so it is no weight of the norm.
    """
    path: list[gs.Node] = []
    tensor = operand
    offset = None
    offset_rank = 0
    while not is_constant(tensor):
        node = producer(tensor)
        if onnx_op(node) in ("Identity", "Cast"):
            tensor = node.inputs[0]
        elif onnx_op(node) == "Add" and offset is None and (split := _split_offset(node)) is not None:
            offset, offset_rank, tensor = split
        else:
            return f"its operand {operand.name} is not a constant"
        path.append(node)
    if is_sparse_constant(tensor):
        # Its dense values are not in the graph for the fused node to take: the multiply stays, reading it.
        return f"the weight {tensor.name} is a sparse tensor, which the fused node cannot take"
    for node in path:
        if node.op == "Cast" and not _is_lossless_cast(node):
            return f"the weight goes through the narrowing Cast {describe(node)}"
        if node.op == "Add" and dtype_name(node.outputs[0]) != "float32":
            return f"the weight offset is added in {dtype_name(node.outputs[0])}, not float32"
    shape = constant_shape(tensor)
    if dtype_name(tensor) not in WEIGHT_DTYPES:
        return f"the weight {tensor.name} has dtype {dtype_name(tensor)}"
    fits = shape and shape[-1] == hidden and math.prod(shape) == hidden
    if not fits:
        return f"the constant {tensor.name} of shape {list(shape)} is not a weight of the hidden size {hidden}"
    if activation_rank is None or len(shape) > activation_rank:
        return f"the constant {tensor.name} of shape {list(shape)} would broadcast the result to a higher rank"
    if offset_rank > activation_rank:
        return f"the offset added to {tensor.name} has rank {offset_rank}: it would broadcast the result to that rank"
    return WeightPath(tensor, offset or 0.0, tuple(path), multiply_dtype)


def _qdq_before_weight(quantize: gs.Node, hidden: int, shapes: Shapes, graph_outputs: set[str]) -> NearMiss | None:
    """Why the chain ends at Q → DQ → Mul(weight) after the normalisation, or None when no weight multiply follows
    the pair (it quantizes the norm's output, and stays after the fused node like any reader).

    The pair rounds and clips the normalised value to its calibrated range before the weight, which the fused node
    cannot do; a pair whose DequantizeLinear does not undo its QuantizeLinear rescales it. Either way the norm ends
    before the pair, without its weight, and the pair and the multiply stay in the graph reading what they read:
    exact.
    """
    dequantize = only_consumer(quantize.outputs[0], graph_outputs)
    if onnx_op(dequantize) != "DequantizeLinear":
        return None
    dequantized = dequantize.outputs[0]
    multiply = only_consumer(dequantized, graph_outputs)
    if onnx_op(multiply) != "Mul":
        return None
    weight = trace_weight(other_input(multiply, dequantized), hidden, shapes.rank(dequantized), None)
    if isinstance(weight, str):
        return None
    pair = f"the pair {describe(quantize)} -> {describe(dequantize)}"
    mismatch = qdq_mismatch(quantize, dequantize)
    if mismatch is not None:
        what = f"{pair} is arithmetic, not a rounding ({mismatch})"
    else:
        what = f"{pair} rounds and clips the normalised value to its calibrated range before the weight"
    return NearMiss(describe(multiply), f"weight multiply not fused: {what}; the norm ends before the pair")


def _weight_follows(node: gs.Node, hidden: int, shapes: Shapes, graph_outputs: set[str]) -> bool:
    """Whether `node`'s output goes to one multiply by a constant weight of the norm."""
    multiply = only_consumer(node.outputs[0], graph_outputs)
    if onnx_op(multiply) != "Mul":
        return False
    operand = other_input(multiply, node.outputs[0])
    return isinstance(trace_weight(operand, hidden, shapes.rank(node.outputs[0]), None), WeightPath)


def _stop_note(end: EndPoint, cast_seen: bool, hidden: int, shapes: Shapes) -> NearMiss | None:
    """Why the chain ends at `end` when a cast back or a weight multiply it could take reads it among others."""
    tensor = end.y
    for node in tensor.outputs:
        op = onnx_op(node)
        cast_back = op == "Cast" and not cast_seen and _narrows_to_activation(dtype_name(tensor), cast_target(node))
        weight = (
            op == "Mul"
            and end.weight is None
            and isinstance(trace_weight(other_input(node, tensor), hidden, shapes.rank(tensor), None), WeightPath)
        )
        if cast_back or weight:
            names = ", ".join(describe(reader) for reader in tensor.outputs) or "nothing"
            return NearMiss(describe(node), f"not fused into the norm: {tensor.name} is also read by {names}")
    return None


def walk_epilogue(normalized: gs.Variable, hidden: int, graph_outputs: set[str], shapes: Shapes) -> Epilogue:
    """Follow the normalised tensor through no-op casts, at most one narrowing Cast and one weight Mul."""
    end_points = [EndPoint(normalized, (), None)]
    notes: list[NearMiss] = []
    cast_seen = False
    rounded_to = None
    while (node := only_consumer(end_points[-1].y, graph_outputs)) is not None:
        last = end_points[-1]
        current_dtype = dtype_name(last.y)
        weight = last.weight
        op = onnx_op(node)
        if op == "Identity" or (op == "Cast" and cast_target(node) == current_dtype):
            pass
        elif op == "Cast" and not cast_seen and _narrows_to_activation(current_dtype, cast_target(node)):
            cast_seen = True
        elif (
            op == "Cast"
            and cast_seen
            and rounded_to is None
            and weight is None
            and cast_target(node) == "float32"
            and _weight_follows(node, hidden, shapes, graph_outputs)
        ):
            rounded_to = current_dtype
        elif op == "QuantizeLinear" and weight is None:
            if (note := _qdq_before_weight(node, hidden, shapes, graph_outputs)) is not None:
                notes.append(note)
            break
        elif op == "Mul" and weight is None:
            weight = trace_weight(other_input(node, last.y), hidden, shapes.rank(last.y), dtype_name(node.outputs[0]))
            if isinstance(weight, str):
                notes.append(NearMiss(describe(node), f"weight multiply not fused: {weight}"))
                break
        else:
            break
        end_points.append(EndPoint(node.outputs[0], (*last.nodes, node), weight, rounded_to))
    else:
        if (note := _stop_note(end_points[-1], cast_seen, hidden, shapes)) is not None:
            notes.append(note)
    return Epilogue(end_points, notes)
