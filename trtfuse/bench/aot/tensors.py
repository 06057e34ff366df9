"""The buffers of one launch case: random activations (and residuals; rows of exact sums of squares for the rsqrt
stage) and weights, NaN-poisoned outputs, pointers shifted where the case says."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from trtfuse.bench.aot.cases import LaunchCase
from trtfuse.bench.aot.matrix import (
    MatrixEntry,
    PartPointers,
    Spec,
    part_hidden,
    part_pointers,
    part_rows,
    rope_shape,
)
from trtfuse.bench.reference import QUANT_TORCH_DTYPES, rotary_tables
from trtfuse.contract import AOT_PLACEHOLDER_WEIGHT_DTYPE, QuantParams
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


# Rows of m / EXACT_STEP, integers |m| <= EXACT_MAX: each square is a multiple of 2^-14 and up to 4096 of them sum to
# below 2^10, so every partial sum of squares is exact in float32 (24 bits), in any order.
EXACT_STEP, EXACT_MAX, EXACT_MAX_HIDDEN = 128, 63, 4096


def exact_square_rows(rows: int, hidden: int, out: torch.Tensor) -> torch.Tensor:
    """Fill `out` (rows x hidden elements, hidden <= EXACT_MAX_HIDDEN) with rows of m / 128, m uniform integers up
    to a random bound per row (20 to 63, so rows differ in size); returns it as rows x hidden. The kernel's sum of
    squares is then the reference's, and so its inverse root r (tests/gpu/test_quant_gpu.py's rows of exact sums)."""
    if hidden > EXACT_MAX_HIDDEN:
        raise ValueError(f"rows of {hidden} elements of m / {EXACT_STEP} have no exact float32 sum of squares")
    bound = torch.randint(20, EXACT_MAX + 1, (rows, 1), device=out.device)
    m = torch.floor(torch.rand(rows, hidden, device=out.device) * (2 * bound + 1)) - bound
    return out.view(rows, hidden).copy_(m / EXACT_STEP)


def activation_rows(quant: QuantParams | None) -> Callable[[int, int, torch.Tensor], torch.Tensor]:
    """How a part's activations are filled: rows of exact sums of squares for the rsqrt stage (r' = DQ(Q(r)) is a
    step function of r, which a sum rounded otherwise than the reference's moves across a step on some rows; the
    step moves y by far more than its tolerance), random rows otherwise."""
    return exact_square_rows if quant is not None and quant.rsqrt is not None else random_rows


# The rotary cases' tables: Qwen3's theta, positions from a random start below 32k per batch row.
ROPE_THETA, ROPE_MAX_START = 1e6, 32768


@dataclass
class RotationTables:
    """The rotary kernel's cos and sin [Bc, S, R] of one case, with q's batch B and the sequence length S."""

    cos: torch.Tensor
    sin: torch.Tensor
    batch: int
    seq_len: int


def rotation_tables(spec: Spec, tokens: int, shifted: tuple[str, ...], device: str) -> RotationTables:
    """cos and sin of real positions for `tokens` tokens split as `matrix.rope_shape` says, each one element past
    an aligned allocation where `shifted` names it."""
    batch, seq_len, cos_batch = rope_shape(tokens)
    starts = torch.randint(0, ROPE_MAX_START, (cos_batch, 1), device=device)
    positions = torch.arange(max(seq_len, 1), device=device)[None, :] + starts
    rope = spec.rope
    tables = rotary_tables(positions, rope.rotary_dim, ROPE_THETA, rope.rotation, getattr(torch, spec.cos_dtype))
    cos, sin = (
        offset_view(t.numel(), t.dtype, int(name in shifted), device).view(t.shape).copy_(t)
        for name, t in zip(("cos", "sin"), tables, strict=True)
    )
    return RotationTables(cos, sin, batch, seq_len)


@dataclass
class PartTensors:
    """One row part's buffers: activation, weight (a NaN placeholder in weight_mode NONE), output and, for
    add+norm, the residual and the sum output h; `names` are their pointer parameters, `quant` the part's quantizers
    (one norm's stages: `part_quant` of the spec)."""

    names: PartPointers
    x: torch.Tensor
    weight: torch.Tensor
    out: torch.Tensor
    rows: int
    hidden: int
    residual: torch.Tensor | None = None
    h: torch.Tensor | None = None
    quant: QuantParams | None = None
    rotation: RotationTables | None = None  # the rotary kernel's tables, which rotate this part's rows
    index: int = 0  # the part's index in its spec (0: x or q, 1: k)

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
    quant: QuantParams | None = None,
) -> PartTensors:
    """One row part's buffers: `dtypes` are x's (and the residual's and h's), y's and the weight's (None: weight
    mode NONE, a NaN placeholder); the pointers named in `shifted` one element past an aligned allocation; the
    activations filled as the part's quantizers `quant` need (`activation_rows`); the outputs poisoned."""
    x_dtype, out_dtype, w_dtype = dtypes
    # A 0-row launch still gets one row of every buffer: it must leave the poisoned outputs untouched.
    allocated = max(rows, 1)

    def buffer(name: str | None, numel: int, dtype: torch.dtype) -> torch.Tensor | None:
        return None if name is None else offset_view(numel, dtype, 1 if name in shifted else 0, device)

    inputs = [buffer(name, allocated * hidden, x_dtype) for name in (names.x, names.residual)]
    for tensor in inputs:
        if tensor is not None:
            activation_rows(quant)(allocated, hidden, tensor)
    weight = buffer(names.weight, hidden, w_dtype or getattr(torch, AOT_PLACEHOLDER_WEIGHT_DTYPE))
    if w_dtype is None:
        # The plugins' placeholder ([H] of AOT_PLACEHOLDER_WEIGHT_DTYPE), NaN: a read would poison y.
        weight.fill_(float("nan"))
    else:
        random_rows(1, hidden, weight)
    out = buffer(names.out, allocated * hidden, out_dtype)
    h = buffer(names.h, allocated * hidden, x_dtype)  # h is D, x's dtype, whatever y's is
    part = PartTensors(names, inputs[0], weight, out, rows, hidden, inputs[1], h, quant)
    for output in part.outputs():
        poison(output)
    return part


