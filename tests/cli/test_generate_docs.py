"""docs/cli.md's `check --generate` and `generate` sections, run as written (their /tmp paths moved into the test's
folder): every `$ trtfuse ...` command, in order, and the lines the page shows under it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from trtfuse import contract

from support.cli import run_cli
from support.paths import REPO_ROOT

DOC = REPO_ROOT / "docs" / "cli.md"
SECTIONS = ("## `trtfuse check ORIGINAL.onnx FUSED.onnx --generate N", "## `trtfuse generate MODEL")
# What the page says a command exits with, where it is not 0.
EXPECTED_STATUS = {"qwen3-kv.bad.onnx": 1}


def _examples() -> list[tuple[str, list[str]]]:
    """(command, the shown lines after it that are output) for every example of the two sections."""
    text = DOC.read_text()
    start = text.index(SECTIONS[0])
    examples: list[tuple[str, list[str]]] = []
    for line in text[start:].splitlines():
        if line.startswith("    $ trtfuse "):
            examples.append((line[len("    $ ") :], []))
        elif line.startswith("    ") and examples and line.strip() != "...":
            examples[-1][1].append(line[4:])
    return examples


def _bad_model(fused: Path, path: Path) -> None:
    """The page's /tmp/qwen3-kv.bad.onnx: the final norm's weight (its last input; the norm is a TrtfuseAddRmsNorm)
    times a ramp from 0.5 to 1.5."""
    model = onnx.load(str(fused))
    norm = [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN][-1]
    assert norm.op_type == contract.ADD_RMS_NORM_OP
    tensor = next(t for t in model.graph.initializer if t.name == norm.input[-1])
    weight = numpy_helper.to_array(tensor)
    tensor.CopyFrom(
        numpy_helper.from_array(weight * np.linspace(0.5, 1.5, weight.size).astype(weight.dtype), tensor.name)
    )
    onnx.save(model, str(path))


def test_the_generate_sections_commands_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    examples = _examples()
    assert len(examples) >= 7
    for command, shown in examples:
        command = command.replace("/tmp/", f"{tmp_path}/")
        if "qwen3-kv.bad.onnx" in command:
            _bad_model(tmp_path / "qwen3-kv.fused.onnx", tmp_path / "qwen3-kv.bad.onnx")
        result = run_cli(*shlex.split(command)[1:])
        status = next((code for name, code in EXPECTED_STATUS.items() if name in command), 0)
        assert result.exit_code == status, f"{command}\n{result.output}"
        for line in shown:
            # Timings differ from run to run; every other shown line is printed as it stands.
            if re.search(r"\d ms", line):
                continue
            assert line.replace("/tmp/", f"{tmp_path}/") in result.output, f"{command}: {line!r}"
