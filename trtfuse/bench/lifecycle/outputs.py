"""A run's outputs against the shared float64 reference: written everywhere; a normalised output within the tolerance
of the coarser of the output dtype and AFTER_CAST's intermediate, or, quantized (FP8 / INT8), within the quantized
steps the norm's rounding to T can move it (`allowed_steps`); the add-norm's sum h bit for bit; a rotary op's
rotated outputs by the AOT check's rule for rotary parts (`rotated_check`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.cases import NormCase
from trtfuse.bench.lifecycle.tensors import DeviceTensors, is_poison
from trtfuse.contract import WeightMode, rounding_dtype
from trtfuse.contract.codec import NodeFields
from trtfuse.contract.rotary_shapes import rotary_extents
from trtfuse.verify.tolerances import output_error, tolerance_for


def reference_norm(x: Any, weight: Any, config: NodeFields, part: int = 0) -> Any:
    """The plugin node's output for x (and its weight) of part `part` (QK-norm: 0 for q, 1 for k; its quantizers
    are that part's) by the shared float64 reference, computed on the CPU."""
    from trtfuse.bench.reference import norm_reference  # torch: only the GPU steps need it

    cpu_weight = None if weight is None else weight.cpu()
    return norm_reference(x.cpu(), cpu_weight, config.params, config.output_dtype, config.part_quant(part))


def reference_part(
    activations: Sequence[Any], weight: Any, config: NodeFields, part: int = 0
) -> tuple[Any, Any | None]:
    """Part `part`'s outputs by the shared float64 reference, on the CPU: (normalised, sum). A part of one activation
    normalises it (no sum); a part of two (the add-norm's x and residual) normalises their sum D(x + residual),
    which `add_norm_reference` rounds once to the activations' dtype D, as the contract defines it."""
    if len(activations) == 1:
        return reference_norm(activations[0], weight, config, part), None
    if len(activations) != 2:
        raise ValueError(f"no reference for a part of {len(activations)} activations")
    from trtfuse.bench.reference import add_norm_reference  # torch: only the GPU steps need it

    x, residual = (activation.cpu() for activation in activations)
    cpu_weight = None if weight is None else weight.cpu()
    return add_norm_reference(x, residual, cpu_weight, config.params, config.output_dtype, config.quant)


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    rtol: float  # 0 for an output that must be bit-exact (h); inf for a quantized one, which `max_steps` judges
    unwritten: int  # poison left in the output: elements the kernel did not write
    differing: int = 0  # a bit-exact output's elements whose bits differ from the reference (-0 for +0 included)
    max_steps: int = 0  # a quantized output: the most representable values between an element and its reference
    allowed_steps: int = 0
    failure: str = ""  # why a rotated output failed the AOT check's rule ("" when it passed)

    @property
    def passed(self) -> bool:
        return (
            self.unwritten == 0
            and self.differing == 0
            and self.max_rel <= self.rtol
            and self.max_steps <= self.allowed_steps
            and not self.failure
        )


def normalised_rtol(case: NormCase) -> float:
    """A normalised output's tolerance: the coarser of the output dtype and AFTER_CAST's intermediate R sets it."""
    after_cast = case.config.params.weight_mode is WeightMode.AFTER_CAST
    coarse = rounding_dtype(case.dtype, case.output_dtype) if after_cast else case.output_dtype
    return max(tolerance_for(case.output_dtype).rtol, tolerance_for(coarse).rtol)


def allowed_steps(case: NormCase, index: int = 0) -> int:
    """How many representable values a quantized output may be from the reference's. The kernel rounds the norm to T
    once from float32 and the reference from float64, so their T values are up to two units of T's last place apart
    (`verify.tolerances.KERNEL_ELEMENTWISE`), which moves Q(y) by at most one step where T resolves the quantized
    grid (FP8's 4 significant bits, INT8's codes in fp32 or fp16), and by two for INT8 codes up to 127 in bfloat16,
    whose 8 significant bits space them half a code apart above 64. `index` is the output's position."""
    quantizer = case.config.output_quantizer(index)
    if quantizer is None:
        return 0
    return 2 if quantizer.dtype == "int8" and case.output_dtype == "bfloat16" else 1


def _ordinals(tensor: Any) -> tuple[Any, Any]:
    """(each element's position on its dtype's ordered grid, its NaN mask): INT8 values as they are; E4M3FN's
    sign-magnitude bits turned into a signed ordinal (±0 both 0), its NaNs (magnitude 0x7F) masked."""
    import torch

    if not tensor.dtype.is_floating_point:
        return tensor.long(), torch.zeros(tensor.shape, dtype=torch.bool)
    bits = tensor.view(torch.uint8).long()
    magnitude = bits & 0x7F
    return torch.where(bits >= 0x80, -magnitude, magnitude), magnitude == 0x7F


