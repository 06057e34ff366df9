"""`compile --baseline` and `--never-slower` with real TensorRT on a GPU: both engines built, timed in paired rounds,
the table printed, the A/B in the sidecar and --json, the per-layer profiles and TensorRT alone's layer information
beside the engine in trtexec's formats, each read back by trtfuse's readers. Skipped where TensorRT is absent (it
cannot be installed in the workplace trtfuse is developed in: these tests have never run)."""

from __future__ import annotations

import json

import pytest

from trtfuse.engine.layer_info import read_layer_information
from trtfuse.engine.layer_profile import read_profile
from trtfuse.engine.sidecar import baseline_path, layer_information_path, layer_profile_path

from support.cli import run_cli
from support.markers import needs_tensorrt
from support.paths import FIXTURES

pytestmark = [needs_tensorrt, pytest.mark.tensorrt]

QWEN3 = FIXTURES / "qwen3-torchscript-fp16.onnx"


def test_compile_baseline_times_both_engines_and_writes_their_profiles(tmp_path):
    engine = tmp_path / "m.engine"
    result = run_cli("compile", QWEN3, "-o", engine, "--profile", "default", "--baseline", "--ab-rounds", 6)
    assert result.exit_code == 0, result.output
    table = result.stdout.splitlines()
    assert any(line.startswith("A/B on ") for line in table)
    (row,) = [line for line in table if line.startswith("default ")]
    assert row.split()[-1] in ("faster", "slower", "noise")
    sidecar = json.loads((tmp_path / "m.engine.json").read_text())
    ab = sidecar["baseline"]
    assert [case["name"] for case in ab["cases"]] == ["default"]
    assert ab["cases"][0]["rounds"] == 6
    assert ab["gpu_memory_bytes"]["baseline"] > 0 and ab["gpu_memory_bytes"]["trtfuse"] > 0
    assert sidecar["engine_report"]["nodes"], "the engine's own layer report"
    for path in (layer_profile_path(engine, 0), layer_profile_path(baseline_path(engine), 0)):
        assert read_profile(path).count == 20
    assert read_layer_information(layer_information_path(baseline_path(engine))).layers
    assert read_layer_information(layer_information_path(engine)).layers


def test_compile_never_slower_records_its_choice(tmp_path):
    engine = tmp_path / "m.engine"
    result = run_cli("compile", QWEN3, "-o", engine, "--never-slower", "--ab-rounds", 6, "--json", "-q")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    choice = out["fusion_choice"]
    assert choice["extra_builds"] <= choice["extra_builds_bound"] <= 4
    sidecar = json.loads((tmp_path / "m.engine.json").read_text())
    assert sidecar["fusion_choice"] == choice
    # The fused model written is the configuration kept: its flags fuse the original to the same nodes.
    flags = choice["flags"]
    fused = run_cli("fuse", QWEN3, "-o", tmp_path / "again.onnx", *flags, "--json")
    expected = json.loads((tmp_path / "m.fusion.json").read_text())["plugin_nodes"]
    assert json.loads(fused.stdout)["plugin_nodes"] == expected
