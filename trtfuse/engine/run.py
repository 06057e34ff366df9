"""`trtfuse run`: an engine (an `EngineFile`) in an `EngineSession` on given or generated inputs, timed."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtfuse.contract import PluginKind
from trtfuse.engine.engine_file import EngineFile, check_engine_path
from trtfuse.engine.session import EngineSession
from trtfuse.engine.sidecar import sidecar_path_for
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.errors import TrtfuseError
from trtfuse.files import OutputPlan
from trtfuse.model.feed_files import is_trtfuse_archive, read_arrays, write_arrays


@dataclass(frozen=True)
class TimingSummary:
    runs: int
    min_ms: float
    median_ms: float
    mean_ms: float
    max_ms: float

    @staticmethod
    def from_seconds(times: Sequence[float]) -> TimingSummary:
        if not times:
            raise TrtfuseError("no timed runs to summarise; ask for at least one iteration")
        ms = [t * 1e3 for t in times]
        return TimingSummary(len(ms), min(ms), statistics.median(ms), statistics.fmean(ms), max(ms))

    def line(self) -> str:
        # Polygraphy's infer time spans the host-to-device input copies, the execution and the copies back, so the
        # numbers are end-to-end, not the engine's device time.
        return (
            f"{self.runs} runs, end to end (inputs copied in, engine run, outputs copied out): "
            f"min {self.min_ms:.3f} ms, median {self.median_ms:.3f} ms, "
            f"mean {self.mean_ms:.3f} ms, max {self.max_ms:.3f} ms"
        )


@dataclass(frozen=True)
class RunResult:
    outputs: dict[str, np.ndarray]
    timing: TimingSummary


def run_engine(
    engine: EngineFile,
    feed: Mapping[str, np.ndarray],
    iterations: int = 10,
    warmup: int = 2,
) -> RunResult:
    """Run the engine `warmup + iterations` times on `feed` in the profile that holds it; time the last ones."""
    if iterations < 1 or warmup < 0:
        raise TrtfuseError(f"need at least one iteration and no negative warm-up, got {iterations} and {warmup}")
    times = []
    with EngineSession(engine) as session:
        for _ in range(warmup):
            session.infer(feed)
        for _ in range(iterations):
            outputs = session.infer(feed)
            times.append(session.last_inference_time())
    return RunResult(outputs=outputs, timing=TimingSummary.from_seconds(times))


@dataclass(frozen=True)
class EngineRun:
    """What `trtfuse run` reports: the engine, the feed it ran on, its outputs and timings."""

    engine_path: Path
    feed: dict[str, np.ndarray]
    result: RunResult
    plugin_kind: PluginKind = PluginKind.PYTHON

    def to_json(self) -> dict:
        return {
            "engine": str(self.engine_path),
            "plugins": self.plugin_kind.value,
            "inputs": {name: _array_json(array) for name, array in self.feed.items()},
            "outputs": {name: _array_json(array) for name, array in self.result.outputs.items()},
            "timing_ms": vars(self.result.timing),
        }

    def lines(self) -> list[str]:
        arrays = [("input ", self.feed), ("output", self.result.outputs)]
        shapes = [f"{kind} {name}: {_shape_text(array)}" for kind, named in arrays for name, array in named.items()]
        return [*shapes, self.result.timing.line()]


def _array_json(array: np.ndarray) -> dict:
    return {"shape": list(array.shape), "dtype": str(array.dtype)}


def _shape_text(array: np.ndarray) -> str:
    return f"{'x'.join(map(str, array.shape))} {array.dtype}"


def run_engine_file(
    engine_path: Path,
    inputs_path: Path | None,
    seed: int,
    shapes: Mapping[str, Sequence[int]],
    dims: Mapping[str, int],
    *,
    iterations: int,
    warmup: int,
    save_outputs: Path | None,
    force: bool = False,
) -> EngineRun:
    """`trtfuse run`: the engine file on the inputs file (else a feed generated from its sidecar), the last run's
    outputs saved when asked (`force`: over a file trtfuse cannot tell it wrote, `files.OutputPlan`); checks every
    path, and that TensorRT is there, before any work."""
    check_engine_path(engine_path)
    plan = OutputPlan(force).read(engine_path, sidecar_path_for(engine_path), *([inputs_path] if inputs_path else []))
    plan.write("outputs file", save_outputs, ours=is_trtfuse_archive).check_paths()
    engine = EngineFile.open(engine_path)
    plan.read(*engine.files()).check()
    import_tensorrt()
    feed = read_arrays(inputs_path) if inputs_path else engine.generated_feed(seed, shapes=shapes, dims=dims)
    result = run_engine(engine, feed, iterations=iterations, warmup=warmup)
    if save_outputs is not None:
        write_arrays(save_outputs, result.outputs)
    return EngineRun(engine_path=engine_path, feed=feed, result=result, plugin_kind=engine.plugin_kind)
