"""Engine build: the pure parts in CI, `trtfuse compile` without TensorRT in CI, the real build where TensorRT is."""

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

import trtfuse
from trtfuse import contract
from trtfuse.cli.main import cli
from trtfuse.cli.options import EXIT_MISSING_DEPENDENCY
from trtfuse.contract import PluginKind
from trtfuse.engine import build, build_options
from trtfuse.engine.build import plugins_used
from trtfuse.engine.build_options import BuildOptions, plugin_kind_for
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.parser_errors import ParserIssue, parser_error_line
from trtfuse.engine.profiles import Profile, ShapeRange
from trtfuse.engine.progress import BuildProgress
from trtfuse.engine.session import ENGINE_RUNNER
from trtfuse.engine.sidecar import read_sidecar
from trtfuse.errors import MissingDependencyError, OptionError, TrtfuseError
from trtfuse.files import write_bytes_atomic
from trtfuse.model.onnx_file import load_model
from trtfuse.plugins import registry

from fakes import tensorrt as fakes_trt
from support.markers import HAS_TENSORRT, HAS_TENSORRT_RTX, needs_tensorrt
from support.models import save_model_file, tiny_lm

PROFILE = Profile("default", {"input_ids": ShapeRange((1, 1), (1, 256), (1, 4096))})


def test_build_options_are_checked():
    with pytest.raises(TrtfuseError, match="at least one optimisation profile"):
        BuildOptions(profiles=())
    with pytest.raises(TrtfuseError, match=r"the optimisation level must be 0 to 5, got 6"):
        BuildOptions(profiles=(PROFILE,), optimization_level=6)
    with pytest.raises(TrtfuseError, match=r"the workspace limit must be positive"):
        BuildOptions(profiles=(PROFILE,), workspace_bytes=0)


def test_plugins_used_counts_only_trtfuse_nodes():
    assert plugins_used(tiny_lm(np.float16, fused=True)) == [
        {"name": contract.RMS_NORM_OP, "namespace": "trtfuse", "version": contract.PLUGIN_VERSION, "nodes": 1}
    ]
    assert plugins_used(tiny_lm(np.float16, fused=False)) == []


def test_parser_error_names_the_node_and_counts_the_rest():
    model = tiny_lm(np.float16, fused=True)
    issues = [
        ParserIssue(1, "norm", contract.RMS_NORM_OP, "Plugin not found\nmore detail"),
        ParserIssue(2, "lm_head", "MatMul", "x"),
    ]
    line = parser_error_line(Path("m.onnx"), issues, model)
    assert line == (
        "m.onnx: TensorRT's ONNX parser failed at node 'norm' (TrtfuseRmsNorm): Plugin not found; "
        "is the 'TrtfuseRmsNorm' plugin registered in namespace 'trtfuse'? (and 1 more parser errors)"
    )
    assert "\n" not in line


def test_parser_error_finds_the_node_name_from_its_index():
    model = tiny_lm(np.float16, fused=True)
    line = parser_error_line(Path("m.onnx"), [ParserIssue(2, "", "", "unsupported")], model)
    assert line == "m.onnx: TensorRT's ONNX parser failed at node 'lm_head' (MatMul): unsupported"
    graph_line = parser_error_line(Path("m.onnx"), [ParserIssue(-1, "", "", "")], model)
    assert graph_line == "m.onnx: TensorRT's ONNX parser failed at the graph: no description"
    assert "without saying why" in parser_error_line(Path("m.onnx"), [], model)


def test_atomic_write_leaves_no_partial_file(tmp_path, monkeypatch):
    target = tmp_path / "m.engine"
    target.write_bytes(b"old engine")

    def fail(*args):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(TrtfuseError, match="disk full"):
        write_bytes_atomic(target, b"new engine")
    assert target.read_bytes() == b"old engine"
    assert os.listdir(tmp_path) == ["m.engine"]


def test_atomic_write_needs_the_folder(tmp_path):
    with pytest.raises(TrtfuseError, match=r"output folder does not exist"):
        write_bytes_atomic(tmp_path / "missing" / "m.engine", b"x")


def test_progress_lines_are_indented_by_phase_depth():
    lines = []
    progress = BuildProgress(lines.append)
    progress.phase_start("Building engine", None, 3)
    progress.phase_start("Tactic search", "Building engine", 10)
    assert progress.step_complete("Tactic search", 0) is True
    progress.phase_finish("Tactic search")
    progress.phase_finish("Building engine")
    assert lines[0] == "Building engine (3 steps)"
    assert lines[1] == "  Tactic search (10 steps)"
    assert lines[2].startswith("  Tactic search done in ")
    assert lines[3].startswith("Building engine done in ")


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_build_without_tensorrt_says_how_to_get_it(tmp_path):
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    with pytest.raises(MissingDependencyError, match=r"pip install -e '\.\[gpu\]'"):
        build.build_engine(load_model(fused), tmp_path / "m.engine", BuildOptions(profiles=(PROFILE,)))
    assert sorted(os.listdir(tmp_path)) == ["m.fused.onnx"]


