"""How close two runs of the same model must be, per output dtype.

The relative error of an output is `max|a - b| / max|b|` with b the reference: one number per output that does not
blow up where single elements of b are near zero.
"""

from __future__ import annotations

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


def output_error(name: str, actual: np.ndarray, reference: np.ndarray) -> OutputError:
    """Max abs and max relative error of `actual` against `reference` in float64; a NaN or inf mismatch fails."""
    dtype = np.dtype(reference.dtype).name
    if actual.shape != reference.shape:
        return OutputError(name, dtype, float("inf"), float("inf"), tolerance_for(dtype))
    actual64 = actual.astype(np.float64)
    reference64 = reference.astype(np.float64)
    nan_mismatch = bool(np.any(np.isnan(actual64) != np.isnan(reference64)))
    both_finite = np.isfinite(actual64) & np.isfinite(reference64)
    inf_mismatch = bool(np.any((actual64 != reference64) & ~both_finite & ~np.isnan(reference64)))
    if nan_mismatch or inf_mismatch:
        return OutputError(name, dtype, float("inf"), float("inf"), tolerance_for(dtype))
    difference = np.abs(actual64 - reference64)[both_finite]
    max_abs = float(difference.max(initial=0.0))
    scale = float(np.abs(reference64[both_finite]).max(initial=0.0))
    if max_abs == 0.0:
        return OutputError(name, dtype, 0.0, 0.0, tolerance_for(dtype))
    max_rel = max_abs / scale if scale > 0.0 else float("inf")
    return OutputError(name, dtype, max_abs, max_rel, tolerance_for(dtype))
