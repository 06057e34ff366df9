"""A rotation's product stage in a head row where the normalised stage before it moved (ModelOpt's INT8 Gemma3:
`y -> Q -> DQ -> the rotation`, each product quantized again): the product's codes may move as far as the
normalised value's move times the table allows, and no further. Before, such rows were not step-judged at all, so a
product wrong only there (and the rotated output, whose bound sums the products' moves) passed `check`."""

from __future__ import annotations

import numpy as np

from trtfuse.verify.node_sites import JudgedOutput
from trtfuse.verify.node_verdict import (
    PRODUCT_STEPS,
    StepCheck,
    _codes,
    _grid_spacing,
    _moved_row_steps,
    _normalised_moved,
)

SCALE = 0.02  # both stages' INT8 scale
ROWS, HEAD = 4, 8
NORMALISED = JudgedOutput(
    "n_codes", "n", "node_n_codes", "node_n", "n_q", "int8", "node_n_raw", "node_n_requantized", "node_n",
    "node_n_dq", "n_dq",
)  # fmt: skip


def _product(table: str | None = "cos") -> JudgedOutput:
    return JudgedOutput(
        "p_codes", "p", "node_p_codes", "node_p", "p_q", "int8", "node_p_raw", "node_p_requantized", "node_p",
        "node_p_dq", "p_dq", normalised=NORMALISED, table=table,
    )  # fmt: skip


def _arrays(normalised_move: int, product_move: int) -> tuple[dict, dict]:
    """The original's codes and the node's: row 1's first normalised code moved `normalised_move` steps, its first
    product code `product_move` steps; every other code the original's. cos at most 0.9."""
    rng = np.random.default_rng(0)
    n = rng.integers(-60, 60, (ROWS, HEAD)).astype(np.float32)
    p = rng.integers(-60, 60, (ROWS, HEAD)).astype(np.float32)
    node_n, node_p = n.copy(), p.copy()
    node_n[1, 0] += normalised_move
    node_p[1, 0] += product_move
    original = {"n_codes": n, "n_dq": n * SCALE, "p_codes": p, "p_dq": p * SCALE, "cos": np.full(HEAD, 0.9)}
    candidate = {"node_n_codes": node_n, "node_n_dq": node_n * SCALE, "node_p_codes": node_p}
    # The node's raw codes equal what the original's quantizer gives its value: only the steps are judged here.
    candidate |= {"node_p_raw": node_p, "node_p_requantized": node_p, "node_p": node_p * SCALE}
    return candidate, original


def _steps_check(product: JudgedOutput, candidate: dict, original: dict) -> StepCheck:
    moved = _normalised_moved(product, candidate, original)
    assert product.normalised is not None and moved is not None
    extra = _moved_row_steps(product, product.normalised, moved, candidate, original)
    codes = _codes(product, candidate, original["p_codes"], extra)
    assert codes.steps is not None
    assert codes.to_json()["steps_allowed"] == codes.steps.allowed
    return codes.steps


def test_a_product_in_a_moved_row_may_move_as_far_as_the_normalised_move_allows() -> None:
    # One normalised step times cos 0.9 is under one product step: 1 + 1 more steps, 3 in all.
    check = _steps_check(_product(), *_arrays(normalised_move=1, product_move=3))
    assert check.passed and check.steps <= PRODUCT_STEPS


def test_a_product_wrong_only_in_a_moved_row_fails_naming_the_code() -> None:
    check = _steps_check(_product(), *_arrays(normalised_move=1, product_move=9))
    assert not check.passed
    assert (check.steps, check.index, check.allowed) == (9, (1, 0), 3)
    assert "a code 9 steps from the original's at [1, 0]" in check.text()
    assert "may move 3 steps there, where its normalised value moved" in check.text()


def test_a_larger_normalised_move_allows_a_larger_product_move() -> None:
    assert _steps_check(_product(), *_arrays(normalised_move=4, product_move=6)).passed
    assert not _steps_check(_product(), *_arrays(normalised_move=4, product_move=7)).passed


def test_outside_the_moved_rows_a_product_may_move_one_step() -> None:
    candidate, original = _arrays(normalised_move=1, product_move=0)
    candidate["node_p_codes"][2, 3] += 2
    check = _steps_check(_product(), candidate, original)
    assert not check.passed and (check.steps, check.index, check.allowed) == (2, (2, 3), PRODUCT_STEPS)


def test_without_a_known_table_a_moved_row_stays_unbounded() -> None:
    assert _steps_check(_product(table=None), *_arrays(normalised_move=1, product_move=40)).passed


def test_the_e4m3_grid_spacing_is_its_binade_s_and_the_subnormals_below_it() -> None:
    magnitudes = np.array([0.0, 2.0**-8, 2.0**-6, 1.0, 1.5, 448.0])
    expected = [2.0**-9, 2.0**-9, 2.0**-9, 0.125, 0.125, 32.0]
    assert _grid_spacing(magnitudes, "float8e4m3fn").tolist() == expected
    assert _grid_spacing(magnitudes, "int8").tolist() == [1.0] * 6
