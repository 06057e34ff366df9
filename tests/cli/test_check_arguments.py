"""`check` and `compare` with their two models in the wrong roles: swapped (the original holds trtfuse nodes) is
refused in one line before anything runs or is written; a candidate holding no trtfuse node is a warning."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from trtfuse.errors import TrtfuseError
from trtfuse.model.onnx_file import load_model
from trtfuse.verify.check import check_fused

from support.cli import run_cli
from support.models import tiny_lm


@pytest.fixture
def models(tmp_path: Path) -> tuple[Path, Path]:
    original, fused = tmp_path / "original.onnx", tmp_path / "fused.onnx"
    onnx.save_model(tiny_lm(np.float32, fused=False), str(original))
    onnx.save_model(tiny_lm(np.float32, fused=True), str(fused))
    return original, fused


@pytest.mark.parametrize("command", ["check", "compare"])
def test_swapped_arguments_are_refused_before_anything_runs(models: tuple[Path, Path], command: str) -> None:
    original, fused = models
    saved = original.parent / "inputs.npz"
    result = run_cli(command, fused, original, "--save-inputs", saved)
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert f"{fused}: holds 1 trtfuse plugin node(s)" in line
    assert "the arguments look swapped" in line
    assert not saved.exists()


def test_the_core_refuses_a_fused_original(models: tuple[Path, Path]) -> None:
    original, fused = models
    with pytest.raises(TrtfuseError, match="look swapped"):
        check_fused(load_model(fused), load_model(original))


def test_a_candidate_without_trtfuse_nodes_is_checked_with_a_warning(models: tuple[Path, Path]) -> None:
    original, _ = models
    result = run_cli("check", original, original)
    assert result.exit_code == 0, result.output
    warning = f"trtfuse: warning: {original} holds no trtfuse plugin node: nothing fused is checked"
    assert warning in result.stderr
    assert warning not in result.stdout
    quiet = run_cli("check", original, original, "-q")
    assert "warning" not in quiet.stderr


def test_a_fused_candidate_gets_no_warning(models: tuple[Path, Path]) -> None:
    original, fused = models
    result = run_cli("check", original, fused)
    assert result.exit_code == 0, result.output
    assert "warning" not in result.stderr
