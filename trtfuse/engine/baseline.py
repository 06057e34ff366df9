"""`compile --baseline` and `--never-slower`: the engine TensorRT builds from the original export alone, with the
trtfuse engine's profiles, optimisation level, flags and timing cache, timed against it (`ab.measure_pair`); with
`never_slower`, the bounded search of `fusion_choice` over configurations that leave kinds of node to TensorRT.

Every engine here is built in memory; the pipeline writes the one kept (`BaselineRun.kept`) and the A/B's files
(`ab_files`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import ModuleType

from trtfuse.engine.ab import EngineUnderTest, PairMeasurement, ProfiledRuns, TimingSettings, measure_pair
from trtfuse.engine.ab_report import BASELINE_LABEL, TRTFUSE_LABEL, ABReport, SiteTotal, site_total
from trtfuse.engine.build import (
    FusedBuild,
    SerializedEngine,
    build_fused_engine,
    gpu_name,
    inspected_layers,
    serialize_network,
)
from trtfuse.engine.fusion_choice import Candidate, FusionChoice, FusionKind, choose_fusion, kinds_present, without
from trtfuse.engine.site_times import node_sites
from trtfuse.engine.timing_cases import TimingCase, timing_cases
from trtfuse.errors import TrtfuseError
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
    `never_slower`), and what to write: the kept build (`kept_fusion`, the fusion that made it, where it is not the
    full one), the per-layer profiles of the kept engine and of TensorRT alone's, and TensorRT alone's layer
    information."""

    report: ABReport
    choice: FusionChoice | None
    kept: FusedBuild
    kept_profiles: tuple[ProfiledRuns, ...]
    baseline_profiles: tuple[ProfiledRuns, ...]
    baseline_layers: str | None
    kept_fusion: FuseResult | None = None


def build_original(
    trt: ModuleType, original: LoadedModel, trtfuse_build: FusedBuild, notify: Notify
) -> SerializedEngine:
    """TensorRT's engine of the original export, as the trtfuse engine was built but with no plugin registered."""
    notify(f"building {BASELINE_LABEL}'s engine of {original.path} (no trtfuse plugin)")
    return serialize_network(trt, original.model, original.path, trtfuse_build.options, None, notify)


@dataclass(frozen=True)
class _Reference:
    """TensorRT alone's side of every pairing: its engine, its layer information and the cases both sides run."""

    serialized: SerializedEngine
    layers: str | None
    cases: tuple[TimingCase, ...]

    @property
    def engine(self) -> EngineUnderTest:
        return EngineUnderTest(BASELINE_LABEL, self.serialized.engine)


def _candidate(left: frozenset[FusionKind], measurement: PairMeasurement) -> Candidate:
    return Candidate(left, {timing.case.name: timing.comparison for timing in measurement.cases})


def _site_totals(
    measurement: PairMeasurement,
    layers: tuple[str | None, str | None],
    sites: Mapping[str, Sequence[str]],
    profile_names: Sequence[str],
    notify: Notify,
) -> dict[str, tuple[SiteTotal | None, SiteTotal | None]]:
    """Per profile, the norm sites' time in TensorRT alone's engine (the original's nodes each fused node took in)
    and in the trtfuse engine (the fused nodes themselves, by the same names)."""
    totals = {}
    for baseline_runs, trtfuse_runs in zip(*measurement.layer_profiles, strict=True):
        pair = []
        for text, engine_sites, runs in (
            (layers[0], sites, baseline_runs),
            (layers[1], node_sites(sites), trtfuse_runs),
        ):
            try:
                pair.append(None if text is None else site_total(text, engine_sites, runs))
            except TrtfuseError as error:
                notify(f"the norm sites' layers could not be attributed: {error}")
                pair.append(None)
        totals[profile_names[baseline_runs.profile_index]] = (pair[0], pair[1])
    return totals


def compare_with_tensorrt(
    trt: ModuleType,
    original: LoadedModel,
    full: FusedBuild,
    fusion: FusionOptions,
    request: BaselineRequest,
    sites: Mapping[str, Sequence[str]],
    notify: Notify,
) -> BaselineRun:
    """Build TensorRT alone's engine, time it against `full` (the trtfuse engine of `original` fused as `fusion`
    says; `sites` its norm sites, `site_times.report_sites` of its fusion report), and with
    `request.never_slower` search for the fastest configuration."""
    baseline = build_original(trt, original, full, notify)
    layers = (
        inspected_layers(trt, baseline.engine, notify),
        inspected_layers(trt, full.serialized.engine, notify),
    )
    reference = _Reference(
        baseline, layers[0], tuple(timing_cases(original.model, full.options.profiles, request.seed))
    )
    trtfuse_engine = EngineUnderTest(TRTFUSE_LABEL, full.serialized.engine)
    measurement = measure_pair(trt, reference.engine, trtfuse_engine, reference.cases, request.settings, notify)
    names = [profile.name for profile in full.options.profiles]
    report = ABReport(
        gpu=gpu_name(),
        tensorrt=str(trt.__version__),
        settings=request.settings,
        measurement=measurement,
        build_seconds=(baseline.seconds, full.serialized.seconds),
        site_times=_site_totals(measurement, layers, sites, names, notify),
    )
    if not request.never_slower:
        baseline_profiles, full_profiles = measurement.layer_profiles
        return BaselineRun(report, None, full, full_profiles, baseline_profiles, layers[0])
    return _never_slower(trt, original, full, fusion, request, reference, report, notify)


def _never_slower(
    trt: ModuleType,
    original: LoadedModel,
    full: FusedBuild,
    fusion: FusionOptions,
    request: BaselineRequest,
    reference: _Reference,
    report: ABReport,
    notify: Notify,
) -> BaselineRun:
    """The search of `fusion_choice` from the full fusion's A/B (`report`); each configuration built in memory and
    timed against TensorRT alone in a pairing of its own."""
    measured: dict[frozenset[FusionKind], tuple[FusedBuild, FuseResult, PairMeasurement]] = {}

    def measure(left: frozenset[FusionKind]) -> Candidate:
        flags = " ".join(kind.value for kind in FusionKind if kind in left)
        notify(f"--never-slower: building and timing the fusion with {flags}")
        result = fuse_model(original.model, without(fusion, left), original.path)
        built = build_fused_engine(trt, LoadedModel(result.model, full.fused.path), full.options, notify)
        engine = EngineUnderTest(f"{TRTFUSE_LABEL} {flags}", built.serialized.engine)
        pair = measure_pair(trt, reference.engine, engine, reference.cases, request.settings, notify)
        measured[left] = (built, result, pair)
        return _candidate(left, pair)

    present = kinds_present(plugin_node_counts(full.fused.model))
    choice = choose_fusion(_candidate(frozenset(), report.measurement), present, measure)
    baseline_profiles, full_profiles = report.measurement.layer_profiles
    if choice.kept.alone:
        result = fuse_model(original.model, without(fusion, present), original.path)
        # TensorRT's own engine: no plugin in it, so no PTX of trtfuse's for the driver to JIT.
        build = {**full.build, **({"ptx_isa": []} if "ptx_isa" in full.build else {})}
        kept = FusedBuild(LoadedModel(result.model, full.fused.path), full.options, reference.serialized, build)
        return BaselineRun(report, choice, kept, baseline_profiles, baseline_profiles, reference.layers, result)
    if not choice.kept.left:
        return BaselineRun(report, choice, full, full_profiles, baseline_profiles, reference.layers)
    built, result, pair = measured[choice.kept.left]
    return BaselineRun(report, choice, built, pair.layer_profiles[1], baseline_profiles, reference.layers, result)
