"""A call never loses a file: outputs that would replace anything the call reads are refused up front (a model's
external data, an engine's sidecar and fused model), and whatever a failed or interrupted call wrote is removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from trtfuse.engine.sidecar import sidecar_path_for
from trtfuse.verify import verdict

from support.cli import run_cli
from support.engines import engine_with_sidecar
from support.models import save_external, save_model_file, tiny_lm

EXIT_BAD_INPUT = 2


@pytest.fixture
def external_pair(tmp_path: Path) -> tuple[Path, Path]:
    """An original with its weights in `original.data` and a fused model with its own in `fused.data`."""
    original = save_external(tiny_lm(np.float32, fused=False), tmp_path / "original.onnx", "original.data")
    fused = save_external(tiny_lm(np.float32, fused=True), tmp_path / "fused.onnx", "fused.data")
    return original, fused


def _unchanged(*paths: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in paths}


@pytest.mark.parametrize("option", ["--report", "--save-inputs"])
@pytest.mark.parametrize("target", ["original.data", "fused.data", "original.onnx", "fused.onnx"])
def test_compare_refuses_to_write_over_what_it_reads(external_pair, tmp_path: Path, option: str, target: str) -> None:
    original, fused = external_pair
    before = _unchanged(*tmp_path.iterdir())
    result = run_cli("compare", original, fused, option, tmp_path / target)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "would overwrite the input" in result.stderr and target in result.stderr
    assert _unchanged(*tmp_path.iterdir()) == before


@pytest.mark.parametrize("target", ["m.engine.json", "m.fused.onnx", "m.engine"])
def test_engine_commands_refuse_to_write_over_the_engine_its_sidecar_or_fused_model(
    tmp_path: Path, target: str
) -> None:
    engine = engine_with_sidecar(tmp_path)
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "original.onnx")
    before = _unchanged(*tmp_path.iterdir())
    ran = run_cli("run", engine, "--save-outputs", tmp_path / target)
    compared = run_cli("compare", original, engine, "--report", tmp_path / target)
    for result in (ran, compared):
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert "would overwrite the input" in result.stderr
    assert _unchanged(*tmp_path.iterdir()) == before


def _fail_while_judging(monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    def fail(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(verdict, "judge_steps", fail)


@pytest.mark.parametrize(
    ("error", "status"), [(KeyboardInterrupt(), 130), (RuntimeError("a bug"), 4)], ids=["ctrl-c", "bug"]
)
def test_saved_inputs_of_a_call_that_does_not_finish_are_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, error: BaseException, status: int
) -> None:
    original = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "original.onnx")
    fused = save_model_file(tiny_lm(np.float32, fused=True), tmp_path / "fused.onnx")
    _fail_while_judging(monkeypatch, error)
    result = run_cli("check", original, fused, "--save-inputs", tmp_path / "inputs.npz")
    assert result.exit_code == status, result.output
    assert not (tmp_path / "inputs.npz").exists(), "what the call wrote is removed with it"


def test_saved_inputs_of_a_call_that_fails_on_bad_input_are_removed(tmp_path: Path) -> None:
    original = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "original.onnx")
    broken = tiny_lm(np.float32, fused=True)
    (output_dtype,) = [a for a in broken.graph.node[1].attribute if a.name == "output_dtype"]
    output_dtype.i = 7  # refused once the fused nodes are read, after the inputs were saved
    fused = save_model_file(broken, tmp_path / "fused.onnx")
    result = run_cli("check", original, fused, "--save-inputs", tmp_path / "inputs.npz")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "output_dtype is 7" in result.stderr
    assert not (tmp_path / "inputs.npz").exists()


def test_saved_inputs_of_a_mismatch_stay_to_repeat_it(tmp_path: Path) -> None:
    """Exit 1 is a result, not a failure: the inputs that show the mismatch are what the user needs."""
    original = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "original.onnx")
    corrupted = save_model_file(tiny_lm(np.float32, fused=True, epsilon=1.0), tmp_path / "fused.onnx")
    result = run_cli("check", original, corrupted, "--save-inputs", tmp_path / "inputs.npz", "--json")
    assert result.exit_code == 1, result.output
    assert (tmp_path / "inputs.npz").exists()
    assert json.loads(result.stdout)["passed"] is False


def test_an_empty_steps_list_is_one_line(tmp_path: Path) -> None:
    original = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "original.onnx")
    fused = save_model_file(tiny_lm(np.float32, fused=True), tmp_path / "fused.onnx")
    np.savez(tmp_path / "empty.npz", __trtfuse_steps__=np.array([], dtype=str))
    result = run_cli("check", original, fused, "--load-inputs", tmp_path / "empty.npz")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "empty.npz: holds no steps to run" in result.stderr


def test_the_sidecar_of_an_engine_is_no_output_of_compile(tmp_path: Path) -> None:
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    sidecar = sidecar_path_for(tmp_path / "model.engine")
    result = run_cli("compile", original, "-o", tmp_path / "model.engine", "--timing-cache", sidecar)
    assert result.exit_code == EXIT_BAD_INPUT and "are the same file" in result.stderr
    assert sorted(path.name for path in tmp_path.iterdir()) == ["model.onnx"]


@pytest.mark.parametrize("link", ["loop", "dangling"])
@pytest.mark.parametrize("command", ["inspect", "fuse", "compile", "check-fused", "run", "compare-original"])
def test_a_symlink_that_leads_nowhere_is_one_line_as_input(tmp_path: Path, link: str, command: str) -> None:
    model = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "m.onnx")
    path = tmp_path / link
    path.symlink_to(path if link == "loop" else tmp_path / "gone.onnx")
    argv = {
        "inspect": ("inspect", path),
        "fuse": ("fuse", path, "-o", tmp_path / "out.onnx"),
        "compile": ("compile", path, "-o", tmp_path / "out.engine"),
        "check-fused": ("check", model, path),
        "run": ("run", path),
        "compare-original": ("compare", path, model),
    }[command]
    result = run_cli(*argv)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    target = "a symlink loop" if link == "loop" else "a symlink to nothing"
    assert result.stderr.startswith(f"trtfuse: error: {path}: is {target}") and result.stderr.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([link, "m.onnx"])


@pytest.mark.parametrize("link", ["loop", "dangling"])
@pytest.mark.parametrize("command", ["fuse", "compile"])
def test_a_symlink_that_leads_nowhere_is_refused_as_output(tmp_path: Path, link: str, command: str) -> None:
    model = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "m.onnx")
    path = tmp_path / link
    path.symlink_to(path if link == "loop" else tmp_path / "gone.onnx")
    result = run_cli(command, model, "-o", path)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    target = "a symlink loop" if link == "loop" else "a symlink to nothing"
    assert result.stderr == f"trtfuse: error: {path}: is {target}; choose a file name\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([link, "m.onnx"])


@pytest.mark.parametrize("place", ["model", "output", "report"])
def test_a_file_name_that_is_not_utf8_is_one_line(tmp_path: Path, place: str) -> None:
    model = save_model_file(tiny_lm(np.float32, fused=False), tmp_path / "m.onnx")
    odd = Path(os.fsdecode(bytes(tmp_path / "m") + b"\xe9.onnx"))
    if place == "model":
        odd.write_bytes(model.read_bytes())
    argv = {
        "model": ("fuse", odd, "-o", tmp_path / "out.onnx"),
        "output": ("fuse", model, "-o", odd),
        "report": ("fuse", model, "-o", tmp_path / "out.onnx", "--report", odd),
    }[place]
    before = sorted(os.listdir(tmp_path))
    result = run_cli(*argv)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "m\\xe9.onnx': the file name is not valid UTF-8" in result.stderr and result.stderr.count("\n") == 1
    assert sorted(os.listdir(tmp_path)) == before
