"""-q, one rule: it drops tables, progress and summary lines, never a verdict; a verdict, pass or fail, is on
stdout (docs/cli.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

from trtfuse.cli.options import EXIT_MISMATCH

from support.cli import run_cli
from support.models import tiny_lm


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    paths = {name: tmp_path / f"{name}.onnx" for name in ("original", "fused", "wrong")}
    onnx.save_model(tiny_lm(np.float32, fused=False), str(paths["original"]))
    onnx.save_model(tiny_lm(np.float32, fused=True), str(paths["fused"]))
    onnx.save_model(tiny_lm(np.float32, fused=True, epsilon=0.5), str(paths["wrong"]))
    return paths


@pytest.mark.parametrize("candidate", ["fused", "wrong"])
def test_check_puts_its_verdict_on_stdout_and_quiet_keeps_only_it(models: dict[str, Path], candidate: str) -> None:
    status = 0 if candidate == "fused" else EXIT_MISMATCH
    # The wrong fusion's epsilon: its node is named first, with its numbers.
    verdict = "all 1 outputs pass" if candidate == "fused" else "fused node 'norm' fails at step single: "
    loud = run_cli("check", models["original"], models[candidate])
    assert loud.exit_code == status, loud.output
    assert loud.stdout.splitlines()[0].startswith("step single (seed 0)")
    assert loud.stdout.splitlines()[-1].startswith(verdict)
    assert verdict not in loud.stderr
    quiet = run_cli("check", models["original"], models[candidate], "-q")
    assert quiet.exit_code == status, quiet.output
    (line,) = quiet.stdout.splitlines()
    assert line.startswith(verdict)
    assert quiet.stderr == ""


def test_inspect_quiet_drops_the_summary_line_and_keeps_the_listing(models: dict[str, Path]) -> None:
    loud = run_cli("inspect", models["original"]).stdout.splitlines()
    assert loud[0].startswith(f"{models['original']}: 1 TrtfuseRmsNorm")
    quiet = run_cli("inspect", models["original"], "-q")
    assert quiet.exit_code == 0
    assert quiet.stdout.splitlines() == loud[1:]
    assert quiet.stdout.splitlines()[0].startswith("  rms_norm  ")


def test_compare_quiet_prints_the_verdict_alone(models: dict[str, Path]) -> None:
    quiet = run_cli("compare", models["original"], models["wrong"], "-q")
    assert quiet.exit_code == EXIT_MISMATCH, quiet.output
    (line,) = quiet.stdout.splitlines()
    assert line.startswith("fused node 'norm' fails at step single: output 'normed': values: ")
    assert line.endswith("; 1 fused node(s) and 1 output(s) fail in all")
