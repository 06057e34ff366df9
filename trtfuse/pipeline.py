"""The pipeline behind `trtfuse fuse` and `trtfuse compile`, on parsed values: check the outputs, load, fuse, save,
report, derive the profiles, build.

Nothing here reads a command line or prints: progress goes to `notify`, results come back as objects, and errors are
TrtfuseError / MissingDependencyError lines that name the file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from trtfuse.errors import MissingDependencyError
from trtfuse.files import OutputPlan, Overwrite, Transaction, write_json_atomic
from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions

if TYPE_CHECKING:
    import onnx

    from trtfuse.contract import PluginKind
    from trtfuse.engine.baseline import BaselineRequest, BaselineRun
    from trtfuse.engine.build import BuildResult
    from trtfuse.engine.build_options import BuildOptions
    from trtfuse.engine.profiles import Profile, ProfileRequest
    from trtfuse.fusion.fuse import FuseResult, FusionCounts
    from trtfuse.model.onnx_file import LoadedModel

Notify = Callable[[str], None]


def _silent(_message: str) -> None:
    return None


@dataclass(frozen=True)
class FusedFile:
    """A fused model written to disk (`model` is what was written, handed on to the build), with its fusion report
    and its counts (`counts.line()`: the summary every command prints) and how long each phase took (`seconds`: load,
    fuse, write)."""

    input_path: Path
    output_path: Path
    report_path: Path | None
    report: dict
    model: onnx.ModelProto
    counts: FusionCounts
    seconds: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class CompiledModel:
    """What `compile_model` wrote; `engine` is None when TensorRT or a GPU is missing (`missing` says which);
    `baseline` is the A/B against TensorRT alone where it was asked for and ran. `fused` is the fused model written,
    the one the engine holds (with `--never-slower`, possibly fewer nodes than the full fusion)."""

    fused: FusedFile
    profiles: tuple[Profile, ...]
    engine: BuildResult | None
    missing: MissingDependencyError | None
    baseline: BaselineRun | None = None

    def to_json(self) -> dict:
        ab = self.baseline
        report = None if self.engine is None else self.engine.engine_report
        return {
            "model": str(self.fused.input_path),
            "fused_model": str(self.fused.output_path),
            "report": str(self.fused.report_path),
            "profiles": [profile.to_json() for profile in self.profiles],
            "engine": None if self.engine is None else str(self.engine.engine_path),
            "build_seconds": None if self.engine is None else self.engine.seconds,
            "plugins": None if self.engine is None else self.engine.plugin_kind.value,
            **({} if report is None else {"engine_report": report.to_json()}),
            **({} if ab is None else {"baseline": ab.report.to_json()}),
            **({} if ab is None or ab.choice is None else {"fusion_choice": ab.choice.to_json()}),
        }


def compile_outputs(engine_path: Path) -> tuple[Path, Path]:
    """The fused model and the fusion report written beside the engine: MODEL.fused.onnx, MODEL.fusion.json."""
    stem = engine_path.with_suffix("")
    return stem.with_name(stem.name + ".fused.onnx"), stem.with_name(stem.name + ".fusion.json")


def plan_model_outputs(plan: OutputPlan, loaded: LoadedModel, output_path: Path) -> None:
    """Add the loaded input's external data files to the plan's reads, and the copies of them the fused model would
    get beside `output_path` to its writes; check the plan, what its outputs would replace included."""
    from trtfuse.model.onnx_file import data_copies

    plan.read(*loaded.data_files)
    for target in data_copies(loaded.model, output_path, loaded):
        folder = output_path.absolute().parent
        plan.write("external data copy", target, folders_under=folder, overwrite=Overwrite.IDENTICAL)
    plan.check()


def _load(path: Path) -> tuple[LoadedModel, dict[str, float]]:
    from trtfuse.model.onnx_file import load_model

    started = time.perf_counter()
    loaded = load_model(path)
    return loaded, {"load": time.perf_counter() - started}


def _fuse(loaded: LoadedModel, source_path: Path, seconds: dict[str, float], fusion: FusionOptions) -> FuseResult:
    from trtfuse.fusion.fuse import fuse_model

    started = time.perf_counter()
    result = fuse_model(loaded.model, fusion, source_path)
    seconds["fuse"] = time.perf_counter() - started
    return result


def write_fused(
    result: FuseResult,
    loaded: LoadedModel,
    paths: tuple[Path, Path, Path | None],
    notify: Notify,
    seconds: dict[str, float] | None = None,
) -> FusedFile:
    """Write the fused model (and the report, when asked for); the caller holds the Transaction. `seconds` are the
    phases timed before (load, fuse); the write is added."""
    from trtfuse.model.onnx_file import save_model

    input_path, output_path, report_path = paths
    started = time.perf_counter()
    save_model(result.model, output_path, source=loaded, notify=notify)
    report = result.report()
    if report_path is not None:
        write_json_atomic(report_path, report)
    timed = {**(seconds or {}), "write": time.perf_counter() - started}
    return FusedFile(input_path, output_path, report_path, report, result.model, result.counts(), timed)


def build_fused(fused: FusedFile, engine_path: Path, options: BuildOptions, notify: Notify) -> BuildResult:
    """Build the engine of a fused model just written, from the model in memory (`fused.model`, resolving its
    external data beside `fused.output_path`)."""
    from trtfuse.engine.build import build_engine
    from trtfuse.model.onnx_file import LoadedModel

    for profile in options.profiles:
        notify(f"profile {profile.name}: " + ", ".join(f"{n}={s}" for n, s in profile.shapes.items()))
    return build_engine(LoadedModel(fused.model, fused.output_path), engine_path, options, emit=notify)


def plan_fused_outputs(plan: OutputPlan, output_path: Path, report_path: Path | None) -> OutputPlan:
    """The fused model and its report in `plan`, each replacing only what trtfuse wrote as such (or, with the
    plan's `force`, another file that is no ONNX model)."""
    from trtfuse.fusion.fuse import is_fusion_report
    from trtfuse.model.onnx_file import is_trtfuse_model

    plan.write("fused model", output_path, ours=is_trtfuse_model)
    return plan.write("fusion report", report_path, ours=is_fusion_report)


def fuse_file(
    input_path: Path,
    output_path: Path,
    report_path: Path | None = None,
    notify: Notify = _silent,
    fusion: FusionOptions = DEFAULT_FUSION,
    force: bool = False,
) -> FusedFile:
    """Rewrite every RMSNorm and QK-norm of the model at `input_path` (and the residual Adds in front of them, as
    `fusion` says: by default they are fused) into trtfuse plugin nodes; write the fused model (and the JSON fusion
    report). Every output is checked before any work (`force`: an output may replace an existing file trtfuse cannot
    tell it wrote, `files.OutputPlan`), and none is left half written."""
    plan = plan_fused_outputs(OutputPlan(force).read(input_path), output_path, report_path)
    # The paths before the input loads; what the outputs would replace once its external data files are known too.
    plan.check_paths()
    loaded, seconds = _load(input_path)
    plan_model_outputs(plan, loaded, output_path)
    with Transaction():
        result = _fuse(loaded, input_path, seconds, fusion)
        return write_fused(result, loaded, (input_path, output_path, report_path), notify, seconds)


def compile_model(
    model_path: Path,
    engine_path: Path,
    request: ProfileRequest,
    *,
    optimization_level: int,
    workspace_bytes: int | None = None,
    timing_cache: Path | None = None,
    allow_tf32: bool = False,
    plugins: PluginKind | None = None,
    fusion: FusionOptions = DEFAULT_FUSION,
    baseline: BaselineRequest | None = None,
    notify: Notify = _silent,
    on_fused: Callable[[FusedFile], None] = lambda _fused: None,
    warn: Notify = _silent,
    force: bool = False,
) -> CompiledModel:
    """Fuse the model (the residual Adds as `fusion` says), write the fused model and its report beside the engine
    (`compile_outputs`), derive the profiles from `request` and build the TensorRT engine with the `plugins` kind
    (None: the installed TensorRT's default, `build_options.plugin_kind_for`). `on_fused` hears of the fused model
    before the build starts, `warn` of each profile that cannot do what its name says (`profiles.profile_warnings`;
    the build goes on). With `baseline`, the engine TensorRT builds from the original alone is built too and timed
    against the trtfuse engine (`engine.baseline`), and with `baseline.never_slower` the fastest configuration is the
    one written. Without TensorRT or a GPU, what was fused stays written and `missing` says why no engine was
    built. Each output replaces only a file trtfuse wrote as such (`force`: also another file that is no ONNX model,
    `files.OutputPlan`); the timing cache is read and written back whatever it holds."""
    from trtfuse.engine.build_options import BuildOptions, check_plugin_kind
    from trtfuse.engine.engine_file import check_engine_output_path
    from trtfuse.engine.profiles import derive_profiles, profile_warnings
    from trtfuse.engine.sidecar import (
        is_engine_companion,
        is_engine_with_sidecar,
        is_sidecar,
        layer_information_path,
        sidecar_path_for,
    )
    from trtfuse.engine.timing_cache import is_stamp, stamp_path

    check_engine_output_path(engine_path)
    fused_path, report_path = compile_outputs(engine_path)
    plan = OutputPlan(force).read(model_path)
    plan.write("engine", engine_path, ours=is_engine_with_sidecar)
    plan.write("engine sidecar", sidecar_path_for(engine_path), ours=is_sidecar)
    plan.write("engine layer information", layer_information_path(engine_path), ours=is_engine_companion)
    plan_fused_outputs(plan, fused_path, report_path)
    plan.write("timing cache", timing_cache, overwrite=Overwrite.UPDATED)
    plan.write("timing cache stamp", None if timing_cache is None else stamp_path(timing_cache), ours=is_stamp)
    plan.check_paths()
    check_plugin_kind(plugins)
    loaded, seconds = _load(model_path)
    plan_model_outputs(plan, loaded, fused_path)
    built: BuildResult | None = None
    missing: MissingDependencyError | None = None
    ab: BaselineRun | None = None
    with Transaction():
        result = _fuse(loaded, model_path, seconds, fusion)
        options = BuildOptions(
            profiles=tuple(derive_profiles(result.model, request)),
            optimization_level=optimization_level,
            workspace_bytes=workspace_bytes,
            timing_cache=timing_cache,
            allow_tf32=allow_tf32,
            plugins=plugins,
        )
        for warning in profile_warnings(result.model, request):
            warn(warning)
        if baseline is not None:
            plan_ab_outputs(plan, engine_path, options.profiles)
        paths = (model_path, fused_path, report_path)
        fused = write_fused(result, loaded, paths, notify, seconds)
        on_fused(fused)
        try:
            if baseline is None:
                built = build_fused(fused, engine_path, options, notify)
            else:
                rewrite = lambda kept: write_fused(kept, loaded, paths, notify, seconds)  # noqa: E731
                built, ab, fused = build_with_baseline(
                    fused, loaded, engine_path, options, fusion, baseline, rewrite, notify
                )
        except MissingDependencyError as error:
            # What was fused stays written: the user can check it, or build on a machine with TensorRT.
            missing = error
    return CompiledModel(fused, options.profiles, built, missing, ab)


def plan_ab_outputs(plan: OutputPlan, engine_path: Path, profiles: Sequence[Profile]) -> None:
    """The A/B's files beside the engine: each engine's per-layer profile per optimisation profile, and TensorRT
    alone's layer information (`engine.sidecar`'s paths)."""
    from trtfuse.engine.sidecar import baseline_path, is_engine_companion, layer_information_path, layer_profile_path

    alone = baseline_path(engine_path)
    for index in range(len(profiles)):
        plan.write("per-layer profile", layer_profile_path(engine_path, index), ours=is_engine_companion)
        plan.write("TensorRT alone's per-layer profile", layer_profile_path(alone, index), ours=is_engine_companion)
    plan.write("TensorRT alone's layer information", layer_information_path(alone), ours=is_engine_companion)
    plan.check()


def build_with_baseline(
    fused: FusedFile,
    original: LoadedModel,
    engine_path: Path,
    options: BuildOptions,
    fusion: FusionOptions,
    request: BaselineRequest,
    rewrite: Callable[[FuseResult], FusedFile],
    notify: Notify,
) -> tuple[BuildResult, BaselineRun, FusedFile]:
    """Build the trtfuse engine in memory, the engine of the original alone beside it, time both; write the engine
    kept (with `never_slower`, the fused model and report of the configuration kept replace the full fusion's) with
    the A/B in its sidecar, and the A/B's files beside it."""
    from trtfuse.engine.ab_files import ab_files
    from trtfuse.engine.baseline import compare_with_tensorrt
    from trtfuse.engine.build import build_fused_engine, check_output_folders, prepare_build, write_engine
    from trtfuse.engine.site_times import report_sites
    from trtfuse.model.onnx_file import LoadedModel

    check_output_folders(engine_path, options)
    written = LoadedModel(fused.model, fused.output_path)
    trt, options = prepare_build(written, options)
    for profile in options.profiles:
        notify(f"profile {profile.name}: " + ", ".join(f"{n}={s}" for n, s in profile.shapes.items()))
    full = build_fused_engine(trt, written, options, notify)
    run = compare_with_tensorrt(trt, original, full, fusion, request, report_sites(fused.report), notify)
    kept = run.kept
    if run.kept_fusion is not None:
        fused = rewrite(run.kept_fusion)
        kept = replace(kept, fused=LoadedModel(fused.model, fused.output_path))
    written = ab_files(engine_path, run)
    sections = {"baseline": {**run.report.to_json(), "files": written}}
    if run.choice is not None:
        sections["fusion_choice"] = run.choice.to_json()
    companions = [name for names in written.values() for name in names]
    return write_engine(trt, kept, engine_path, notify, sections, companions), run, fused
