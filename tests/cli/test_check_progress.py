"""The progress lines of `check`, `check --generate`, `compare` and `generate` (docs/cli.md): on stderr, which model
loads, which step of how many runs and which token of how many is generated (the first, the last, and at most one a
second between), in the order the models run (one at a time); `-q` silences them, and stdout (the tables, the
verdict, `--json`) is the same either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from support.cli import run_cli
from support.paths import FIXTURES

FP16_FIXTURE = FIXTURES / "llama-dynamo-fp16.onnx"
KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
LOWERED = "the fused model (plugin nodes lowered)"
FLOAT32 = "the float32 evaluation of the original"
NODES_NAME = "each fused node on the original's tensors"
REFERENCE_NAME = "the float32 evaluation of the original's ops at each fused node"


def _fused(source: Path, folder: Path) -> Path:
    fused = folder / f"{source.stem}.fused.onnx"
    assert run_cli("fuse", source, "-o", fused, "-q").exit_code == 0
    return fused


def test_check_says_which_model_loads_and_which_step_runs(tmp_path: Path) -> None:
    fused = _fused(KV_FIXTURE, tmp_path)
    result = run_cli("check", KV_FIXTURE, fused)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"loading the original in onnxruntime: {KV_FIXTURE}",
        "the original: step 1 of 2 (prefill), twice",
        "the original: step 2 of 2 (decode), twice",
        f"loading {LOWERED} in onnxruntime: {fused}",
        f"{LOWERED}: step 1 of 2 (prefill)",
        f"{LOWERED}: step 2 of 2 (decode)",
        f"loading {NODES_NAME} in onnxruntime: {fused}",
        f"{NODES_NAME}: step 1 of 2 (prefill)",
        f"{NODES_NAME}: step 2 of 2 (decode)",
    ]
    assert "loading" not in result.stdout


def test_check_of_a_16_bit_model_loads_the_float32_evaluations_after_each_model(tmp_path: Path) -> None:
    fused = _fused(FP16_FIXTURE, tmp_path)
    result = run_cli("check", FP16_FIXTURE, fused)
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines()[-6:] == [
        f"loading {FLOAT32} in onnxruntime: {FP16_FIXTURE}",
        f"{FLOAT32}: step 1 of 1 (single)",
        f"loading {NODES_NAME} in onnxruntime: {fused}",
        f"{NODES_NAME}: step 1 of 1 (single)",
        f"loading {REFERENCE_NAME} in onnxruntime: {FP16_FIXTURE}",
        f"{REFERENCE_NAME}: step 1 of 1 (single)",
    ]


def test_check_generate_says_the_tokens_of_each_model_in_turn(tmp_path: Path) -> None:
    fused = _fused(KV_FIXTURE, tmp_path)
    result = run_cli("check", KV_FIXTURE, fused, "--generate", "3")
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    generation = lines[lines.index(f"generation: loading the original in onnxruntime: {KV_FIXTURE}") :]
    # Token 2's line shows only where token 1's step took a second or more (`generate.loop.ThrottledNotify`).
    assert [line for line in generation if not line.endswith("token 2 of 3")] == [
        f"generation: loading the original in onnxruntime: {KV_FIXTURE}",
        *(f"generation: the original: token {token} of 3" for token in (1, 3)),
        f"generation: loading {LOWERED} in onnxruntime: {fused}",
        *(f"generation: {LOWERED}: token {token} of 3" for token in (1, 3)),
    ]


def test_generate_of_many_tokens_says_the_first_and_the_last_and_one_a_second_between(tmp_path: Path) -> None:
    result = run_cli("generate", KV_FIXTURE, "--steps", "40")
    assert result.exit_code == 0, result.output
    tokens = [line for line in result.stderr.splitlines() if line.startswith("token ")]
    assert tokens[0] == "token 1 of 40" and tokens[-1] == "token 40 of 40"
    # 40 steps of this fixture take well under a second each.
    assert len(tokens) < 40


def test_compare_with_a_fused_model_says_the_same_as_check(tmp_path: Path) -> None:
    fused = _fused(KV_FIXTURE, tmp_path)
    checked, compared = run_cli("check", KV_FIXTURE, fused), run_cli("compare", KV_FIXTURE, fused)
    assert compared.exit_code == 0, compared.output
    assert compared.stderr == checked.stderr


def test_generate_says_each_token(tmp_path: Path) -> None:
    result = run_cli("generate", KV_FIXTURE, "--steps", "2")
    assert result.exit_code == 0, result.output
    assert result.stderr.splitlines() == [
        f"loading the original in onnxruntime: {KV_FIXTURE}",
        "token 1 of 2",
        "token 2 of 2",
    ]


@pytest.mark.parametrize(
    "command",
    [
        ["check", "{original}", "{fused}", "--generate", "2"],
        ["compare", "{original}", "{fused}"],
        ["generate", "{fused}", "--steps", "2"],
    ],
)
def test_quiet_silences_the_progress_lines_and_leaves_stdout_alone(tmp_path: Path, command: list[str]) -> None:
    fused = _fused(KV_FIXTURE, tmp_path)
    arguments = [part.format(original=KV_FIXTURE, fused=fused) for part in command]
    quiet = run_cli(*arguments, "-q", "--json")
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    loud = run_cli(*arguments, "--json")
    assert loud.stderr != ""
    # The same result, without its timings.
    assert _untimed(json.loads(quiet.stdout)) == _untimed(json.loads(loud.stdout))


def _untimed(value: object) -> object:
    timings = {"seconds", "step_ms", "first_token_ms", "per_token_ms"}
    if isinstance(value, dict):
        return {key: _untimed(item) for key, item in value.items() if key not in timings}
    if isinstance(value, list):
        return [_untimed(item) for item in value]
    return value
