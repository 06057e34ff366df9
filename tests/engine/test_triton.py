"""`trtfuse triton-config`: the config.pbtxt of a Triton model repository, read off the engine's sidecar and fused
model (the engine itself is a stand-in: nothing here deserialises it). Each config written is loaded by Triton's own
server (`support.triton_server`: the tritonserver 2.51.0 that nvidia-pytriton 0.7.0 bundles), which validates it and
stops only at the missing TensorRT backend; and held to the TensorRT backend's checks against the engine, which that
server cannot make (`support.triton_backend_rules`, from the backend's sources). What Triton refuses is refused here
in one line."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from trtfuse.cli.options import EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY
from trtfuse.contract import PluginKind
from trtfuse.engine.build import tool_versions
from trtfuse.engine.build_options import BuildOptions
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import DimRange, Profile, ShapeRange, derive_profiles, request_from_options
from trtfuse.engine.sidecar import make_sidecar, sidecar_path_for
from trtfuse.engine.triton import triton_config
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.engines import DECODE, PREFILL, engine_with_sidecar, write_engine_files
from support.kv_models import genai_model
from support.markers import needs_tritonclient
from support.models import tiny_lm
from support.paths import FIXTURES, REPO_ROOT
from support.triton_backend_rules import backend_errors, engine_tensors
from support.triton_server import ServerNotStarted, TritonServer, missing_tensorrt_backend, why_no_tritonserver

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
DEPLOY_DOC = REPO_ROOT / "docs" / "deploy.md"
BATCH_ONE = DimRange(1, 1, 1)


@pytest.fixture(scope="module")
def kv_fused(tmp_path_factory) -> onnx.ModelProto:
    return load_model(fuse_file(KV_FIXTURE, tmp_path_factory.mktemp("fused") / "fused.onnx").output_path).model


@pytest.fixture(scope="module")
def tritonserver(tmp_path_factory):
    """One tritonserver for the module's loads, each in its own folder of the server's repository."""
    reason = why_no_tritonserver()
    if reason is not None:
        pytest.skip(reason)
    try:
        with TritonServer(tmp_path_factory.mktemp("triton")) as server:
            yield server
    except ServerNotStarted as error:
        pytest.skip(f"Triton's tritonserver could not start here: {error}")


def _engine(folder: Path, model: onnx.ModelProto, profiles, shape_tensor_inputs=()) -> Path:
    folder.mkdir()
    return engine_with_sidecar(
        folder, profiles=profiles, plugins=PluginKind.AOT, model=model, shape_tensor_inputs=shape_tensor_inputs
    )


def _kv_engine(folder: Path, kv_fused: onnx.ModelProto, presets=(), batch=BATCH_ONE, past=None) -> Path:
    """The Qwen3 KV fixture's engine as `trtfuse compile --profile ... --batch ... --past ...` builds it."""
    return _engine(folder, kv_fused, derive_profiles(kv_fused, request_from_options(presets, batch=batch, past=past)))


@pytest.fixture
def aot_engine(tmp_path, kv_fused) -> Path:
    """The Qwen3 KV fixture's engine as docs/deploy.md builds it: prefill and decode, batch 1."""
    return _kv_engine(tmp_path / "engine", kv_fused, ["prefill", "decode"])


def _parsed(text: str):
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    return text_format.Parse(text, model_config_pb2.ModelConfig())


def _identity_model(input_name: str, output_name: str, dims=("batch", "tokens")) -> onnx.ModelProto:
    graph = helper.make_graph(
        [helper.make_node("Identity", [input_name], [output_name])],
        "g",
        [helper.make_tensor_value_info(input_name, TensorProto.INT64, list(dims))],
        [helper.make_tensor_value_info(output_name, TensorProto.INT64, list(dims))],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _with_inputs(model: onnx.ModelProto, *values: onnx.ValueInfoProto) -> onnx.ModelProto:
    model.graph.input.extend(values)
    return model


def _genai_with_lengths() -> onnx.ModelProto:
    return _with_inputs(
        genai_model(),
        helper.make_tensor_value_info("past_sequence_length", TensorProto.INT32, [1]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1]),
    )