def quantized_steps(actual: Any, reference: Any) -> int:
    """The most representable values between an element of a quantized output and its reference's; a NaN where the
    reference has none, or the reverse, counts as the whole grid (256)."""
    actual_ordinals, actual_nan = _ordinals(actual.contiguous())
    reference_ordinals, reference_nan = _ordinals(reference.contiguous())
    steps = (actual_ordinals - reference_ordinals).abs().masked_fill(actual_nan & reference_nan, 0)
    steps = steps.masked_fill(actual_nan != reference_nan, 256)
    return int(steps.max()) if steps.numel() else 0


def _same_width_int(tensor: Any) -> Any:
    import torch

    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def rotated_check(case: NormCase, tensors: DeviceTensors, index: int) -> OutputCheck:
    """Output `index` of a rotary op (`FusedOp.rotary_tables`), judged as the AOT check judges a rotary kernel's part
    (`bench.aot.compare.compare_part`: within `rotated_tolerance` of `qk_norm_rope_reference`'s T value, one step of
    each product stage's grid more, and of the output quantizer's where it has one), the tables' rows located by the
    plugin's own `rotary_extents`. `max_rel` is the worst error over its allowance, so `rtol` is 1; `unwritten`
    counts poison where the reference holds another value."""
    from trtfuse.bench.aot.compare import compare_part
    from trtfuse.bench.aot.matrix import PartPointers
    from trtfuse.bench.aot.tensors import PartTensors, RotationTables
    from trtfuse.bench.reference import qk_norm_rope_reference

    op, config, spec = case.op, case.config, case.kernel_spec
    part = op.output_parts[index]
    activation = op.activation_parts.index(part)
    names = op.inputs(config.has_weight)
    batch, seq_len, _cos_batch = rotary_extents(config, case.name, names, [t.shape for t in tensors.inputs])
    cos, sin = (table.cpu() for table in tensors.inputs[len(names) - case.table_count :])
    x = tensors.inputs[activation].cpu()
    weight = tensors.inputs[len(op.activations) + part].cpu() if config.has_weight else None
    out = tensors.outputs[index].detach().cpu()
    hidden = config.hidden_sizes[part]
    pointers = PartPointers(op.activations[activation], op.weights[part], op.outputs[index])
    rotated = PartTensors(
        pointers,
        x.reshape(-1),
        weight,
        out.reshape(-1),
        x.numel() // hidden,
        hidden,
        quant=spec.part_quant(part),
        rotation=RotationTables(cos, sin, batch, seq_len),
        index=part,
    )
    passed, detail, max_abs, worst = compare_part(spec, rotated)
    reference = qk_norm_rope_reference(x, weight, cos, sin, spec, part, batch, seq_len)[0]
    unwritten = int((is_poison(out) & ~is_poison(reference)).sum())
    return OutputCheck(op.outputs[index], max_abs, worst, 1.0, unwritten, failure="" if passed else detail)


def check_outputs(case: NormCase, tensors: DeviceTensors) -> list[OutputCheck]:
    """Every output of a run, in the op's output order (its names: y; q_out, k_out; y, h)."""
    op = case.op
    if op.rotary:
        return [rotated_check(case, tensors, index) for index in range(len(op.outputs))]
    activations = len(op.activations)
    references = []
    for part in range(len(op.weights)):
        members = [tensors.inputs[i] for i, owner in enumerate(op.activation_parts) if owner == part]
        weight = tensors.inputs[activations + part] if case.config.has_weight else None
        references.append(reference_part(members, weight, case.config, part))
    checks = []
    for index, (name, part, normalised) in enumerate(
        zip(op.outputs, op.output_parts, op.normalised_outputs, strict=True)
    ):
        normed, summed = references[part]
        actual = tensors.outputs[index].detach().cpu()
        unwritten = int(is_poison(actual).sum())
        if normalised and case.config.output_quantizer(index) is not None:
            # The poison is a value INT8 outputs may hold: unwritten only where the reference holds another.
            unwritten = int((is_poison(actual) & ~is_poison(normed)).sum())
            error = output_error(name, actual.double().numpy(), normed.double().numpy())
            steps = quantized_steps(actual, normed)
            checks.append(
                OutputCheck(
                    name, error.max_abs, error.max_rel, math.inf, unwritten, 0, steps, allowed_steps(case, index)
                )
            )
            continue
        if normalised:
            error = output_error(name, actual.double().numpy(), normed.double().numpy())
            checks.append(OutputCheck(name, error.max_abs, error.max_rel, normalised_rtol(case), unwritten))
            continue
        if summed is None:
            raise ValueError(f"{op.name}: output {name} is not normalised, but its part has no sum")
        error = output_error(name, actual.double().numpy(), summed.double().numpy())
        differing = int((_same_width_int(actual.contiguous()) != _same_width_int(summed.contiguous())).sum())
        checks.append(OutputCheck(name, error.max_abs, error.max_rel, 0.0, unwritten, differing))
    return checks
