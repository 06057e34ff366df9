"""From a Hugging Face model to text generation, as a user runs it on a fresh clone: `models/export.py --cache` of the
tiny random Qwen3, `trtfuse compile` (fuses, then exit 3 where TensorRT is missing), `trtfuse generate` on the
original and the fused model (the same tokens), `trtfuse check --generate 16` (passes). Each step is the command line
in a process of its own, as docs/cli.md writes it."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from support.markers import HAS_TENSORRT
from support.paths import REPO_ROOT

TRTFUSE = [sys.executable, "-m", "trtfuse.cli.main"]


def _run(*args: object) -> subprocess.CompletedProcess:
    command = [str(arg) for arg in args]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False, cwd=REPO_ROOT)


@pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="the export script needs torch and transformers (pip install -e '.[export]')",
)
def test_export_compile_generate_and_check_generate(tmp_path: Path) -> None:
    exported = _run(
        sys.executable, REPO_ROOT / "models" / "export.py", "--cache", "--out", tmp_path,
        "--arch", "qwen3", "--dtype", "float32", "--exporter", "torchscript",
    )  # fmt: skip
    assert exported.returncode == 0, exported.stdout + exported.stderr
    model = tmp_path / "qwen3-torchscript-fp32-kv.onnx"
    engine = tmp_path / "qwen3.engine"
    compiled = _run(*TRTFUSE, "compile", model, "-o", engine, "--profile", "prefill", "--profile", "decode")
    fused = tmp_path / "qwen3.fused.onnx"
    counts = (
        "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 4 TrtfuseAddRmsNorm and 2 TrtfuseQkNormRope nodes (9 norms), 0 rejected"
    )
    assert counts in compiled.stdout
    assert fused.exists()
    if not HAS_TENSORRT:
        assert compiled.returncode == 3, compiled.stderr
        assert "no engine built" in compiled.stderr
    else:
        assert compiled.returncode == 0, compiled.stderr
    prompt = ["--prompt-ids", "3,14,15,92,65", "--steps", "16", "--json"]
    generated = {}
    for name, path in (("original", model), ("fused", fused)):
        result = _run(*TRTFUSE, "generate", path, *prompt)
        assert result.returncode == 0, result.stderr
        generated[name] = json.loads(result.stdout)
    assert generated["original"]["runner"] == "onnxruntime"
    assert generated["fused"]["runner"] == "onnxruntime-fused-lowered"
    assert len(generated["original"]["tokens"]) == 16
    assert generated["original"]["tokens"] == generated["fused"]["tokens"]
    checked = _run(*TRTFUSE, "check", model, fused, "--generate", "16")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "generation: all 16 tokens equal" in checked.stdout
