"""GPU: the A/B's CUDA layer (`trtfuse.engine.cuda_timing`) on real CUDA work, with cupy kernels in TensorRT's place:
a run captured into a CUDA graph and replayed, the fallback to eager runs where a capture fails (TensorRT says no,
or the work breaks the capture), event timing that tells a run from one twice as long, the paired-rounds verdict
on them, and the GPU memory reading. TensorRT itself is not here (tests/engine/test_ab_tensorrt.py needs it)."""

from __future__ import annotations

import contextlib

import pytest

cupy = pytest.importorskip("cupy", reason="cupy is not installed")
pytest.importorskip("cuda.bindings.runtime", reason="cuda-python is not installed")

from trtfuse.engine.ab import TimingSettings, paired_rounds, runs_per_batch  # noqa: E402
from trtfuse.engine.ab_stats import Verdict, compare_rounds  # noqa: E402
from trtfuse.engine.cuda_timing import (  # noqa: E402
    DeviceBuffer,
    cuda_stream,
    gpu_memory_in_use,
    prepare_replay,
    round_ms,
    synchronize,
    time_replays_ms,
)


def _has_gpu() -> bool:
    try:
        return cupy.cuda.runtime.getDeviceCount() > 0
    except cupy.cuda.runtime.CUDARuntimeError:
        return False


pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not _has_gpu(), reason="needs a CUDA GPU (run with `python3 -m pytest -m gpu`)"),
]

# 64 Mi float32 (256 MiB) each way: far past the L2 cache, a few hundred microseconds per pass on a Hopper GPU.
ELEMENTS = 64 << 20

ADD_ONE = cupy.RawKernel(
    r"""
extern "C" __global__ void add_one(const float* x, float* y, long long n, int passes) {
    for (int pass = 0; pass < passes; ++pass) {
        for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
             i += (long long)gridDim.x * blockDim.x) {
            y[i] = x[i] + 1.0f + 0.0f * pass;
        }
    }
}
""",
    "add_one",
)


def _enqueue(x, y, passes: int = 1, refuse_capture: bool = False, sync_in_capture: bool = False):
    """An Enqueue of `passes` passes of y = x + 1 on the given stream, as TensorRT's execute_async_v3 is one."""

    def enqueue(handle: int) -> bool:
        stream = cupy.cuda.ExternalStream(handle)
        capturing = stream.is_capturing()
        if capturing and refuse_capture:
            return False
        with stream:
            ADD_ONE((1024,), (256,), (x, y, cupy.int64(x.size), cupy.int32(passes)))
            if capturing and sync_in_capture:
                # Not allowed while capturing: CUDA refuses it and invalidates the capture, which the enqueue does
                # not notice (as a TensorRT layer that breaks capture may not).
                with contextlib.suppress(cupy.cuda.runtime.CUDARuntimeError):
                    stream.synchronize()
        return True

    return enqueue


def _poisoned(size: int = ELEMENTS):
    x = cupy.random.standard_normal(size, dtype=cupy.float32)
    y = cupy.full(size, cupy.nan, dtype=cupy.float32)
    return x, y


def test_a_run_is_captured_replayed_and_writes_every_output():
    x, y = _poisoned()
    with cuda_stream() as stream:
        replay = prepare_replay(_enqueue(x, y), stream)
        try:
            assert replay.graph, "a plain kernel launch is capturable"
            y.fill(cupy.nan)
            cupy.cuda.runtime.deviceSynchronize()
            replay.launch()
            synchronize(stream)
            assert bool(cupy.all(y == x + 1)), "the graph replay computed every element"
            assert time_replays_ms(replay, 5) > 0.0
        finally:
            replay.release()


@pytest.mark.parametrize("breaks", ["refused", "invalidated"])
def test_a_run_that_cannot_be_captured_is_timed_eagerly(breaks):
    x, y = _poisoned(1 << 20)
    enqueue = _enqueue(x, y, refuse_capture=breaks == "refused", sync_in_capture=breaks == "invalidated")
    with cuda_stream() as stream:
        replay = prepare_replay(enqueue, stream)
        assert not replay.graph
        y.fill(cupy.nan)
        cupy.cuda.runtime.deviceSynchronize()
        replay.launch()
        synchronize(stream)
        assert bool(cupy.all(y == x + 1))
        assert time_replays_ms(replay, 3) > 0.0
    # The failed capture left no error behind for the next CUDA call.
    assert gpu_memory_in_use() > 0


def test_timing_tells_a_run_from_one_twice_as_long_and_the_rounds_say_slower():
    x, y = _poisoned()
    with cuda_stream() as stream:
        once = prepare_replay(_enqueue(x, y, passes=1), stream)
        twice = prepare_replay(_enqueue(x, y, passes=2), stream)
        try:
            settings = TimingSettings()
            runs = runs_per_batch(round_ms(once, 1, 1), settings)
            one, two = (round_ms(replay, runs, 3) for replay in (once, twice))
            assert 1.6 < two / one < 2.4, (one, two)
            baseline, candidate = paired_rounds(lambda: round_ms(once, runs, 3), lambda: round_ms(twice, runs, 3), 8)
            comparison = compare_rounds(baseline, candidate)
            assert comparison.verdict is Verdict.SLOWER
            assert comparison.ratio == pytest.approx(2.0, rel=0.2)
        finally:
            once.release()
            twice.release()


def test_gpu_memory_in_use_sees_an_allocation_and_its_release():
    before = gpu_memory_in_use()
    buffer = DeviceBuffer(512 << 20)
    try:
        assert gpu_memory_in_use() - before >= 500 << 20
    finally:
        buffer.free()
    assert gpu_memory_in_use() - before < 64 << 20
