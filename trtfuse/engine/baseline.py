"""`compile --baseline` and `--never-slower`: the engine TensorRT builds from the original export alone, with the
trtfuse engine's profiles, optimisation level, flags and timing cache, timed against it (`ab.measure_pair`); with
`never_slower`, the bounded search of `fusion_choice` over configurations that leave kinds of node to TensorRT.

Every engine here is built in memory; the pipeline writes the one kept (`BaselineRun.kept`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType

from trtfuse.engine.ab import EngineUnderTest, PairMeasurement, TimingSettings, measure_pair
from trtfuse.engine.ab_report import BASELINE_LABEL, TRTFUSE_LABEL, ABReport
from trtfuse.engine.build import FusedBuild, SerializedEngine, build_fused_engine, gpu_name, serialize_network
from trtfuse.engine.fusion_choice import Candidate, FusionChoice, FusionKind, choose_fusion, kinds_present, without
from trtfuse.engine.timing_cases import timing_cases
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.fused_nodes import plugin_node_counts
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.onnx_file import LoadedModel

Notify = Callable[[str], None]


@dataclass(frozen=True)
class BaselineRequest:
    """What the user asked of the A/B: its settings, whether to search for a never-slower fusion, the feeds' seed."""

    settings: TimingSettings = field(default_factory=TimingSettings)
    never_slower: bool = False
    seed: int = 0


@dataclass(frozen=True)
class BaselineRun:
    """The A/B's outcome: the report of the full fusion against TensorRT alone, the search's choice (with
    `never_slower`), and what to write: the kept build, and the fusion that made it where it is not the full one
    (None: the full fusion stays)."""

    report: ABReport
    choice: FusionChoice | None
    kept: FusedBuild
    kept_fusion: FuseResult | None = None


def build_original(
    trt: ModuleType, original: LoadedModel, trtfuse_build: FusedBuild, notify: Notify
) -> SerializedEngine:
    """TensorRT's engine of the original export, as the trtfuse engine was built but with no plugin registered."""
    notify(f"building {BASELINE_LABEL}'s engine of {original.path} (no trtfuse plugin)")
    return serialize_network(trt, original.model, original.path, trtfuse_build.options, None, notify)


def _candidate(left: frozenset[FusionKind], measurement: PairMeasurement) -> Candidate:
    return Candidate(left, {timing.case.name: timing.comparison for timing in measurement.cases})


def compare_with_tensorrt(
    trt: ModuleType,
    original: LoadedModel,
    full: FusedBuild,
    fusion: FusionOptions,
    request: BaselineRequest,
    notify: Notify,
) -> BaselineRun:
    """Build TensorRT alone's engine, time it against `full` (the trtfuse engine of `original` fused as `fusion`
    says), and with `request.never_slower` search for the fastest configuration."""
    baseline = build_original(trt, original, full, notify)
    cases = timing_cases(original.model, full.options.profiles, request.seed)
    alone = EngineUnderTest(BASELINE_LABEL, baseline.engine)
    measurement = measure_pair(
        trt, alone, EngineUnderTest(TRTFUSE_LABEL, full.serialized.engine), cases, request.settings, notify
    )
    report = ABReport(
        gpu=gpu_name(),
        tensorrt=str(trt.__version__),
        settings=request.settings,
        measurement=measurement,
        build_seconds=(baseline.seconds, full.serialized.seconds),
    )
    if not request.never_slower:
        return BaselineRun(report, None, full)
    builds: dict[frozenset[FusionKind], tuple[FusedBuild, FuseResult]] = {}

    def measure(left: frozenset[FusionKind]) -> Candidate:
        options = without(fusion, left)
        flags = " ".join(kind.value for kind in FusionKind if kind in left)
        notify(f"--never-slower: building and timing the fusion with {flags}")
        result = fuse_model(original.model, options, original.path)
        built = build_fused_engine(trt, LoadedModel(result.model, full.fused.path), full.options, notify)
        builds[left] = (built, result)
        engine = EngineUnderTest(f"{TRTFUSE_LABEL} {flags}", built.serialized.engine)
        return _candidate(left, measure_pair(trt, alone, engine, cases, request.settings, notify))

    present = kinds_present(plugin_node_counts(full.fused.model))
    choice = choose_fusion(_candidate(frozenset(), measurement), present, measure)
    if choice.kept.alone:
        result = fuse_model(original.model, without(fusion, present), original.path)
        # TensorRT's own engine: no plugin in it, so no PTX of trtfuse's for the driver to JIT.
        build = {**full.build, **({"ptx_isa": []} if "ptx_isa" in full.build else {})}
        kept = FusedBuild(LoadedModel(result.model, full.fused.path), full.options, baseline, build)
        return BaselineRun(report, choice, kept, result)
    if not choice.kept.left:
        return BaselineRun(report, choice, full)
    built, result = builds[choice.kept.left]
    return BaselineRun(report, choice, built, result)