# Config text a name would add to the config if it were not kept inside its string.
INJECTION = (
    '"\n  instance_group [ { kind: KIND_CPU } ]\n  input [ { name: "extra" data_type: TYPE_FP32 dims: [ 1 ] } ]\n#'
)


def _named_engine(folder: Path, input_name: str, output_name: str, profile_name: str) -> Path:
    profile = Profile(profile_name, {input_name: ShapeRange((1, 1), (1, 4), (2, 8))})
    return _engine(folder, _identity_model(input_name, output_name), [profile])


@dataclass(frozen=True)
class Served:
    """An engine on disk, the `--name` its config is written with (None: left out) and the repository folder that
    holds it (Triton names a model by its folder)."""

    engine: Path
    name: str | None
    folder_name: str
    shape_tensor_inputs: frozenset[str] = frozenset()

    def config(self) -> str:
        return triton_config(EngineFile.open(self.engine), self.name)


def _named(engine: Path, name: str, shape_tensor_inputs: frozenset[str] = frozenset()) -> Served:
    return Served(engine, name, name, shape_tensor_inputs)


# What `triton-config` is given, each built as `trtfuse compile` leaves it: (a folder to build in, the fused KV
# fixture) -> the engine served.
CASES: dict[str, Callable[[Path, onnx.ModelProto], Served]] = {
    "prefill-decode": lambda folder, kv: _named(_kv_engine(folder, kv, ["prefill", "decode"]), "qwen3"),
    "past": lambda folder, kv: _named(_kv_engine(folder, kv, ["decode"], past=DimRange(1, 256, 1024)), "past"),
    "batch-range": lambda folder, kv: _named(_kv_engine(folder, kv, ["prefill", "decode"], DimRange(1, 2, 4)), "batch"),
    "prefill-only": lambda folder, kv: _named(_kv_engine(folder, kv, ["prefill"]), "prefill"),
    "no-name": lambda folder, kv: Served(_kv_engine(folder, kv), None, "unnamed"),
    "fp16": lambda folder, kv: _named(_engine(folder, tiny_lm(np.float16, fused=True), [DECODE, PREFILL]), "fp16"),
    "bf16": lambda folder, kv: _named(
        _engine(folder, tiny_lm(ml_dtypes.bfloat16, fused=True), [DECODE, PREFILL]), "bf16"
    ),
    # Both length inputs have value ranges in the profile; the build recorded only one as a shape tensor.
    "shape-tensor": lambda folder, kv: _named(
        _engine(
            folder,
            _genai_with_lengths(),
            derive_profiles(_genai_with_lengths(), request_from_options(["decode"], batch=BATCH_ONE)),
            shape_tensor_inputs=["total_sequence_length"],
        ),
        "genai",
        frozenset({"total_sequence_length"}),
    ),
    "quotes": lambda folder, kv: _named(_named_engine(folder, 'ids "x"', 'out"\\', '"default"'), 'my "model"'),
    "newlines": lambda folder, kv: _named(
        _named_engine(folder, f"ids{INJECTION}", f"out{INJECTION}\\", f"default{INJECTION}\u2028"), "newlines"
    ),
    "non-ascii": lambda folder, kv: _named(_named_engine(folder, "ids é", "sortie→", "défaut 預設"), "modèle-é"),
}


@needs_tritonclient
@pytest.mark.parametrize("case", CASES)
def test_the_config_is_tritons_message_and_keeps_the_tensorrt_backends_rules(tmp_path, kv_fused, case):
    """The text parses as Triton's ModelConfig, prints back the same, offers one GPU instance every profile of the
    engine, and breaks none of the checks the TensorRT backend makes against the engine."""
    from google.protobuf import text_format

    served = CASES[case](tmp_path / "engine", kv_fused)
    engine = EngineFile.open(served.engine)
    text = served.config()
    config = _parsed(text)
    assert text.endswith(text_format.MessageToString(config, use_short_repeated_primitives=True))
    (group,) = config.instance_group
    assert (group.kind, group.count) == (group.KIND_GPU, 1)
    assert list(group.profile) == [str(index) for index in range(len(engine.profiles))]
    assert backend_errors(config, engine_tensors(engine, served.shape_tensor_inputs)) == []