def test_build_checks_the_output_folder_first(tmp_path):
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    with pytest.raises(TrtfuseError, match=r"output folder does not exist"):
        build.build_engine(load_model(fused), tmp_path / "no" / "m.engine", BuildOptions(profiles=(PROFILE,)))
    cache_elsewhere = BuildOptions(profiles=(PROFILE,), timing_cache=tmp_path / "no" / "timing.cache")
    with pytest.raises(TrtfuseError, match=r"timing\.cache: output folder does not exist"):
        build.build_engine(load_model(fused), tmp_path / "m.engine", cache_elsewhere)


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_compile_without_tensorrt_fuses_then_exits_3(tmp_path):
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    engine = tmp_path / "out" / "model.engine"
    engine.parent.mkdir()
    result = CliRunner().invoke(cli, ["compile", str(original), "-o", str(engine), "--profile", "decode"])
    assert result.exit_code == EXIT_MISSING_DEPENDENCY, result.output
    assert "fused, but no engine built" in result.output
    assert "pip install -e '.[gpu]'" in result.output
    assert sorted(os.listdir(engine.parent)) == ["model.fused.onnx", "model.fusion.json"]
    report = json.loads((engine.parent / "model.fusion.json").read_text())
    assert len(report["fused"]) == 1
    assert plugins_used(onnx.load(str(engine.parent / "model.fused.onnx")))[0]["nodes"] == 1


def test_compile_bad_profile_spec_is_exit_2_and_writes_nothing(tmp_path):
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    for args in (["--tokens", "8:4:16"], ["--shape", "ids=1x1:1x2:1x3"], ["--workspace", "lots"]):
        result = CliRunner().invoke(cli, ["compile", str(original), *args])
        assert result.exit_code == 2, result.output
        assert result.output.startswith("trtfuse: error: ")
        assert sorted(os.listdir(tmp_path)) == ["model.onnx"]


@pytest.mark.parametrize("name", ["x.onnx", "X.ONNX", "x.onnxtxt"])
def test_compile_refuses_an_onnx_name_for_the_engine_before_writing_anything(tmp_path, name):
    """An engine named like an ONNX model would pass for one (run, compare and generate tell them apart by name)."""
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    result = CliRunner().invoke(cli, ["compile", str(original), "-o", str(tmp_path / name)])
    assert result.exit_code == 2, result.output
    assert f"{tmp_path / name}: an engine is not an ONNX model; give it another name, such as " in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]


def test_compile_never_overwrites_its_input(tmp_path):
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "m.fused.onnx")
    result = CliRunner().invoke(cli, ["compile", str(original), "-o", str(tmp_path / "m.engine")])
    assert result.exit_code == 2
    assert "would overwrite the input" in result.output
    assert onnx.load(str(original)) == tiny_lm(np.float16, fused=False)


def test_compile_unknown_symbolic_dim_names_input(tmp_path):
    model = tiny_lm(np.float16, fused=False)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s1"
    original = save_model_file(model, tmp_path / "model.onnx")
    result = CliRunner().invoke(cli, ["compile", str(original)])
    assert result.exit_code == 2
    assert "input 'input_ids' dim 1 is symbolic dim 's1'" in result.output
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]


def _compile_in_a_process_of_its_own(*args: str) -> subprocess.CompletedProcess:
    """`trtfuse compile` in a child process: the build registers one kind of trtfuse plugins, and the test process
    must stay free to load either kind of engine (and to register the Python plugins for other tests)."""
    return subprocess.run(
        [sys.executable, "-m", "trtfuse.cli.main", "compile", *args], capture_output=True, text=True, timeout=1800
    )


@pytest.mark.parametrize("plugins", ["aot", "python"])
@pytest.mark.parametrize("dtype", [np.float16, np.float32], ids=["fp16", "fp32"])
@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_compile_builds_an_engine_that_matches_onnxruntime(dtype, plugins, tmp_path):
    from trtfuse.engine.compare import compare
    from trtfuse.verify.check import CheckInputs

    original = save_model_file(tiny_lm(dtype, fused=False), tmp_path / "model.onnx")
    engine = tmp_path / "model.engine"
    cache = tmp_path / "timing.cache"
    args = ["--profile", "decode", "--tokens", "1:16:64", "--timing-cache", str(cache), "--plugins", plugins]
    result = _compile_in_a_process_of_its_own(str(original), *args)
    assert result.returncode == 0, result.stderr
    sidecar = read_sidecar(engine)
    assert [profile.name for profile in sidecar.profiles] == ["decode", "tokens 1:16:64"]
    assert sidecar.data["plugins"][0]["name"] == contract.RMS_NORM_OP
    assert sidecar.plugin_kind is PluginKind(plugins)
    assert cache.stat().st_size > 0
    report = compare(original, engine, CheckInputs(dims={"batch": 1, "sequence": 9}))
    assert report.candidate_runner == ENGINE_RUNNER
    assert report.passed, report.to_json()