def part_dtypes(spec: Spec, part: int) -> tuple[torch.dtype, torch.dtype, torch.dtype | None]:
    """`part_tensors`' dtypes of row part `part`: x's, the dtype the part stores y in (each QK-norm part its own)
    and the weight's (None: weight mode NONE)."""
    y_dtype = spec.part_y_dtype(part)
    weight = None if spec.weight_dtype is None else getattr(torch, spec.weight_dtype)
    return getattr(torch, spec.dtype), QUANT_TORCH_DTYPES.get(y_dtype) or getattr(torch, y_dtype), weight


class CaseTensors:
    """The buffers of one launch case, each pointer shifted where the case says; outputs NaN-poisoned. Which
    parameter is which buffer comes from the entry's kind (`matrix.KINDS`), checked against the declaration."""

    def __init__(
        self, entry: MatrixEntry, declaration: LaunchDeclaration, case: LaunchCase, device: str = "cuda"
    ) -> None:
        spec = entry.spec
        self.entry = entry
        self.null = case.null
        self.rows = part_rows(entry, case.tokens)
        pointers = part_pointers(spec, declaration)
        self.parts: dict[str, PartTensors] = {
            part_name: part_tensors(
                names, rows, hidden, part_dtypes(spec, index), case.shifted, device, spec.part_quant(index)
            )
            for index, ((part_name, names), rows, hidden) in enumerate(
                zip(pointers, self.rows, part_hidden(entry), strict=True)
            )
        }
        # The rotary kernel's shared inputs, and the extents its declaration reads off q's and cos's shapes.
        self.rotation = None
        self.extents: tuple[int, ...] = ()
        if entry.kind.shared:
            self.rotation = rotation_tables(spec, case.tokens, case.shifted, device)
            cos_batch = self.rotation.cos.shape[0]
            self.extents = (self.rotation.batch, self.rotation.seq_len, cos_batch)
            for index, part in enumerate(self.parts.values()):
                part.rotation, part.index = self.rotation, index

    def pointers(self) -> dict[str, int]:
        result = {}
        for part in self.parts.values():
            result |= {name: tensor.data_ptr() for name, tensor in part.by_name().items()}
        if self.rotation is not None:
            result |= {"cos": self.rotation.cos.data_ptr(), "sin": self.rotation.sin.data_ptr()}
        return dict.fromkeys(result, 0) if self.null else result

    def refresh(self) -> None:
        """Fresh random activations and re-poisoned outputs in the same buffers (for another graph replay)."""
        for part in self.parts.values():
            for tensor in part.inputs():
                activation_rows(part.quant)(max(part.rows, 1), part.hidden, tensor)
            for output in part.outputs():
                poison(output)