@needs_tritonclient
@pytest.mark.parametrize("case", CASES)
def test_tritons_own_server_validates_the_config(tmp_path, kv_fused, tritonserver, case):
    """Triton's core reads the config as written (no auto-complete) and validates it when the repository is polled;
    the load then stops only at the TensorRT backend, which the repository lacks."""
    served = CASES[case](tmp_path / "engine", kv_fused)
    tritonserver.add_model(served.folder_name, served.config(), served.engine)
    refusal = tritonserver.load(served.folder_name)
    assert refusal == missing_tensorrt_backend(served.folder_name), tritonserver.log()


def _broken(config, edit) -> str:
    from google.protobuf import text_format

    edit(config)
    return text_format.MessageToString(config, use_short_repeated_primitives=True)


def _zero_dim(config) -> None:
    config.name = "zero-dim"
    config.input[3].dims[2] = 0


def _empty_reshape(config) -> None:
    """What Triton's TensorRT backend's own auto-complete writes for a scalar input."""
    config.name = "empty-reshape"
    config.input[0].dims[:] = [1]
    config.input[0].reshape.SetInParent()


def _empty_dims(config) -> None:
    config.name = "empty-dims"
    del config.input[0].dims[:]


BROKEN = {
    "zero-dim": (
        _zero_dim,
        "model input 'past_key_values.0.key' dimension must be integer >= 1, or -1 to indicate a variable-size "
        "dimension for zero-dim",
    ),
    "empty-reshape": (
        _empty_reshape,
        "model input 'input_ids' cannot have empty reshape for non-batching model as scalar tensors are not "
        "supported for empty-reshape",
    ),
    "empty-dims": (_empty_dims, "model input 'input_ids' must specify 'dims' for empty-dims"),
    # The config keeps its name, qwen3.
    "other-folder": (
        lambda config: None,
        "unexpected directory name 'other-folder' for model 'qwen3', directory name must equal model name",
    ),
}


@needs_tritonclient
@pytest.mark.parametrize("broken", BROKEN)
def test_tritons_own_server_refuses_a_broken_config(aot_engine, tritonserver, broken):
    """The forms an earlier triton-config wrote (a scalar's empty reshape, a prefill-only past of 0), empty dims and a
    name that is not its folder's are refused by the core's validation, with its own reason: the server's "only the
    backend is missing" above is a verdict, not a load that checks nothing."""
    edit, reason = BROKEN[broken]
    text = _broken(_parsed(triton_config(EngineFile.open(aot_engine), "qwen3")), edit)
    tritonserver.add_model(broken, text, aot_engine)
    assert tritonserver.load(broken) == reason, tritonserver.log()


@needs_tritonclient
def test_the_config_writes_the_engines_dims_and_profiles(aot_engine):
    text = triton_config(EngineFile.open(aot_engine), "qwen3")
    config = _parsed(text)
    assert (config.name, config.platform, config.max_batch_size) == ("qwen3", "tensorrt_plan", 0)
    inputs = {io.name: list(io.dims) for io in config.input}
    assert inputs["input_ids"] == [1, -1] and inputs["past_key_values.0.key"] == [1, 1, -1, 64]
    assert {io.name: list(io.dims) for io in config.output}["logits"] == [-1, -1, 128]
    assert len(config.input) == 7 and len(config.output) == 5
    assert not any(io.is_shape_tensor or io.HasField("reshape") for io in config.input)
    (group,) = config.instance_group
    assert list(group.profile) == ["0", "1"] and group.count == 1 and group.kind == group.KIND_GPU
    assert '"0" = "prefill", "1" = "decode"' in text
    assert _parsed(triton_config(EngineFile.open(aot_engine))).name == ""


@needs_tritonclient
def test_the_docs_example_is_what_the_command_writes(aot_engine):
    """docs/deploy.md pastes what `trtfuse triton-config model.engine --name qwen3` writes for the fixture's engine."""
    blocks = re.findall(r"\n\n((?:    .*\n|\n)+?)\n(?=\S)", DEPLOY_DOC.read_text())
    shown = next(block for block in blocks if block.lstrip().startswith("# Written by trtfuse triton-config"))
    result = run_cli("triton-config", aot_engine, "--name", "qwen3")
    assert result.exit_code == 0, result.output
    assert result.stdout == "".join(line[4:] + "\n" for line in shown.rstrip("\n").split("\n"))


