"""A run's outputs against the shared float64 reference: written everywhere, and within the tolerance of the coarser
of the output dtype and AFTER_CAST's intermediate."""

from __future__ import annotations

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


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    rtol: float
    unwritten: int  # NaNs left in the output: elements the kernel did not write

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.max_rel <= self.rtol


def check_outputs(case: NormCase, tensors: DeviceTensors) -> list[OutputCheck]:
    activations = len(case.config.hidden_sizes)
    names = ("y",) if activations == 1 else ("q_out", "k_out")
    checks = []
    for i in range(activations):
        weight = tensors.inputs[activations + i] if case.config.has_weight else None
        reference = reference_norm(tensors.inputs[i], weight, case.config).double()
        actual = tensors.outputs[i].detach().cpu().double()
        unwritten = int(actual.isnan().sum())
        error = output_error(names[i], actual.numpy(), reference.numpy())
        # The coarser of the output dtype and AFTER_CAST's intermediate R sets the tolerance.
        after_cast = case.config.params.weight_mode is WeightMode.AFTER_CAST
        coarse = rounding_dtype(case.dtype, case.output_dtype) if after_cast else case.output_dtype
        rtol = max(tolerance_for(case.output_dtype).rtol, tolerance_for(coarse).rtol)
        checks.append(OutputCheck(names[i], error.max_abs, error.max_rel, rtol, unwritten))
    return checks
