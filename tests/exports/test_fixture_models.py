"""The exported-model fixtures in models/fixtures: each loads, passes the checker, runs in onnxruntime, and fuses into
exactly as many norms as its torch model calls; and the export script still regenerates them."""

from __future__ import annotations

import importlib
import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType

import numpy as np
import onnx
import onnxruntime
import pytest

from trtfuse import contract

from support.paths import REPO_ROOT, fixture_models

ROOT = REPO_ROOT
FIXTURES = ROOT / "models" / "fixtures"
MANIFEST = json.loads((FIXTURES / "expected.json").read_text())
EXPECTED: dict[str, dict] = MANIFEST["files"]
NAMES = sorted(EXPECTED)
ONNX_DTYPES = {"float32": onnx.TensorProto.FLOAT, "float16": onnx.TensorProto.FLOAT16}


def _pipeline_module(name: str) -> ModuleType:
    """The module, or a skip while it has not been written; a module that exists but fails to import fails the test."""
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} does not exist yet")
    return importlib.import_module(name)


def _vocabulary(model: onnx.ModelProto) -> int:
    return model.graph.output[0].type.tensor_type.shape.dim[2].dim_value


def test_manifest_lists_exactly_the_committed_files() -> None:
    on_disk = {path.name: path.stat().st_size for path in fixture_models(FIXTURES)}
    assert on_disk == {name: entry["bytes"] for name, entry in EXPECTED.items()}
    assert sum(on_disk.values()) < 8 * 2**20


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="not a git checkout")
def test_what_compile_writes_beside_a_fixture_is_ignored_by_git() -> None:
    # `trtfuse compile MODEL` without -o writes beside its input; left there, the files must not look like fixtures.
    from trtfuse.engine.sidecar import sidecar_path_for
    from trtfuse.pipeline import compile_outputs

    engine = FIXTURES / "qwen3-torchscript-fp16.engine"
    written = [engine, sidecar_path_for(engine), *compile_outputs(engine)]
    relative = [str(path.relative_to(ROOT)) for path in written]
    ignored = subprocess.run(["git", "check-ignore", *relative], cwd=ROOT, capture_output=True, text=True, check=False)
    assert sorted(ignored.stdout.split()) == sorted(relative)
    assert fixture_models(FIXTURES) == sorted(FIXTURES / name for name in EXPECTED)


def test_fixtures_cover_every_architecture_exporter_and_dtype() -> None:
    entries = EXPECTED.values()
    assert {entry["architecture"] for entry in entries} >= {
        "llama",
        "qwen3",
        "gemma3",
        "olmo2",
        "phi3",
        "deepseek_v3",
        "gpt2",
        "cohere",
    }
    assert {(entry["exporter"], entry["opset"]) for entry in entries} == {("torchscript", 17), ("dynamo", 18)}
    assert {entry["dtype"] for entry in entries} == {"float32", "float16"}
    assert all(entry["norm_calls"] > 0 for entry in entries if entry["uses_rms_norm"])


@pytest.mark.parametrize("name", NAMES)
def test_fixture_passes_the_checker(name: str) -> None:
    entry = EXPECTED[name]
    model = onnx.load(str(FIXTURES / name))
    onnx.checker.check_model(model, full_check=True)
    assert {opset.version for opset in model.opset_import if opset.domain in ("", "ai.onnx")} == {entry["opset"]}
    assert [value.name for value in model.graph.input] == ["input_ids"]
    assert [value.name for value in model.graph.output] == ["logits"]
    assert model.graph.output[0].type.tensor_type.elem_type == ONNX_DTYPES[entry["dtype"]]


