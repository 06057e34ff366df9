"""`check` and `compare` on a model with a string or sequence output beside its numbers: the numbers are judged as
usual, a string output must equal the original's, and an output with no value to compare is named as not compared
(docs/cli.md, "The verdict")."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtfuse.cli.options import EXIT_MISMATCH

from support.cli import run_cli
from support.models import tiny_lm


def _with_outputs(model: onnx.ModelProto, text: str | None = None) -> onnx.ModelProto:
    """`model` with the token ids as text (or one constant `text`) and a sequence of its logits as outputs."""
    if text is None:
        model.graph.node.append(helper.make_node("Cast", ["input_ids"], ["ids_text"], to=TensorProto.STRING))
        model.graph.output.append(helper.make_tensor_value_info("ids_text", TensorProto.STRING, ["batch", "sequence"]))
    else:
        value = helper.make_tensor("value", TensorProto.STRING, [1], [text.encode()])
        model.graph.node.append(helper.make_node("Constant", [], ["ids_text"], value=value))
        model.graph.output.append(helper.make_tensor_value_info("ids_text", TensorProto.STRING, [1]))
    model.graph.node.append(helper.make_node("SequenceConstruct", ["logits"], ["all_logits"]))
    model.graph.output.append(
        helper.make_tensor_sequence_value_info("all_logits", model.graph.output[0].type.tensor_type.elem_type, None)
    )
    return model


@pytest.fixture(params=[np.float32, np.float16], ids=["fp32", "fp16"])
def fused(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[Path, Path]:
    original = tmp_path / "original.onnx"
    onnx.save_model(_with_outputs(tiny_lm(request.param, fused=False)), str(original))
    result = run_cli("fuse", original, "-o", tmp_path / "fused.onnx")
    assert result.exit_code == 0, result.output
    return original, tmp_path / "fused.onnx"


@pytest.mark.parametrize("command", ["check", "compare"])
def test_strings_are_compared_and_a_sequence_is_named_as_not_compared(fused: tuple[Path, Path], command: str) -> None:
    result = run_cli(command, *fused, "-q")
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    assert line.startswith("all 2 outputs pass (")
    assert line.endswith(", not compared: 'all_logits' (no tensor of real numbers, bools or strings)")
    table = run_cli(command, *fused).stdout
    assert "compared for equality" in table
    assert "not compared: a sequence" in table
    report = json.loads(run_cli(command, *fused, "--json").stdout)
    outputs = {output["name"]: output for output in report["steps"][0]["outputs"]}
    assert (outputs["ids_text"]["dtype"], outputs["ids_text"]["passed"]) == ("string", True)
    assert (outputs["all_logits"]["dtype"], outputs["all_logits"]["passed"]) == ("sequence", None)
    assert report["passed"]


def test_a_string_output_that_differs_fails_check(tmp_path: Path) -> None:
    original, fused = tmp_path / "original.onnx", tmp_path / "fused.onnx"
    onnx.save_model(_with_outputs(tiny_lm(np.float32, fused=False), "one"), str(original))
    onnx.save_model(_with_outputs(tiny_lm(np.float32, fused=True), "two"), str(fused))
    result = run_cli("check", original, fused)
    assert result.exit_code == EXIT_MISMATCH, result.output
    assert "1 of 1 strings differ, the first at [0]: 'two', the original's 'one'" in result.stdout
    assert result.stdout.splitlines()[-1] == "1 output(s) fail"
