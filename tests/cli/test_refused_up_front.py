"""A request `check --generate` or `compare --generate` will refuse is refused before anything runs (docs/cli.md):
no check step, no saved inputs written and removed, and bad input (exit 2) before a missing dependency (exit 3)."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.verify import check as check_module

from support.cli import run_cli
from support.engines import engine_with_sidecar
from support.paths import FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
OUTSIDE = "prompt id 500 is outside the vocabulary"


@pytest.fixture
def no_check_runs(monkeypatch):
    def must_not_run(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a check step ran before the request was refused")

    monkeypatch.setattr(check_module, "check_fused", must_not_run)


def test_check_refuses_prompt_ids_outside_the_vocabulary_before_any_step(tmp_path: Path, no_check_runs) -> None:
    saved = tmp_path / "s.npz"
    args = ("--generate", "3", "--prompt-ids", "500", "--save-inputs", saved)
    result = run_cli("check", KV_FIXTURE, KV_FIXTURE, *args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert OUTSIDE in result.stderr and result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_compare_refuses_bad_prompt_ids_before_a_missing_dependency(tmp_path: Path) -> None:
    """The stand-in engine cannot run (no TensorRT here): the prompt is still refused first, as bad input."""
    engine = engine_with_sidecar(tmp_path)
    result = run_cli("compare", KV_FIXTURE, engine, "--generate", "4", "--prompt-ids", "500")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert OUTSIDE in result.stderr


def test_compare_refuses_steps_the_engines_profiles_do_not_hold_before_a_missing_dependency(tmp_path: Path) -> None:
    """`generate` on the engine refuses step 17 (exit 2); `compare --generate` on it gave TensorRT's exit 3 instead."""
    from trtfuse.engine.profiles import DimRange, derive_profiles, request_from_options
    from trtfuse.model.onnx_file import load_model

    model = load_model(KV_FIXTURE).model
    profiles = derive_profiles(model, request_from_options(presets=("decode", "prefill"), past=DimRange(0, 4, 16)))
    engine = engine_with_sidecar(tmp_path, profiles=profiles, model=model)
    refused = "step 17 (1 token after 17) fits none of the engine's optimisation profiles"
    generated = run_cli("generate", engine, "--steps", "40", "--prompt-ids", "1,2")
    compared = run_cli("compare", KV_FIXTURE, engine, "--generate", "40", "--prompt-ids", "1,2")
    for result in (generated, compared):
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert refused in result.stderr and len(result.stderr.splitlines()) == 1
