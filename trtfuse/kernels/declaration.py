"""Launch declarations of ahead-of-time kernels: what a runtime that knows nothing of trtfuse needs to launch one.

A declaration names the kernel's entry, its parameters in order (input pointers, int32 scalars, output pointers:
TensorRT's order for AOT plugins), the block size, the dynamic shared memory and the grid as a function of each
part's row count. It imports neither CuTeDSL nor TensorRT, so the bare-driver launcher and the TensorRT plugins read
it without compiling anything. `launch_values` is the one formula for the grid and the scalars; it runs on ints
here and on TensorRT's symbolic shape expressions in the AOT plugins.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

# 2: the rotary kernel's scalars gained each part's rows per token and token multiplier (a format-1 rotary declaration
# would be launched with too few scalars).
DECLARATION_FORMAT = 2
POINTER_PTX_TYPE = ".u64"
SCALAR_PTX_TYPE = ".u32"  # CuTeDSL's Int32 parameters are declared .u32 in the PTX


class Tactic(enum.IntEnum):
    """The tilings an AOT plugin offers TensorRT to time. TensorRT's tactics are positive (0 is "the default")."""

    PREFILL = 1  # rows packed into blocks: many tokens
    DECODE = 2  # one row per block, rows spread over the SMs: few tokens


class ParamRole(str, enum.Enum):
    INPUT = "input"
    SCALAR = "scalar"
    OUTPUT = "output"


@dataclass(frozen=True)
class KernelParam:
    name: str
    role: ParamRole

    @property
    def ptx_type(self) -> str:
        return SCALAR_PTX_TYPE if self.role is ParamRole.SCALAR else POINTER_PTX_TYPE


@dataclass(frozen=True)
class RowPart:
    """One normalisation problem of the grid: rows of `hidden` elements, `rows_per_block` rows per block."""

    name: str  # the activation input: "x", or "q" then "k"
    hidden: int
    rows_per_block: int


@dataclass(frozen=True)
class Extent:
    """A scalar argument read off an input's shape: dimension `axis` of input `tensor` (the QK-norm + rotary
    kernel's batch, sequence length and cos batch), which the caller passes after the row counts."""

    name: str
    tensor: str
    axis: int


T = TypeVar("T")


