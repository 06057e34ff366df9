"""`trtfuse triton-config`: the config.pbtxt of a Triton model repository, read off the engine's sidecar and fused
model (the engine itself is a stand-in: nothing here deserialises it). Where tritonclient is installed, the text is
parsed with Triton's own ModelConfig message."""

from __future__ import annotations

from pathlib import Path

import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.contract import PluginKind
from trtfuse.engine.build import tool_versions
from trtfuse.engine.build_options import BuildOptions
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import derive_profiles, request_from_options
from trtfuse.engine.sidecar import make_sidecar
from trtfuse.engine.triton import triton_config
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.engines import engine_with_sidecar, write_engine_files
from support.paths import FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"


@pytest.fixture
def aot_engine(tmp_path: Path) -> Path:
    fused = load_model(fuse_file(KV_FIXTURE, tmp_path / "fused.onnx").output_path).model
    profiles = derive_profiles(fused, request_from_options(presets=["prefill", "decode"]))
    folder = tmp_path / "engine"
    folder.mkdir()
    return engine_with_sidecar(folder, profiles=profiles, plugins=PluginKind.AOT, model=fused)


def test_the_config_has_every_input_and_output_with_dynamic_dims_and_both_profiles(aot_engine):
    text = triton_config(EngineFile.open(aot_engine), "qwen3")
    assert text.startswith('name: "qwen3"\nplatform: "tensorrt_plan"\nmax_batch_size: 0\ninput [\n')
    assert '    name: "past_key_values.0.key"\n    data_type: TYPE_FP32\n    dims: [ -1, 1, -1, 64 ]' in text
    assert '    name: "logits"\n    data_type: TYPE_FP32\n    dims: [ -1, -1, 128 ]' in text
    assert text.count("    name: ") == 7 + 5
    assert '    profile: [ "0", "1" ]\n' in text and "(prefill, decode)" in text
    assert "name:" not in triton_config(EngineFile.open(aot_engine)).splitlines()[0]


def test_the_config_parses_as_tritons_model_config(aot_engine):
    text_format = pytest.importorskip("google.protobuf.text_format")
    model_config = pytest.importorskip(
        "tritonclient.grpc.model_config_pb2", reason="tritonclient[grpc] is not installed (Triton's ModelConfig)"
    )
    config = text_format.Parse(triton_config(EngineFile.open(aot_engine), "qwen3"), model_config.ModelConfig())
    assert (config.platform, config.max_batch_size) == ("tensorrt_plan", 0)
    assert list(config.instance_group[0].profile) == ["0", "1"]
    assert list(config.input[0].dims) == [-1, -1]


def test_python_plugin_engines_are_refused_in_one_line(tmp_path):
    fused = fuse_file(KV_FIXTURE, tmp_path / "m.fused.onnx").output_path
    profiles = tuple(derive_profiles(load_model(fused).model, request_from_options()))
    engine = tmp_path / "m.engine"
    sidecar = make_sidecar(
        engine_path=engine,
        fused_model_path=fused,
        versions=tool_versions("none"),
        gpu="none",
        plugins=[{"name": "TrtfuseRmsNorm", "namespace": "trtfuse", "version": "1", "nodes": 5}],
        profiles=profiles,
        build=BuildOptions(profiles=profiles, plugins=PluginKind.PYTHON).to_json(),
        shape_tensor_inputs=(),
    )
    write_engine_files(engine, b"not an engine", sidecar)
    result = run_cli("triton-config", engine)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "Python plugins, which Triton's TensorRT backend (C++, no Python interpreter) cannot run" in result.output
    assert len(result.output.strip().splitlines()) == 1


def test_the_documented_command_writes_the_repository_config(aot_engine, tmp_path):
    # docs/deploy.md: trtfuse triton-config qwen3.engine --name qwen3 > repository/qwen3/config.pbtxt
    result = run_cli("triton-config", aot_engine, "--name", "qwen3")
    assert result.exit_code == 0, result.output
    assert result.stdout == triton_config(EngineFile.open(aot_engine), "qwen3")
