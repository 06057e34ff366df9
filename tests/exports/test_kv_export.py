"""KV-cache exports (`models/export.py --cache`): the script writes optimum's interface with dynamic batch, sequence and
past length, and the committed fixture in models/fixtures/kv fuses and passes `trtfuse check` at a prefill and a decode
step with no options."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import onnx
import pytest

from trtfuse import contract
from trtfuse.fusion.fuse import fuse_model
from trtfuse.model.dims import DimRole, model_dims
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import check_fused

from support.paths import REPO_ROOT, fixture_models

ROOT = REPO_ROOT
FIXTURES = ROOT / "models" / "fixtures" / "kv"
MANIFEST = json.loads((FIXTURES / "expected.json").read_text())
EXPECTED: dict[str, dict] = MANIFEST["files"]
FIXTURE = "qwen3-dynamo-fp32-kv.onnx"
LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 2, 1, 64, 128
TOTAL = "past_sequence_length + sequence_length"


def _interface(layers: int) -> tuple[list[str], list[str]]:
    caches = [f"{layer}.{kind}" for layer in range(layers) for kind in ("key", "value")]
    inputs = ["input_ids", "attention_mask", "position_ids", *(f"past_key_values.{name}" for name in caches)]
    return inputs, ["logits", *(f"present.{name}" for name in caches)]


def _dims(value: onnx.ValueInfoProto) -> list[int | str]:
    return [dim.dim_param or dim.dim_value for dim in value.type.tensor_type.shape.dim]


def _assert_qwen3_interface(model: onnx.ModelProto) -> None:
    inputs, outputs = _interface(LAYERS)
    assert [value.name for value in model.graph.input] == inputs
    assert [value.name for value in model.graph.output] == outputs
    dims = {value.name: _dims(value) for value in (*model.graph.input, *model.graph.output)}
    for name in ("input_ids", "position_ids"):
        assert dims[name] == ["batch_size", "sequence_length"]
    assert dims["attention_mask"] == ["batch_size", TOTAL]
    assert dims["logits"] == ["batch_size", "sequence_length", VOCAB]
    for name in inputs[3:]:
        assert dims[name] == ["batch_size", KV_HEADS, "past_sequence_length", HEAD_DIM]
    for name in outputs[1:]:
        assert dims[name] == ["batch_size", KV_HEADS, TOTAL, HEAD_DIM]
    # What trtfuse reads off the names: a KV-cache model whose dims it can size for each step.
    reading = model_dims(model)
    assert reading.has_kv_cache
    assert reading.cache_inputs == tuple(inputs[3:])
    assert reading.roles == {
        "batch_size": DimRole.BATCH,
        "sequence_length": DimRole.TOKENS,
        "past_sequence_length": DimRole.PAST,
    }


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers", "onnxscript")),
    reason="the export script needs torch, transformers and onnxscript (pip install -e '.[export]')",
)
def test_export_script_writes_the_kv_cache_interface(tmp_path: Path) -> None:
    command = [sys.executable, str(ROOT / "models" / "export.py"), "--cache", "--out", str(tmp_path)]
    command += ["--arch", "qwen3", "--dtype", "float32", "--exporter", "torchscript", "--exporter", "dynamo"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    manifest = json.loads((tmp_path / "expected.json").read_text())
    names = ("qwen3-torchscript-fp32-kv.onnx", FIXTURE)
    assert sorted(manifest["files"]) == sorted(names)
    same_versions = (manifest["torch"], manifest["transformers"]) == (MANIFEST["torch"], MANIFEST["transformers"])
    for name in names:
        entry = manifest["files"][name]
        # Per layer: input, post-attention, q and k norms; then the final norm. All but the first read a sum.
        assert (entry["norm_calls"], entry["qk_norm_calls"]) == (4 * LAYERS + 1, 2 * LAYERS)
        assert entry["add_norm_calls"] == 2 * LAYERS
        assert entry["cache"]["layers"] == LAYERS
        assert (entry["cache"]["kv_heads"], entry["cache"]["key_head_dim"]) == (KV_HEADS, HEAD_DIM)
        assert max(entry["max_rel_error_vs_torch"].values()) < 1e-4
        assert entry["greedy_tokens"]["match"]
        assert (entry["inputs"], entry["outputs"]) == _interface(LAYERS)
        model = onnx.load(str(tmp_path / name))
        onnx.checker.check_model(model, full_check=True)
        _assert_qwen3_interface(model)
    if same_versions:
        assert (tmp_path / FIXTURE).read_bytes() == (FIXTURES / FIXTURE).read_bytes()


def test_manifest_lists_exactly_the_committed_kv_fixture() -> None:
    on_disk = {path.name: path.stat().st_size for path in fixture_models(FIXTURES)}
    assert on_disk == {name: entry["bytes"] for name, entry in EXPECTED.items()}
    assert all(size < 2**20 for size in on_disk.values())
    entry = EXPECTED[FIXTURE]
    assert (entry["architecture"], entry["exporter"], entry["dtype"]) == ("qwen3", "dynamo", "float32")
    assert entry["cache"]["dims"] == ["batch_size", "kv_heads", "past_sequence_length", "head_dim"]
    _assert_qwen3_interface(onnx.load(str(FIXTURES / FIXTURE)))


def test_kv_fixture_fuses_every_norm_and_passes_check_at_prefill_and_decode() -> None:
    entry = EXPECTED[FIXTURE]
    original = load_model(FIXTURES / FIXTURE)
    result = fuse_model(original.model)
    kinds = Counter(node.kind for node in result.fused)
    norms = kinds[contract.RMS_NORM_OP] + 2 * kinds[contract.QK_NORM_ROPE_OP] + kinds[contract.ADD_RMS_NORM_OP]
    assert norms == entry["norm_calls"], result.report()
    # Each layer's q/k norms and the rotary embedding after them: one TrtfuseQkNormRope.
    assert 2 * kinds[contract.QK_NORM_ROPE_OP] == entry["qk_norm_calls"]
    assert kinds[contract.ADD_RMS_NORM_OP] == entry["add_norm_calls"]
    verdict = check_fused(original, LoadedModel(model=result.model, path=original.path))
    assert verdict.passed, verdict.to_json()
    steps = {step.name: step for step in verdict.steps}
    assert sorted(steps) == ["decode", "prefill"]
    assert steps["prefill"].input_shapes["past_key_values.0.key"][2] == 0
    assert steps["decode"].input_shapes["input_ids"][1] == 1
    assert steps["decode"].input_shapes["past_key_values.0.key"][2] > 0
    # Every output, the presents too, is judged at both steps.
    assert all(len(step.outputs) == 1 + 2 * LAYERS for step in verdict.steps)


def test_cli_fuse_and_check_pass_on_the_kv_fixture_without_options(tmp_path: Path) -> None:
    fused = tmp_path / "fused.onnx"
    cli = [sys.executable, "-m", "trtfuse.cli.main"]
    completed = subprocess.run(
        [*cli, "fuse", str(FIXTURES / FIXTURE), "-o", str(fused)], capture_output=True, text=True, check=False, cwd=ROOT
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    assert f"({EXPECTED[FIXTURE]['norm_calls']} norms)" in completed.stdout + completed.stderr
    completed = subprocess.run(
        [*cli, "check", "--json", str(FIXTURES / FIXTURE), str(fused)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert completed.returncode == 0, completed.stdout + completed.stderr
    report = json.loads(completed.stdout)
    assert [(step["step"], step["passed"]) for step in report["steps"]] == [("prefill", True), ("decode", True)]


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="the export script needs torch and transformers (pip install -e '.[export]')",
)
def test_a_failed_checkpoint_export_leaves_the_earlier_export_in_out(tmp_path: Path) -> None:
    """A checkpoint without weights fails before anything is written: what --out held before is left as it was."""
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    out = tmp_path / "out"
    out.mkdir()
    earlier = {
        name: f"earlier {name}".encode() for name in ("ckpt-dynamo-fp32-kv.onnx", "ckpt-dynamo-fp32-kv.onnx.data")
    }
    # The earlier run's manifest lists its export: the script's own files, which it may replace.
    earlier["expected.json"] = json.dumps({"files": {"ckpt-dynamo-fp32-kv.onnx": {}}}).encode()
    for name, data in earlier.items():
        (out / name).write_bytes(data)
    completed = subprocess.run(
        [sys.executable, ROOT / "models" / "export.py", "--cache", "--checkpoint", checkpoint, "--out", out,
         "--exporter", "dynamo", "--dtype", "float32"],
        capture_output=True, text=True, timeout=300, check=False, cwd=ROOT,
    )  # fmt: skip
    assert completed.returncode == 1, completed.stdout + completed.stderr
    assert "FAILED  ckpt-dynamo-fp32-kv.onnx" in completed.stdout
    assert {path.name: path.read_bytes() for path in out.iterdir()} == earlier
