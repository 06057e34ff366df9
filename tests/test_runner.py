"""Engine runner: profile choice, feeds, timing summary and sidecar use in CI; running an engine where TensorRT is."""

import importlib.util
import json

import numpy as np
import pytest
from click.testing import CliRunner
from test_compare import save_model_file, tiny_lm

from trtfuse.build import BuildOptions, make_sidecar, tool_versions
from trtfuse.cli.engine_commands import compile_command, run_command
from trtfuse.cli.main import TrtfuseGroup
from trtfuse.cli.options import EXIT_MISSING_DEPENDENCY
from trtfuse.engine_file import EngineFile, write_engine
from trtfuse.errors import MissingDependencyError, OptionError, TrtfuseError
from trtfuse.profiles import Profile, ShapeRange
from trtfuse.runner import (
    TimingSummary,
    load_feed,
    profile_for_feed,
    run_engine,
    save_arrays,
)

HAS_TENSORRT = importlib.util.find_spec("tensorrt") is not None
DECODE = Profile("decode", {"input_ids": ShapeRange((1, 1), (1, 1), (4, 1))})
PREFILL = Profile("prefill", {"input_ids": ShapeRange((1, 2), (1, 64), (1, 128))})


def _cli() -> TrtfuseGroup:
    return TrtfuseGroup(commands={"compile": compile_command, "run": run_command})


def _engine_with_sidecar(tmp_path, profiles=(DECODE, PREFILL)):
    """A fused model and a sidecar as `compile` writes them; the engine bytes are a stand-in, never deserialised."""
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    engine = tmp_path / "m.engine"
    sidecar = make_sidecar(
        engine_path=engine,
        fused_model_path=fused,
        versions=tool_versions("none"),
        gpu="none",
        plugins=[],
        options=BuildOptions(profiles=profiles),
    )
    write_engine(engine, b"not an engine", sidecar)
    return engine


def _feed(*shape):
    return {"input_ids": np.zeros(shape, np.int64)}


def test_profile_for_feed_picks_the_first_that_holds_every_input():
    assert profile_for_feed([DECODE, PREFILL], _feed(3, 1)) == 0
    assert profile_for_feed([DECODE, PREFILL], _feed(1, 100)) == 1
    assert profile_for_feed([], _feed(9, 9)) == 0


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
    save_arrays(tmp_path / "feed.npz", arrays)
    loaded = load_feed(tmp_path / "feed.npz")
    assert loaded.keys() == arrays.keys()
    assert all(np.array_equal(loaded[name], arrays[name]) for name in arrays)
    (tmp_path / "bad.npz").write_text("nope")
    with pytest.raises(TrtfuseError, match=r"bad\.npz: not a readable \.npz"):
        load_feed(tmp_path / "bad.npz")


def test_generated_feed_uses_the_first_profile_opt_shapes_and_vocabulary(tmp_path):
    engine = _engine_with_sidecar(tmp_path, profiles=(PREFILL, DECODE))
    feed = EngineFile.open(engine).generated_feed(seed=1)
    assert feed["input_ids"].shape == (1, 64)
    assert feed["input_ids"].dtype == np.int64
    assert feed["input_ids"].min() >= 0
    assert feed["input_ids"].max() < 32
    assert EngineFile.open(engine).generated_feed(seed=1, dims={"batch": 1, "sequence": 3})["input_ids"].shape == (1, 3)


def test_generated_feed_needs_a_sidecar(tmp_path):
    (tmp_path / "m.engine").write_bytes(b"x")
    with pytest.raises(OptionError, match=r"no sidecar beside the engine; give the inputs with inputs"):
        EngineFile.open(tmp_path / "m.engine").generated_feed(seed=0)


def test_run_of_missing_engine_is_bad_input(tmp_path):
    with pytest.raises(TrtfuseError, match=r"no such engine file"):
        run_engine(EngineFile.open(tmp_path / "none.engine"), _feed(1, 1))


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_run_without_tensorrt(tmp_path):
    engine = _engine_with_sidecar(tmp_path)
    with pytest.raises(MissingDependencyError, match=r"`tensorrt` is not installed"):
        run_engine(EngineFile.open(engine), _feed(1, 1))
    result = CliRunner().invoke(_cli(), ["run", str(engine)])
    assert result.exit_code == EXIT_MISSING_DEPENDENCY, result.output
    assert "cannot run" in result.output


def test_run_rejects_bad_iteration_counts(tmp_path):
    engine = _engine_with_sidecar(tmp_path)
    with pytest.raises(TrtfuseError, match=r"need at least one iteration"):
        run_engine(EngineFile.open(engine), _feed(1, 1), iterations=0)


@pytest.mark.gpu
@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TENSORRT, reason="needs the real `tensorrt` module and an NVIDIA GPU (not installable)")
def test_run_engine_on_given_and_generated_inputs(tmp_path):
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    runner = CliRunner()
    assert runner.invoke(_cli(), ["compile", str(original), "--tokens", "1:8:32"]).exit_code == 0
    engine = tmp_path / "model.engine"
    feed = {"input_ids": np.array([[1, 2, 3, 4]], np.int64)}
    result = run_engine(EngineFile.open(engine), feed, iterations=3, warmup=1)
    assert result.outputs["logits"].shape == (1, 4, 8)
    assert result.outputs["logits"].dtype == np.float16
    assert result.timing.runs == 3
    save_arrays(tmp_path / "feed.npz", feed)
    args = ["run", str(engine), "--inputs", str(tmp_path / "feed.npz"), "--save-outputs", str(tmp_path / "out.npz")]
    cli_result = runner.invoke(_cli(), args)
    assert cli_result.exit_code == 0, cli_result.output
    assert "output logits: 1x4x8 float16" in cli_result.output
    assert np.array_equal(load_feed(tmp_path / "out.npz")["logits"], result.outputs["logits"])
    generated = runner.invoke(_cli(), ["run", str(engine), "--iterations", "2"])
    assert generated.exit_code == 0, generated.output
    assert "input  input_ids: 1x8 int64" in generated.output
    assert json.loads((tmp_path / "model.engine.json").read_text())["profiles"][0]["name"] == "tokens 1:8:32"
