"""`check` judges a rotary node's own norm stages (docs/cli.md, "Each fused node"): ModelOpt's INT8 Gemma3 puts a
pair on each q/k norm's output before the rotation (the node's normalised stage, judged where the original's
QuantizeLinear on y reads: its codes the original quantizer's of the node's y bit for bit, at most one step from
the original's), its INT8 OLMo2 a pair on each norm's input and inverse root (the node's input and rsqrt stages,
whose rows move with their r'). Both fixtures pass; a wrong normalised or rsqrt stage fails, naming the node."""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest

from trtfuse import contract
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.paths import TOOL_FIXTURES

GEMMA3 = TOOL_FIXTURES / "gemma3-modelopt-int8-fp16.onnx"
OLMO2 = TOOL_FIXTURES / "olmo2-modelopt-int8-fp16-optimum.onnx"


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    folder = tmp_path_factory.mktemp("rotation_norm_stages")
    return {
        original: fuse_file(original, folder / f"{original.stem}.fused.onnx").output_path
        for original in (GEMMA3, OLMO2)
    }


def _report(original: Path, candidate: Path) -> dict:
    result = run_cli("check", original, candidate, "--json")
    report = json.loads(result.stdout)
    report["exit_code"] = result.exit_code
    return report


def _rotary_entries(step: dict) -> list[dict]:
    return [entry for entry in step["nodes"] if entry["op"] == contract.QK_NORM_ROPE_QUANT_OP]


def test_gemma3_s_normalised_stages_are_judged_where_their_quantizers_read(fused) -> None:
    report = _report(GEMMA3, fused[GEMMA3])
    assert report["exit_code"] == 0, report
    [step] = report["steps"]
    entries = _rotary_entries(step)
    # q's and k's normalised pair of each of the two rotary nodes, on the norm's own y (mul_225: layer 0's q norm).
    normalised = [entry for entry in entries if entry["output"] in NORMALISED_CODES]
    assert sorted(entry["output"] for entry in normalised) == sorted(NORMALISED_CODES)
    assert (
        next(entry for entry in normalised if entry["output"] == "mul_225_QuantizeLinear_Output")["value"] == "mul_225"
    )
    assert all(entry["passed"] for entry in entries)
    assert all(entry["codes"]["not_the_quantizers"] == 0 for entry in entries if entry["codes"])
    assert all(entry["codes"]["steps_from_original"] <= 1 for entry in normalised)


# The original's Q on each q/k norm's output (before the rotation) in Gemma3's INT8 fixture.
NORMALISED_CODES = (
    "mul_225_QuantizeLinear_Output",
    "mul_250_QuantizeLinear_Output",
    "mul_564_QuantizeLinear_Output",
    "mul_589_QuantizeLinear_Output",
)


def test_olmo2_s_rotations_with_input_and_rsqrt_stages_pass(fused) -> None:
    report = _report(OLMO2, fused[OLMO2])
    assert report["exit_code"] == 0, report
    for step in report["steps"]:
        entries = _rotary_entries(step)
        # Two rotary nodes, each with q's and k's rsqrt stage, two products and their sum.
        assert len(entries) == 16 and all(entry["passed"] for entry in entries)
        # The rsqrt stage on the original's inverse root (the Div of q_norm / k_norm), at most a step from it; the
        # products after it move with r', as far as its largest relative move allows (a few steps, never unbounded).
        rsqrt = [entry for entry in entries if "_norm/Div_output_0_QuantizeLinear" in entry["output"]]
        assert len(rsqrt) == 4 and all(entry["codes"]["steps_from_original"] <= 1 for entry in rsqrt)
        stages = [entry for entry in entries if entry["codes"] and entry["codes"]["steps_allowed"] is not None]
        assert len(stages) == 12 and all(entry["codes"]["steps_allowed"] <= 4 for entry in stages)


def _tampered(fused: Path, tmp_path: Path, field: str, factor: float) -> tuple[Path, str]:
    model = onnx.load(str(fused))
    node = next(node for node in model.graph.node if node.op_type == contract.QK_NORM_ROPE_QUANT_OP)
    next(attribute for attribute in node.attribute if attribute.name == field).f *= factor
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    return tampered, node.name


@pytest.mark.parametrize(
    ("original", "field", "failing"),
    [
        (GEMMA3, "q_normalised_quant_scale", "mul_225_QuantizeLinear_Output"),
        (OLMO2, "k_rsqrt_quant_scale", None),
    ],
    ids=["gemma3-normalised-scale", "olmo2-rsqrt-scale"],
)
def test_a_wrong_norm_stage_of_a_rotary_node_fails_where_it_stands(
    original: Path, field: str, failing: str | None, fused, tmp_path: Path
) -> None:
    tampered, name = _tampered(fused[original], tmp_path, field, 1.1)
    report = _report(original, tampered)
    assert report["exit_code"] == EXIT_MISMATCH
    failed = [entry for step in report["steps"] for entry in step["nodes"] if not entry["passed"]]
    assert failed and failed[0]["node"] == name, failed[0]["text"]
    if failing is not None:
        assert failed[0]["output"] == failing, failed[0]["text"]