@needs_tritonclient
@pytest.mark.parametrize("case", ["quotes", "newlines", "non-ascii"])
def test_quotes_newlines_and_other_letters_in_names_stay_inside_their_strings(tmp_path, case):
    """A tensor name (from the model) and the model name hold a quote; the tensor and profile names a newline and
    config text too; others non-ASCII letters. Each stays one string (the profile's inside its comment line): the
    model's inputs and outputs, every name as it was (and one instance group, checked with every case above)."""
    served = CASES[case](tmp_path / "engine", None)
    model = load_model(EngineFile.open(served.engine).fused_model_path).model
    config = _parsed(served.config())
    assert config.name == served.name
    assert [io.name for io in config.input] == [value.name for value in model.graph.input]
    assert [io.name for io in config.output] == [value.name for value in model.graph.output]


@pytest.mark.parametrize("name", ["a/b", "..", ".", "", "qwen3\ninstance_group [ { kind: KIND_CPU } ]", "x\ty", "a\\b"])
def test_a_name_that_is_not_a_plain_folder_name_is_refused_in_one_line(aot_engine, name):
    result = run_cli("triton-config", aot_engine, "--name", name)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"--name {name!r}: not a plain folder name" in result.output
    assert len(result.output.strip().splitlines()) == 1 and not result.stdout


