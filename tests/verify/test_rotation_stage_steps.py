"""How far a rotation stage's codes may move from the original's where a stage before it moved. After a normalised
stage (ModelOpt's INT8 Gemma3: `y -> Q -> DQ -> the rotation`, each product quantized again), in a head row where a
normalised code moved: as far as that move times the table allows. After an rsqrt stage (its INT8 OLMo2: r' per
row through a pair), wherever a row's r' moved: as far as the largest relative move of r' allows. No further in
either: before, such codes were not step-judged at all, so a product wrong only there (and the rotated output, whose
bound sums the products' moves) passed `check`."""

from __future__ import annotations

import numpy as np

from trtfuse.verify.node_sites import JudgedOutput
from trtfuse.verify.node_verdict import (
    PRODUCT_STEPS,
    StepCheck,
    _codes,
    _extra_steps,
    _grid_spacing,
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
    extra = _extra_steps(product, _normalised_moved(product, candidate, original), candidate, original)
    codes = _codes(product, candidate, original["p_codes"], extra)
    assert codes.steps is not None
    assert codes.to_json()["steps_allowed"] == codes.steps.allowed
    return codes.steps


def test_a_product_in_a_moved_row_may_move_as_far_as_the_normalised_move_allows() -> None:
    # One normalised step times cos 0.9 is under one product step: 1 + 1 more steps, 3 in all.
    check = _steps_check(_product(), *_arrays(normalised_move=1, product_move=3))
    assert check.passed and (check.steps, check.allowed) == (3, 3)
    assert check.text() == "at most 3 steps from the original's (where a stage before it moved)"


def test_a_product_wrong_only_in_a_moved_row_fails_naming_the_code() -> None:
    check = _steps_check(_product(), *_arrays(normalised_move=1, product_move=9))
    assert not check.passed
    assert (check.steps, check.index, check.allowed) == (9, (1, 0), 3)
    assert "a code 9 steps from the original's at [1, 0]" in check.text()
    assert "may move 3 steps there, where a stage before it moved" in check.text()


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


RSQRT = JudgedOutput(
    "r_codes", "r", "node_r_codes", "node_r", "r_q", "int8", "node_r_raw", "node_r_requantized", "node_r",
    "node_r_dq", "r_dq",
)  # fmt: skip


def _after_rsqrt(r_move: float, product_move: int) -> tuple[JudgedOutput, dict, dict]:
    """A product after an rsqrt stage: row 2's r' moved by `r_move` (relative), the product code at [1, 0] (60, a
    value of 1.2) `product_move` steps; every other code the original's."""
    product = JudgedOutput(
        "p_codes", "p", "node_p_codes", "node_p", "p_q", "int8", "node_p_raw", "node_p_requantized", "node_p",
        "node_p_dq", "p_dq", rsqrt=RSQRT,
    )  # fmt: skip
    r = np.linspace(0.5, 2.0, ROWS)[:, None]
    node_r = r.copy()
    node_r[2] *= 1 + r_move
    p = np.zeros((ROWS, HEAD), dtype=np.float32)
    p[1, 0] = 60
    node_p = p.copy()
    node_p[1, 0] += product_move
    original = {"r_dq": r, "p_codes": p, "p_dq": p * SCALE}
    candidate = {"node_r_dq": node_r, "node_p_codes": node_p, "node_p_raw": node_p, "node_p_requantized": node_p}
    return product, candidate, original


def test_after_an_rsqrt_stage_a_code_may_move_as_far_as_the_largest_relative_move_of_r_allows() -> None:
    # r' 1 % off: (1.2 + one step) x 1 % is under one step, so 1 + 1 more: 3 steps in all, everywhere in the part.
    assert _steps_check(*_after_rsqrt(r_move=0.01, product_move=3)).passed
    check = _steps_check(*_after_rsqrt(r_move=0.01, product_move=4))
    assert not check.passed and (check.steps, check.index, check.allowed) == (4, (1, 0), 3)


def test_after_an_rsqrt_stage_no_r_moved_allows_one_step() -> None:
    assert _steps_check(*_after_rsqrt(r_move=0.0, product_move=1)).passed
    check = _steps_check(*_after_rsqrt(r_move=0.0, product_move=2))
    assert not check.passed and check.allowed == PRODUCT_STEPS
