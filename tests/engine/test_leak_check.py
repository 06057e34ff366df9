"""`trtfuse run --leak-check N` (NVIDIA/TensorRT#4849): the schedule, the measurement's arithmetic, the verdict and
the command on a simulated GPU in CI; the real CUDA and TensorRT layer where TensorRT is."""

import contextlib
import itertools
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trtfuse.cli.main import cli
from trtfuse.cli.options import EXIT_MISSING_DEPENDENCY
from trtfuse.engine import leak_check
from trtfuse.engine.engine_file import EngineFile, PluginKind
from trtfuse.engine.leak_check import (
    LeakCheckReport,
    LeakMeasurement,
    feeds_by_tokens,
    leak_check_engine_file,
    measure_leak,
    token_range,
    token_schedule,
)
from trtfuse.engine.profiles import DimRange, Profile, ShapeRange, derive_profiles, request_from_options
from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.model.dims import model_dims

from support.engines import engine_with_sidecar
from support.kv_models import optimum_model
from support.markers import HAS_TENSORRT
from support.models import save_model_file, tiny_lm

MIB = 1 << 20
DECODE = Profile("decode", {"input_ids": ShapeRange((1, 1), (2, 1), (2, 1))})
PREFILL = Profile("prefill", {"input_ids": ShapeRange((1, 2), (2, 16), (2, 64))})


@pytest.mark.parametrize(("low", "high", "changes"), [(1, 64, 10), (1, 2, 5), (2, 4096, 300), (5, 9, 1)])
def test_the_schedule_changes_the_token_count_every_run_and_spans_the_range(low, high, changes):
    counts = token_schedule(low, high, changes)
    assert len(counts) == changes + 1
    assert all(a != b for a, b in itertools.pairwise(counts))
    distinct = sorted(set(counts))
    assert len(distinct) <= leak_check.MAX_TOKEN_COUNTS
    assert all(low <= count <= high for count in counts)
    if changes + 1 >= leak_check.MAX_TOKEN_COUNTS:
        assert (distinct[0], distinct[-1]) == (low, high)


def test_the_schedule_comes_back_to_counts_it_used():
    assert token_schedule(1, 2, 5) == [1, 2, 1, 2, 1, 2]
    counts = token_schedule(1, 4096, 100)
    assert counts[:8] == counts[8:16], "a cycle, so #4849's growth on shapes used before shows"


def test_the_schedule_needs_changes_and_a_range():
    with pytest.raises(TrtfuseError, match="at least one token-count change, got 0"):
        token_schedule(1, 8, 0)
    with pytest.raises(TrtfuseError, match=r"needs a token range, got 1\.\.1"):
        token_schedule(1, 1, 4)


class _SimulatedGpu:
    """Device memory as #4849 describes it: a session allocates buffers and frees them on teardown; the first session
    of the process loads libraries that stay; each token-count change in a context leaks `leak_per_change`."""

    def __init__(self, leak_per_change: int, one_time: int = 300 * MIB, buffers: int = 64 * MIB) -> None:
        self.in_use = 1000 * MIB
        self.leak_per_change = leak_per_change
        self.one_time = one_time
        self.buffers = buffers
        self.sessions: list[list[int]] = []
        self.open = False

    def memory_in_use(self) -> int:
        assert not self.open, "memory is read only with every session torn down"
        return self.in_use

    @contextlib.contextmanager
    def session(self):
        if not self.sessions:
            self.in_use += self.one_time
        self.in_use += self.buffers
        self.open = True
        runs: list[int] = []
        self.sessions.append(runs)

        def run(feed):
            tokens = feed["input_ids"].shape[1]
            if runs and runs[-1] != tokens:
                self.in_use += self.leak_per_change
            runs.append(tokens)

        try:
            yield run
        finally:
            self.open = False
            self.in_use -= self.buffers


def _feed_for(tokens: int) -> dict[str, np.ndarray]:
    return {"input_ids": np.zeros((1, tokens), np.int64)}


def _measure(gpu: _SimulatedGpu, counts: list[int]) -> LeakMeasurement:
    return measure_leak(gpu.memory_in_use, gpu.session, counts, _feed_for)


def test_the_measurement_charges_only_the_changes_not_the_one_time_costs():
    gpu = _SimulatedGpu(leak_per_change=96 * 1024)
    counts = token_schedule(1, 64, 50)
    measurement = _measure(gpu, counts)
    reference, changing = gpu.sessions
    assert reference == [1] * len(counts), "as many runs, at one count, with no change"
    assert changing == counts
    assert measurement.changes == 50
    assert measurement.one_time == 300 * MIB
    assert measurement.growth_from_changes == 50 * 96 * 1024
    assert measurement.per_change == 96 * 1024
    assert measurement.total_growth == 300 * MIB + 50 * 96 * 1024, "what #4849 measures: fresh to torn down"


