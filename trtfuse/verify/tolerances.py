"""How close two runs of the same model must be: per output dtype, and against a float32 evaluation of the graph.

The relative error of an output is `max|a - b| / max|b|` with b the reference: one number per output that does not
blow up where single elements of b are near zero. Against a float32 evaluation (`ReferenceErrors`) each model's
error is the RMS of its difference relative to the evaluation's RMS.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    """An output passes when its max abs error is within `atol` or its max relative error within `rtol`."""

    atol: float
    rtol: float

    def accepts(self, max_abs: float, max_rel: float) -> bool:
        return max_abs <= self.atol or max_rel <= self.rtol


# rtol is a few units in the last place of each format after a model's worth of rounding; atol only matters for
# outputs whose reference is (near) all zeros, where the relative error means nothing.
_FLOAT_TOLERANCES = {
    "float64": Tolerance(atol=1e-12, rtol=1e-9),
    "float32": Tolerance(atol=1e-7, rtol=1e-5),
    "float16": Tolerance(atol=1e-5, rtol=2e-3),
    "bfloat16": Tolerance(atol=1e-4, rtol=1e-2),
}
_EXACT = Tolerance(atol=0.0, rtol=0.0)
# A kernel's outputs against the float64 reference of the contract's semantics, elementwise (rtol, atol) per dtype:
# two units in the last place (the kernel rounds once from fp32, the reference from fp64, and AFTER_CAST rounds
# twice), plus an absolute floor for outputs near zero. The kernel GPU tests and the AOT bare-driver check use it.
KERNEL_ELEMENTWISE = {"float32": (1e-5, 1e-6), "float16": (2e-3, 1e-3), "bfloat16": (1.6e-2, 1e-2)}


def tolerance_for(dtype: str | np.dtype | type) -> Tolerance:
    """The tolerance for outputs of `dtype` (a numpy dtype or name); integer and bool outputs must match exactly."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    return _FLOAT_TOLERANCES.get(name, _EXACT)


@dataclass(frozen=True)
class OutputError:
    """How far one output is from its reference."""

    name: str
    dtype: str
    max_abs: float
    max_rel: float
    tolerance: Tolerance

    @property
    def passed(self) -> bool:
        return self.tolerance.accepts(self.max_abs, self.max_rel)


def non_finite_mismatch(actual: np.ndarray, reference: np.ndarray) -> bool:
    """Whether NaNs or infinities of two float64 arrays of one shape sit in different places or differ."""
    nan_mismatch = bool(np.any(np.isnan(actual) != np.isnan(reference)))
    both_finite = np.isfinite(actual) & np.isfinite(reference)
    return nan_mismatch or bool(np.any((actual != reference) & ~both_finite & ~np.isnan(reference)))


def output_error(
    name: str, actual: np.ndarray, reference: np.ndarray, tolerance: Tolerance | None = None
) -> OutputError:
    """Max abs and max relative error of `actual` against `reference` in float64; a NaN or inf mismatch fails.
    `tolerance` defaults to the reference dtype's."""
    dtype = np.dtype(reference.dtype).name
    tolerance = tolerance or tolerance_for(dtype)
    if actual.shape != reference.shape:
        return OutputError(name, dtype, math.inf, math.inf, tolerance)
    actual64 = actual.astype(np.float64)
    reference64 = reference.astype(np.float64)
    if non_finite_mismatch(actual64, reference64):
        return OutputError(name, dtype, math.inf, math.inf, tolerance)
    both_finite = np.isfinite(actual64) & np.isfinite(reference64)
    difference = np.abs(actual64[both_finite] - reference64[both_finite])  # matching infinities left out first
    max_abs = float(difference.max(initial=0.0))
    scale = float(np.abs(reference64[both_finite]).max(initial=0.0))
    if max_abs == 0.0:
        return OutputError(name, dtype, 0.0, 0.0, tolerance)
    max_rel = max_abs / scale if scale > 0.0 else math.inf
    return OutputError(name, dtype, max_abs, max_rel, tolerance)


# Measured with every 16-bit value rounded as the graph says (`onnxrt.keep_16_bit_roundings`): on 70 outputs of real
# exports (optimum, genai, ModelOpt int8/fp8/int4/AutoCast, dynamo opset 23, onnxslim) where a correct fusion differs
# from the original, its RMS error against the float32 evaluation is 0.18-1.21 times the original's (the committed
# fp16 fixtures fuse bit-exactly); a weight offset off by 0.01 on the fp16 fixtures is 14.5-18.4 times.
REFERENCE_MARGIN = 1.5
# Beyond the margin, float32 rounding of the evaluation itself: an output both models compute in float32 agrees to it.
REFERENCE_FLOOR = tolerance_for("float32").rtol
# Each fused node against the float32 evaluation of the original's own ops from the same inputs: where the original's
# runtime rounds once less than the node (onnx's evaluator runs ONNX RMSNormalization without rounding the normalised
# value to X's dtype, which the ONNX function and the node do: OLMo2's bf16 opset-23 fixture), the node's error is
# sqrt(2) times the original's on average, at most 1.62 over seeds 0-9; every other node of the committed fixtures is
# at most 1.13 times (ModelOpt's FP8 KV fixture) or equal to the original. The wrong nodes of
# tests/verify/test_node_verdict.py are 9-150 times.
NODE_MARGIN = 2.0


@dataclass(frozen=True)
class ReferenceErrors:
    """RMS errors, relative to the reference's RMS, of the original and the candidate against the float32 evaluation,
    and how many times the original's the candidate's may be (`margin`)."""

    original: float
    candidate: float
    margin: float = REFERENCE_MARGIN

    @property
    def bound(self) -> float:
        return self.original * self.margin + REFERENCE_FLOOR

    @property
    def passed(self) -> bool:
        return self.candidate <= self.bound


def rms_error(actual: np.ndarray, reference: np.ndarray) -> float:
    """RMS of `actual - reference` over RMS of `reference`, in float64; inf on a shape or NaN/inf mismatch."""
    if actual.shape != reference.shape:
        return math.inf
    actual64 = np.asarray(actual, dtype=np.float64)
    reference64 = np.asarray(reference, dtype=np.float64)
    if non_finite_mismatch(actual64, reference64):
        return math.inf
    finite = np.isfinite(reference64)
    difference = actual64[finite] - reference64[finite]
    if difference.size == 0 or not np.any(difference):
        return 0.0
    scale = math.sqrt(float(np.mean(reference64[finite] ** 2)))
    return math.sqrt(float(np.mean(difference**2))) / scale if scale > 0.0 else math.inf
