"""A run's tensors on the GPU (or the CPU, for a stand-in kernel): random activations and weights, poisoned outputs
with a guard tail (NaN; for an INT8 output, which has none, -128)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.cases import NormCase, Shape

GUARD_ELEMENTS = 4096


# An INT8 output's poison: the one value of its range a symmetric quantizer gives only to the most negative inputs.
INT8_POISON = -128


def torch_dtype(name: str) -> Any:
    import torch

    from trtfuse.bench.reference import QUANT_TORCH_DTYPES

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, **QUANT_TORCH_DTYPES}[name]


def poison(dtype: Any) -> float:
    """What an output of torch dtype `dtype` starts filled with: NaN, or INT8_POISON for an integer dtype."""
    return float(INT8_POISON) if not dtype.is_floating_point else float("nan")


def is_poison(tensor: Any) -> Any:
    """Where `tensor` still holds its poison."""
    return tensor == INT8_POISON if not tensor.dtype.is_floating_point else tensor.isnan()


@dataclass
class DeviceTensors:
    """A run's tensors on the GPU. Each output is the head of a poisoned buffer with a guard tail: a kernel that
    writes too little leaves poison, one that writes too far spoils the tail."""

    inputs: list[Any]
    outputs: list[Any]
    output_buffers: list[Any]

    @property
    def input_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.inputs]

    @property
    def output_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.outputs]

    def refill(self, generator: Any) -> None:
        """New random activations and weights in place (same addresses), outputs poisoned again."""
        import torch

        for tensor in self.inputs:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.dtype))
        for buffer in self.output_buffers:
            buffer.fill_(poison(buffer.dtype))

    def guards_intact(self) -> bool:
        pairs = zip(self.output_buffers, self.outputs, strict=True)
        return all(bool(is_poison(buffer[out.numel() :]).all()) for buffer, out in pairs)


def device_tensors(case: NormCase, part_shapes: Sequence[Shape], seed: int, device: str = "cuda") -> DeviceTensors:
    """A run's tensors for one shape per part: N(0, 1) inputs in the case's input dtypes, and every output (each in
    its own dtype: y in the normalised dtype, h in the activations') poisoned, with a guard tail."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for shape, dtype in zip(case.input_shapes(part_shapes), case.input_dtypes, strict=True):
        values = torch.randn(shape, generator=generator, dtype=torch.float32)
        inputs.append(values.to(device=device, dtype=torch_dtype(dtype)))
    buffers, outputs = [], []
    for shape, dtype in zip(case.output_shapes(part_shapes), case.output_dtypes, strict=True):
        size = math.prod(shape)
        buffer = torch.full(
            (size + GUARD_ELEMENTS,), poison(torch_dtype(dtype)), device=device, dtype=torch_dtype(dtype)
        )
        buffers.append(buffer)
        outputs.append(buffer[:size].view(shape))
    return DeviceTensors(inputs, outputs, buffers)
