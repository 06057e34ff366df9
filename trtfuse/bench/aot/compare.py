"""One row part's outputs against the float64 reference: y within the kernels' elementwise tolerance (a quantized y
within one quantization step more, dequantized) and, for add+norm, h bit for bit."""

from __future__ import annotations

import dataclasses

import torch

from trtfuse.bench.aot.matrix import Spec
from trtfuse.bench.aot.tensors import PartTensors, unwritten
from trtfuse.bench.reference import (
    add_norm_reference,
    norm_reference,
    qk_norm_rope_reference,
    quantize_reference,
    rotated_tolerance,
)
from trtfuse.contract import Quantizer, QuantParams, WeightMode
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE

# Integer views of the same width, to compare h's bits: a value comparison would let -0 pass for +0.
SAME_WIDTH_INT = {2: torch.int16, 4: torch.int32}
Comparison = tuple[bool, str, float, float]


def rounded_to(spec: Spec) -> str | None:
    """AFTER_CAST's 16-bit intermediate R, whose last-place units then set the tolerance; None otherwise."""
    if spec.params.weight_mode is not WeightMode.AFTER_CAST:
        return None
    return spec.dtype if spec.dtype != "float32" else spec.out_dtype


def untouched(part: PartTensors) -> Comparison:
    """A 0-row launch: every output still all NaN."""
    for name, output in ((part.names.out, part.out), (part.names.h, part.h)):
        written = 0 if output is None else int((~unwritten(output)).sum())
        if written:
            return False, f"{name}: {written} elements written by a 0-row launch", 0.0, 0.0
    return True, "", 0.0, 0.0


def compare_sum(part: PartTensors, reference: torch.Tensor) -> str:
    """Why h is not exactly the reference's rounded sum D(x + residual) ("" when it is)."""
    h = part.h.view(part.rows, part.hidden)
    nan = int(torch.isnan(h).sum())
    if nan:
        return f"{part.names.h}: {nan} NaN elements (unwritten or computed)"
    as_int = SAME_WIDTH_INT[h.element_size()]
    differing = int((h.view(as_int) != reference.view(as_int)).sum())
    if differing:
        return f"{part.names.h}: {differing} elements not bit-exact D({part.names.x} + {part.names.residual})"
    return ""


def _unquantized(quant: QuantParams | None) -> QuantParams | None:
    """One norm's quantizers less the output stage: what y is before it is quantized."""
    if quant is None or quant.output is None:
        return quant
    rest = dataclasses.replace(quant, output=None)
    return rest if rest.stages else None