@needs_tritonclient
@pytest.mark.parametrize("where", ["input", "output"])
def test_a_scalar_input_or_output_is_refused_with_tritons_reason(tmp_path, where):
    """Triton's core refuses empty dims, and `dims: [1]` with an empty reshape when max_batch_size is 0 (both shown by
    its server above); its TensorRT backend wants the engine's rank (0): no config serves a scalar."""
    model = _identity_model("x", "y", dims=("n",))
    shapes = {"x": ShapeRange((1,), (2,), (4,))}
    if where == "input":
        model = _with_inputs(model, helper.make_tensor_value_info("past_sequence_length", TensorProto.INT32, []))
        shapes["past_sequence_length"] = ShapeRange((), (), ())
    else:
        model.graph.node[0].CopyFrom(helper.make_node("ReduceSum", ["x"], ["y"], keepdims=0))
        model.graph.output[0].CopyFrom(helper.make_tensor_value_info("y", TensorProto.INT64, []))
    engine = _engine(tmp_path / "e", model, [Profile("default", shapes)])
    result = run_cli("triton-config", engine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    name = "past_sequence_length" if where == "input" else "y"
    assert f"{where} '{name}' is a scalar (0-d), which Triton cannot serve from a TensorRT engine" in result.output
    assert "ValidateIOShape" in result.output and len(result.output.strip().splitlines()) == 1


@needs_tritonclient
def test_the_backend_rules_refuse_a_needless_shape_tensor_flag_and_a_dim_outside_the_profiles(aot_engine):
    """The backend's checks against the engine, which Triton's server cannot make without the backend, can fail: a
    length input flagged as a shape tensor the engine does not take as one (an earlier triton-config's form), a
    fixed batch no profile holds."""
    config = _parsed(triton_config(EngineFile.open(aot_engine), "qwen3"))
    tensors = engine_tensors(EngineFile.open(aot_engine))
    config.input[0].is_shape_tensor = True
    config.input[1].dims[0] = 2
    errors = backend_errors(config, tensors)
    assert any("'input_ids' is incorrectly marked as a shape tensor" in error for error in errors), errors
    assert any("input 'attention_mask': dimension 0 to be between 1 and 1 but received 2" in e for e in errors), errors


@needs_tritonclient
def test_is_shape_tensor_marks_exactly_the_inputs_the_build_recorded(tmp_path):
    """Both length inputs have value ranges in the profile; the build recorded only one as a shape tensor (as the
    network reported), and only that one is flagged."""
    served = CASES["shape-tensor"](tmp_path / "engine", None)
    assert set(EngineFile.open(served.engine).profiles[0].values) == {"past_sequence_length", "total_sequence_length"}
    flagged = {io.name: (io.is_shape_tensor, list(io.dims)) for io in _parsed(served.config()).input}
    assert flagged["total_sequence_length"] == (True, [1])
    assert flagged["past_sequence_length"] == (False, [1])
    assert not any(shape_tensor for name, (shape_tensor, _) in flagged.items() if name != "total_sequence_length")


@needs_tritonclient
def test_an_axis_fixed_at_zero_in_every_profile_is_written_as_variable(tmp_path, kv_fused):
    """A prefill-only engine's past length is 0 in every profile; Triton takes no dim of 0, and -1 lets requests
    send the empty cache."""
    served = CASES["prefill-only"](tmp_path / "engine", kv_fused)
    assert EngineFile.open(served.engine).profiles[0].shapes["past_key_values.0.key"].max[2] == 0
    dims = {io.name: list(io.dims) for io in _parsed(served.config()).input}
    assert dims["past_key_values.0.key"] == [1, 1, -1, 64]


def _edit_sidecar(engine: Path, edit) -> None:
    path = sidecar_path_for(engine)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


@needs_tritonclient
def test_a_sidecar_whose_profile_leaves_out_an_input_is_one_line(aot_engine):
    _edit_sidecar(aot_engine, lambda data: data["profiles"][1]["shapes"].pop("attention_mask"))
    result = run_cli("triton-config", aot_engine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "profile 'decode' gives no shape for input 'attention_mask' of the fused model m.fused.onnx" in result.output
    assert len(result.output.strip().splitlines()) == 1


@needs_tritonclient
def test_a_sidecar_at_odds_with_the_fused_model_is_one_line(aot_engine):
    """The engine was built from the fused model: a profile giving a head size or a rank the model does not have is
    a damaged sidecar, not a config to write."""

    def head_size(data):
        shape = data["profiles"][0]["shapes"]["past_key_values.0.key"]
        for bound in ("min", "opt", "max"):
            shape[bound][3] = 32

    _edit_sidecar(aot_engine, head_size)
    result = run_cli("triton-config", aot_engine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "where the fused model m.fused.onnx fixes dim 3 at 64; rebuild the engine" in result.output
    _edit_sidecar(
        aot_engine, lambda data: data["profiles"][0]["shapes"].update(input_ids={"min": [1], "opt": [1], "max": [1]})
    )
    result = run_cli("triton-config", aot_engine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "input 'input_ids' has ranks [1, 2] across the fused model m.fused.onnx and the profiles" in result.output


@needs_tritonclient
def test_a_format_1_sidecar_is_refused_only_where_its_shape_tensors_are_unknown(tmp_path, aot_engine):
    def format_1(data):
        data["format"] = "trtfuse-engine/1"
        data.pop("shape_tensor_inputs")

    # No value ranges: TensorRT builds no profile without one for each shape-tensor input, so there were none.
    _edit_sidecar(aot_engine, format_1)
    result = run_cli("triton-config", aot_engine, "--name", "qwen3")
    assert result.exit_code == 0, result.output
    model = _genai_with_lengths()
    engine = _engine(tmp_path / "genai", model, derive_profiles(model, request_from_options(presets=["decode"])))
    _edit_sidecar(engine, format_1)
    result = run_cli("triton-config", engine)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "written by an older trtfuse, it does not record which of past_sequence_length, total_sequence_length" in (
        result.output
    )
    assert "rebuild the engine with trtfuse compile" in result.output


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


def test_without_tritonclient_it_says_what_to_install(aot_engine, monkeypatch):
    monkeypatch.setitem(sys.modules, "tritonclient.grpc", None)
    result = run_cli("triton-config", aot_engine)
    assert result.exit_code == EXIT_MISSING_DEPENDENCY, result.output
    assert "needs Triton's ModelConfig from tritonclient; install it with `pip install -e '.[triton]'`" in (
        result.output
    )


def test_an_onnx_model_is_not_an_engine(tmp_path):
    fused = fuse_file(KV_FIXTURE, tmp_path / "model.fused.onnx").output_path
    result = run_cli("triton-config", fused)
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"{fused}: this is an ONNX model, not an engine" in result.output
    assert len(result.output.strip().splitlines()) == 1


@needs_tritonclient
def test_json_carries_the_same_config(aot_engine):
    result = run_cli("triton-config", aot_engine, "--name", "qwen3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["config_pbtxt"] == triton_config(EngineFile.open(aot_engine), "qwen3")