# Deserialises and runs an engine with TensorRT and cuda-python alone, then says whether trtfuse was ever imported.
_BARE_RUN = """
import sys
import numpy as np
import tensorrt as trt
from cuda.bindings import runtime as cudart

engine_path, feed_path, out_path = sys.argv[1:]
engine = trt.Runtime(trt.Logger(trt.Logger.WARNING)).deserialize_cuda_engine(open(engine_path, "rb").read())
assert engine is not None, "TensorRT could not deserialise the engine"
context = engine.create_execution_context()
feed = dict(np.load(feed_path))
for name, array in feed.items():
    context.set_input_shape(name, array.shape)
outputs = {}
for index in range(engine.num_io_tensors):
    name = engine.get_tensor_name(index)
    is_input = engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT
    dtype = trt.nptype(engine.get_tensor_dtype(name))
    array = feed[name] if is_input else np.empty(tuple(context.get_tensor_shape(name)), dtype)
    error, pointer = cudart.cudaMalloc(max(array.nbytes, 1))
    assert error == cudart.cudaError_t.cudaSuccess, error
    if is_input:
        cudart.cudaMemcpy(pointer, array.ctypes.data, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyHostToDevice)
    else:
        outputs[name] = (array, pointer)
    context.set_tensor_address(name, pointer)
assert context.execute_async_v3(0)
cudart.cudaDeviceSynchronize()
for name, (array, pointer) in outputs.items():
    cudart.cudaMemcpy(array.ctypes.data, pointer, array.nbytes, cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost)
np.savez(out_path, **{name: array for name, (array, _) in outputs.items()})
print(sorted(name for name in sys.modules if name.split(".")[0] == "trtfuse"))
"""


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_an_aot_engine_runs_where_trtfuse_is_not(tmp_path):
    """The point of AOT engines: deserialised and run by TensorRT alone (no trtfuse imported, no plugin registered),
    with `trtexec` too where it is installed, and giving what `trtfuse run` gives."""
    import shutil

    from trtfuse.engine.run import run_engine
    from trtfuse.model.feed_files import read_arrays, write_arrays

    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    result = _compile_in_a_process_of_its_own(str(original), "--tokens", "1:8:32", "--plugins", "aot")
    assert result.returncode == 0, result.stderr
    engine = tmp_path / "model.engine"
    feed = {"input_ids": np.array([[1, 2, 3, 4, 5]], np.int64)}
    write_arrays(tmp_path / "feed.npz", feed)
    script = tmp_path / "bare_run.py"
    script.write_text(_BARE_RUN)
    # Run from the temp folder, with no path to trtfuse's checkout: an import of trtfuse could only come from an
    # installed copy, and the script says whether one happened.
    bare = subprocess.run(
        [sys.executable, str(script), str(engine), str(tmp_path / "feed.npz"), str(tmp_path / "out.npz")],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,
    )
    assert bare.returncode == 0, bare.stderr
    assert bare.stdout.strip() == "[]", "TensorRT alone ran the engine"
    expected = run_engine(EngineFile.open(engine), feed, iterations=1, warmup=0).outputs["logits"]
    got = read_arrays(tmp_path / "out.npz")["logits"]
    np.testing.assert_allclose(got.astype(np.float32), expected.astype(np.float32), atol=2e-3, rtol=2e-3)
    if shutil.which("trtexec"):
        trtexec = subprocess.run(
            ["trtexec", f"--loadEngine={engine}", "--shapes=input_ids:1x5"], capture_output=True, text=True, timeout=600
        )
        assert trtexec.returncode == 0, trtexec.stdout[-2000:]


@pytest.mark.filterwarnings("ignore:.*Timing cache operations are no-ops in TensorRT-RTX")
@pytest.mark.skipif(
    not HAS_TENSORRT_RTX, reason="needs TensorRT-RTX's Python module as an API stand-in (pip install tensorrt-rtx-cu13)"
)
def test_tensorrt_layer_against_the_tensorrt_rtx_api(tmp_path, monkeypatch):
    """TensorRT-RTX shares TensorRT's builder, ONNX parser, profile, timing-cache and progress-monitor API and builds
    ahead of time without a GPU, but aborts on Python plugins. So this drives `build_engine`'s TensorRT calls on the
    unfused model, and the parser-error path on the fused one with no plugin registered. It checks trtfuse's use of
    the API, not a TensorRT engine."""
    import tensorrt_rtx

    monkeypatch.setattr(build, "import_tensorrt", lambda: tensorrt_rtx)
    monkeypatch.setattr(build, "register_plugins", lambda kind: None)
    plain = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "plain.onnx")
    cache = tmp_path / "timing.cache"
    decode = Profile("decode", {"input_ids": ShapeRange((1, 1), (1, 1), (2, 1))})
    options = BuildOptions(
        profiles=(decode, PROFILE), optimization_level=0, workspace_bytes=1 << 28, timing_cache=cache
    )
    lines = []
    result = build.build_engine(load_model(plain), tmp_path / "plain.engine", options, emit=lines.append)
    assert result.engine_path.stat().st_size > 0
    assert cache.stat().st_size > 0
    assert read_sidecar(result.engine_path).versions["tensorrt"] == tensorrt_rtx.__version__
    # TensorRT-RTX has no AOT plugins (no QuickPluginCreationRequest), so the default is the Python kind.
    assert read_sidecar(result.engine_path).plugin_kind is PluginKind.PYTHON
    assert any(line.endswith("steps)") for line in lines)
    assert any(" done in " in line for line in lines)

    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "fused.onnx")
    with pytest.raises(TrtfuseError) as error:
        build.build_engine(load_model(fused), tmp_path / "fused.engine", options)
    assert str(error.value).startswith(f"{fused}: TensorRT's ONNX parser failed at node 'norm' (TrtfuseRmsNorm): ")
    assert "is the 'TrtfuseRmsNorm' plugin registered in namespace 'trtfuse'?" in str(error.value)
    assert not (tmp_path / "fused.engine").exists()


def test_parser_error_points_at_the_plugin_when_it_was_found_but_refused():
    model = tiny_lm(np.float16, fused=True)
    refused = [ParserIssue(1, "norm", contract.RMS_NORM_OP, "Could not create the plugin.")]
    said = "TrtfuseRmsNorm 'norm': field 'epsilon' must be FLOAT32, got FLOAT16"
    line = parser_error_line(Path("m.onnx"), refused, model, [said])
    assert line.endswith(f"Could not create the plugin.; the plugin said: {said}")
    assert "registered" not in line
    assert "in TensorRT's log above" in parser_error_line(Path("m.onnx"), refused, model)


