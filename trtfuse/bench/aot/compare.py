"""One row part's output against the float64 reference, within the kernels' elementwise tolerance."""

from __future__ import annotations

import torch

from trtfuse.bench.aot.tensors import PartTensors
from trtfuse.bench.reference import norm_reference
from trtfuse.contract import WeightMode
from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE


def rounded_to(spec: RmsNormSpec | QkNormSpec) -> str | None:
    """AFTER_CAST's 16-bit intermediate R, whose last-place units then set the tolerance; None otherwise."""
    if spec.params.weight_mode is not WeightMode.AFTER_CAST:
        return None
    return spec.dtype if spec.dtype != "float32" else spec.out_dtype


def compare_part(spec: RmsNormSpec | QkNormSpec, part: PartTensors) -> tuple[bool, str, float, float]:
    """(passed, detail, max abs error, worst |error| / allowed) of one part's output against the reference."""
    out = part.out.view(max(part.rows, 1), part.hidden)
    if part.rows == 0:
        written = int((~torch.isnan(out)).sum())
        return written == 0, f"{written} elements written by a 0-row launch" if written else "", 0.0, 0.0
    x = part.x.view(part.rows, part.hidden)
    weight = None if spec.weight_dtype is None else part.weight
    reference = norm_reference(x, weight, spec.params, spec.out_dtype).double()
    rtol, atol = max(KERNEL_ELEMENTWISE[spec.out_dtype], KERNEL_ELEMENTWISE[rounded_to(spec) or "float32"])
    error = (out.double() - reference).abs()
    ratio = error / (atol + rtol * reference.abs())
    nan = int(torch.isnan(out).sum())
    worst = float(ratio.nan_to_num(nan=float("inf")).max())
    max_abs = float(error.nan_to_num(nan=float("inf")).max())
    if nan:
        return False, f"{nan} NaN elements (unwritten or computed)", max_abs, worst
    failing = int((ratio > 1).sum())
    if failing:
        return False, f"{failing} elements outside rtol {rtol:g} atol {atol:g}", max_abs, worst
    return True, "", max_abs, worst