def _report(measurement: LeakMeasurement, kind: PluginKind = PluginKind.AOT) -> LeakCheckReport:
    return LeakCheckReport(Path("m.engine"), kind, "11.1.0", "prefill", measurement)


def test_a_leak_at_or_over_the_threshold_is_reported_as_one():
    measurement = _measure(_SimulatedGpu(leak_per_change=128 * 1024), token_schedule(1, 64, 40))
    report = _report(measurement)
    assert report.leaked
    assert report.verdict() == (
        "LEAK: +5.0 MiB after 40 token-count changes (+128.0 KiB per change) beyond a session without changes, at "
        "or over the 4.0 MiB threshold; NVIDIA/TensorRT#4849 (docs/aot.md says what to do)"
    )
    lines = report.lines()
    assert lines[0] == (
        "leak check of m.engine (aot plugins, TensorRT 11.1.0), profile 'prefill': 40 token-count changes through 8 "
        "counts (1, 10, 19, 28, 37, 46, 55, 64)"
    )
    assert lines[1].startswith("GPU memory in use: 1000.0 MiB before TensorRT; +300.0 MiB after a session at 1 tokens")
    assert lines[2] == report.verdict()


def test_growth_under_the_threshold_is_no_leak_and_says_what_it_could_not_see():
    # One 2 MiB page of rounding (a buffer freed into the driver's cache, say) is not a leak.
    gpu = _SimulatedGpu(leak_per_change=0)
    measurement = _measure(gpu, token_schedule(1, 64, 100))
    shifted = LeakMeasurement(
        measurement.token_counts,
        measurement.before,
        measurement.after_reference,
        measurement.after_reference + leak_check.DRIVER_PAGE_BYTES,
    )
    report = _report(shifted, PluginKind.PYTHON)
    assert not report.leaked
    assert report.verdict() == (
        "no leak: +2.0 MiB after 100 token-count changes (+20.5 KiB per change), under the 4.0 MiB threshold (two "
        "2 MiB driver pages); a leak under 41.0 KiB per change would not show, so give more changes to see one"
    )
    assert not _report(measurement).leaked


def test_the_json_report_holds_every_reading_and_the_verdict():
    measurement = _measure(_SimulatedGpu(leak_per_change=MIB), token_schedule(1, 64, 10))
    data = _report(measurement).to_json()
    assert json.loads(json.dumps(data)) == data
    assert data["plugins"] == "aot" and data["tensorrt"] == "11.1.0" and data["profile"] == "prefill"
    assert data["changes"] == 10 and len(data["token_counts"]) == 11
    assert data["bytes_in_use"] == {
        "before": 1000 * MIB,
        "after_reference": 1300 * MIB,
        "after_changes": 1310 * MIB,
    }
    assert (data["bytes_leaked"], data["bytes_leaked_per_change"]) == (10 * MIB, MIB)
    assert data["bytes_leaked_total"] == 310 * MIB
    assert data["threshold_bytes"] == 4 * MIB
    assert data["leaked"] is True and data["verdict"].startswith("LEAK: ")


def _engine(tmp_path, profiles=(DECODE, PREFILL), model=None, plugins=PluginKind.AOT):
    """An AOT engine's fused model and sidecar as `compile` writes them; the engine bytes are never deserialised."""
    return engine_with_sidecar(tmp_path, profiles, plugins, model)


def test_the_check_runs_in_the_first_profile_whose_token_count_varies(tmp_path):
    engine = EngineFile.open(_engine(tmp_path))
    reading = model_dims(tiny_lm(np.float16, fused=True))
    tokens = token_range(engine, reading)
    assert (tokens.profile_index, tokens.profile.name, tokens.symbols, tokens.low, tokens.high) == (
        1,
        "prefill",
        ("sequence",),
        2,
        64,
    )


def test_a_decode_only_engine_cannot_be_checked(tmp_path):
    engine = EngineFile.open(_engine(tmp_path, profiles=(DECODE,)))
    with pytest.raises(OptionError) as error:
        token_range(engine, model_dims(tiny_lm(np.float16, fused=True)))
    assert "every optimisation profile fixes the token count (decode: 1x1:2x1:2x1)" in str(error.value)
    assert "with a profile whose --tokens range" in error.value.spelled(lambda name: f"--{name}")


def test_a_model_without_a_tokens_dim_cannot_be_checked(tmp_path):
    model = tiny_lm(np.float16, fused=True)
    model.graph.input[0].type.tensor_type.shape.dim[1].dim_param = "s17"
    engine = EngineFile.open(_engine(tmp_path, model=model))
    with pytest.raises(TrtfuseError, match="no input of its model has a tokens dim"):
        token_range(engine, model_dims(model))


