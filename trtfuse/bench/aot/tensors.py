"""The buffers of one launch case: random activations and weights, NaN-poisoned outputs, pointers shifted where the
case says."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from trtfuse.bench.aot.cases import LaunchCase
from trtfuse.bench.aot.matrix import MatrixEntry, part_hidden, part_rows
from trtfuse.contract import AOT_PLACEHOLDER_WEIGHT_DTYPE
from trtfuse.kernels.declaration import LaunchDeclaration

# Each row part's tensors, by parameter name: (activation, weight, output).
PART_TENSORS = {"x": ("x", "weight", "y"), "q": ("q", "q_weight", "q_out"), "k": ("k", "k_weight", "k_out")}


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
    """One row part's buffers: activation, weight (a NaN placeholder in weight_mode NONE), output."""

    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    rows: int
    hidden: int


class CaseTensors:
    """The buffers of one launch case, each pointer shifted where the case says; outputs NaN-poisoned."""

    def __init__(
        self, entry: MatrixEntry, declaration: LaunchDeclaration, case: LaunchCase, device: str = "cuda"
    ) -> None:
        spec = entry.spec
        x_dtype, out_dtype = getattr(torch, spec.dtype), getattr(torch, spec.out_dtype)
        no_weight = spec.weight_dtype is None
        w_dtype = getattr(torch, AOT_PLACEHOLDER_WEIGHT_DTYPE if no_weight else spec.weight_dtype)
        self.entry = entry
        self.null = case.null
        self.rows = part_rows(entry, case.tokens)
        self.parts: dict[str, PartTensors] = {}
        for part, rows, hidden in zip(declaration.parts, self.rows, part_hidden(entry), strict=True):
            x_name, w_name, out_name = PART_TENSORS[part.name]

            def offset(name: str) -> int:
                return 1 if name in case.shifted else 0

            # A 0-row launch still gets one row of every buffer: it must leave the poisoned output untouched.
            allocated = max(rows, 1)
            x = random_rows(allocated, hidden, offset_view(allocated * hidden, x_dtype, offset(x_name), device))
            weight = offset_view(hidden, w_dtype, offset(w_name), device)
            if no_weight:
                # The plugins' placeholder ([H] of AOT_PLACEHOLDER_WEIGHT_DTYPE), NaN: a read would poison y.
                weight.fill_(float("nan"))
            else:
                random_rows(1, hidden, weight)
            out = offset_view(allocated * hidden, out_dtype, offset(out_name), device).fill_(float("nan"))
            self.parts[part.name] = PartTensors(x, weight, out, rows, hidden)

    def pointers(self) -> dict[str, int]:
        result = {}
        for part_name, part in self.parts.items():
            x_name, w_name, out_name = PART_TENSORS[part_name]
            result |= {x_name: part.x.data_ptr(), w_name: part.weight.data_ptr(), out_name: part.out.data_ptr()}
        return dict.fromkeys(result, 0) if self.null else result

    def refresh(self) -> None:
        """Fresh random activations and re-poisoned outputs in the same buffers (for another graph replay)."""
        for part in self.parts.values():
            random_rows(max(part.rows, 1), part.hidden, part.x)
            part.out.fill_(float("nan"))
