"""The residual add-norm through the command line: `inspect` (text and --json), `fuse` and its report, `compile`
(exit 3 without TensorRT, after fusing), each with and without --no-fuse-residual."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import onnx
import pytest

from trtfuse import contract

from support.cli import run_cli
from support.graphs import residual_near_miss, residual_stack

DIGESTS = Path(__file__).parents[1] / "fusion" / "test_no_fuse_residual_digests.json"
STACK_COUNTS = "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (5 norms), 0 rejected"
ALONE_COUNTS = "5 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (5 norms), 0 rejected"


@pytest.fixture
def stack(write_model) -> Path:
    # As the byte-for-byte test records it, so the file --no-fuse-residual writes can be held against that digest.
    return write_model(residual_stack("float16", sums_as_outputs=True), "stack.onnx")


def _op_types(path: Path) -> list[str]:
    return [node.op_type for node in onnx.load(str(path)).graph.node if node.domain == contract.ONNX_DOMAIN]


def test_inspect_lists_each_add_norm_with_its_add(stack: Path) -> None:
    result = run_cli("inspect", stack)
    assert result.exit_code == 0, result.output
    first, *lines = result.stdout.splitlines()
    assert first == f"{stack}: {STACK_COUNTS}"
    add_norms = [line for line in lines if line.startswith("  add_norm  ")]
    assert len(add_norms) == 4 and len([line for line in lines if line.startswith("  rms_norm  ")]) == 1
    assert all(" float16 weight=AFTER_CAST offset=0 tags=decomposed," in line for line in add_norms)
    assert all(line.rsplit(" ", 1)[1].startswith("add=Add_") for line in add_norms)
    alone = run_cli("inspect", stack, "--no-fuse-residual")
    assert alone.stdout.splitlines()[0] == f"{stack}: {ALONE_COUNTS}" and "add_norm" not in alone.stdout


def test_inspect_json_lists_add_norms_and_the_adds_kept_out(stack: Path, write_model) -> None:
    found = json.loads(run_cli("inspect", stack, "--json").stdout)
    assert len(found["rms_norms"]) == 1 and found["residual_near_misses"] == []
    [entry, *_] = found["add_rms_norms"]
    assert entry["add"].startswith("Add_") and entry["dtype"] == "float16" and entry["replaces"][0] == entry["add"]
    assert found["plugin_nodes"][contract.ADD_RMS_NORM_OP] == 4
    kept = json.loads(run_cli("inspect", write_model(residual_near_miss("bias"), "bias.onnx"), "--json").stdout)
    assert kept["near_misses"] == [] and kept["add_rms_norms"] == [] and len(kept["rms_norms"]) == 1
    [miss] = kept["residual_near_misses"]
    assert "it adds the constant bias" in miss["reason"]


def test_inspect_and_fuse_name_the_add_kept_out(write_model, tmp_path: Path) -> None:
    model = write_model(residual_near_miss("broadcast"), "broadcast.onnx")
    inspected = run_cli("inspect", model)
    counts = "1 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (1 norms), 0 rejected, 1 Add kept out"
    assert inspected.stdout.splitlines()[0] == f"{model}: {counts}"
    [kept] = [line for line in inspected.stdout.splitlines() if line.startswith("  add kept  ")]
    assert "may broadcast (dim 0), and the add-norm adds without broadcasting; the norm was fused alone" in kept
    fused = run_cli("fuse", model, "-o", tmp_path / "fused.onnx", "-v")
    assert fused.stdout.startswith(f"{model}: {counts} (first: Add_"), fused.output
    assert "add kept Add_" in fused.stderr


def test_fuse_writes_add_norms_and_reports_them(stack: Path, tmp_path: Path) -> None:
    out, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = run_cli("fuse", stack, "-o", out, "--report", report_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{stack}: {STACK_COUNTS} -> {out}"
    assert sorted(_op_types(out)) == sorted([contract.RMS_NORM_OP] + [contract.ADD_RMS_NORM_OP] * 4)
    report = json.loads(report_path.read_text())
    assert report["totals"] == {
        contract.RMS_NORM_OP: 1,
        contract.QK_NORM_OP: 0,
        contract.ADD_RMS_NORM_OP: 4,
        "norms": 5,
    }
    assert [entry["kind"] for entry in report["fused"]].count(contract.ADD_RMS_NORM_OP) == 4
    assert report["near_misses"] == [] and report["residual_near_misses"] == []


def test_fuse_without_the_residual_fusion_writes_the_old_model_byte_for_byte(stack: Path, tmp_path: Path) -> None:
    out = tmp_path / "alone.onnx"
    result = run_cli("fuse", stack, "-o", out, "--no-fuse-residual")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == f"{stack}: {ALONE_COUNTS} -> {out}"
    recorded = json.loads(DIGESTS.read_text())
    if recorded["environment"]["onnx"] != onnx.__version__:
        pytest.skip(f"digests recorded with onnx {recorded['environment']['onnx']}")
    digest = hashlib.sha256(onnx.load(str(out)).SerializeToString()).hexdigest()
    assert digest == recorded["sha256"]["residual-stack-float16"]


@pytest.mark.parametrize("keep_adds_out", [False, True], ids=["fused", "no-fuse-residual"])
def test_compile_fuses_before_it_stops_without_tensorrt(stack: Path, tmp_path: Path, keep_adds_out: bool) -> None:
    engine = tmp_path / "stack.engine"
    flags = ["--no-fuse-residual"] if keep_adds_out else []
    result = run_cli("compile", stack, "-o", engine, *flags)
    assert result.exit_code == 3, result.output
    counts = ALONE_COUNTS if keep_adds_out else STACK_COUNTS
    assert result.stdout.startswith(f"{stack}: {counts} -> {tmp_path / 'stack.fused.onnx'}")
    kinds = _op_types(tmp_path / "stack.fused.onnx")
    assert kinds.count(contract.ADD_RMS_NORM_OP) == (0 if keep_adds_out else 4)
    report = json.loads((tmp_path / "stack.fusion.json").read_text())
    assert report["totals"]["norms"] == 5
