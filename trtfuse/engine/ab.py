"""The A/B of `compile --baseline`: a trtfuse engine against the engine TensorRT builds from the same export alone,
on one GPU, case by case (`timing_cases`), in paired rounds (`ab_stats`), with each engine's GPU memory and
per-layer profile.

How a case is timed: both engines are loaded, each with its own execution context; the case's feed is bound to
both and each run captured in a CUDA graph where TensorRT allows it (`cuda_timing.prepare_replay`); then `rounds`
rounds, the engines' order alternating, each engine timed in `batches` batches of back-to-back replays (a batch
long enough to dwarf the event timer's resolution) whose median is its time in the round. The per-layer profiles
come after, from `layer_runs` runs with TensorRT's profiler attached, at each profile's OPT shapes. Memory is read
before anything is timed, each engine alone: GPU memory in use after it is loaded and has run every case once,
minus before it was loaded (its weights, its execution context's activation memory, what its plugins load).

The schedule (`paired_rounds`, `runs_per_batch`) is plain Python that the CPU tests run; what touches TensorRT
is `engine_runner`, what touches CUDA `cuda_timing`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from types import ModuleType

from trtfuse.engine.ab_stats import Comparison, compare_rounds
from trtfuse.engine.cuda_timing import cuda_stream, gpu_memory_in_use, prepare_replay, round_ms, synchronize
from trtfuse.engine.engine_runner import LoadedEngine
from trtfuse.engine.layer_profile import LayerTimes, profile_text
from trtfuse.engine.timing_cases import TimingCase
from trtfuse.errors import TrtfuseError

Notify = Callable[[str], None]


def _silent(_line: str) -> None:
    return None


@dataclass(frozen=True)
class TimingSettings:
    """How hard the A/B looks: `rounds` paired rounds per case, each engine's round the median of `batches` batches
    of replays, a batch about `batch_ms` long (at most `max_runs` runs); `layer_runs` profiled runs per profile."""

    rounds: int = 15
    batches: int = 3
    batch_ms: float = 20.0
    max_runs: int = 1000
    layer_runs: int = 20
    use_graph: bool = True

    def to_json(self) -> dict:
        return {
            "rounds": self.rounds,
            "batches": self.batches,
            "batch_ms": self.batch_ms,
            "max_runs": self.max_runs,
            "layer_runs": self.layer_runs,
            "cuda_graphs": self.use_graph,
        }


@dataclass(frozen=True)
class EngineUnderTest:
    """A built engine in memory and what the table calls it."""

    label: str
    engine: bytes | memoryview


@dataclass(frozen=True)
class CaseTiming:
    """One case of the A/B: the comparison (candidate against baseline), how many runs each batch held, and whether
    each engine's run was replayed as a CUDA graph (baseline, candidate)."""

    case: TimingCase
    comparison: Comparison
    runs: int
    graphs: tuple[bool, bool]

    def to_json(self) -> dict:
        return {
            **self.case.to_json(),
            **self.comparison.to_json(),
            "runs_per_batch": self.runs,
            "cuda_graph": {"baseline": self.graphs[0], "trtfuse": self.graphs[1]},
        }


@dataclass(frozen=True)
class ProfiledRuns:
    """One engine's per-layer times at one optimisation profile's OPT shapes: each layer TensorRT's profiler
    reported, in engine order, with its time in each of the `count` runs (`layer_profile.LayerTimes`)."""

    profile_index: int
    case: str
    count: int
    layers: tuple[LayerTimes, ...]

    def text(self) -> str:
        """The profile as `trtexec --exportProfile` writes it."""
        return profile_text(self.layers, self.count)


@dataclass(frozen=True)
class PairMeasurement:
    """Everything the A/B measured of one pair: the cases, each engine's GPU memory (bytes; baseline, candidate)
    and per-layer profiles (baseline's, candidate's)."""

    cases: tuple[CaseTiming, ...]
    memory: tuple[int, int]
    layer_profiles: tuple[tuple[ProfiledRuns, ...], tuple[ProfiledRuns, ...]]


def runs_per_batch(one_run_ms: float, settings: TimingSettings) -> int:
    """Runs in a batch of about `settings.batch_ms`, from one run's time; at least 1, at most `max_runs`."""
    if one_run_ms <= 0.0 or not math.isfinite(one_run_ms):
        return settings.max_runs
    return max(1, min(settings.max_runs, math.ceil(settings.batch_ms / one_run_ms)))