@pytest.mark.parametrize(("version", "flags"), [("10.8.0.43", 1 << 1), ("10.13.2", 1 << 1), ("11.1.0.1", 0)])
def test_strongly_typed_flag_only_below_tensorrt_11(version, flags):
    module = type("trt", (), {"__version__": version, "NetworkDefinitionCreationFlag": fakes_trt.Flags})
    assert build.network_flags(module) == flags


def test_profiles_tensorrt_refuses_are_one_line_errors():
    """IOptimizationProfile.set_shape raises RuntimeError, IBuilderConfig.add_optimization_profile returns -1 for a
    profile it refuses (TensorRT's Python binding sources); neither may surface as a traceback or go unnoticed."""
    with pytest.raises(TrtfuseError, match=r"profile 'default': TensorRT refused the shapes of input 'input_ids'"):
        build.add_profiles(fakes_trt.ProfileBuilder(refuse_shapes=True), fakes_trt.ProfileConfig(0), [PROFILE])
    with pytest.raises(TrtfuseError, match=r"profile 'default': TensorRT refused the optimisation profile"):
        build.add_profiles(fakes_trt.ProfileBuilder(refuse_shapes=False), fakes_trt.ProfileConfig(-1), [PROFILE])
    build.add_profiles(fakes_trt.ProfileBuilder(refuse_shapes=False), fakes_trt.ProfileConfig(0), [PROFILE])


def test_length_inputs_get_value_ranges_only_where_tensorrt_reads_them_as_shape_tensors():
    lengths = ShapeRange((0,), (256,), (4095,))
    profile = Profile("default", {"input_ids": ShapeRange((1, 1), (1, 1), (1, 1))}, {"past_sequence_length": lengths})
    config = fakes_trt.ProfileConfig(0)
    build.add_profiles(fakes_trt.ProfileBuilder(refuse_shapes=False), config, [profile], {"past_sequence_length"})
    assert config.profiles[0].values == {"past_sequence_length": ((0,), (256,), (4095,))}
    config = fakes_trt.ProfileConfig(0)
    build.add_profiles(fakes_trt.ProfileBuilder(refuse_shapes=False), config, [profile])
    assert config.profiles[0].values == {}


def test_the_default_plugin_kind_is_aot_where_tensorrt_has_it():
    refused = "TensorRT 10.8.0 has no AOT plugins (tensorrt.plugin's aot_impl)"
    assert plugin_kind_for(None, None) is PluginKind.AOT
    assert plugin_kind_for(None, refused) is PluginKind.PYTHON
    assert plugin_kind_for(PluginKind.PYTHON, None) is PluginKind.PYTHON
    assert plugin_kind_for(PluginKind.PYTHON, refused) is PluginKind.PYTHON
    assert plugin_kind_for(PluginKind.AOT, None) is PluginKind.AOT


@pytest.mark.parametrize(
    ("version", "reason"),
    [
        ("10.8.0.43", "TensorRT 10.8.0.43 has no AOT plugins (tensorrt.plugin's aot_impl)"),
        (
            "10.12.0.36",
            "TensorRT 10.12.0.36's Python binding hands TensorRT each AOT kernel's name in a string it has already "
            "freed (fixed in 10.14)",
        ),
    ],
)
def test_aot_asked_for_on_a_tensorrt_it_is_refused_on_says_why_in_one_line(version: str, reason: str):
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    if version.startswith("10.12"):
        trt.QuickPluginCreationRequest = object
    with pytest.raises(OptionError) as error:
        plugin_kind_for(PluginKind.AOT, registry.aot_refusal(trt))
    assert error.value.choice == "plugins"
    assert error.value.spelled(lambda name: f"--{name}") == (
        f"{reason}; trtfuse builds AOT plugins with TensorRT >= 10.14: install it or build with --plugins python"
    )


@pytest.mark.parametrize(
    ("version", "enum", "plugins", "flags"),
    [
        ("10.9.0", fakes_trt.AotFlags, PluginKind.AOT, 1 << 1 | 1 << 3),
        ("10.9.0", fakes_trt.AotFlags, PluginKind.PYTHON, 1 << 1),
        ("11.1.0", fakes_trt.AotFlags11, PluginKind.AOT, 1 << 2),
        ("11.1.0", fakes_trt.AotFlags11, PluginKind.PYTHON, 0),
        # A TensorRT without the flag (before 10.9): the AOT nodes' own attribute still asks for AOT.
        ("10.8.0", fakes_trt.Flags, PluginKind.AOT, 1 << 1),
    ],
)
def test_aot_builds_set_the_flag_that_prefers_aot_plugins(version, enum, plugins, flags):
    module = type("trt", (), {"__version__": version, "NetworkDefinitionCreationFlag": enum})
    assert build.network_flags(module, plugins) == flags


def _use_tensorrt(monkeypatch, trt) -> None:
    """`trt` as the TensorRT both the build and the plugin-kind check import."""
    monkeypatch.setattr(build, "import_tensorrt", lambda: trt)
    monkeypatch.setattr(build_options, "import_tensorrt", lambda: trt)


def _aot_modules(monkeypatch, calls: dict, has_aot: bool) -> None:
    """The plugins side's TensorRT calls as recorders (whether the TensorRT has AOT plugins, registering them), so the
    build side is tested on its own; `prepare_for_aot` is the real one."""
    if has_aot:
        monkeypatch.setattr(registry, "aot_refusal", lambda trt: None)
    monkeypatch.setattr(build, "register_plugins", lambda kind: calls.setdefault("registered", []).append(kind.value))
    monkeypatch.setattr(build, "plugin_creation_errors", lambda: [])


