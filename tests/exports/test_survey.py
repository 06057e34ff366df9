"""models/survey.py over a corpus folder laid out as the per-tool scripts write it: `--file` picks exports by name,
`--skip` leaves out inspect and compile (the check columns alone), and `--generate N` runs `check --generate N` on
the exports with a KV cache."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

from support.paths import FIXTURES, REPO_ROOT, TOOL_FIXTURES

KV_EXPORT = "qwen3-modelopt-fp8-kv.onnx"
LOGITS_EXPORT = "qwen3-modelopt-int8-fp16.onnx"
OLMO2_INT8_EXPORT = "olmo2-modelopt-int8-fp16-optimum.onnx"
GENAI_EXPORT = "qwen3-genai-cpu-int4.onnx"


def corpus(folder: Path, names: list[str], fixtures: Path = TOOL_FIXTURES, tool_name: str = "modelopt") -> Path:
    """EXPORTS/<tool_name>/ holding `names` (committed fixtures of `fixtures`) and their expected.json entries."""
    entries = json.loads((fixtures / "expected.json").read_text())["files"]
    tool = folder / tool_name
    tool.mkdir(parents=True)
    for name in names:
        shutil.copy(fixtures / name, tool / name)
    manifest = {"tool": tool_name, "files": {name: entries[name] for name in names}, "failures": {}}
    (tool / "expected.json").write_text(json.dumps(manifest))
    return folder


def survey(exports: Path, *options: str) -> tuple[list[dict], str]:
    out = exports / "survey.json"
    markdown = exports / "survey.md"
    command = [sys.executable, "models/survey.py", str(exports), "--out", str(out), "--markdown", str(markdown)]
    command += ["--trtfuse", f"{sys.executable} -m trtfuse.cli.main", "--cwd", str(REPO_ROOT), *options]
    result = subprocess.run(command, cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(out.read_text()), markdown.read_text()


def test_the_check_columns_alone_with_generation_on_the_kv_export(tmp_path: Path) -> None:
    exports = corpus(tmp_path, [KV_EXPORT, LOGITS_EXPORT, "qwen3-optimum-fp16.onnx"])
    outcomes, tables = survey(
        exports, "--file", "qwen3-modelopt-*", "--skip", "inspect", "--skip", "compile", "--generate", "2"
    )
    by_file = {outcome["file"]: outcome for outcome in outcomes}
    assert sorted(by_file) == [KV_EXPORT, LOGITS_EXPORT]
    for outcome in outcomes:
        assert outcome["inspect_exit"] is None
        assert outcome["compile_exit"] is None
        assert outcome["fuse_exit"] == 0
        assert outcome["check_exit"] == 0
        assert outcome["fused_norms"] == outcome["expected_norms"] == 9
        assert outcome["kept_out"] == []
    assert by_file[KV_EXPORT]["generate_exit"] == 0
    assert "the 2 generated tokens agree" in by_file[KV_EXPORT]["generate_output"]
    assert by_file[LOGITS_EXPORT]["generate_exit"] is None
    assert "| generate 2 |" in tables
    kv_row = next(line for line in tables.splitlines() if f"| {KV_EXPORT} |" in line)
    logits_row = next(line for line in tables.splitlines() if f"| {LOGITS_EXPORT} |" in line)
    assert "| pass | pass |" in kv_row
    assert "| pass | - |" in logits_row


def test_without_generate_no_generation_column(tmp_path: Path) -> None:
    exports = corpus(tmp_path, [KV_EXPORT])
    outcomes, tables = survey(exports, "--skip", "compile")
    (outcome,) = outcomes
    assert outcome["inspect_exit"] == 0
    assert outcome["generate_exit"] is None
    assert "generate" not in tables


def test_mla_latent_norms_are_expected_as_pairs(tmp_path: Path) -> None:
    # DeepSeek-V3's q_a/kv_a latent norms pair into TrtfuseQkNorm nodes: the manifest counts them as mla_norm_calls.
    exports = corpus(tmp_path, ["deepseek_v3-dynamo-fp32.onnx"], FIXTURES, "dynamo")
    (outcome,), tables = survey(exports, "--skip", "inspect", "--skip", "compile")
    assert outcome["qk_norm_nodes"] == outcome["expected_qk_pairs"] == 2
    assert "| 9 / 9 | 2 / 2 | 0 |" in tables


def test_pairs_with_their_rotation_count_as_pairs_and_apart(tmp_path: Path) -> None:
    # Qwen3's q/k pairs with the rotary embedding after them: TrtfuseQkNormRope nodes, QK pairs with a rotation.
    exports = corpus(tmp_path, ["qwen3-dynamo-fp32.onnx"], FIXTURES, "dynamo")
    (outcome,), tables = survey(exports, "--skip", "compile")
    assert outcome["qk_norm_nodes"] == outcome["expected_qk_pairs"] == outcome["rope_nodes"] == 2
    assert outcome["messages"] == [] and outcome["inspected_norms"] == 9
    assert "| 9 / 9 | 2 / 2 | 2 | 4 / 4 |" in tables


def test_quantized_qk_norms_count_as_pairs(tmp_path: Path) -> None:
    # ModelOpt's INT8 Gemma3: both q/k pairs are TrtfuseQkNormRopeQuant nodes, the pairs on their outputs (which the
    # rotations read) taken in as their normalised stages, with the products' pairs and q's output Q.
    exports = corpus(tmp_path, ["gemma3-modelopt-int8-fp16.onnx"])
    (outcome,), tables = survey(exports, "--skip", "inspect", "--skip", "compile")
    assert outcome["qk_norm_nodes"] == outcome["expected_qk_pairs"] == outcome["rope_nodes"] == 2
    assert "| 13 / 13 | 2 / 2 | 2 | 4 / 4 | 0 | 35 (1 kept out) |" in tables


def test_a_rotation_kept_out_gives_its_reason_in_the_export_row(tmp_path: Path) -> None:
    # onnxruntime-genai's Qwen3 rotates inside GroupQueryAttention: both rotations stay out, and with nothing else
    # kept out or rejected the row's last column says why. ModelOpt's INT8 OLMo2 (its q/k norms' input and
    # inverse-root pairs) and INT8 Qwen3 (each product of the rotation quantized) fuse both, with those stages.
    exports = corpus(tmp_path, [GENAI_EXPORT, OLMO2_INT8_EXPORT, LOGITS_EXPORT])
    outcomes, tables = survey(exports, "--skip", "compile")
    by_file = {outcome["file"]: outcome for outcome in outcomes}
    assert by_file[GENAI_EXPORT]["rope_nodes"] == 0 and len(by_file[GENAI_EXPORT]["rope_kept_out"]) == 2
    row = next(line for line in tables.splitlines() if f"| {GENAI_EXPORT} |" in line)
    assert "| 0 (2 kept out) |" in row
    assert row.endswith("the rotary embedding is inside the attention op (do_rotary=1): left alone |"), row
    for name in (OLMO2_INT8_EXPORT, LOGITS_EXPORT):
        assert by_file[name]["rope_nodes"] == by_file[name]["qk_norm_nodes"] == 2
        assert by_file[name]["rope_kept_out"] == []


def test_generation_runs_on_kv_exports_whose_manifest_records_no_cache(tmp_path: Path) -> None:
    # optimum's manifests, and onnxslim's copies of its exports, have no `cache` entry: the past_key_values inputs
    # say there is a cache, so `--generate` runs on them as on ModelOpt's --cache exports.
    names = ["qwen3-optimum-fp16.onnx", "qwen3-optimum-fp16-slim.onnx"]
    exports = corpus(tmp_path, names, tool_name="optimum")
    outcomes, tables = survey(exports, "--skip", "inspect", "--skip", "compile", "--generate", "2")
    assert {outcome["file"] for outcome in outcomes} == set(names)
    for outcome in outcomes:
        assert outcome["kv_cache"] and outcome["generate_exit"] == 0
        assert "the 2 generated tokens agree" in outcome["generate_output"]
    assert "| optimum | qwen3 | fp16, fp16-slim |" in tables and tables.count("| pass | pass |") == 2
