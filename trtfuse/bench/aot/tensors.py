"""The buffers of one launch case: random activations (and residuals) and weights, NaN-poisoned outputs, pointers
shifted where the case says."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtfuse.bench.aot.cases import LaunchCase
from trtfuse.bench.aot.matrix import MatrixEntry, PartPointers, part_hidden, part_pointers, part_rows, part_y_dtype
from trtfuse.bench.reference import QUANT_TORCH_DTYPES
from trtfuse.contract import AOT_PLACEHOLDER_WEIGHT_DTYPE
from trtfuse.kernels.declaration import LaunchDeclaration

# A quantized output's poison (INT8 has no NaN): E4M3FN's NaN code, INT8's 127.
QUANT_POISON = 0x7F


def poison(output: torch.Tensor) -> None:
    """NaN, or QUANT_POISON in every byte of a quantized output."""
    if output.element_size() == 1:
        output.view(torch.uint8).fill_(QUANT_POISON)
    else:
        output.fill_(float("nan"))


def unwritten(output: torch.Tensor) -> torch.Tensor:
    """Where `output` still holds its poison."""
    if output.element_size() == 1:
        return output.view(torch.uint8) == QUANT_POISON
    return torch.isnan(output)


def offset_view(numel: int, dtype: torch.dtype, offset: int, device: str) -> torch.Tensor:
    """A 1-D tensor of `numel` elements starting `offset` elements into a fresh (aligned) allocation."""
    return torch.empty(offset + numel, dtype=dtype, device=device)[offset:]


def random_rows(rows: int, hidden: int, out: torch.Tensor) -> torch.Tensor:
    """Fill `out` (rows x hidden elements) with N(0, 1) rows scaled by a random per-row magnitude, so rows differ
    in size; returns it as rows x hidden."""
    x = torch.randn(rows, hidden, device=out.device, dtype=torch.float32)
    x *= torch.rand((rows, 1), device=out.device) * 4 + 0.1
    return out.view(rows, hidden).copy_(x)


@dataclass
class PartTensors:
    """One row part's buffers: activation, weight (a NaN placeholder in weight_mode NONE), output and, for
    add+norm, the residual and the sum output h; `names` are their pointer parameters."""

    names: PartPointers
    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    rows: int
    hidden: int
    residual: torch.Tensor | None = None
    h: torch.Tensor | None = None

    def inputs(self) -> list[torch.Tensor]:
        """The buffers a launch reads that hold fresh random rows (not the weight)."""
        return [t for t in (self.x, self.residual) if t is not None]

    def outputs(self) -> list[torch.Tensor]:
        return [t for t in (self.out, self.h) if t is not None]

    def by_name(self) -> dict[str, torch.Tensor]:
        names = self.names
        pairs = [(names.x, self.x), (names.residual, self.residual), (names.weight, self.weight)]
        pairs += [(names.out, self.out), (names.h, self.h)]
        return {name: tensor for name, tensor in pairs if name is not None}


def part_tensors(
    names: PartPointers,
    rows: int,
    hidden: int,
    dtypes: tuple[torch.dtype, torch.dtype, torch.dtype | None],
    shifted: tuple[str, ...],
    device: str,
) -> PartTensors:
    """One row part's buffers: `dtypes` are x's (and the residual's and h's), y's and the weight's (None: weight
    mode NONE, a NaN placeholder); the pointers named in `shifted` one element past an aligned allocation; the
    outputs poisoned."""
    x_dtype, out_dtype, w_dtype = dtypes
    # A 0-row launch still gets one row of every buffer: it must leave the poisoned outputs untouched.
    allocated = max(rows, 1)

    def buffer(name: str | None, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        return None if name is None else offset_view(numel, dtype, 1 if name in shifted else 0, device)

    inputs = [buffer(name, allocated * hidden, x_dtype) for name in (names.x, names.residual)]
    for tensor in inputs:
        if tensor is not None:
            random_rows(allocated, hidden, tensor)
    weight = buffer(names.weight, hidden, w_dtype or getattr(torch, AOT_PLACEHOLDER_WEIGHT_DTYPE))
    if w_dtype is None:
        # The plugins' placeholder ([H] of AOT_PLACEHOLDER_WEIGHT_DTYPE), NaN: a read would poison y.
        weight.fill_(float("nan"))
    else:
        random_rows(1, hidden, weight)
    out = buffer(names.out, allocated * hidden, out_dtype)
    h = buffer(names.h, allocated * hidden, x_dtype)  # h is D, x's dtype, whatever y's is
    part = PartTensors(names, inputs[0], weight, out, rows, hidden, inputs[1], h)
    for output in part.outputs():
        poison(output)
    return part


class CaseTensors:
    """The buffers of one launch case, each pointer shifted where the case says; outputs NaN-poisoned. Which
    parameter is which buffer comes from the entry's kind (`matrix.KINDS`), checked against the declaration."""

    def __init__(
        self, entry: MatrixEntry, declaration: LaunchDeclaration, case: LaunchCase, device: str = "cuda"
    ) -> None:
        spec = entry.spec
        weight = None if spec.weight_dtype is None else getattr(torch, spec.weight_dtype)

        def dtypes(names: PartPointers) -> tuple[torch.dtype, torch.dtype, torch.dtype | None]:
            y_dtype = part_y_dtype(spec, names)  # each part's own: a QK-norm's q_out may be INT8, its k_out T
            return getattr(torch, spec.dtype), QUANT_TORCH_DTYPES.get(y_dtype) or getattr(torch, y_dtype), weight

        self.entry = entry
        self.null = case.null
        self.rows = part_rows(entry, case.tokens)
        pointers = part_pointers(spec, declaration)
        self.parts: dict[str, PartTensors] = {
            part_name: part_tensors(names, rows, hidden, dtypes(names), case.shifted, device)
            for (part_name, names), rows, hidden in zip(pointers, self.rows, part_hidden(entry), strict=True)
        }

    def pointers(self) -> dict[str, int]:
        result = {}
        for part in self.parts.values():
            result |= {name: tensor.data_ptr() for name, tensor in part.by_name().items()}
        return dict.fromkeys(result, 0) if self.null else result

    def refresh(self) -> None:
        """Fresh random activations and re-poisoned outputs in the same buffers (for another graph replay)."""
        for part in self.parts.values():
            for tensor in part.inputs():
                random_rows(max(part.rows, 1), part.hidden, tensor)
            for output in part.outputs():
                poison(output)