@dataclass(frozen=True)
class LaunchDeclaration:
    """How to launch one compiled AOT kernel: parts' blocks are laid out one after the other in grid x."""

    kernel_name: str
    arch: str
    tactic: Tactic
    block_threads: int
    shared_mem: int  # dynamic shared memory, bytes
    params: tuple[KernelParam, ...]
    parts: tuple[RowPart, ...]
    extents: tuple[Extent, ...] = ()

    def launch_values(
        self,
        rows: Sequence[T],
        cdiv: Callable[[T, int], T],
        at_least_one: Callable[[T], T],
        extents: Sequence[T] = (),
    ) -> tuple[T, tuple[T, ...]]:
        """(grid x, the scalar arguments in parameter order) from each part's row count and each of `extents`'
        values (the declaration's `extents`, in order, read off the inputs' shapes).

        The scalars are every part's row count, the extents, with extents each part's rows per token (its row count
        over batch x seq_len) and each one's multiplier ceil(2^30 / rows per token), then the block count of every
        part but the last (the block where the next part starts). The grid is never empty, so a 0-row call is a
        valid one-block no-op.
        """
        if len(rows) != len(self.parts):
            raise ValueError(f"{self.kernel_name} has {len(self.parts)} row counts, got {len(rows)}")
        if len(extents) != len(self.extents):
            raise ValueError(f"{self.kernel_name} has {len(self.extents)} extents, got {len(extents)}")
        blocks = [cdiv(n, part.rows_per_block) for n, part in zip(rows, self.parts, strict=True)]
        total = blocks[0]
        for more in blocks[1:]:
            total = total + more
        per_token: tuple[T, ...] = ()
        if self.extents:
            # The rotary kernel's rows per token of each part (its heads) and their multipliers ceil(2^30 / H)
            # (norm_kernel.TOKEN_SHIFT), so that no thread divides by B·S or by H.
            named = dict(zip((e.name for e in self.extents), extents, strict=True))
            tokens = at_least_one(named["batch"] * named["seq_len"])
            heads = tuple(n // tokens for n in rows)
            per_token = (*heads, *((n + (TOKEN_MAGIC_NUMERATOR - 1)) // at_least_one(n) for n in heads))
        return at_least_one(total), (*rows, *extents, *per_token, *blocks[:-1])

    def grid_x(self, rows: Sequence[int]) -> int:
        return self.launch_values(rows, _cdiv, _at_least_one, (0,) * len(self.extents))[0]

    def scalars(self, rows: Sequence[int], extents: Sequence[int] = ()) -> tuple[int, ...]:
        return self.launch_values(rows, _cdiv, _at_least_one, extents)[1]

    def rows_of(self, element_counts: Sequence[int]) -> tuple[int, ...]:
        """Each part's row count from its activation's element count."""
        return tuple(count // part.hidden for count, part in zip(element_counts, self.parts, strict=True))

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["format"] = DECLARATION_FORMAT
        data["tactic"] = int(self.tactic)
        data["params"] = [{"name": p.name, "role": p.role.value} for p in self.params]
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LaunchDeclaration:
        if data.get("format") != DECLARATION_FORMAT:
            raise ValueError(f"launch declaration format {data.get('format')!r}, expected {DECLARATION_FORMAT}")
        return cls(
            kernel_name=str(data["kernel_name"]),
            arch=str(data["arch"]),
            tactic=Tactic(int(data["tactic"])),
            block_threads=int(data["block_threads"]),
            shared_mem=int(data["shared_mem"]),
            params=tuple(KernelParam(str(p["name"]), ParamRole(p["role"])) for p in data["params"]),
            parts=tuple(RowPart(str(p["name"]), int(p["hidden"]), int(p["rows_per_block"])) for p in data["parts"]),
            extents=tuple(Extent(str(e["name"]), str(e["tensor"]), int(e["axis"])) for e in data.get("extents", ())),
        )

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1, sort_keys=True)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _at_least_one(n: int) -> int:
    return max(n, 1)


def _params(inputs: tuple[str, ...], scalars: tuple[str, ...], outputs: tuple[str, ...]) -> tuple[KernelParam, ...]:
    roles = ((inputs, ParamRole.INPUT), (scalars, ParamRole.SCALAR), (outputs, ParamRole.OUTPUT))
    return tuple(KernelParam(name, role) for names, role in roles for name in names)


def rms_norm_params() -> tuple[KernelParam, ...]:
    """x, weight (never read when weight_mode is NONE: such nodes get a placeholder weight), rows, y."""
    return _params(("x", "weight"), ("rows",), ("y",))


def add_rms_norm_params() -> tuple[KernelParam, ...]:
    """x, residual, weight (never read when weight_mode is NONE), rows, y, h (= x + residual)."""
    return _params(("x", "residual", "weight"), ("rows",), ("y", "h"))


def qk_norm_params() -> tuple[KernelParam, ...]:
    """q, k, their weights, both row counts, the q block count (the first k block), q_out, k_out."""
    return _params(("q", "k", "q_weight", "k_weight"), ("q_rows", "k_rows", "q_blocks"), ("q_out", "k_out"))


def qk_norm_rope_params() -> tuple[KernelParam, ...]:
    """QK-norm's inputs, cos and sin; both row counts, the extents (`ROPE_EXTENTS`), both parts' rows per token and
    their multipliers, the q block count; q_out, k_out."""
    inputs = ("q", "k", "q_weight", "k_weight", "cos", "sin")
    per_token = ("q_rows_per_token", "k_rows_per_token", "q_token_magic", "k_token_magic")
    scalars = ("q_rows", "k_rows", *(e.name for e in ROPE_EXTENTS), *per_token, "q_blocks")
    return _params(inputs, scalars, ("q_out", "k_out"))


# q's batch B (dimension 0 of [B, S, H, D], [B, S, H*D] and [B, H, S, D] alike), the sequence length S and cos's
# batch Bc (1 or B) of cos [Bc, S, R]: what locates a head row's cos/sin row.
# The rotary kernel finds a token-major row's token by a multiply-shift: t = (row · m) >> TOKEN_SHIFT with
# m = ceil(2^30 / H) (each part's `token_magic`, an int32 expression in TensorRT's aot_impl), exact for every row
# while rows · H <= 2^30 (m·H = 2^30 + e with e < H, so row·e < 2^30 and the error stays below 1/H); larger
# launches divide.
TOKEN_SHIFT = 30
TOKEN_MAGIC_NUMERATOR = 1 << TOKEN_SHIFT
ROPE_EXTENTS = (Extent("batch", "q", 0), Extent("seq_len", "cos", 1), Extent("cos_batch", "cos", 0))


@dataclass(frozen=True)
class KernelArtifact:
    """A compiled AOT kernel: PTX (what TensorRT embeds) and the cubin for the declaration's architecture."""

    declaration: LaunchDeclaration
    ptx: str
    cubin: bytes
