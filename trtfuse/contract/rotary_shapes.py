"""The shapes a rotary node's inputs must have together, and what is read off them: where its tables' rows are
(docs/plugin-nodes.md, "Rotary embedding"). Both plugin kinds launch the kernel with q's batch B, the tokens S and the
tables' batch Bc after its row counts; `check` and `generate` hold a fused model's rotary nodes to the same rule at
the shapes they feed, before onnxruntime runs the lowered nodes."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from trtfuse.contract.codec import NodeFields
from trtfuse.contract.nodes import HeadLayout, RotaryParams
from trtfuse.errors import TrtfuseError

# The axis of the tokens in each layout's activations: [B, S, H, D] or [B, S, H*D]; [B, H, S, D].
TOKEN_AXIS = {HeadLayout.TOKEN_MAJOR: 1, HeadLayout.HEAD_MAJOR: 2}
Dim = TypeVar("Dim")


def output_dims(rotary: RotaryParams | None, hidden: int, dims: Sequence[Dim]) -> tuple[Dim | int, ...]:
    """The dims of a node's output whose part's activation has `dims` and normalises `hidden` elements: the
    activation's, or, where a rotary node moves heads (`RotaryParams.moves_heads`), [B, H, S, D] of its token-major
    [B, S, H, D] or [B, S, H*D] (H = hidden / D, a constant, for the latter). Any dim type: ints, symbols, TensorRT
    expressions; the constants are ints, for a caller to wrap."""
    if rotary is None or not rotary.moves_heads:
        return tuple(dims)
    return attention_dims(dims, hidden, rotary.head_dim)


def attention_dims(dims: Sequence[Dim], hidden: int, head_dim: int) -> tuple[Dim | int, ...]:
    """[B, H, S, D] of token-major `dims` ([B, S, H, D], or [B, S, H*D] of rows of `hidden` = H*D)."""
    if len(dims) == 4:
        return (dims[0], dims[2], dims[1], dims[3])
    return (dims[0], hidden // head_dim, dims[1], head_dim)


def rotary_extents(config: NodeFields, label: str, names: Sequence[str], shapes: Sequence[Any]) -> tuple[int, ...]:
    """(B, S, Bc) of a rotary node's inputs (`names` and `shapes` in the op's input order: q, k, weights, cos,
    sin), after checking that q and k share B and S (`token_extents`) and the tables are [1 or B, S, rotary_dim]
    (`table_batch`); () for another op. A shape another than these is one TrtfuseError line naming the node
    (`label`) and the input."""
    rotary = config.rotary
    if rotary is None:
        return ()
    batch, tokens = token_extents(rotary, label, names[:2], shapes[:2])
    return batch, tokens, table_batch(rotary, label, names[-2:], shapes[-2:], batch, tokens)


def token_extents(rotary: RotaryParams, label: str, names: Sequence[str], shapes: Sequence[Any]) -> tuple[int, int]:
    """(B, S) of a rotary node's q and k (`names`, `shapes`), which must share both as its layout reads them."""
    q, k = ([int(dim) for dim in shape] for shape in shapes)
    token = TOKEN_AXIS[rotary.layout]
    if len(q) <= token or len(k) <= token or (k[0], k[token]) != (q[0], q[token]):
        raise TrtfuseError(
            f"{label}: inputs '{names[0]}' {q} and '{names[1]}' {k} differ in batch or tokens as layout "
            f"{rotary.layout.name} reads them (axes 0 and {token})"
        )
    return q[0], q[token]


def table_batch(
    rotary: RotaryParams, label: str, names: Sequence[str], shapes: Sequence[Any], batch: int, tokens: int
) -> int:
    """Bc of a rotary node's cos and sin (`names`, `shapes`), which must both be [1 or B, S, rotary_dim] for q's
    B and S (`token_extents`)."""
    cos, sin = ([int(dim) for dim in shape] for shape in shapes)
    for name, table in zip(names, (cos, sin), strict=True):
        if len(table) != 3 or table[0] not in (1, batch) or table[1:] != [tokens, rotary.rotary_dim]:
            raise TrtfuseError(
                f"{label}: input '{name}' has shape {table}, expected [1 or {batch}, {tokens}, {rotary.rotary_dim}] "
                f"as layout {rotary.layout.name} reads q"
            )
    if sin != cos:
        raise TrtfuseError(f"{label}: inputs '{names[0]}' {cos} and '{names[1]}' {sin} must have one shape")
    return cos[0]
