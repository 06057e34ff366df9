"""What both plugin kinds read off a rotary node's shapes (`contract.rotary_shapes.rotary_extents`): q's batch, the
tokens and the tables' batch, after checking q, k and the tables against each other; one line naming the input
otherwise."""

from __future__ import annotations

import pytest

from trtfuse import contract
from trtfuse.contract import HeadLayout, NormParams, RotaryParams, Rotation, WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.contract.rotary_shapes import rotary_extents
from trtfuse.errors import TrtfuseError

NAMES = ("q", "k", "q_weight", "k_weight", "cos", "sin")
PARAMS = NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)


def _fields(layout: HeadLayout) -> NodeFields:
    rotary = RotaryParams(64, 32, Rotation.HALF_SPLIT, layout)
    return NodeFields(contract.QK_NORM_ROPE, PARAMS, (64, 64), "float16", rotary=rotary)


@pytest.mark.parametrize(
    ("layout", "q", "k", "table", "extents"),
    [
        (HeadLayout.TOKEN_MAJOR, (3, 7, 4, 64), (3, 7, 2, 64), (1, 7, 32), (3, 7, 1)),
        (HeadLayout.TOKEN_MAJOR, (3, 7, 256), (3, 7, 128), (3, 7, 32), (3, 7, 3)),
        (HeadLayout.HEAD_MAJOR, (2, 4, 5, 64), (2, 2, 5, 64), (2, 5, 32), (2, 5, 2)),
    ],
)
def test_the_extents_are_q_s_batch_the_tokens_and_the_tables_batch(
    layout: HeadLayout, q: tuple, k: tuple, table: tuple, extents: tuple
) -> None:
    shapes = [q, k, (64,), (64,), table, table]
    assert rotary_extents(_fields(layout), "rope", NAMES, shapes) == extents


def test_other_ops_have_none() -> None:
    fields = NodeFields(contract.QK_NORM, PARAMS, (64, 64), "float16")
    assert rotary_extents(fields, "qk", NAMES[:4], [(1, 2, 64), (1, 2, 64), (64,), (64,)]) == ()


@pytest.mark.parametrize(
    ("k", "cos", "sin", "message"),
    [
        ((3, 6, 2, 64), (1, 7, 32), (1, 7, 32), r"inputs 'q' \[3, 7, 4, 64\] and 'k' \[3, 6, 2, 64\] differ"),
        ((3, 7, 2, 64), (2, 7, 32), (2, 7, 32), r"input 'cos' has shape \[2, 7, 32\], expected \[1 or 3, 7, 32\]"),
        ((3, 7, 2, 64), (1, 5, 32), (1, 5, 32), r"input 'cos' has shape \[1, 5, 32\], expected \[1 or 3, 7, 32\]"),
        ((3, 7, 2, 64), (1, 7, 64), (1, 7, 64), r"input 'cos' has shape \[1, 7, 64\], expected \[1 or 3, 7, 32\]"),
        ((3, 7, 2, 64), (7, 32), (7, 32), r"input 'cos' has shape \[7, 32\], expected"),
        ((3, 7, 2, 64), (1, 7, 32), (3, 7, 32), r"inputs 'cos' \[1, 7, 32\] and 'sin' \[3, 7, 32\] must have one"),
    ],
)
def test_shapes_that_do_not_fit_are_one_line_naming_the_input(k: tuple, cos: tuple, sin: tuple, message: str) -> None:
    shapes = [(3, 7, 4, 64), k, (64,), (64,), cos, sin]
    with pytest.raises(TrtfuseError, match=f"^TrtfuseQkNormRope 'n': {message}"):
        rotary_extents(_fields(HeadLayout.TOKEN_MAJOR), "TrtfuseQkNormRope 'n'", NAMES, shapes)