def test_kv_cache_feeds_vary_the_tokens_and_keep_every_other_dim_at_the_profiles_opt(tmp_path):
    model = optimum_model()
    request = request_from_options(tokens=[DimRange(1, 4, 8)], past=DimRange(0, 3, 6))
    profiles = tuple(derive_profiles(model, request))
    engine = EngineFile.open(_engine(tmp_path, profiles=profiles, model=model))
    reading = model_dims(model)
    tokens = token_range(engine, reading)
    assert (tokens.low, tokens.high) == (1, 8)
    feeds = feeds_by_tokens(model, reading, 0, tokens, token_schedule(tokens.low, tokens.high, 12))
    assert sorted(feeds) == list(range(1, 9))
    for count, feed in feeds.items():
        assert feed["input_ids"].shape == (2, count)
        assert feed["past_key_values.0.key"].shape[2] == 3, "past at the profile's OPT"
        assert feed["attention_mask"].shape == (2, 3 + count)


def _simulate(monkeypatch, gpu: _SimulatedGpu) -> list:
    """The thin CUDA/TensorRT layer replaced by the simulated GPU; records the profile each session was opened in."""
    profiles = []

    def session(engine, profile_index):
        profiles.append(profile_index)
        return gpu.session()

    monkeypatch.setattr(leak_check, "gpu_memory_in_use", gpu.memory_in_use)
    monkeypatch.setattr(leak_check, "engine_session", session)
    monkeypatch.setattr(leak_check, "import_tensorrt", lambda: type("trt", (), {"__version__": "11.1.0"}))
    return profiles


def test_the_command_reports_a_leak_with_exit_1_and_none_with_0(tmp_path, monkeypatch):
    engine = _engine(tmp_path)
    profiles = _simulate(monkeypatch, _SimulatedGpu(leak_per_change=MIB))
    leaking = CliRunner().invoke(cli, ["run", str(engine), "--leak-check", "20", "--seed", "3"])
    assert leaking.exit_code == 1, leaking.output
    assert profiles == [1, 1]
    lines = leaking.output.splitlines()
    assert len(lines) == 3 and lines[2].startswith("LEAK: +20.0 MiB after 20 token-count changes")
    _simulate(monkeypatch, _SimulatedGpu(leak_per_change=0))
    clean = CliRunner().invoke(cli, ["run", str(engine), "--leak-check", "20", "--json"])
    assert clean.exit_code == 0, clean.output
    data = json.loads(clean.stdout)
    assert data["leaked"] is False and data["changes"] == 20 and data["engine"] == str(engine)


def test_the_core_function_is_the_whole_check(tmp_path, monkeypatch):
    _simulate(monkeypatch, _SimulatedGpu(leak_per_change=0))
    report = leak_check_engine_file(_engine(tmp_path), 9)
    assert report.measurement.changes == 9 and report.plugin_kind is PluginKind.AOT and not report.leaked


@pytest.mark.parametrize(
    "extra",
    [["--inputs", "x.npz"], ["--shape", "input_ids=1x4"], ["--dim", "sequence=4"], ["--iterations", "3"]],
    ids=["inputs", "shape", "dim", "iterations"],
)
def test_the_leak_check_refuses_the_options_of_a_timed_run(tmp_path, extra):
    engine = _engine(tmp_path)
    result = CliRunner().invoke(cli, ["run", str(engine), "--leak-check", "4", *extra])
    assert result.exit_code == 2, result.output
    assert "--leak-check sets the inputs and runs itself; drop --" in result.output


def test_the_leak_check_of_a_missing_engine_is_bad_input(tmp_path):
    result = CliRunner().invoke(cli, ["run", str(tmp_path / "none.engine"), "--leak-check", "4"])
    assert result.exit_code == 2
    assert result.output == f"trtfuse: error: {tmp_path / 'none.engine'}: no such engine file\n"


@pytest.mark.skipif(HAS_TENSORRT, reason="checks the behaviour without TensorRT")
def test_the_leak_check_without_tensorrt_exits_3(tmp_path):
    result = CliRunner().invoke(cli, ["run", str(_engine(tmp_path)), "--leak-check", "4"])
    assert result.exit_code == EXIT_MISSING_DEPENDENCY, result.output
    assert "cannot check" in result.output and "`tensorrt` is not installed" in result.output


def _trtfuse(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "trtfuse.cli.main", *args], capture_output=True, text=True, timeout=1200
    )


