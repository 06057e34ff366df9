"""`trtfuse explain LAYERS.json FUSED.onnx [PROFILE.json]`: its exit statuses (0 all folded, 1 a quantized node's
output reaches a GEMM through a standing dequantize or reformat, 2 bad input in one line), -q, --json and -h."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT, EXIT_MISMATCH

from support.cli import run_cli
from support.layer_info import LAYER_INFO, fused_export
from support.paths import FIXTURES, REPO_ROOT


@pytest.fixture(scope="module")
def fp8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return fused_export("qwen3-fp8", tmp_path_factory.mktemp("fused"))[0]


def test_help_says_what_trtexec_writes_it_reads() -> None:
    result = run_cli("explain", "-h")
    text = " ".join(result.output.split())
    assert result.exit_code == 0
    assert "trtexec --profilingVerbosity=detailed --exportLayerInfo=LAYERS.json" in text
    assert "--exportProfile=PROFILE.json" in text and "--json" in text and "--quiet" in text


def test_every_dequantize_folded_exits_0(fp8: Path) -> None:
    result = run_cli(
        "explain",
        LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json",
        fp8,
        LAYER_INFO / "qwen3-fp8.folded.trt10.profile.json",
    )
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[-1] == "5 of 5 dequantizes after quantized nodes folded into their GEMMs"
    assert any(line.startswith("  TrtfuseRmsNormQuant/mul_110: PluginV3") and line.endswith(" ms") for line in lines)
    assert result.stderr == ""


def test_a_standing_dequantize_exits_1_naming_each_node(fp8: Path) -> None:
    result = run_cli("explain", LAYER_INFO / "qwen3-fp8.unfolded.trt10.layers.json", fp8)
    assert result.exit_code == EXIT_MISMATCH
    verdict = result.stdout.splitlines()[-1]
    assert verdict.startswith("2 quantized nodes reach a GEMM through a dequantize or reformat left standing: ")
    assert "TrtfuseAddRmsNormQuant/mul_382" in verdict and "TrtfuseAddRmsNormQuant/mul_726" in verdict


def test_quiet_prints_the_verdict_only(fp8: Path) -> None:
    result = run_cli("explain", LAYER_INFO / "qwen3-fp8.unfolded.trt10.layers.json", fp8, "-q")
    assert result.exit_code == EXIT_MISMATCH and len(result.stdout.splitlines()) == 1


def test_json_is_the_report_written_whole(fp8: Path) -> None:
    result = run_cli("explain", LAYER_INFO / "qwen3-fp8.unfolded.trt10.layers.json", fp8, "--json")
    assert result.exit_code == EXIT_MISMATCH
    report = json.loads(result.stdout)
    assert report["passed"] is False
    assert report["unfolded"] == ["TrtfuseAddRmsNormQuant/mul_382", "TrtfuseAddRmsNormQuant/mul_726"]
    assert len(report["nodes"]) == 7


def test_a_missing_node_is_a_warning(fp8: Path, tmp_path: Path) -> None:
    data = json.loads((LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json").read_text())
    data["Layers"] = [layer for layer in data["Layers"] if layer["Name"] != "TrtfuseQkNorm/mul_136"]
    layers = tmp_path / "layers.json"
    layers.write_text(json.dumps(data))
    result = run_cli("explain", layers, fp8)
    assert result.exit_code == 0
    assert result.stderr == (
        f"trtfuse: warning: {layers}: no layer names trtfuse node 'TrtfuseQkNorm/mul_136'; its verdicts are unknown\n"
    )


@pytest.mark.parametrize(
    ("layers", "model", "says"),
    [
        (
            "qwen3-fp8.names-only.layers.json",
            "fused",
            "rebuild the engine with `trtexec --profilingVerbosity=detailed`",
        ),
        ("qwen3-int8.trt10-context.layers.json", "fused", "names none of the 7 trtfuse nodes"),
        ("qwen3-fp8.folded.trt10.layers.json", "original", "holds no trtfuse node"),
        ("absent.layers.json", "fused", "no such layer information file"),
        ("qwen3-fp8.folded.trt10.profile.json", "fused", 'not TensorRT layer information (no "Layers" list)'),
    ],
)
def test_bad_input_is_one_line_and_exit_2(fp8: Path, layers: str, model: str, says: str) -> None:
    model_path = fp8 if model == "fused" else FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx"
    result = run_cli("explain", LAYER_INFO / layers, model_path)
    assert result.exit_code == EXIT_BAD_INPUT and result.stdout == ""
    assert len(result.stderr.splitlines()) == 1 and result.stderr.startswith("trtfuse: error: ")
    assert says in result.stderr
    as_json = run_cli("explain", LAYER_INFO / layers, model_path, "--json")
    assert json.loads(as_json.stdout)["exit"] == EXIT_BAD_INPUT


def test_an_engine_profile_the_file_lacks_is_one_line(fp8: Path) -> None:
    result = run_cli("explain", LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json", fp8, "--engine-profile", "2")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "holds no layer of optimisation profile 2 (profiles: 0)" in result.stderr


def test_the_docs_example_runs_as_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/engine.md "How the engine runs": every `$ trtfuse` command in order, and the lines shown under it."""
    monkeypatch.chdir(REPO_ROOT)
    text = (REPO_ROOT / "docs" / "engine.md").read_text()
    section = text[text.index("## How the engine runs") : text.index("## Optimisation profiles")]
    examples: list[tuple[str, list[str]]] = []
    for line in section.splitlines():
        if line.startswith("    $ trtfuse "):
            examples.append((line[len("    $ ") :], []))
        elif line.startswith("    ") and examples:
            examples[-1][1].append(line[4:])
        elif examples and examples[-1][1]:
            break
    assert [command.split()[1] for command, _ in examples] == ["fuse", "explain"]
    statuses = []
    for command, shown in examples:
        result = run_cli(*shlex.split(command.replace("/tmp/", f"{tmp_path}/"))[1:])
        statuses.append(result.exit_code)
        assert result.stdout.splitlines() == shown
    assert statuses == [0, EXIT_MISMATCH]