def quantization_step(reference: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """The spacing of the quantizer's dequantized values at each (dequantized) reference value (INT8: the scale;
    E4M3FN: a mantissa step of 2^-3 of the value's binade, 2^-9 among the subnormals, times the scale)."""
    if quantizer.dtype == "int8":
        return torch.full_like(reference, quantizer.scale)
    # A 0-d tensor divisor: torch on CUDA divides by a Python scalar as a product with its reciprocal, which puts
    # a code of 2^k just below 2^k, a binade too low; frexp reads the binade exactly.
    codes = reference / reference.new_tensor(quantizer.scale)
    binade = torch.frexp(codes.abs().clamp(min=2.0**-6)).exponent - 1
    return torch.exp2(binade.to(reference.dtype) - 3) * quantizer.scale


def compare_part(spec: Spec, part: PartTensors) -> Comparison:
    """(passed, detail, max abs error of y, worst |error| / allowed of y) of one part's outputs against the
    reference; the detail names the failing output's parameter. A quantized y is compared dequantized, allowed one
    quantization step beyond y's own tolerance, and NaN exactly where the reference's is (an element left holding
    the poison, E4M3FN's NaN or INT8's 127, fails unless the reference has that very value). The quantizers are the
    part's own (`PartTensors.quant`: a QK-norm part's output quantizer, or none)."""
    if part.rows == 0:
        return untouched(part)
    x = part.x.view(part.rows, part.hidden)
    weight = None if spec.weight_dtype is None else part.weight
    quant = _unquantized(part.quant)
    rtol, atol = max(KERNEL_ELEMENTWISE[spec.out_dtype], KERNEL_ELEMENTWISE[rounded_to(spec) or "float32"])
    rotation = part.rotation
    if rotation is not None:
        # The rotary kernel's part: its T value (the unquantized spec's), within `rotated_tolerance`.
        plain = dataclasses.replace(spec, quant=None)
        extents = (rotation.cos, rotation.sin, part.index, rotation.batch, rotation.seq_len)
        reference, magnitude = qk_norm_rope_reference(x, weight, *extents[:2], plain, *extents[2:])
        allowed = rotated_tolerance(plain, reference, magnitude)
        products = part.quant is not None and part.quant.cos_product is not None
        if products:
            # With product stages, the T value the part's quantizers leave before any output stage. y may differ
            # from the reference's within the tolerance above, which a product's quantizer can turn into one step
            # of its grid (check's rule for product stages, docs/cli.md): one step of each, at the rotated terms'
            # size (no product is larger, and a grid's step grows with the value). A kernel that skipped the
            # product quantizers would move each product by at most half a step and so pass here: the stages are
            # checked bit for bit by tests/gpu/test_rope_gpu.py on the kernel's own y (the JIT compiles the same
            # variant); this check is the artifact's launch and values.
            before_output = dataclasses.replace(spec.quant, q_output=None, k_output=None)
            rounded = dataclasses.replace(spec, quant=before_output)
            reference = qk_norm_rope_reference(x, weight, *extents[:2], rounded, *extents[2:])[0]
            for stage in (part.quant.cos_product, part.quant.sin_product):
                allowed = allowed + quantization_step(magnitude.double(), stage)
        # As the output holds them (its [B, H, S, D] where the spec moves heads): rows of the part's width.
        reference, allowed = (t.reshape(part.rows, part.hidden) for t in (reference, allowed))
    elif part.residual is None:
        reference = norm_reference(x, weight, spec.params, spec.out_dtype, quant)
    else:
        residual = part.residual.view(part.rows, part.hidden)
        # y's reference is the RMSNorm of the reference's rounded h, so a wrong h cannot hide in y's tolerance.
        reference, h_reference = add_norm_reference(x, residual, weight, spec.params, spec.out_dtype, quant)
        wrong_sum = compare_sum(part, h_reference)
        if wrong_sum:
            return False, wrong_sum, 0.0, 0.0
    reference = reference.double()
    out = part.out.view(part.rows, part.hidden)
    name = part.names.out
    if rotation is None:
        allowed = atol + rtol * reference.abs()
    quantizer = None if part.quant is None else part.quant.output
    if quantizer is None:
        ours, nan = out.double(), int(torch.isnan(out).sum())
        if nan:
            return False, f"{name}: {nan} NaN elements (unwritten or computed)", 0.0, float("inf")
    else:
        unquantized = reference
        codes = quantize_reference(reference.to(getattr(torch, spec.out_dtype)), quantizer)
        ours = out.double() * quantizer.scale
        mismatched = int((torch.isnan(ours) != torch.isnan(codes.double())).sum())
        if mismatched:
            return False, f"{name}: {mismatched} elements NaN on one side only (of the reference's)", 0.0, float("inf")
        reference = (codes.double() * quantizer.scale).nan_to_num(nan=0.0)
        ours = ours.nan_to_num(nan=0.0)
        allowed = allowed + quantization_step(reference, quantizer)
    error = (ours - reference).abs()
    ratio = error / allowed
    worst = float(ratio.max())
    max_abs = float(error.max())
    failing = int((ratio > 1).sum())
    if failing:
        at = int(ratio.argmax())
        row, column = divmod(at, part.hidden)
        got, expected = float(ours.reshape(-1)[at]), float(reference.reshape(-1)[at])
        where = f"worst at row {row} column {column}: {got!r} for {expected!r}"
        if quantizer is not None:
            where += f" (unquantized {float(unquantized.reshape(-1)[at])!r}, scale {quantizer.scale!r})"
        return False, f"{name}: {failing} elements outside rtol {rtol:g} atol {atol:g}; {where}", max_abs, worst
    return True, "", max_abs, worst
