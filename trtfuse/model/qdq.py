"""When a QuantizeLinear -> DequantizeLinear pair is a rounding and nothing more: the one rule the matcher (on
onnx-graphsurgeon nodes) and the float32 evaluation (on ONNX protos) both apply.

A pair whose dequantize uses another scale or zero point, or another axis or block size for a per-channel scale,
rescales or shifts the value: arithmetic the graph means, which neither may drop as if it were noise.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

# The attributes that place a per-channel or blocked scale, with ONNX's defaults.
_PLACEMENT_ATTRIBUTES = (("axis", 1), ("block_size", 0))


@dataclass(frozen=True)
class QdqOperand:
    """A scale or zero-point input: the tensor's name ("" when the optional input is absent), its dtype name where
    known, and its values where it is a small constant (None otherwise)."""

    name: str
    dtype: str | None = None
    values: np.ndarray | None = None


def _same_value(first: QdqOperand, second: QdqOperand, absent: float | None) -> bool:
    """One tensor, or constants of equal dtype, shape and values; an absent operand is the scalar `absent` (or
    differs from everything when `absent` is None)."""
    if first.name and first.name == second.name:
        return True
    arrays = []
    for operand in (first, second):
        if not operand.name:
            if absent is None:
                return False
            arrays.append((None, np.asarray(absent, dtype=np.float64)))
        elif operand.values is None:
            return False
        else:
            arrays.append((operand.dtype, np.asarray(operand.values, dtype=np.float64)))
    (first_dtype, first_values), (second_dtype, second_values) = arrays
    if None not in (first_dtype, second_dtype) and first_dtype != second_dtype:
        return False
    if first_values.shape != second_values.shape and not (first_values.size == second_values.size == 1):
        return False
    return bool(np.array_equal(first_values.reshape(-1), second_values.reshape(-1)))


def pair_difference(
    scales: tuple[QdqOperand, QdqOperand],
    zero_points: tuple[QdqOperand, QdqOperand],
    attributes: tuple[Mapping[str, object], Mapping[str, object]],
) -> str | None:
    """None when the dequantize (the second of each pair) undoes the quantize's rounding exactly; else what differs:
    "scale", "zero point", "axis" or "block_size"."""
    if not _same_value(*scales, absent=None):
        return "scale"
    if not _same_value(*zero_points, absent=0.0):
        return "zero point"
    per_tensor = scales[0].values is not None and scales[0].values.size == 1
    if not per_tensor:
        quantize, dequantize = attributes
        for attribute, default in _PLACEMENT_ATTRIBUTES:
            if quantize.get(attribute, default) != dequantize.get(attribute, default):
                return attribute
    return None