def test_an_aot_build_parses_the_aot_form_from_bytes_and_leaves_the_fused_file_as_it_was(tmp_path, monkeypatch):
    from trtfuse.model import onnx_file as model_io
    from trtfuse.plugins import qdp

    from support.models import save_external

    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=True)
    # Before the build, what an earlier build embedded (dropped); after it, what aot_impl handed this one.
    taken = iter([["7.0"], ["8.8", "9.4"]])
    monkeypatch.setattr(qdp, "take_embedded_ptx_isas", lambda: next(taken))
    _use_tensorrt(monkeypatch, fakes_trt.fake_tensorrt("10.14.1", calls))
    # Every tensor left in the external file, as an LLM's large weights are: the parser must still find them.
    monkeypatch.setattr(model_io, "SMALL_TENSOR_BYTES", 0)
    fused = save_external(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    on_disk = fused.read_bytes()
    result = build.build_engine(load_model(fused), tmp_path / "m.engine", BuildOptions(profiles=(PROFILE,)))
    assert calls["registered"] == ["aot"], "only the AOT kind is registered"
    assert "parse_from_file" not in calls
    assert calls["flags"] == 1 << 1 | 1 << 3
    model_bytes, path = calls["parse"]
    assert path == str(fused.absolute()), "the model file: onnx-tensorrt resolves external data beside it"
    parsed = onnx.load_from_string(model_bytes)
    (norm,) = [node for node in parsed.graph.node if node.domain == contract.ONNX_DOMAIN]
    assert onnx.helper.get_attribute_value(next(a for a in norm.attribute if a.name == "aot")) == 1
    external = [t.name for t in parsed.graph.initializer if onnx.external_data_helper.uses_external_data(t)]
    assert sorted(external) == ["embedding", "lm_head", "norm.weight"]
    onnx.external_data_helper.load_external_data_for_model(parsed, str(Path(path).parent))
    assert fused.read_bytes() == on_disk
    assert result.sidecar["build"]["plugins"] == "aot"
    # The PTX ISAs the plugins' aot_impl handed TensorRT (planted: the stand-in builder calls no plugin), in order.
    assert result.sidecar["build"]["ptx_isa"] == ["8.8", "9.4"]
    assert EngineFile.open(result.engine_path).plugin_kind is PluginKind.AOT


def test_an_aot_build_reads_only_a_timing_cache_this_trtfuse_stamped(tmp_path, monkeypatch):
    """The AOT plugins' timing-cache ID is tensorrt.plugin's empty default, so their cached tactics are keyed by
    shapes and formats only: a cache from another trtfuse (or none's stamp) is set aside, and every build stamps it."""
    from trtfuse.engine.timing_cache import stamp_path
    from trtfuse.plugins import qdp

    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=True)
    monkeypatch.setattr(qdp, "take_embedded_ptx_isas", lambda: ["8.8"])
    _use_tensorrt(monkeypatch, fakes_trt.fake_tensorrt("10.14.1", calls))
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    cache = tmp_path / "timing.cache"
    cache.write_bytes(b"trtexec's")
    options = BuildOptions(profiles=(PROFILE,), timing_cache=cache, plugins=PluginKind.AOT)

    def build_lines() -> list[str]:
        lines: list[str] = []
        build.build_engine(load_model(fused), tmp_path / "m.engine", options, emit=lines.append)
        return [line for line in lines if line.startswith("timing cache")]

    (line,) = build_lines()
    assert line.startswith(f"timing cache {cache} was written without trtfuse's stamp; this is trtfuse ")
    assert line.endswith("so starting a fresh one")
    assert cache.read_bytes() == b"+timed"
    stamp = json.loads(stamp_path(cache).read_text())
    assert stamp == {"format": "trtfuse-timing-cache/1", "trtfuse": trtfuse.__version__}
    assert build_lines() == [] and cache.read_bytes() == b"+timed+timed", "this trtfuse's own cache is read"
    stamp_path(cache).write_text(json.dumps({**stamp, "trtfuse": "0.0.1"}))
    (line,) = build_lines()
    assert f"was written by trtfuse 0.0.1; this is trtfuse {trtfuse.__version__}" in line
    assert cache.read_bytes() == b"+timed"
    python = BuildOptions(profiles=(PROFILE,), timing_cache=cache, plugins=PluginKind.PYTHON)
    stamp_path(cache).unlink()
    build.build_engine(load_model(fused), tmp_path / "m.engine", python, emit=lambda line: None)
    assert cache.read_bytes() == b"+timed+timed", "the Python plugins' timing-cache IDs name the trtfuse version"


def test_a_python_build_registers_only_the_python_plugins_and_parses_the_model_it_is_given(tmp_path, monkeypatch):
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=True)
    _use_tensorrt(monkeypatch, fakes_trt.fake_tensorrt("10.14.1", calls))
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    options = BuildOptions(profiles=(PROFILE,), plugins=PluginKind.PYTHON)
    result = build.build_engine(load_model(fused), tmp_path / "m.engine", options)
    assert calls["registered"] == ["python"]
    assert "parse_from_file" not in calls, "the fused model flows in from the pipeline, not read again"
    model_bytes, path = calls["parse"]
    assert path == str(fused.absolute()) and onnx.load_from_string(model_bytes) == load_model(fused).model
    assert calls["flags"] == 1 << 1
    assert result.sidecar["build"]["plugins"] == "python"


