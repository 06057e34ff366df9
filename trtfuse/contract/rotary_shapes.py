"""The shapes a rotary node's inputs must have together, and what is read off them: where its tables' rows are
(docs/plugin-nodes.md, "Rotary embedding"). Both plugin kinds launch the kernel with q's batch B, the tokens S and the
tables' batch Bc after its row counts; `check` and `generate` hold a fused model's rotary nodes to the same rule at
the shapes they feed, before onnxruntime runs the lowered nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from trtfuse.contract.codec import NodeFields
from trtfuse.contract.nodes import HeadLayout
from trtfuse.errors import TrtfuseError

# The axis of the tokens in each layout's activations: [B, S, H, D] or [B, S, H*D]; [B, H, S, D].
TOKEN_AXIS = {HeadLayout.TOKEN_MAJOR: 1, HeadLayout.HEAD_MAJOR: 2}


def rotary_extents(config: NodeFields, label: str, names: Sequence[str], shapes: Sequence[Any]) -> tuple[int, ...]:
    """(B, S, Bc) of a rotary node's inputs (`names` and `shapes` in the op's input order: q, k, weights, cos,
    sin), after checking that q and k share B and S and the tables are [1 or B, S, rotary_dim]; () for another op.
    A shape another than these is one TrtfuseError line naming the node (`label`) and the input."""
    rotary = config.rotary
    if rotary is None:
        return ()
    dims = [[int(dims[axis]) for axis in range(len(dims))] for dims in shapes]
    token = TOKEN_AXIS[rotary.layout]
    q, k, cos, sin = dims[0], dims[1], dims[-2], dims[-1]
    batch, tokens = q[0], q[token]
    if len(k) <= token or (k[0], k[token]) != (batch, tokens):
        raise TrtfuseError(
            f"{label}: inputs '{names[0]}' {q} and '{names[1]}' {k} differ in batch or tokens "
            f"as layout {rotary.layout.name} reads them"
        )
    for name, table in ((names[-2], cos), (names[-1], sin)):
        if len(table) != 3 or table[0] not in (1, batch) or table[1:] != [tokens, rotary.rotary_dim]:
            raise TrtfuseError(
                f"{label}: input '{name}' has shape {table}, expected [1 or {batch}, {tokens}, {rotary.rotary_dim}] "
                f"(layout {rotary.layout.name}: q is {q})"
            )
    if sin != cos:
        raise TrtfuseError(f"{label}: inputs '{names[-2]}' {cos} and '{names[-1]}' {sin} must have one shape")
    return batch, tokens, cos[0]
