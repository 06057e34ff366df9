"""Counts take ASCII digits only (docs/cli.md, "Options every command has"): one parser for every integer option, so
`1_0` and other scripts' digits are usage errors, caught before any file is read."""

from __future__ import annotations

import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT

from support.cli import run_cli

SPELLINGS = ["1_0", "\u0661\u0660", "\uff11", "1.0", "0x10", ""]


# Options that take a count (a minimum of 0 or more), then those that take any integer; each with its command line.
COUNTS = [
    ("generate", "missing.onnx", "--steps"),
    ("generate", "missing.onnx", "--repeat"),
    ("generate", "missing.onnx", "--max-positions"),
    ("check", "missing.onnx", "missing.onnx", "--generate"),
    ("run", "missing.engine", "--iterations"),
    ("run", "missing.engine", "--warmup"),
    ("compile", "missing.onnx", "--opt-level"),
]
INTEGERS = [("generate", "missing.onnx", "--seed"), ("check", "missing.onnx", "missing.onnx", "--seed")]


def _option_id(part: object) -> str | None:
    return "-".join(part) if isinstance(part, tuple) else None


@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("command", COUNTS + INTEGERS, ids=_option_id)
def test_an_integer_not_in_ascii_digits_is_a_usage_error(command, spelling):
    result = run_cli(*command, spelling)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "is not an integer in ASCII digits" in result.stderr
    assert "no such file" not in result.stderr


@pytest.mark.parametrize("ids", ["\u0661,2", "1_0", "\uff13"])
def test_prompt_ids_take_ascii_digits_only(ids):
    result = run_cli("generate", "missing.onnx", "--prompt-ids", ids)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "expected token ids separated by commas" in result.stderr


def test_ascii_integers_still_parse():
    result = run_cli(
        "generate", "missing.onnx", "--steps", " 10 ", "--repeat", "2", "--seed", "+3", "--prompt-ids", "1,2"
    )
    assert result.exit_code == EXIT_BAD_INPUT
    assert "missing.onnx: no such file" in result.stderr


@pytest.mark.parametrize("spelling", ["+3", "-3", " +2"])
@pytest.mark.parametrize("command", COUNTS, ids=_option_id)
def test_a_count_takes_no_sign(command, spelling):
    """`--steps +3` ran three steps: a count is digits alone, as `--tokens` and `--dim` take it."""
    result = run_cli(*command, spelling)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{spelling!r} is not a count: ASCII digits alone, without a sign" in result.stderr
    assert "no such file" not in result.stderr