def paired_rounds(
    time_baseline: Callable[[], float], time_candidate: Callable[[], float], rounds: int
) -> tuple[list[float], list[float]]:
    """`rounds` rounds of both timers, the baseline first in even rounds and the candidate first in odd ones, so a
    drift of the clocks within a round reaches both alike."""
    baseline: list[float] = []
    candidate: list[float] = []
    for index in range(rounds):
        order = ((baseline, time_baseline), (candidate, time_candidate))
        for times, timer in order if index % 2 == 0 else reversed(order):
            times.append(timer())
    return baseline, candidate


def engine_memory(trt: ModuleType, engine: EngineUnderTest, cases: Sequence[TimingCase]) -> int:
    """GPU memory the engine takes alone: in use after loading it and running every case once, minus before."""
    before = gpu_memory_in_use()
    with cuda_stream() as stream, LoadedEngine(trt, engine.engine, engine.label, stream) as loaded:
        peak = before
        for case in cases:
            bound = loaded.bind(case)
            try:
                if not bound.enqueue(stream):
                    raise TrtfuseError(f"{engine.label}: TensorRT could not run the {case.name} case (its log above)")
                synchronize(stream)
                peak = max(peak, gpu_memory_in_use())
            finally:
                bound.release()
    return peak - before


def _time_case(loaded: tuple[LoadedEngine, LoadedEngine], case: TimingCase, settings: TimingSettings) -> CaseTiming:
    """One case on both loaded engines: bound, captured, then timed in paired rounds."""
    with ExitStack() as stack:
        replays = []
        for engine in loaded:
            bound = engine.bind(case)
            stack.callback(bound.release)
            replay = prepare_replay(bound.enqueue, engine.stream, settings.use_graph)
            stack.callback(replay.release)
            replays.append(replay)
        # The batch size from the slower engine's single run, the same for both.
        runs = min(runs_per_batch(round_ms(replay, 1, 1), settings) for replay in replays)
        baseline, candidate = paired_rounds(
            lambda: round_ms(replays[0], runs, settings.batches),
            lambda: round_ms(replays[1], runs, settings.batches),
            settings.rounds,
        )
        return CaseTiming(case, compare_rounds(baseline, candidate), runs, (replays[0].graph, replays[1].graph))


def _profiled_runs(engine: LoadedEngine, case: TimingCase, runs: int) -> ProfiledRuns:
    bound = engine.bind(case)
    try:
        layers, count = engine.layer_times(bound, runs)
    finally:
        bound.release()
    return ProfiledRuns(case.profile_index, case.name, count, layers)


def measure_pair(
    trt: ModuleType,
    baseline: EngineUnderTest,
    candidate: EngineUnderTest,
    cases: Sequence[TimingCase],
    settings: TimingSettings = TimingSettings(),
    notify: Notify = _silent,
) -> PairMeasurement:
    """The A/B of two engines built from one export over `cases` (the first case of each profile is its OPT case,
    which the per-layer profiles use)."""
    memory = []
    for engine in (baseline, candidate):
        notify(f"loading {engine.label} alone to read its GPU memory")
        memory.append(engine_memory(trt, engine, cases))
    timings = []
    profiles: tuple[list[ProfiledRuns], list[ProfiledRuns]] = ([], [])
    with ExitStack() as stack:
        loaded = tuple(
            stack.enter_context(LoadedEngine(trt, engine.engine, engine.label, stack.enter_context(cuda_stream())))
            for engine in (baseline, candidate)
        )
        for case in cases:
            notify(f"timing {case.name}: {settings.rounds} rounds of {baseline.label} and {candidate.label}")
            timings.append(_time_case(loaded, case, settings))
        opt_cases = {case.profile_index: case for case in reversed(cases)}
        for index in sorted(opt_cases):
            notify(f"per-layer profile of {opt_cases[index].name} ({settings.layer_runs} runs of each engine)")
            for engine, found in zip(loaded, profiles, strict=True):
                found.append(_profiled_runs(engine, opt_cases[index], settings.layer_runs))
    return PairMeasurement(tuple(timings), (memory[0], memory[1]), (tuple(profiles[0]), tuple(profiles[1])))