@pytest.mark.parametrize("name", NAMES)
def test_fixture_runs_in_onnxruntime_at_any_batch_and_length(name: str) -> None:
    path = FIXTURES / name
    vocabulary = _vocabulary(onnx.load(str(path)))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for batch, sequence in ((1, 1), (1, 9), (4, 3)):
        input_ids = rng.integers(0, vocabulary, (batch, sequence), dtype=np.int64)
        (logits,) = session.run(None, {"input_ids": input_ids})
        assert logits.shape == (batch, sequence, vocabulary)
        assert np.isfinite(logits).all()


@pytest.mark.parametrize("name", NAMES)
def test_fusion_replaces_every_norm_call_and_nothing_else(name: str) -> None:
    fuse = _pipeline_module("trtfuse.fusion.fuse")
    entry = EXPECTED[name]
    fused = fuse.fuse_model(onnx.load(str(FIXTURES / name))).model
    plugin_nodes = [node for node in fused.graph.node if node.domain == contract.ONNX_DOMAIN]
    kinds = Counter(node.op_type for node in plugin_nodes)
    assert set(kinds) <= set(contract.FUSED_OPS)
    assert sum(contract.OPS[op].norm_calls * count for op, count in kinds.items()) == entry["norm_calls"]
    # Every q/k norm of these families is rotated right after: each pair with its rotation is one TrtfuseQkNormRope;
    # DeepSeek's MLA latent norms, which no rotation reads, pair as TrtfuseQkNorm.
    assert 2 * kinds[contract.QK_NORM_ROPE_OP] == entry["qk_norm_calls"]
    assert 2 * kinds[contract.QK_NORM_OP] == entry["mla_norm_calls"]
    # Every norm that reads a residual sum takes its Add: these exports put nothing between the two.
    assert kinds[contract.ADD_RMS_NORM_OP] == entry["add_norm_calls"]
    if not entry["uses_rms_norm"]:
        assert not plugin_nodes
    for node in plugin_nodes:
        epsilon = next(attribute.f for attribute in node.attribute if attribute.name == contract.ATTR_EPSILON)
        assert epsilon == np.float32(entry["epsilon"])


@pytest.mark.parametrize("name", NAMES)
def test_fused_fixture_matches_the_original_in_onnxruntime(name: str) -> None:
    fuse = _pipeline_module("trtfuse.fusion.fuse")
    check = _pipeline_module("trtfuse.verify.check")
    model_io = _pipeline_module("trtfuse.model.onnx_file")
    original = model_io.load_model(FIXTURES / name)
    fused = model_io.LoadedModel(model=fuse.fuse_model(original.model).model, path=original.path)
    result = check.check_fused(original, fused)
    assert result.passed, result.errors


@pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("transformers") is None,
    reason="the export script needs torch and transformers (pip install -e '.[export]')",
)
def test_export_script_regenerates_the_qwen3_fixtures(tmp_path: Path) -> None:
    names = ("qwen3-torchscript-fp16.onnx", "qwen3-dynamo-fp16.onnx")
    command = [sys.executable, str(ROOT / "models" / "export.py"), "--out", str(tmp_path), "--arch", "qwen3"]
    command += ["--exporter", "torchscript", "--exporter", "dynamo", "--dtype", "float16"]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert completed.returncode == 0, completed.stdout + completed.stderr
    manifest = json.loads((tmp_path / "expected.json").read_text())
    assert sorted(manifest["files"]) == sorted(names)
    same_versions = (manifest["torch"], manifest["transformers"]) == (MANIFEST["torch"], MANIFEST["transformers"])
    for name in names:
        entry = manifest["files"][name]
        # Per layer: input, post-attention, q and k norms; then the final norm. All but the first read a sum.
        assert (entry["norm_calls"], entry["qk_norm_calls"], entry["add_norm_calls"]) == (4 * 2 + 1, 2 * 2, 2 * 2)
        assert entry["max_rel_error_vs_torch"] < 1e-2
        onnx.checker.check_model(str(tmp_path / name), full_check=True)
        if same_versions:
            assert (tmp_path / name).read_bytes() == (FIXTURES / name).read_bytes()
