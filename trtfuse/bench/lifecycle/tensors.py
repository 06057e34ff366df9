"""A run's tensors on the GPU (or the CPU, for a stand-in kernel): random activations and weights, a rotary op's
cos and sin of real positions, poisoned outputs with a guard tail (NaN; for an INT8 output, which has none, -128)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.cases import NormCase, Shape

GUARD_ELEMENTS = 4096
# A rotary case's positions: each table row's tokens from a random start below this (decode reads far positions).
MAX_START_POSITION = 32768


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
    tables: int = 0  # how many inputs, at the end, are a rotary op's tables

    @property
    def random_inputs(self) -> list[Any]:
        """The activations and weights: every input but the tables."""
        return self.inputs[: len(self.inputs) - self.tables]

    @property
    def input_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.inputs]

    @property
    def output_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.outputs]

    def refill(self, generator: Any) -> None:
        """New random activations and weights in place (same addresses), outputs poisoned again; the tables stay
        those of their positions."""
        import torch

        for tensor in self.random_inputs:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.dtype))
        for buffer in self.output_buffers:
            buffer.fill_(poison(buffer.dtype))

    def guards_intact(self) -> bool:
        pairs = zip(self.output_buffers, self.outputs, strict=True)
        return all(bool(is_poison(buffer[out.numel() :]).all()) for buffer, out in pairs)


def rotary_inputs(case: NormCase, shape: Shape, generator: Any, device: str) -> list[Any]:
    """cos and sin of `shape` [Bc, S, R] as a model computes them (`bench.reference.rotary_tables`, the case's theta
    and the node's rotation), each table row for S positions from its own random start."""
    import torch

    from trtfuse.bench.reference import rotary_tables

    rows, tokens, rotary_dim = shape
    starts = torch.randint(0, MAX_START_POSITION, (rows, 1), generator=generator)
    positions = starts + torch.arange(tokens)[None, :]
    rope, tables = case.kernel_spec.rope, case.tables
    cos, sin = rotary_tables(positions, rotary_dim, tables.theta, rope.rotation, torch_dtype(tables.dtype))
    return [cos.to(device), sin.to(device)]


def device_tensors(case: NormCase, part_shapes: Sequence[Shape], seed: int, device: str = "cuda") -> DeviceTensors:
    """A run's tensors for one shape per part: N(0, 1) activations and weights in the case's input dtypes, a rotary
    op's tables of real positions (`rotary_inputs`), and every output (each in its own dtype: y in the normalised
    dtype, h in the activations') poisoned, with a guard tail."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    inputs = []
    shapes = case.input_shapes(part_shapes)
    random = len(shapes) - case.table_count
    for shape, dtype in zip(shapes[:random], case.input_dtypes[:random], strict=True):
        values = torch.randn(shape, generator=generator, dtype=torch.float32)
        inputs.append(values.to(device=device, dtype=torch_dtype(dtype)))
    if case.table_count:
        inputs.extend(rotary_inputs(case, shapes[random], generator, device))
    buffers, outputs = [], []
    for shape, dtype in zip(case.output_shapes(part_shapes), case.output_dtypes, strict=True):
        size = math.prod(shape)
        buffer = torch.full(
            (size + GUARD_ELEMENTS,), poison(torch_dtype(dtype)), device=device, dtype=torch_dtype(dtype)
        )
        buffers.append(buffer)
        outputs.append(buffer[:size].view(shape))
    return DeviceTensors(inputs, outputs, buffers, case.table_count)
