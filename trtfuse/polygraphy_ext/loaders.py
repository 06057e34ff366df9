"""Polygraphy loaders over trtfuse's own pipeline: fuse (`fusion.fuse`), lower for onnxruntime (`fusion.lowering`,
as `trtfuse check` does), write the fused model and build its engine (`pipeline.write_fused` and `build_fused`, as
`trtfuse compile` does). Each is lazy: it does its work when called, and takes the loader before it (or its result)
as its input, so they chain like Polygraphy's own.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import onnx
from polygraphy import util
from polygraphy.backend.base import BaseLoader
from polygraphy.logger import G_LOGGER

import trtfuse
from trtfuse.contract import PluginKind
from trtfuse.engine.build import gpu_name
from trtfuse.engine.build_options import BuildOptions
from trtfuse.engine.profiles import Profile, ShapeRange, derive_profiles, profile_warnings, request_from_options
from trtfuse.engine.sidecar import read_sidecar
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.files import make_folders
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.pipeline import build_fused, write_fused
from trtfuse.polygraphy_ext.errors import as_polygraphy_error

# One shape range per input name, as Polygraphy's --trt-min/opt/max-shapes give them: [MIN, OPT, MAX].
PolygraphyProfile = Mapping[str, Sequence[Sequence[int]]]
ENGINE_CACHE_ENV = "TRTFUSE_ENGINE_CACHE"


def default_engine_cache() -> Path:
    """Where `--trtfuse` keeps fused models and engines between runs: $TRTFUSE_ENGINE_CACHE, else beside the
    kernel cache in ~/.cache/trtfuse/engines."""
    configured = os.environ.get(ENGINE_CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "trtfuse" / "engines"


@dataclass(frozen=True)
class FusedModel:
    """The original model as loaded and trtfuse's fusion of it."""

    original: LoadedModel
    result: FuseResult

    @property
    def fused(self) -> LoadedModel:
        # External data stays where the original keeps it, so the fused model resolves it against the same folder.
        return LoadedModel(model=self.result.model, path=self.original.path)


class FuseModel(BaseLoader):
    """Functor that loads an ONNX model with `trtfuse.model.onnx_file.load_model` and fuses its norms with
    `trtfuse.fusion.fuse.fuse_model`, returning a `FusedModel`. `fuse_residual=False` keeps each residual Add outside
    the norm after it (`trtfuse fuse --no-fuse-residual`), `fuse_quant=False` every Q/DQ pair around a norm outside its
    node (`--no-fuse-quant`), `fuse_rope=False` the rotary embedding after a QK pair outside its node
    (`--no-fuse-rope`); by default all are fused."""

    def __init__(
        self,
        model_path: str,
        fuse_residual: bool | None = None,
        fuse_quant: bool | None = None,
        fuse_rope: bool | None = None,
    ) -> None:
        self.model_path = model_path
        self.fusion = FusionOptions(
            fuse_residual=util.default(fuse_residual, DEFAULT_FUSION.fuse_residual),
            fuse_quant=util.default(fuse_quant, DEFAULT_FUSION.fuse_quant),
            fuse_rope=util.default(fuse_rope, DEFAULT_FUSION.fuse_rope),
        )

    @util.check_called_by("__call__")
    def call_impl(self) -> FusedModel:
        with as_polygraphy_error("trtfuse"):
            original = load_model(self.model_path)
            result = fuse_model(original.model, self.fusion, self.model_path)
        G_LOGGER.info(f"trtfuse: fused {self.model_path}: {result.counts().line()}")
        return FusedModel(original=original, result=result)


class LowerFusedNodes(BaseLoader):
    """Functor that replaces each plugin node of a `FusedModel` with standard ONNX ops computing the contract's exact
    semantics (`trtfuse.fusion.lowering.lower_fused_nodes`), so onnxruntime runs it; returns a `LoadedModel`."""

    def __init__(self, fused: FusedModel | Callable[[], FusedModel]) -> None:
        self._fused = fused

    @util.check_called_by("__call__")
    def call_impl(self) -> LoadedModel:
        fused, _ = util.invoke_if_callable(self._fused)
        with as_polygraphy_error("trtfuse"):
            lowered = lower_fused_nodes(fused.result.model, fused.original.path)
            return LoadedModel(model=lowered, path=fused.original.path)


