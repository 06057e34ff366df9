"""CPU stand-ins for the trtfuse.kernels kernels, for driving the lifecycle harness without a GPU.

Each takes its kernel's exact launch signature (trtfuse/kernels/api.py), reads its inputs from the raw host pointers
enqueue hands it, computes its outputs with the shared float64 reference (trtfuse/bench/reference.py) rounded to the
outputs' dtypes (a quantized spec's normalised output in its output quantizer's dtype; the rotary kernel's rotated
outputs by `qk_norm_rope_reference`, cos and sin read at the extents it is launched with), and writes them through
the output pointers. A pointer out of place, a wrong row count or an output
written in the wrong dtype therefore shows in the harness's own checks, as it would on the GPU; the numbers say
nothing about the real kernels.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any

import torch

from trtfuse.bench.reference import add_norm_reference, norm_reference, qk_norm_rope_reference
from trtfuse.contract import WeightMode


def host_view(pointer: int, count: int, dtype: str) -> torch.Tensor:
    """`count` elements of `dtype` at host address `pointer`, as a tensor sharing that memory."""
    torch_dtype = getattr(torch, dtype)
    size = count * torch.empty((), dtype=torch_dtype).element_size()
    return torch.frombuffer((ctypes.c_char * size).from_address(pointer), dtype=torch_dtype, count=count)


@dataclass
class HostKernel:
    """What every stand-in shares: the spec it was made for, warm-ups and launches recorded (as RecordingKernel)."""

    spec: Any
    warm_ups: list[int] = field(default_factory=list)
    launches: list[tuple[int, ...]] = field(default_factory=list)

    def warm_up(self, max_rows: int) -> None:
        self.warm_ups.append(max_rows)

    def _weight(self, pointer: int, hidden: int) -> torch.Tensor | None:
        weighted = self.spec.params.weight_mode is not WeightMode.NONE
        if weighted != (pointer != 0):
            raise AssertionError(f"weight pointer {pointer:#x} with weight_mode {self.spec.params.weight_mode.name}")
        return host_view(pointer, hidden, self.spec.weight_dtype) if weighted else None

    @property
    def _normalised_dtype(self) -> str:
        """y's dtype: the output quantizer's, where the spec has one, else the spec's out_dtype."""
        quant = getattr(self.spec, "quant", None)
        return self.spec.out_dtype if quant is None or quant.output is None else quant.output.dtype

    def _rows(self, pointer: int, rows: int, hidden: int, dtype: str) -> torch.Tensor:
        if rows <= 0 or pointer == 0:
            raise AssertionError(f"a launch of {rows} rows at {pointer:#x}")
        return host_view(pointer, rows * hidden, dtype).view(rows, hidden)


class HostRmsNormKernel(HostKernel):
    def launch(self, x_ptr: int, w_ptr: int, y_ptr: int, rows: int, stream: int) -> None:
        self.launches.append((x_ptr, w_ptr, y_ptr, rows, stream))
        spec = self.spec
        x = self._rows(x_ptr, rows, spec.hidden, spec.dtype)
        y = norm_reference(x, self._weight(w_ptr, spec.hidden), spec.params, spec.out_dtype, spec.quant)
        self._rows(y_ptr, rows, spec.hidden, self._normalised_dtype).copy_(y)


class HostAddRmsNormKernel(HostKernel):
    def launch(self, x_ptr: int, residual_ptr: int, w_ptr: int, y_ptr: int, h_ptr: int, rows: int, stream: int) -> None:
        self.launches.append((x_ptr, residual_ptr, w_ptr, y_ptr, h_ptr, rows, stream))
        spec = self.spec
        x = self._rows(x_ptr, rows, spec.hidden, spec.dtype)
        residual = self._rows(residual_ptr, rows, spec.hidden, spec.dtype)
        weight = self._weight(w_ptr, spec.hidden)
        y, h = add_norm_reference(x, residual, weight, spec.params, spec.out_dtype, spec.quant)
        self._rows(y_ptr, rows, spec.hidden, self._normalised_dtype).copy_(y)
        self._rows(h_ptr, rows, spec.hidden, spec.dtype).copy_(h)


class HostQkNormKernel(HostKernel):
    def launch(
        self,
        q_ptr: int,
        k_ptr: int,
        wq_ptr: int,
        wk_ptr: int,
        q_out_ptr: int,
        k_out_ptr: int,
        q_rows: int,
        k_rows: int,
        stream: int,
    ) -> None:
        self.launches.append((q_ptr, k_ptr, wq_ptr, wk_ptr, q_out_ptr, k_out_ptr, q_rows, k_rows, stream))
        spec = self.spec
        for x_ptr, w_ptr, out_ptr, rows, hidden in (
            (q_ptr, wq_ptr, q_out_ptr, q_rows, spec.q_hidden),
            (k_ptr, wk_ptr, k_out_ptr, k_rows, spec.k_hidden),
        ):
            x = self._rows(x_ptr, rows, hidden, spec.dtype)
            out = norm_reference(x, self._weight(w_ptr, hidden), spec.params, spec.out_dtype)
            self._rows(out_ptr, rows, hidden, spec.out_dtype).copy_(out)


class HostQkNormRopeKernel(HostKernel):
    def launch(
        self,
        q_ptr: int,
        k_ptr: int,
        wq_ptr: int,
        wk_ptr: int,
        cos_ptr: int,
        sin_ptr: int,
        q_out_ptr: int,
        k_out_ptr: int,
        q_rows: int,
        k_rows: int,
        batch: int,
        seq_len: int,
        cos_batch: int,
        stream: int,
    ) -> None:
        args = (q_ptr, k_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_out_ptr, k_out_ptr, q_rows, k_rows)
        self.launches.append((*args, batch, seq_len, cos_batch, stream))
        spec = self.spec
        rotary = spec.rope.rotary_dim
        cos, sin = (
            self._rows(pointer, cos_batch * seq_len, rotary, spec.cos_dtype).view(cos_batch, seq_len, rotary)
            for pointer in (cos_ptr, sin_ptr)
        )
        for part, (x_ptr, w_ptr, out_ptr, rows, hidden) in enumerate(
            ((q_ptr, wq_ptr, q_out_ptr, q_rows, spec.q_hidden), (k_ptr, wk_ptr, k_out_ptr, k_rows, spec.k_hidden))
        ):
            x = self._rows(x_ptr, rows, hidden, spec.dtype)
            weight = self._weight(w_ptr, hidden)
            out, _magnitude = qk_norm_rope_reference(x, weight, cos, sin, spec, part, batch, seq_len)
            self._rows(out_ptr, rows, hidden, spec.part_y_dtype(part)).copy_(out.reshape(rows, hidden))


# trtfuse.kernels' factory for each stand-in.
HOST_KERNELS = {
    "get_rms_norm": HostRmsNormKernel,
    "get_add_rms_norm": HostAddRmsNormKernel,
    "get_qk_norm": HostQkNormKernel,
    "get_qk_norm_rope": HostQkNormRopeKernel,
}
