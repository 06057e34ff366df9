"""Running engines: profile choice, feeds, timing summary, sidecar use and the engine session in CI; running an
engine where TensorRT is."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trtfuse.cli.main import cli
from trtfuse.cli.options import EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY
from trtfuse.contract import PluginKind
from trtfuse.engine import session as session_module
from trtfuse.engine import tensorrt as tensorrt_module
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile, ShapeRange, profile_for_feed, profile_holds
from trtfuse.engine.run import TimingSummary, run_engine
from trtfuse.engine.session import EngineSession
from trtfuse.engine.sidecar import sidecar_path_for
from trtfuse.errors import MissingDependencyError, OptionError, TrtfuseError
from trtfuse.model.feed_files import read_arrays, write_arrays

from support.engines import DECODE, PREFILL, engine_with_sidecar
from support.markers import HAS_TENSORRT, NO_TENSORRT
from support.models import save_model_file, tiny_lm


def _feed(*shape):
    return {"input_ids": np.zeros(shape, np.int64)}


def test_profile_for_feed_picks_the_first_that_holds_every_input():
    assert profile_for_feed([DECODE, PREFILL], _feed(3, 1)) == 0
    assert profile_for_feed([DECODE, PREFILL], _feed(1, 100)) == 1
    assert profile_for_feed([], _feed(9, 9)) == 0


def test_profile_holds_every_fed_shape_or_not():
    assert profile_holds(PREFILL, _feed(1, 100))
    assert not profile_holds(DECODE, _feed(1, 100))
    assert profile_holds(DECODE, {"not_in_the_profile": np.zeros((7,), np.int64)})


def test_profile_for_feed_names_the_input_outside_every_profile():
    with pytest.raises(TrtfuseError, match=r"input 'input_ids' of shape 2x100 fits no optimisation profile") as error:
        profile_for_feed([DECODE, PREFILL], _feed(2, 100))
    assert "decode: 1x1:1x1:4x1; prefill: 1x2:1x64:1x128" in str(error.value)


def test_timing_summary():
    summary = TimingSummary.from_seconds([0.003, 0.001, 0.002])
    assert (summary.runs, summary.min_ms, summary.median_ms, summary.max_ms) == (3, 1.0, 2.0, 3.0)
    assert summary.mean_ms == pytest.approx(2.0)
    assert summary.line() == (
        "3 runs, end to end (inputs copied in, engine run, outputs copied out): "
        "min 1.000 ms, median 2.000 ms, mean 2.000 ms, max 3.000 ms"
    )
    with pytest.raises(TrtfuseError, match="no timed runs"):
        TimingSummary.from_seconds([])


def test_feed_npz_round_trip_and_bad_file(tmp_path):
    arrays = {"input_ids": np.arange(6, dtype=np.int64).reshape(1, 6), "mask": np.ones((1, 6), np.bool_)}
    write_arrays(tmp_path / "feed.npz", arrays)
    loaded = read_arrays(tmp_path / "feed.npz")
    assert loaded.keys() == arrays.keys()
    assert all(np.array_equal(loaded[name], arrays[name]) for name in arrays)
    (tmp_path / "bad.npz").write_text("nope")
    with pytest.raises(TrtfuseError, match=r"bad\.npz: not a readable \.npz"):
        read_arrays(tmp_path / "bad.npz")


def test_generated_feed_uses_the_first_profile_opt_shapes_and_vocabulary(tmp_path):
    engine = engine_with_sidecar(tmp_path, profiles=(PREFILL, DECODE))
    feed = EngineFile.open(engine).generated_feed(seed=1)
    assert feed["input_ids"].shape == (1, 64)
    assert feed["input_ids"].dtype == np.int64
    assert feed["input_ids"].min() >= 0
    assert feed["input_ids"].max() < 32
    assert EngineFile.open(engine).generated_feed(seed=1, dims={"batch": 1, "sequence": 3})["input_ids"].shape == (1, 3)


_UNFIT_PROFILES = {
    "rank": (Profile("p", {"input_ids": ShapeRange((1, 1, 1), (1, 2, 1), (1, 4, 1))}), r"OPT shape input_ids: .*rank"),
    "empty": (Profile("p", {"input_ids": ShapeRange((0, 1), (0, 2), (1, 4))}), r"OPT shape input_ids=0x2: dim 0"),
    "other input": (Profile("p", {"tokens": ShapeRange((1, 1), (1, 2), (1, 4))}), r"OPT shape names no graph input"),
}


@pytest.mark.parametrize("case", list(_UNFIT_PROFILES))
def test_opt_shapes_the_fused_model_cannot_take_blame_the_sidecar(tmp_path, case):
    profile, problem = _UNFIT_PROFILES[case]
    engine = EngineFile.open(engine_with_sidecar(tmp_path, profiles=(profile,)))
    with pytest.raises(
        TrtfuseError, match=r"m\.engine\.json: profile 'p' does not fit the fused model m\.fused\.onnx"
    ) as error:
        engine.generated_feed(seed=0)
    assert not isinstance(error.value, OptionError)
    assert re.search(problem, str(error.value))


def test_generated_feed_needs_a_sidecar(tmp_path):
    (tmp_path / "m.engine").write_bytes(b"x")
    with pytest.raises(
        OptionError,
        match=r"no sidecar beside the engine \(m\.engine\.json, written by trtfuse compile\) "
        r"to make inputs from; give them with inputs FILE\.npz",
    ):
        EngineFile.open(tmp_path / "m.engine").generated_feed(seed=0)


def test_run_of_missing_engine_is_bad_input(tmp_path):
    with pytest.raises(TrtfuseError, match=r"no such engine file"):
        run_engine(EngineFile.open(tmp_path / "none.engine"), _feed(1, 1))
    (tmp_path / "folder.engine").mkdir()
    with pytest.raises(TrtfuseError, match=r"folder\.engine: is a folder, not an engine file"):
        EngineFile.open(tmp_path / "folder.engine")


@pytest.mark.parametrize("args", [[], ["--leak-check", "2"]])
def test_an_onnx_model_given_as_the_engine_is_named_so_before_tensorrt_is_looked_for(tmp_path, args):
    """`run model.fused.onnx` (the file compile writes beside the engine): the mistake is the file, whether or not
    TensorRT is installed."""
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "model.fused.onnx")
    result = CliRunner().invoke(cli, ["run", str(fused), *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"{fused}: this is an ONNX model, not an engine; build one with trtfuse compile" in result.output
    assert len(result.output.strip().splitlines()) == 1
    with pytest.raises(TrtfuseError, match=r"this is an ONNX model, not an engine"):
        EngineFile.open(fused)


def test_the_sidecar_given_as_the_engine_points_at_the_engine(tmp_path):
    engine = engine_with_sidecar(tmp_path)
    result = CliRunner().invoke(cli, ["run", str(sidecar_path_for(engine))])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"this is a JSON file (a sidecar or a report), not an engine; give the engine it describes, {engine}" in (
        result.output
    )


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_run_without_tensorrt(tmp_path):
    engine = engine_with_sidecar(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"`tensorrt` is not installed"):
        run_engine(EngineFile.open(engine), _feed(1, 1))
    result = CliRunner().invoke(cli, ["run", str(engine)])
    assert result.exit_code == EXIT_MISSING_DEPENDENCY, result.output
    assert "cannot run" in result.output


def test_run_rejects_bad_iteration_counts(tmp_path):
    engine = engine_with_sidecar(tmp_path)
    with pytest.raises(TrtfuseError, match=r"need at least one iteration"):
        run_engine(EngineFile.open(engine), _feed(1, 1), iterations=0)


@pytest.mark.gpu
@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TENSORRT, reason=NO_TENSORRT)
def test_run_engine_on_given_and_generated_inputs(tmp_path):
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    runner = CliRunner()
    # Built in a child process: a build registers one kind of trtfuse plugins, and this process must stay free to
    # load the engine, whichever kind the installed TensorRT's default gives.
    compile_args = [sys.executable, "-m", "trtfuse.cli.main", "compile", str(original), "--tokens", "1:8:32"]
    built = subprocess.run(compile_args, capture_output=True, text=True, timeout=1800)
    assert built.returncode == 0, built.stderr
    engine = tmp_path / "model.engine"
    feed = {"input_ids": np.array([[1, 2, 3, 4]], np.int64)}
    result = run_engine(EngineFile.open(engine), feed, iterations=3, warmup=1)
    assert result.outputs["logits"].shape == (1, 4, 8)
    assert result.outputs["logits"].dtype == np.float16
    assert result.timing.runs == 3
    write_arrays(tmp_path / "feed.npz", feed)
    args = ["run", str(engine), "--inputs", str(tmp_path / "feed.npz"), "--save-outputs", str(tmp_path / "out.npz")]
    cli_result = runner.invoke(cli, args)
    assert cli_result.exit_code == 0, cli_result.output
    assert "output logits: 1x4x8 float16" in cli_result.output
    assert np.array_equal(read_arrays(tmp_path / "out.npz")["logits"], result.outputs["logits"])
    generated = runner.invoke(cli, ["run", str(engine), "--iterations", "2"])
    assert generated.exit_code == 0, generated.output
    assert "input  input_ids: 1x8 int64" in generated.output
    assert json.loads((tmp_path / "model.engine.json").read_text())["profiles"][0]["name"] == "tokens 1:8:32"


def _rewrite_sidecar(engine: Path, edit) -> None:
    """The sidecar as a damaged or hand-edited file would have it: `edit` changes its JSON in place."""
    path = sidecar_path_for(engine)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def test_the_sidecar_decides_the_plugin_kind(tmp_path):
    engine = engine_with_sidecar(tmp_path, plugins=PluginKind.AOT)
    assert EngineFile.open(engine).plugin_kind is PluginKind.AOT
    _rewrite_sidecar(engine, lambda data: data["build"].update(plugins="python"))
    assert EngineFile.open(engine).plugin_kind is PluginKind.PYTHON
    sidecar_path_for(engine).unlink()
    assert EngineFile.open(engine).plugin_kind is PluginKind.PYTHON, "no sidecar: a Python-plugin engine"


@pytest.mark.parametrize("kind", ["cuda", None])
def test_an_unknown_or_missing_plugin_kind_is_one_line_naming_the_sidecar(tmp_path, kind):
    engine = engine_with_sidecar(tmp_path)
    _rewrite_sidecar(engine, lambda data: data["build"].update(plugins=kind))
    with pytest.raises(TrtfuseError, match=rf"m\.engine\.json: 'build\.plugins' is {kind!r}, not aot or python"):
        EngineFile.open(engine)


class _FakeEngineFromBytes:
    def __init__(self, data) -> None:
        self.data = data

    def __call__(self) -> str:
        return "deserialised engine"


@pytest.mark.parametrize(
    ("plugins", "registered"), [(PluginKind.AOT, []), (PluginKind.PYTHON, [PluginKind.PYTHON])], ids=["aot", "python"]
)
def test_loading_an_engine_registers_plugins_only_for_the_python_kind(tmp_path, monkeypatch, plugins, registered):
    """What `trtfuse run`, `compare`, the leak check and the Polygraphy runner load through: the engine session."""
    import polygraphy.backend.trt

    engine = engine_with_sidecar(tmp_path, plugins=plugins)
    calls = []
    monkeypatch.setattr(tensorrt_module, "import_tensorrt", lambda: calls.append("import") or object())
    monkeypatch.setattr(tensorrt_module, "register_plugins", calls.append)
    monkeypatch.setattr(tensorrt_module, "embedded_ptx_problem", lambda engine: None)
    monkeypatch.setattr(polygraphy.backend.trt, "EngineFromBytes", _FakeEngineFromBytes)
    assert EngineSession(EngineFile.open(engine))._load() == "deserialised engine"
    assert calls == ["import", *registered]


FAKE_TENSORRT = '__version__ = "10.14.1.0"\nQuickPluginCreationRequest = object\n'


def test_an_aot_engine_loads_without_importing_trtfuse_plugins(tmp_path):
    """In a fresh process (a stand-in `tensorrt` module on the path): readying TensorRT for an AOT engine, through
    every module that runs engines, imports nothing from trtfuse.plugins and no CuTeDSL or TVM-FFI (the driver check
    of the recorded PTX ISA reads only trtfuse.kernels.device)."""
    engine = engine_with_sidecar(tmp_path, plugins=PluginKind.AOT, ptx_isa=["8.8"])
    (tmp_path / "fake" / "tensorrt").mkdir(parents=True)
    (tmp_path / "fake" / "tensorrt" / "__init__.py").write_text(FAKE_TENSORRT)
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "import trtfuse.engine.compare, trtfuse.engine.leak_check, trtfuse.polygraphy_ext.runners, trtfuse.engine.run\n"
        "from trtfuse.engine.engine_file import EngineFile\n"
        "from trtfuse.engine.tensorrt import tensorrt_for\n"
        f"assert tensorrt_for(EngineFile.open(Path({str(engine)!r}))).__version__ == '10.14.1.0'\n"
        "print(sorted(m for m in sys.modules if m.startswith(('trtfuse.plugins', 'cutlass', 'tvm_ffi'))))\n"
    )
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), *sys.path])}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_running_without_polygraphy_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr(session_module, "import_tensorrt", lambda: object())
    monkeypatch.setitem(sys.modules, "polygraphy.backend.trt", None)
    with pytest.raises(MissingDependencyError, match=r"TrtRunner; install it with `pip install polygraphy`"):
        EngineSession(EngineFile.open(engine_with_sidecar(tmp_path))).__enter__()


def test_run_reports_the_engines_plugin_kind(tmp_path, monkeypatch):
    from trtfuse.engine import run as runner
    from trtfuse.engine.run import RunResult

    engine = engine_with_sidecar(tmp_path, plugins=PluginKind.AOT)
    timing = TimingSummary.from_seconds([0.001])
    monkeypatch.setattr(runner, "import_tensorrt", lambda: object())
    monkeypatch.setattr(runner, "run_engine", lambda engine, feed, **_: RunResult({}, timing))
    run = runner.run_engine_file(engine, None, 0, {}, {}, iterations=1, warmup=0, save_outputs=None)
    assert run.to_json()["plugins"] == "aot"


@pytest.mark.parametrize(
    ("recorded", "driver", "problem"),
    [
        (["8.8"], 13000, None),
        (["8.8", "9.4"], 13000, "ISA 9.4, which needs a CUDA 13.4 driver; this machine's driver is CUDA 13.0"),
        (["8.8"], 12080, "ISA 8.8, which needs a CUDA 12.9 driver; this machine's driver is CUDA 12.8"),
        (["9.4"], None, None),  # no driver to ask
    ],
)
def test_an_aot_engine_whose_ptx_this_driver_cannot_jit_is_refused_in_one_line(
    tmp_path, monkeypatch, recorded, driver, problem
):
    """The H200's CUDA 13.0 driver refused PTX ISA 9.4 (CuTeDSL's CUDA 13 libraries): an engine embedding it would
    fail inside TensorRT with a bare CUDA error."""
    pytest.importorskip("cuda.bindings", reason="cuda-python maps PTX ISA versions to CUDA versions")
    from trtfuse.kernels import device

    engine = engine_with_sidecar(tmp_path, plugins=PluginKind.AOT, ptx_isa=recorded)
    monkeypatch.setattr(device, "driver_version", lambda: driver)
    monkeypatch.setattr(tensorrt_module, "import_tensorrt", lambda: object())
    opened = EngineFile.open(engine)
    if problem is None:
        tensorrt_module.tensorrt_for(opened)
        return
    with pytest.raises(MissingDependencyError) as raised:  # exit 3: this machine lacks a new enough driver
        tensorrt_module.tensorrt_for(opened)
    message = str(raised.value)
    assert "\n" not in message and problem in message and str(engine) in message and "CUDA 12 libraries" in message
