"""The one judgment `check` and `compare` pass on a candidate's outputs: blame the fusion only when it is to blame.

Per output of the original:
- an output that differs between two runs of the original on the same inputs (uninitialised cache slots, say) says
  nothing about the candidate: it is left out, and the verdict says so;
- a missing output, a changed declared dtype, rank or static dim, a changed runtime shape or a NaN/inf mismatch
  fails (a renamed symbolic dim is only reported);
- integer and bool outputs must equal the original's;
- float outputs of a float32 graph, and every float output when the user gives a tolerance, pass within the
  tolerance of the dtype that computed them (`tolerances.tolerance_for`);
- float outputs of a 16-bit or quantized graph are measured against a float32 evaluation of the original graph's
  arithmetic (`trtfuse.widening`): they pass when the candidate's error there is at most `REFERENCE_MARGIN` times the
  original's own error, plus float32's tolerance, and both errors are reported.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from trtfuse.tolerances import OutputError, Tolerance, non_finite_mismatch, output_error, tolerance_for

# Measured with every 16-bit value rounded as the graph says (`check.keep_16_bit_roundings`): on 70 outputs of real
# exports (optimum, genai, ModelOpt int8/fp8/int4/AutoCast, dynamo opset 23, onnxslim) where a correct fusion differs
# from the original, its RMS error against the float32 evaluation is 0.18-1.21 times the original's (the committed
# fp16 fixtures fuse bit-exactly); a weight offset off by 0.01 on the fp16 fixtures is 14.5-18.4 times.
REFERENCE_MARGIN = 1.5
# Beyond the margin, float32 rounding of the evaluation itself: an output both models compute in float32 agrees to it.
REFERENCE_FLOOR = tolerance_for("float32").rtol


@dataclass(frozen=True)
class ReferenceErrors:
    """RMS errors, relative to the reference's RMS, of the original and the candidate against the float32 evaluation."""

    original: float
    candidate: float

    @property
    def bound(self) -> float:
        return self.original * REFERENCE_MARGIN + REFERENCE_FLOOR

    @property
    def passed(self) -> bool:
        return self.candidate <= self.bound


@dataclass(frozen=True)
class OutputVerdict:
    """What was measured on one output and why it passed, failed or was left out (`passed` None)."""

    name: str
    dtype: str
    computed_in: str
    error: OutputError | None
    reference: ReferenceErrors | None
    passed: bool | None
    note: str = ""

    @property
    def max_abs(self) -> float:
        return self.error.max_abs if self.error else math.inf

    @property
    def max_rel(self) -> float:
        return self.error.max_rel if self.error else math.inf

    def to_json(self) -> dict:
        """Plain values; non-finite errors stay floats for the JSON writer to spell."""
        error, reference = self.error, self.reference
        return {
            "name": self.name,
            "dtype": self.dtype,
            "computed_in": self.computed_in,
            "max_abs": error.max_abs if error else None,
            "max_rel": error.max_rel if error else None,
            "atol": error.tolerance.atol if error else None,
            "rtol": error.tolerance.rtol if error else None,
            "float32_evaluation": (
                {"original_error": reference.original, "candidate_error": reference.candidate, "bound": reference.bound}
                if reference
                else None
            ),
            "passed": self.passed,
            "note": self.note,
        }


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


def same_runs(first: np.ndarray, second: np.ndarray) -> bool:
    """Bit-for-bit agreement of two runs of one model (NaN equal to NaN)."""
    if first.shape != second.shape or first.dtype != second.dtype:
        return False
    if first.dtype.kind in "fc" or first.dtype.name == "bfloat16":
        return bool(np.array_equal(first.astype(np.float64), second.astype(np.float64), equal_nan=True))
    return bool(np.array_equal(first, second))


def is_float(dtype: np.dtype) -> bool:
    return np.dtype(dtype).kind == "f" or np.dtype(dtype).name == "bfloat16"


@dataclass(frozen=True)
class Judge:
    """How to judge: `tolerance` set by the user replaces every default; `computed_in` maps an output to the dtype
    of the computation that produced it (an fp16 model's `logits.float()` is float16's); `declared` holds, per output,
    why the candidate's declared interface differs from the original's so that it fails; `remarks`, differences
    that are only reported."""

    tolerance: Tolerance | None = None
    computed_in: Mapping[str, str] | None = None
    declared: Mapping[str, str] | None = None
    remarks: Mapping[str, str] | None = None

    def outputs(
        self,
        original: Mapping[str, np.ndarray],
        original_again: Mapping[str, np.ndarray],
        candidate: Mapping[str, np.ndarray],
        reference: Mapping[str, np.ndarray] | None,
    ) -> list[OutputVerdict]:
        return [
            self.output(name, expected, original_again[name], candidate.get(name), reference)
            for name, expected in original.items()
        ]

    def output(
        self,
        name: str,
        expected: np.ndarray,
        expected_again: np.ndarray,
        actual: np.ndarray | None,
        reference: Mapping[str, np.ndarray] | None,
    ) -> OutputVerdict:
        dtype = np.dtype(expected.dtype).name
        computed_in = (self.computed_in or {}).get(name, dtype)
        verdict = {"name": name, "dtype": dtype, "computed_in": computed_in}
        if actual is None:
            return OutputVerdict(**verdict, error=None, reference=None, passed=False, note="missing from the candidate")
        tolerance = self.tolerance if self.tolerance and is_float(expected.dtype) else tolerance_for(computed_in)
        error = output_error(name, np.asarray(actual), expected, tolerance)
        if not same_runs(expected, expected_again):
            spread = output_error(name, expected_again, expected)
            note = f"left out: two runs of the original differ (max abs {spread.max_abs:.3e})"
            return OutputVerdict(**verdict, error=error, reference=None, passed=None, note=note)
        declared = (self.declared or {}).get(name)
        if declared:
            return OutputVerdict(**verdict, error=error, reference=None, passed=False, note=declared)
        if actual.shape != expected.shape:
            note = f"shape {_shape(actual)}, the original's {_shape(expected)}"
            return OutputVerdict(**verdict, error=error, reference=None, passed=False, note=note)
        remark = (self.remarks or {}).get(name, "")
        if reference is None or self.tolerance is not None or not is_float(expected.dtype) or name not in reference:
            return OutputVerdict(**verdict, error=error, reference=None, passed=error.passed, note=remark)
        errors = ReferenceErrors(rms_error(expected, reference[name]), rms_error(np.asarray(actual), reference[name]))
        # Identical outputs cannot be blamed, whatever the reference says.
        passed = errors.passed or error.max_abs == 0.0
        return OutputVerdict(**verdict, error=error, reference=errors, passed=passed, note=remark)


def _shape(array: np.ndarray) -> str:
    return "x".join(str(dim) for dim in array.shape) or "scalar"