def test_the_sidecar_records_the_inputs_the_network_takes_as_shape_tensors(tmp_path, monkeypatch):
    """Both length inputs have value ranges in the profile; only the one the parsed network reports as a shape tensor
    is recorded (and given its values): what Triton's `is_shape_tensor` must say."""
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=True)
    network_inputs = ("input_ids", "past_sequence_length", "total_sequence_length")
    trt = fakes_trt.fake_tensorrt("10.14.1", calls, network_inputs, frozenset({"past_sequence_length"}))
    _use_tensorrt(monkeypatch, trt)
    lengths = ShapeRange((0,), (255,), (4095,))
    profile = Profile("default", PROFILE.shapes, {"past_sequence_length": lengths, "total_sequence_length": lengths})
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    options = BuildOptions(profiles=(profile,), plugins=PluginKind.PYTHON)
    result = build.build_engine(load_model(fused), tmp_path / "m.engine", options)
    assert result.sidecar["shape_tensor_inputs"] == ["past_sequence_length"]
    assert read_sidecar(result.engine_path).shape_tensor_inputs == {"past_sequence_length"}


def test_compile_plugins_aot_on_a_tensorrt_without_aot_is_one_line_exit_2(tmp_path, monkeypatch):
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=False)
    _use_tensorrt(monkeypatch, fakes_trt.fake_tensorrt("10.8.0", calls))
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    result = CliRunner().invoke(cli, ["compile", str(original), "--plugins", "aot"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "trtfuse: error: TensorRT 10.8.0 has no AOT plugins (tensorrt.plugin's aot_impl); trtfuse builds AOT plugins "
        "with TensorRT >= 10.14: install it or build with --plugins python\n"
    )
    assert "registered" not in calls and "flags" not in calls
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"], "what was fused is removed with the failed call"
    default = CliRunner().invoke(cli, ["compile", str(original), "--json"])
    assert default.exit_code == 0, default.output
    assert json.loads(default.stdout)["plugins"] == "python", "without AOT the default is the Python kind"
    assert calls["registered"] == ["python"]


def test_compile_plugin_kinds_are_the_core_enum():
    from trtfuse.cli.engine_commands import PLUGIN_KINDS

    assert tuple(kind.value for kind in PluginKind) == PLUGIN_KINDS


def _quantized(model: onnx.ModelProto, quant: contract.QuantParams) -> onnx.ModelProto:
    """`model` with its first TrtfuseRmsNorm made a TrtfuseRmsNormQuant with `quant` (its other fields kept), its y
    declared in the normalised dtype (fp16 T, or the output stage's)."""
    from dataclasses import replace

    from trtfuse.contract.codec import from_node

    node = next(node for node in model.graph.node if node.op_type == contract.RMS_NORM_OP)
    fields = replace(from_node(node, "test"), op=contract.RMS_NORM_QUANT, quant=quant)
    node.op_type = contract.RMS_NORM_QUANT_OP
    del node.attribute[:]
    node.attribute.extend(onnx.helper.make_node("N", [], [], **fields.onnx_attributes()).attribute)
    for value in [*model.graph.value_info, *model.graph.output]:
        if value.name == node.output[0]:
            value.type.tensor_type.elem_type = contract.QUANT_DTYPE_CODES.get(fields.normalised_dtype(0), 10)
    return model


FP8_OUTPUT = contract.QuantParams(output=contract.Quantizer("float8_e4m3fn", 0.015625))
INT8_RSQRT = contract.QuantParams(rsqrt=contract.Quantizer("int8", 0.015625, True, "float16"))


def _quant_tensorrt(version: str, calls: dict, data_types: tuple[str, ...] = ("FP8", "INT8")) -> types.ModuleType:
    trt = fakes_trt.fake_tensorrt(version, calls)
    trt.IPluginV3 = object
    trt.DataType = types.SimpleNamespace(**{name: name for name in data_types})
    return trt


@pytest.mark.parametrize(
    ("version", "data_types", "reason"),
    [
        (
            "9.3.0",
            ("FP8", "INT8"),
            "TensorRT 9.3.0 predates 10.1, the first TensorRT that documents FP8 plugin outputs (IPluginV3)",
        ),
        (
            "10.0.1",
            ("FP8", "INT8"),
            "TensorRT 10.0.1 predates 10.1, the first TensorRT that documents FP8 plugin outputs (IPluginV3)",
        ),
        ("10.8.0", ("INT8",), "TensorRT 10.8.0 has no DataType.FP8 for the quantized outputs"),
        ("10.8.0", ("FP8", "INT8"), None),
        ("11.1.0", ("FP8", "INT8"), None),
    ],
)
def test_which_tensorrt_takes_fp8_and_int8_plugin_outputs(version, data_types, reason):
    trt = _quant_tensorrt(version, {}, data_types)
    assert registry.quant_refusal(trt, {"float8_e4m3fn", "int8"}) == reason
    int8_from = (10, 0)
    int8_reason = None if registry.tensorrt_release(trt) >= int8_from else reason.replace("10.1", "10.0")
    int8_reason = int8_reason and int8_reason.replace("FP8", "INT8")
    assert registry.quant_refusal(trt, {"int8"}) == int8_reason
    del trt.IPluginV3
    if reason is None:
        assert registry.quant_refusal(trt, {"int8"}) == (
            f"TensorRT {version} has no IPluginV3, the plugin interface whose FP8 and INT8 outputs TensorRT documents"
        )


def test_a_quantized_model_on_a_tensorrt_without_quantized_plugin_outputs_is_one_line_before_any_work(
    tmp_path, monkeypatch
):
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=False)
    _use_tensorrt(monkeypatch, _quant_tensorrt("9.3.0", calls))
    fused = save_model_file(_quantized(tiny_lm(np.float16, fused=True), FP8_OUTPUT), tmp_path / "m.fused.onnx")
    options = BuildOptions(profiles=(PROFILE,), plugins=PluginKind.PYTHON)
    with pytest.raises(MissingDependencyError) as error:
        build.build_engine(load_model(fused), tmp_path / "m.engine", options)
    assert str(error.value) == (
        f"{fused}: TensorRT 9.3.0 predates 10.1, the first TensorRT that documents FP8 plugin outputs "
        "(IPluginV3); its quantized trtfuse nodes output FP8 or INT8"
    )
    assert calls == {} and not (tmp_path / "m.engine").exists()


