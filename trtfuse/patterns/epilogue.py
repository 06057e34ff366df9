"""What follows the normalisation: the cast back to the activation dtype and the weight multiply.

The walk records every point the chain could end at; the caller keeps the last one whose dtype is the activation
dtype, so a norm whose weight multiply cannot be fused still fuses without it (the Mul stays in the graph).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import onnx_graphsurgeon as gs

from trtfuse.contract import ACTIVATION_DTYPES, WEIGHT_DTYPES
from trtfuse.patterns.matches import NearMiss
from trtfuse.patterns.queries import (
    LOSSLESS_CASTS,
    cast_target,
    constant_shape,
    describe,
    dtype_name,
    is_constant,
    only_consumer,
    other_input,
    producer,
    rank,
    scalar_constant,
)


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


@dataclass
class Epilogue:
    end_points: list[EndPoint]
    notes: list[NearMiss] = field(default_factory=list)


def _is_lossless_cast(node: gs.Node) -> bool:
    return dtype_name(node.outputs[0]) in LOSSLESS_CASTS.get(dtype_name(node.inputs[0]), ())


def _narrows_to_activation(source: str | None, target: str) -> bool:
    """Only a narrowing Cast is a cast back to the activation dtype: widening the result is not part of a norm."""
    return target in ACTIVATION_DTYPES and target not in LOSSLESS_CASTS.get(source, ())


def _split_offset(add: gs.Node) -> tuple[float, gs.Tensor] | None:
    """For Add(c, w) or Add(w, c) with a one-element constant c: (c, w)."""
    for scalar, rest in (add.inputs, add.inputs[::-1]):
        shape = constant_shape(scalar)
        if shape is not None and math.prod(shape) == 1 and constant_shape(rest) != ():
            value = scalar_constant(scalar)
            if value is not None:
                return value, rest
    return None


def trace_weight(operand: gs.Tensor, hidden: int, multiply: gs.Node) -> WeightPath | str:
    """The constant weight behind a multiply operand, or the reason it is not one (a sentence fragment)."""
    path: list[gs.Node] = []
    tensor = operand
    offset = None
    while not is_constant(tensor):
        node = producer(tensor)
        if node is not None and node.op in ("Identity", "Cast"):
            tensor = node.inputs[0]
        elif node is not None and node.op == "Add" and offset is None and (split := _split_offset(node)) is not None:
            offset, tensor = split
        else:
            return f"its operand {operand.name} is not a constant"
        path.append(node)
    for node in path:
        if node.op == "Cast" and not _is_lossless_cast(node):
            return f"the weight goes through the narrowing Cast {describe(node)}"
        if node.op == "Add" and dtype_name(node.outputs[0]) != "float32":
            return f"the weight offset is added in {dtype_name(node.outputs[0])}, not float32"
    shape = constant_shape(tensor)
    if dtype_name(tensor) not in WEIGHT_DTYPES:
        return f"the weight {tensor.name} has dtype {dtype_name(tensor)}"
    out_rank = rank(multiply.outputs[0])
    fits = shape and shape[-1] == hidden and math.prod(shape) == hidden
    if not fits or (out_rank is not None and len(shape) > out_rank):
        return f"the constant {tensor.name} of shape {list(shape)} is not a weight of the hidden size {hidden}"
    return WeightPath(tensor, offset or 0.0, tuple(path), dtype_name(multiply.outputs[0]))


def walk_epilogue(normalized: gs.Variable, hidden: int, graph_outputs: set[str]) -> Epilogue:
    """Follow the normalised tensor through no-op casts, at most one narrowing Cast and one weight Mul."""
    end_points = [EndPoint(normalized, (), None)]
    notes: list[NearMiss] = []
    cast_seen = False
    while (node := only_consumer(end_points[-1].y, graph_outputs)) is not None:
        last = end_points[-1]
        current_dtype = dtype_name(last.y)
        weight = last.weight
        if node.op == "Identity" or (node.op == "Cast" and cast_target(node) == current_dtype):
            pass
        elif node.op == "Cast" and not cast_seen and _narrows_to_activation(current_dtype, cast_target(node)):
            cast_seen = True
        elif node.op == "Mul" and weight is None:
            traced = trace_weight(other_input(node, last.y), hidden, node)
            if isinstance(traced, str):
                notes.append(NearMiss(describe(node), f"weight multiply not fused: {traced}"))
                break
            weight = traced
        else:
            break
        end_points.append(EndPoint(node.outputs[0], (*last.nodes, node), weight))
    return Epilogue(end_points, notes)
