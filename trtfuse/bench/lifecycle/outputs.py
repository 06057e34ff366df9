"""A run's outputs against the shared float64 reference: written everywhere; a normalised output within the tolerance
of the coarser of the output dtype and AFTER_CAST's intermediate; the add-norm's sum h bit for bit."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.cases import NormCase
from trtfuse.bench.lifecycle.tensors import DeviceTensors
from trtfuse.contract import WeightMode, rounding_dtype
from trtfuse.contract.codec import NodeFields
from trtfuse.verify.tolerances import output_error, tolerance_for


def reference_norm(x: Any, weight: Any, config: NodeFields) -> Any:
    """The plugin node's output for x (and its weight) by the shared float64 reference, computed on the CPU."""
    from trtfuse.bench.reference import norm_reference  # torch: only the GPU steps need it

    cpu_weight = None if weight is None else weight.cpu()
    return norm_reference(x.cpu(), cpu_weight, config.params, config.output_dtype)


def reference_part(activations: Sequence[Any], weight: Any, config: NodeFields) -> tuple[Any, Any | None]:
    """One part's outputs by the shared float64 reference, on the CPU: (normalised, sum). A part of one activation
    normalises it (no sum); a part of two (the add-norm's x and residual) normalises their sum D(x + residual),
    which `add_norm_reference` rounds once to the activations' dtype D, as the contract defines it."""
    if len(activations) == 1:
        return reference_norm(activations[0], weight, config), None
    if len(activations) != 2:
        raise ValueError(f"no reference for a part of {len(activations)} activations")
    from trtfuse.bench.reference import add_norm_reference  # torch: only the GPU steps need it

    x, residual = (activation.cpu() for activation in activations)
    cpu_weight = None if weight is None else weight.cpu()
    return add_norm_reference(x, residual, cpu_weight, config.params, config.output_dtype)


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    rtol: float  # 0 for an output that must be bit-exact (h)
    unwritten: int  # NaNs left in the output: elements the kernel did not write
    differing: int = 0  # a bit-exact output's elements whose bits differ from the reference (-0 for +0 included)

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.differing == 0 and self.max_rel <= self.rtol


def normalised_rtol(case: NormCase) -> float:
    """A normalised output's tolerance: the coarser of the output dtype and AFTER_CAST's intermediate R sets it."""
    after_cast = case.config.params.weight_mode is WeightMode.AFTER_CAST
    coarse = rounding_dtype(case.dtype, case.output_dtype) if after_cast else case.output_dtype
    return max(tolerance_for(case.output_dtype).rtol, tolerance_for(coarse).rtol)


def _same_width_int(tensor: Any) -> Any:
    import torch

    return tensor.view({2: torch.int16, 4: torch.int32, 8: torch.int64}[tensor.element_size()])


def check_outputs(case: NormCase, tensors: DeviceTensors) -> list[OutputCheck]:
    """Every output of a run, in the op's output order (its names: y; q_out, k_out; y, h)."""
    op = case.op
    activations = len(op.activations)
    references = []
    for part in range(len(op.weights)):
        members = [tensors.inputs[i] for i, owner in enumerate(op.activation_parts) if owner == part]
        weight = tensors.inputs[activations + part] if case.config.has_weight else None
        references.append(reference_part(members, weight, case.config))
    checks = []
    for index, (name, part, normalised) in enumerate(
        zip(op.outputs, op.output_parts, op.normalised_outputs, strict=True)
    ):
        normed, summed = references[part]
        actual = tensors.outputs[index].detach().cpu()
        unwritten = int(actual.isnan().sum())
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
