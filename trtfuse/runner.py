"""Run a trtfuse engine (an `EngineFile`) through Polygraphy's TrtRunner; a Python-plugin engine's plugins are
registered first, an AOT engine needs none (`engine_file.tensorrt_for` decides)."""

from __future__ import annotations

import io
import statistics
import zipfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtfuse.engine_file import EngineFile, PluginKind, import_tensorrt, tensorrt_for
from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError, first_line
from trtfuse.outputs import OutputPlan, write_bytes_atomic
from trtfuse.profiles import Profile

ENGINE_RUNNER = "tensorrt-engine"


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


def profile_for_feed(profiles: Sequence[Profile], feed: Mapping[str, np.ndarray]) -> int:
    """The first profile whose ranges hold every fed shape; raises naming an input that no profile holds."""
    if not profiles:
        return 0
    for index, profile in enumerate(profiles):
        if profile_holds(profile, feed):
            return index
    outside = [name for name, array in feed.items() if not any(_shape_fits(p, name, array.shape) for p in profiles)]
    # When every shape fits some profile but no profile fits them all, the first input is as good a culprit as any.
    name = outside[0] if outside else next(iter(feed))
    shape = "x".join(str(dim) for dim in feed[name].shape)
    ranges = "; ".join(f"{p.name}: {p.shapes[name]}" for p in profiles if name in p.shapes)
    raise OptionError(
        "shape",
        f"input '{name}' of shape {shape} fits no optimisation profile of the engine together with the other inputs "
        f"({ranges}); pick shapes inside one profile with ",
        Choice("shape"),
        "/",
        Choice("dim"),
    )


def profile_holds(profile: Profile, feed: Mapping[str, np.ndarray]) -> bool:
    """Whether every fed shape lies in the profile's ranges."""
    return all(_shape_fits(profile, name, array.shape) for name, array in feed.items())


def _shape_fits(profile: Profile, name: str, shape: tuple[int, ...]) -> bool:
    if name not in profile.shapes:
        return True
    ranges = profile.shapes[name]
    return len(shape) == len(ranges.min) and all(
        low <= dim <= high for dim, low, high in zip(shape, ranges.min, ranges.max, strict=True)
    )


def load_feed(path: Path) -> dict[str, np.ndarray]:
    """Inputs saved with numpy.savez: one array per input name."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            return {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise TrtfuseError(f"{path}: not a readable .npz of input arrays ({error})") from None


def save_arrays(path: Path, arrays: Mapping[str, np.ndarray]) -> None:
    """Arrays as an .npz (the format `load_feed` reads), written atomically."""
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    write_bytes_atomic(path, buffer.getbuffer())


def engine_loader(engine: EngineFile) -> Callable[[], object]:
    """A Polygraphy-style loader: calling it readies TensorRT for the engine's plugin kind (`tensorrt_for`), then
    deserialises the engine."""
    engine_path = engine.path
    if not engine_path.is_file():
        raise TrtfuseError(f"{engine_path}: no such engine file")

    def load() -> object:
        tensorrt_for(engine)
        from polygraphy.backend.common import BytesFromPath
        from polygraphy.backend.trt import EngineFromBytes
        from polygraphy.exception import PolygraphyException

        try:
            return EngineFromBytes(BytesFromPath(str(engine_path)))()
        except PolygraphyException as error:
            raise TrtfuseError(
                f"{engine_path}: TensorRT cannot deserialise the engine ({first_line(error)}); its sidecar records "
                "the TensorRT version and GPU it was built for"
            ) from None

    return load


def trt_runner(engine: EngineFile, profile_index: int = 0) -> object:
    """Polygraphy's TrtRunner over the engine, set to one optimisation profile."""
    loader = engine_loader(engine)
    import_tensorrt()
    try:
        from polygraphy.backend.trt import TrtRunner
    except ImportError:
        raise MissingDependencyError(
            "running an engine takes Polygraphy's TrtRunner; install it with `pip install polygraphy`"
        ) from None
    return TrtRunner(loader, name=ENGINE_RUNNER, optimization_profile=profile_index)


def run_engine(
    engine: EngineFile,
    feed: Mapping[str, np.ndarray],
    iterations: int = 10,
    warmup: int = 2,
) -> RunResult:
    """Run the engine `warmup + iterations` times on `feed` in the profile that holds it; time the last ones."""
    if iterations < 1 or warmup < 0:
        raise TrtfuseError(f"need at least one iteration and no negative warm-up, got {iterations} and {warmup}")
    runner = trt_runner(engine, profile_for_feed(engine.profiles, feed))
    from polygraphy.exception import PolygraphyException

    times = []
    try:
        with runner:
            for _ in range(warmup):
                runner.infer(dict(feed))
            for _ in range(iterations):
                outputs = runner.infer(dict(feed))
                times.append(runner.last_inference_time())
    except PolygraphyException as error:
        raise TrtfuseError(f"{engine.path}: inference failed: {first_line(error)}") from None
    # Copies: Polygraphy may hand out the same host buffers again on the next inference.
    host_outputs = {name: np.array(array, copy=True) for name, array in outputs.items()}
    return RunResult(outputs=host_outputs, timing=TimingSummary.from_seconds(times))


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
) -> EngineRun:
    """`trtfuse run`: the engine file on the inputs file (else a feed generated from its sidecar), the last run's
    outputs saved when asked; checks every path before any work."""
    if not engine_path.is_file():
        raise TrtfuseError(
            f"{engine_path}: no such engine file" if not engine_path.exists() else f"{engine_path}: not a file"
        )
    OutputPlan().read(engine_path).read(*([inputs_path] if inputs_path else [])).write(
        "outputs file", save_outputs
    ).check()
    engine = EngineFile.open(engine_path)
    feed = load_feed(inputs_path) if inputs_path else engine.generated_feed(seed, shapes=shapes, dims=dims)
    result = run_engine(engine, feed, iterations=iterations, warmup=warmup)
    if save_outputs is not None:
        save_arrays(save_outputs, result.outputs)
    return EngineRun(engine_path=engine_path, feed=feed, result=result, plugin_kind=engine.plugin_kind)