def engine_profiles_for(
    model: onnx.ModelProto, presets: Sequence[str], polygraphy_profiles: Sequence[PolygraphyProfile]
) -> list[Profile]:
    """trtfuse's profiles for `model`: one per Polygraphy profile where given (inputs a profile leaves out take the
    first preset's derived ranges), else one per preset, derived from the model's dims as `trtfuse compile` does."""
    if not polygraphy_profiles:
        request = request_from_options(presets=presets)
        for warning in profile_warnings(model, request):
            G_LOGGER.warning(f"trtfuse: {warning}")
        return derive_profiles(model, request)
    base = request_from_options(presets=list(presets[:1]))
    profiles = []
    for index, shapes in enumerate(polygraphy_profiles):
        ranges = {
            name: ShapeRange(*(tuple(int(dim) for dim in shape) for shape in bounds)) for name, bounds in shapes.items()
        }
        (derived,) = derive_profiles(model, replace(base, shapes=ranges))
        profiles.append(Profile(f"polygraphy {index}", derived.shapes))
    return profiles


class BuildTrtfuseEngine(BaseLoader):
    """Functor that builds the TensorRT engine of a `FusedModel` with the trtfuse plugins, through
    `trtfuse.engine.build.build_engine` (the code `trtfuse compile` runs), and returns the engine's path.

    The fused model, its report, the engine and its sidecar go to one folder per (fused model, profiles, build
    options) under `cache_dir`; an engine already there that the sidecar says was built by this TensorRT on this GPU
    is used again.
    """

    def __init__(
        self,
        fused: FusedModel | Callable[[], FusedModel],
        presets: Sequence[str] | None = None,
        profiles: Sequence[PolygraphyProfile] | None = None,
        cache_dir: str | None = None,
        optimization_level: int | None = None,
        workspace_bytes: int | None = None,
        timing_cache: str | None = None,
        allow_tf32: bool | None = None,
        plugins: str | None = None,
    ) -> None:
        self._fused = fused
        self.presets = list(util.default(presets, []))
        self.profiles = list(util.default(profiles, []))
        self.cache_dir = Path(cache_dir) if cache_dir else default_engine_cache()
        self.optimization_level = util.default(optimization_level, BuildOptions.optimization_level)
        self.workspace_bytes = workspace_bytes
        self.timing_cache = Path(timing_cache) if timing_cache else None
        self.allow_tf32 = util.default(allow_tf32, False)
        # "aot" or "python" (`PluginKind`); None: what `trtfuse compile` picks for the installed TensorRT.
        self.plugins = None if plugins is None else PluginKind(plugins)

    @util.check_called_by("__call__")
    def call_impl(self) -> str:
        with as_polygraphy_error("trtfuse"):
            # Before fusing: without TensorRT there is nothing to build, and the error should say so at once.
            trt = import_tensorrt()
        fused, _ = util.invoke_if_callable(self._fused)
        with as_polygraphy_error("trtfuse"):
            options = BuildOptions(
                profiles=tuple(engine_profiles_for(fused.result.model, self.presets, self.profiles)),
                optimization_level=self.optimization_level,
                workspace_bytes=self.workspace_bytes,
                timing_cache=self.timing_cache,
                allow_tf32=self.allow_tf32,
                plugins=self.plugins,
            )
            folder = self.cache_dir / f"{fused.original.path.stem}-{_build_key(fused.result.model, options)}"
            engine_path = folder / "model.engine"
            if _reusable(engine_path, trt.__version__):
                G_LOGGER.info(f"trtfuse: using the engine built before: {engine_path}")
                return str(engine_path)
            make_folders(folder)
            paths = (fused.original.path, folder / "model.fused.onnx", folder / "model.fusion.json")
            written = write_fused(fused.result, fused.original, paths, notify=G_LOGGER.info)
            built = build_fused(written, engine_path, options, notify=G_LOGGER.info)
        G_LOGGER.info(f"trtfuse: built {built.engine_path} in {built.seconds:.1f} s")
        return str(built.engine_path)


def _build_key(model: onnx.ModelProto, options: BuildOptions) -> str:
    """What the engine depends on: the fused graph (so a changed matcher or rewrite builds anew), the profiles, the
    build options and the trtfuse version."""
    digest = hashlib.sha256(model.SerializeToString())
    settings = {
        "trtfuse": trtfuse.__version__,
        "profiles": [profile.to_json() for profile in options.profiles],
        "build": options.to_json(),
    }
    digest.update(json.dumps(settings, sort_keys=True).encode())
    return digest.hexdigest()[:16]


def _reusable(engine_path: Path, tensorrt_version: str) -> bool:
    if not engine_path.is_file():
        return False
    sidecar = read_sidecar(engine_path)
    return sidecar is not None and sidecar.versions.get("tensorrt") == tensorrt_version and sidecar.gpu == gpu_name()