@pytest.mark.parametrize("plugins", [PluginKind.PYTHON, PluginKind.AOT])
@pytest.mark.parametrize(("version", "flags"), [("10.14.1", 1 << 1), ("11.1.0", 0)])
def test_a_quantized_model_builds_strongly_typed_with_no_precision_flag(tmp_path, monkeypatch, plugins, version, flags):
    """FP8 / INT8 plugin outputs in a strongly typed network: STRONGLY_TYPED below TensorRT 11 (always from 11), and
    no builder flag set but TF32's clearing (the fake's BuilderConfig records every flag)."""
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=True)
    trt = _quant_tensorrt(version, calls)
    if version.startswith("11"):
        trt.NetworkDefinitionCreationFlag = fakes_trt.AotFlags11
    _use_tensorrt(monkeypatch, trt)
    from trtfuse.plugins import qdp

    monkeypatch.setattr(qdp, "take_embedded_ptx_isas", lambda: ["8.8"])
    fused = save_model_file(_quantized(tiny_lm(np.float16, fused=True), FP8_OUTPUT), tmp_path / "m.fused.onnx")
    options = BuildOptions(profiles=(PROFILE,), plugins=plugins)
    result = build.build_engine(load_model(fused), tmp_path / "m.engine", options)
    prefer_aot = {"10": 1 << 3, "11": 1 << 2}[version.split(".")[0]] if plugins is PluginKind.AOT else 0
    assert calls["flags"] == flags | prefer_aot
    assert result.sidecar["build"]["strongly_typed"] is True
    assert result.sidecar["plugins"][-1]["name"] == contract.RMS_NORM_QUANT_OP


def test_the_quantized_output_dtypes_are_the_output_stages():
    from trtfuse.model.onnx_file import LoadedModel

    model = _quantized(tiny_lm(np.float16, fused=True), FP8_OUTPUT)
    assert build.quantized_output_dtypes(LoadedModel(model, Path("m.onnx"))) == {"float8_e4m3fn"}
    rsqrt_only = _quantized(tiny_lm(np.float16, fused=True), INT8_RSQRT)
    assert build.quantized_output_dtypes(LoadedModel(rsqrt_only, Path("m.onnx"))) == set()
    assert build.quantized_output_dtypes(LoadedModel(tiny_lm(np.float16, fused=True), Path("m.onnx"))) == set()


@pytest.mark.parametrize(("arch", "refused"), [("sm_86", True), ("sm_89", False), ("sm_90a", False)])
def test_fp8_nodes_on_a_gpu_older_than_sm_89_are_one_line_before_any_work(tmp_path, monkeypatch, arch, refused):
    from trtfuse.kernels import device

    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=False)
    _use_tensorrt(monkeypatch, _quant_tensorrt("10.8.0", calls))
    monkeypatch.setattr(device, "current_device", lambda: device.DeviceInfo(arch, 84, True))
    fused = save_model_file(_quantized(tiny_lm(np.float16, fused=True), FP8_OUTPUT), tmp_path / "m.fused.onnx")
    if not refused:
        assert build.refuse_fp8_on_older_gpus(load_model(fused)) is None
        return
    options = BuildOptions(profiles=(PROFILE,), plugins=PluginKind.PYTHON)
    with pytest.raises(MissingDependencyError) as error:
        build.build_engine(load_model(fused), tmp_path / "m.engine", options)
    (name,) = build.fp8_nodes(load_model(fused))
    assert (
        str(error.value)
        == f"{fused}: node '{name}' quantizes to FP8: FP8 needs a GPU of sm_89 or newer and this one is sm_86"
    )
    assert calls == {} and not (tmp_path / "m.engine").exists()
    int8 = save_model_file(_quantized(tiny_lm(np.float16, fused=True), INT8_RSQRT), tmp_path / "i.fused.onnx")
    assert build.fp8_nodes(load_model(int8)) == []


def _inspecting_tensorrt(monkeypatch, layer_fixture: str) -> tuple[dict, str]:
    """A TensorRT stand-in of 10.16 with FP8 and INT8 plugin outputs and AOT plugins on an sm_90a GPU, whose engine
    inspector answers the layer-information fixture `layer_fixture` (tests/engine/layer_info); its calls and that
    text."""
    from trtfuse.kernels import device
    from trtfuse.plugins import qdp

    from support.layer_info import LAYER_INFO

    calls: dict = {}
    layers = (LAYER_INFO / layer_fixture).read_text(encoding="utf-8")
    _aot_modules(monkeypatch, calls, has_aot=True)
    monkeypatch.setattr(qdp, "take_embedded_ptx_isas", lambda: ["8.8"])
    monkeypatch.setattr(device, "current_device", lambda: device.DeviceInfo("sm_90a", 132, True))
    trt = _quant_tensorrt("10.16.1", calls)
    trt.Runtime = fakes_trt.fake_tensorrt("10.16.1", calls, layer_information=layers).Runtime
    _use_tensorrt(monkeypatch, trt)
    return calls, layers