@pytest.mark.gpu
@pytest.mark.tensorrt
@pytest.mark.skipif(not HAS_TENSORRT, reason="needs the real `tensorrt` module and an NVIDIA GPU (not installable)")
@pytest.mark.parametrize("plugins", ["aot", "python"])
def test_leak_check_of_a_real_engine(tmp_path, plugins):
    """The real layer: cudaMemGetInfo, the engine deserialised and run in one context over the changes, torn down.
    Whether TensorRT leaks is its own matter (#4849); this checks that the readings and the report are whole. Each
    kind in processes of its own: a process registers one kind of trtfuse plugins."""
    original = save_model_file(tiny_lm(np.float16, fused=False), tmp_path / "model.onnx")
    built = _trtfuse("compile", str(original), "--tokens", "1:8:32", "--plugins", plugins)
    assert built.returncode == 0, built.stderr
    checked = _trtfuse("run", str(tmp_path / "model.engine"), "--leak-check", "12", "--json")
    assert checked.returncode in (0, 1), checked.stderr
    data = json.loads(checked.stdout)
    assert data["plugins"] == plugins and data["changes"] == 12
    assert sorted(set(data["token_counts"]))[::7] == [1, 32]
    assert all(value > 0 for value in data["bytes_in_use"].values())
    assert data["leaked"] is (checked.returncode == 1)
    assert data["verdict"].startswith(("LEAK: ", "no leak: "))


def _has_gpu() -> bool:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        return False
    error, count = cudart.cudaGetDeviceCount()
    return error == cudart.cudaError_t.cudaSuccess and count > 0


# A kernel of a few KiB of machine code (about a trtfuse norm kernel's): 300 steps of load, xor, rotate on a buffer.
_STEPS = "\n".join(
    f"ld.volatile.global.u32 %r2, [%rd2+{4 * (i % 64)}];\nxor.b32 %r1, %r1, %r2;\n"
    f"shf.l.wrap.b32 %r1, %r1, %r1, {i % 31 + 1};"
    for i in range(300)
)
_LEAK_PTX = f""".version 8.0
.target sm_80
.address_size 64
.visible .entry step(.param .u64 p, .param .u32 n)
{{
.reg .b64 %rd<3>;
.reg .b32 %r<3>;
ld.param.u64 %rd1, [p];
ld.param.u32 %r1, [n];
cvta.to.global.u64 %rd2, %rd1;
{_STEPS}
st.global.u32 [%rd2], %r1;
ret;
}}
""".encode()


@contextlib.contextmanager
def _module_per_change(leak: bool):
    """What #4849 describes, with the bare driver: a CUDA module loaded and launched at every token-count change;
    unloaded on teardown unless `leak`."""
    import ctypes

    from cuda.bindings import driver, runtime

    error, buffer = runtime.cudaMalloc(256)
    assert error == runtime.cudaError_t.cudaSuccess
    modules, last = [], []

    def run(feed):
        tokens = feed["input_ids"].shape[1]
        if last and last[-1] != tokens:
            error, module = driver.cuModuleLoadData(_LEAK_PTX)
            assert error == driver.CUresult.CUDA_SUCCESS, error
            error, function = driver.cuModuleGetFunction(module, b"step")
            pointer, count = ctypes.c_uint64(buffer), ctypes.c_uint32(tokens)
            arguments = (ctypes.c_void_p * 2)(ctypes.addressof(pointer), ctypes.addressof(count))
            (error,) = driver.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, 0, ctypes.addressof(arguments), 0)
            assert error == driver.CUresult.CUDA_SUCCESS, error
            modules.append(module)
        last.append(tokens)

    try:
        yield run
    finally:
        runtime.cudaFree(buffer)
        for module in modules if not leak else ():
            driver.cuModuleUnload(module)


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU and cuda-python (run with `python3 -m pytest -m gpu`)")
def test_the_real_readings_see_a_module_leaked_per_change_and_nothing_without_one():
    """cudaMemGetInfo through `gpu_memory_in_use`, on modules of a few KiB of code as #4849 leaks them: on the H200
    each costs 16 KiB, so 1000 changes leak about 16 MiB, and the same modules unloaded leave nothing."""
    counts = token_schedule(1, 64, 1000)
    leaking = measure_leak(leak_check.gpu_memory_in_use, lambda: _module_per_change(leak=True), counts, _feed_for)
    clean = measure_leak(leak_check.gpu_memory_in_use, lambda: _module_per_change(leak=False), counts, _feed_for)
    print(f"leaked modules: {leaking.growth_from_changes} bytes; unloaded: {clean.growth_from_changes} bytes")
    assert _report(leaking).leaked, _report(leaking).verdict()
    assert not _report(clean).leaked, _report(clean).verdict()
