"""The pipeline behind `trtfuse fuse` and `trtfuse compile`, on parsed values: check the outputs, load, fuse, save,
report, derive the profiles, build.

Nothing here reads a command line or prints: progress goes to `notify`, results come back as objects, and errors are
TrtfuseError / MissingDependencyError lines that name the file.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trtfuse.errors import MissingDependencyError, TrtfuseError
from trtfuse.outputs import OutputPlan, Transaction, write_json_atomic

if TYPE_CHECKING:
    from trtfuse.build import BuildResult
    from trtfuse.engine_file import PluginKind
    from trtfuse.fuse import FuseResult
    from trtfuse.model_io import LoadedModel
    from trtfuse.profiles import Profile, ProfileRequest

Notify = Callable[[str], None]


def _silent(_message: str) -> None:
    return None


@dataclass(frozen=True)
class FusedFile:
    """A fused model written to disk, with its fusion report and the plugins it uses."""

    input_path: Path
    output_path: Path
    report_path: Path | None
    report: dict
    plugins: list[dict]


@dataclass(frozen=True)
class CompiledModel:
    """What `compile_model` wrote; `engine` is None when TensorRT or a GPU is missing (`missing` says which)."""

    fused: FusedFile
    profiles: tuple[Profile, ...]
    engine: BuildResult | None
    missing: MissingDependencyError | None

    def to_json(self) -> dict:
        return {
            "model": str(self.fused.input_path),
            "fused_model": str(self.fused.output_path),
            "report": str(self.fused.report_path),
            "profiles": [profile.to_json() for profile in self.profiles],
            "engine": None if self.engine is None else str(self.engine.engine_path),
            "build_seconds": None if self.engine is None else self.engine.seconds,
            "plugins": None if self.engine is None else self.engine.sidecar["build"]["plugins"],
        }


def compile_outputs(engine_path: Path) -> tuple[Path, Path]:
    """The fused model and the fusion report written beside the engine: MODEL.fused.onnx, MODEL.fusion.json."""
    stem = engine_path.with_suffix("")
    return stem.with_name(stem.name + ".fused.onnx"), stem.with_name(stem.name + ".fusion.json")


def plan_model_outputs(plan: OutputPlan, loaded: LoadedModel, output_path: Path) -> None:
    """Add the loaded input's external data files to the plan's reads, and the copies of them the fused model would
    get beside `output_path` to its writes; check the plan again."""
    from trtfuse.model_io import data_copies

    plan.read(*loaded.data_files)
    for target in data_copies(loaded.model, output_path, loaded):
        plan.write("external data copy", target)
    plan.check()


def _fuse(loaded: LoadedModel, source_path: Path) -> FuseResult:
    from trtfuse.fuse import fuse_model

    try:
        return fuse_model(loaded.model)
    except TrtfuseError as error:
        raise TrtfuseError(f"{source_path}: {error}") from None


def _save(result: FuseResult, loaded: LoadedModel, paths: tuple[Path, Path, Path | None], notify: Notify) -> FusedFile:
    """Write the fused model (and the report, when asked for); the caller holds the Transaction."""
    from trtfuse.build import plugins_used
    from trtfuse.model_io import save_model

    input_path, output_path, report_path = paths
    save_model(result.model, output_path, source=loaded, notify=notify)
    report = result.report()
    if report_path is not None:
        write_json_atomic(report_path, report)
    return FusedFile(input_path, output_path, report_path, report, plugins_used(result.model))


def fuse_file(
    input_path: Path, output_path: Path, report_path: Path | None = None, notify: Notify = _silent
) -> FusedFile:
    """Rewrite every RMSNorm and QK-norm of the model at `input_path` into trtfuse plugin nodes; write the fused model
    (and the JSON fusion report). Every output is checked before any work, and none is left half written."""
    from trtfuse.model_io import load_model

    plan = OutputPlan().read(input_path).write("fused model", output_path).write("report", report_path)
    plan.check()
    loaded = load_model(input_path)
    plan_model_outputs(plan, loaded, output_path)
    with Transaction():
        result = _fuse(loaded, input_path)
        return _save(result, loaded, (input_path, output_path, report_path), notify)


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
    notify: Notify = _silent,
    on_fused: Callable[[FusedFile], None] = lambda _fused: None,
) -> CompiledModel:
    """Fuse the model, write the fused model and its report beside the engine (`compile_outputs`), derive the
    profiles from `request` and build the TensorRT engine with the `plugins` kind (None: the installed TensorRT's
    default, `build.plugin_kind_for`). `on_fused` hears of the fused model before the build starts. Without TensorRT
    or a GPU, what was fused stays written and `missing` says why no engine was built."""
    from trtfuse.build import BuildOptions, build_engine, check_plugin_kind
    from trtfuse.engine_file import sidecar_path_for
    from trtfuse.model_io import load_model
    from trtfuse.profiles import derive_profiles

    fused_path, report_path = compile_outputs(engine_path)
    plan = OutputPlan().read(model_path)
    plan.write("engine", engine_path).write("engine sidecar", sidecar_path_for(engine_path))
    plan.write("fused model", fused_path).write("fusion report", report_path).write("timing cache", timing_cache)
    plan.check()
    check_plugin_kind(plugins)
    loaded = load_model(model_path)
    plan_model_outputs(plan, loaded, fused_path)
    built: BuildResult | None = None
    missing: MissingDependencyError | None = None
    with Transaction():
        result = _fuse(loaded, model_path)
        options = BuildOptions(
            profiles=tuple(derive_profiles(result.model, request)),
            optimization_level=optimization_level,
            workspace_bytes=workspace_bytes,
            timing_cache=timing_cache,
            allow_tf32=allow_tf32,
            plugins=plugins,
        )
        fused = _save(result, loaded, (model_path, fused_path, report_path), notify)
        on_fused(fused)
        for profile in options.profiles:
            notify(f"profile {profile.name}: " + ", ".join(f"{n}={s}" for n, s in profile.shapes.items()))
        try:
            built = build_engine(fused_path, engine_path, options, emit=notify)
        except MissingDependencyError as error:
            # What was fused stays written: the user can check it, or build on a machine with TensorRT.
            missing = error
    return CompiledModel(fused, options.profiles, built, missing)