@pytest.mark.parametrize(("fixture", "passed"), [("qwen3-fp8.folded.trt10", True), ("qwen3-fp8.unfolded.trt10", False)])
def test_every_build_records_detailed_layers_and_reports_the_folds(tmp_path, monkeypatch, fixture, passed):
    """The builder config asks for detailed layer information (ProfilingVerbosity.DETAILED), the engine inspector's
    JSON goes beside the engine as trtexec writes it, and its report on the quantized nodes into the sidecar. The
    inspector's answer is a layer-information fixture in TensorRT 10's shape (tests/engine/layer_info/README.md)."""
    from trtfuse.engine.sidecar import layer_information_path

    from support.layer_info import fused_model

    calls, layers = _inspecting_tensorrt(monkeypatch, f"{fixture}.layers.json")
    fused = fused_model("qwen3-fp8", tmp_path)
    result = build.build_engine(fused, tmp_path / "m.engine", BuildOptions(profiles=(PROFILE,)), emit=lambda _: None)
    assert calls["profiling_verbosity"] == 2, "ProfilingVerbosity.DETAILED"
    assert calls["deserialized"] == b"engine" and calls["layer_information_format"] == 1, "JSON of the built engine"
    assert layer_information_path(result.engine_path).read_text(encoding="utf-8") == layers, "written as is"
    report = result.sidecar["engine_report"]
    assert report["passed"] is passed
    assert json.loads(result.sidecar_path.read_text())["engine_report"] == report
    assert bool(report["unfolded"]) is not passed
    if not passed:
        assert result.engine_report.unfolded_nodes == tuple(report["unfolded"])


def test_a_build_whose_engine_cannot_be_inspected_still_writes_the_engine(tmp_path, monkeypatch):
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=False)
    trt = fakes_trt.fake_tensorrt("10.16.1", calls)
    trt.Runtime = lambda logger: types.SimpleNamespace(deserialize_cuda_engine=lambda data: None)
    _use_tensorrt(monkeypatch, trt)
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    lines: list[str] = []
    result = build.build_engine(
        load_model(fused), tmp_path / "m.engine", BuildOptions(profiles=(PROFILE,)), lines.append
    )
    assert result.engine_path.read_bytes() == b"engine"
    assert result.layer_information is None and "engine_report" not in result.sidecar
    assert any(line.startswith("the engine's layer information could not be read") for line in lines)


@pytest.mark.parametrize("strict", [False, True])
def test_compile_warns_of_an_unfolded_dequantize_and_strict_folds_exits_1(tmp_path, monkeypatch, strict):
    """The ModelOpt FP8 export compiled, the engine's layer information (a TensorRT 10 fixture) showing two
    dequantizes left standing: a warning names the nodes; --strict-folds makes it exit 1 with the engine written."""
    from trtfuse.engine.sidecar import layer_information_path

    from support.paths import TOOL_FIXTURES

    _inspecting_tensorrt(monkeypatch, "qwen3-fp8.unfolded.trt10.layers.json")
    engine = tmp_path / "m.engine"
    # The fixture's node names are those of the fusion in tests/support/layer_info.py: the same export, same pass.
    args = ["compile", str(TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"), "-o", str(engine), "--profile", "prefill"]
    result = CliRunner().invoke(cli, [*args, *(["--strict-folds"] if strict else [])])
    assert result.exit_code == (1 if strict else 0), result.output
    (warned,) = [line for line in result.stderr.splitlines() if "trtfuse: warning:" in line]
    assert "reach a GEMM through a dequantize or reformat left standing" in warned
    assert "mul_382_DequantizeLinear" in warned and "mul_726_DequantizeLinear" in warned
    assert f"(layers: {layer_information_path(engine)})" in warned
    assert engine.is_file() and layer_information_path(engine).is_file()


def test_compile_again_replaces_its_layer_information_but_not_a_users_file(tmp_path, monkeypatch):
    """The sidecar lists the files trtfuse wrote beside the engine; a later compile replaces those, while a file
    of the user's at that path (trtexec's own export, say) needs --force."""
    calls: dict = {}
    _aot_modules(monkeypatch, calls, has_aot=False)
    _use_tensorrt(monkeypatch, fakes_trt.fake_tensorrt("10.8.0", calls))
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    engine = tmp_path / "m.engine"
    layers = tmp_path / "m.engine.layers.json"
    args = ["compile", str(original), "-o", str(engine)]
    first = CliRunner().invoke(cli, args)
    assert first.exit_code == 0, first.output
    assert json.loads((tmp_path / "m.engine.json").read_text())["files"] == [layers.name]
    again = CliRunner().invoke(cli, args)
    assert again.exit_code == 0, again.output
    layers.write_text('{"Layers": [], "Bindings": []}')  # what the user's trtexec wrote there
    (tmp_path / "m.engine.json").unlink()
    engine.unlink()
    refused = CliRunner().invoke(cli, args)
    assert refused.exit_code == 2, refused.output
    assert str(layers) in refused.output and "--force" in refused.output
    assert layers.read_text() == '{"Layers": [], "Bindings": []}'
    assert CliRunner().invoke(cli, [*args, "--force"]).exit_code == 0
