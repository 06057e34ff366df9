"""The values of small integer tensors a graph computes from constants and static dims: slice bounds, axes.

TorchScript writes `x[..., : x.shape[-1] // 2]` as a Slice whose end is `Unsqueeze(Div(Gather(Shape(x), -1), 2))`;
the value is known wherever the dims it reads are static. `index_values` follows such a computation back through the
ONNX ops that move or combine a few integers, and gives each element's value, None where it depends on a dim that is
not static (a batch or sequence length) or on anything else.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trtfuse.fusion.patterns.queries import onnx_op, producer, small_constant
from trtfuse.fusion.patterns.shapes import Shapes

IndexValues = tuple[int | None, ...]
# How many ops back a computation is followed: a TorchScript slice bound is four (Shape, Gather, Div, Unsqueeze).
MAX_DEPTH = 8
_ARITHMETIC = {
    "Add": lambda a, b: a + b,
    "Sub": lambda a, b: a - b,
    "Mul": lambda a, b: a * b,
    # ONNX's integer Div truncates toward zero.
    "Div": lambda a, b: int(a / b) if b else None,
}
_SAME_VALUES = ("Cast", "Identity", "Squeeze", "Unsqueeze", "Reshape", "Flatten")


def index_values(tensor: gs.Tensor, shapes: Shapes, depth: int = MAX_DEPTH) -> IndexValues | None:
    """The flattened integer values of `tensor`, each None where unknown; None for a tensor whose elements this does
    not follow (a float, a large constant, an op it does not know)."""
    values = small_constant(tensor)
    if values is not None:
        return tuple(_integer(value) for value in values.reshape(-1).tolist())
    node = producer(tensor)
    op = onnx_op(node)
    if node is None or depth == 0 or op is None:
        return None
    if op == "Shape":
        dims = shapes.of(node.inputs[0])
        if dims is None:
            return None
        start, end = node.attrs.get("start", 0), node.attrs.get("end", len(dims))
        return tuple(dim if isinstance(dim, int) else None for dim in dims[start:end])
    operands = [index_values(operand, shapes, depth - 1) if operand.name else None for operand in node.inputs]
    if op in _SAME_VALUES:
        return operands[0]
    if op == "Gather" and node.attrs.get("axis", 0) == 0 and None not in operands[:2]:
        data, indices = operands[0], operands[1]
        if None in indices:
            return None
        return tuple(data[index] if -len(data) <= index < len(data) else None for index in indices)
    if op == "Concat" and None not in operands:
        return tuple(value for operand in operands for value in operand)
    if op in _ARITHMETIC and len(operands) == 2 and None not in operands:
        first, second = operands
        if len(first) != len(second) and 1 not in (len(first), len(second)):
            return None
        size = max(len(first), len(second))
        pairs = zip(first * (size // len(first)), second * (size // len(second)), strict=True)
        return tuple(None if a is None or b is None else _ARITHMETIC[op](a, b) for a, b in pairs)
    return None


def _integer(value: float) -> int | None:
    return int(value) if float(value).is_integer() else None
