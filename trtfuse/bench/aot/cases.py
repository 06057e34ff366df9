"""The launches the check makes of every artifact: row counts, misaligned pointers, graph replays, null pointers."""

from __future__ import annotations

from dataclasses import dataclass

from trtfuse.bench.aot.params import pointer_names
from trtfuse.kernels.declaration import LaunchDeclaration

LARGE_ROWS = 16384
RAGGED_ROWS = 4097  # one row past a whole number of prefill blocks of every tiling
GRAPH_ROWS = 32


@dataclass(frozen=True)
class LaunchCase:
    """One launch to check: `tokens` rows (RMSNorm, add+norm) or tokens of `heads` rows each (QK-norm), the pointers
    in `shifted` one element (an odd offset) off the allocation's alignment, or launched from replays of a captured
    CUDA graph;
    `null`: every pointer 0 (what a runtime may pass for empty tensors; 0 tokens only)."""

    tokens: int
    shifted: tuple[str, ...] = ()
    graph: bool = False
    null: bool = False

    def label(self) -> str:
        parts = [f"tokens={self.tokens}"]
        if self.shifted:
            parts.append("shifted=" + ",".join(self.shifted))
        if self.null:
            parts.append("null pointers")
        if self.graph:
            parts.append("graph")
        return " ".join(parts)


def launch_cases(declaration: LaunchDeclaration, sm_count: int) -> list[LaunchCase]:
    """0 rows (a no-op), 1, 3, one per SM, a ragged and a large count; each pointer the declaration names (inputs
    and outputs: add+norm's residual and h too) alone and all of them one element off alignment; a graph capture,
    aligned and shifted."""
    pointers = pointer_names(declaration)
    cases = [LaunchCase(tokens) for tokens in (0, 1, 3, sm_count, RAGGED_ROWS, LARGE_ROWS)]
    cases += [LaunchCase(3, (name,)) for name in pointers]
    cases += [LaunchCase(tokens, pointers) for tokens in (1, sm_count + 1, RAGGED_ROWS)]
    cases += [LaunchCase(GRAPH_ROWS, graph=True), LaunchCase(3, pointers, graph=True)]
    return cases


# Last, after every other case of every artifact: a fault here loses the context, and would lose the rest with it.
NULL_POINTER_CASES = (LaunchCase(0, null=True),)
