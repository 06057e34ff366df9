"""The engine artefact: a serialised TensorRT engine and the JSON sidecar beside it (`MODEL.engine.json`), which
records the fused model it was built from, its optimisation profiles and the tools that built it.

`build` writes it through `write_engine`; `run`, `compare` and `polygraphy run --trtfuse` read it once, with
`EngineFile.open`, and hand the object on. TensorRT is imported, and the trtfuse plugins registered, here and
nowhere else on the engine side; `tensorrt_for` is the one place that decides, from the sidecar's plugin kind,
whether an engine needs the Python plugins registered to run (an AOT engine carries its kernels and needs nothing).
"""

from __future__ import annotations

import importlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from trtfuse.contract import PluginKind
from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError
from trtfuse.inputs import make_feed
from trtfuse.model_io import load_model
from trtfuse.outputs import write_bytes_atomic, write_json_atomic
from trtfuse.profiles import Profile

SIDECAR_FORMAT = "trtfuse-engine/1"
INSTALL_HINT = (
    "install it with `pip install -e '.[gpu]'` in a trtfuse checkout (tensorrt>=10.14; the Python plugins alone run "
    "from 10.8) on a machine with an NVIDIA GPU"
)


def sidecar_path_for(engine_path: Path) -> Path:
    return engine_path.with_name(engine_path.name + ".json")


def write_engine(engine_path: Path, engine: bytes | memoryview, sidecar: dict) -> Path:
    """The engine, then its sidecar; each atomic, so neither is ever seen half written."""
    write_bytes_atomic(engine_path, engine)
    sidecar_path = sidecar_path_for(engine_path)
    write_json_atomic(sidecar_path, sidecar)
    return sidecar_path


def read_sidecar(engine_path: Path) -> dict | None:
    """The sidecar written beside an engine, or None when there is none."""
    path = sidecar_path_for(engine_path)
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrtfuseError(f"{path}: unreadable engine sidecar ({error})") from None
    if not isinstance(data, dict) or data.get("format") != SIDECAR_FORMAT:
        raise TrtfuseError(f"{path}: not a trtfuse engine sidecar (expected format {SIDECAR_FORMAT})")
    return data


def recorded_plugin_kind(engine_path: Path, sidecar: dict | None) -> PluginKind:
    """The kind the sidecar's build options record. A sidecar from before AOT engines records no kind, and an engine
    without a sidecar has none: both run as Python-plugin engines always have."""
    build = sidecar.get("build") if sidecar is not None else None
    recorded = build.get("plugins") if isinstance(build, dict) else None
    if recorded is None:
        return PluginKind.PYTHON
    try:
        return PluginKind(recorded)
    except ValueError:
        kinds = " or ".join(kind.value for kind in PluginKind)
        raise TrtfuseError(
            f"{sidecar_path_for(engine_path)}: unknown plugin kind {recorded!r} in the build options (expected {kinds})"
        ) from None


@dataclass(frozen=True)
class EngineFile:
    """An engine path and what its sidecar says, read once; without a sidecar, no profiles, no fused model and the
    Python plugin kind."""

    path: Path
    sidecar: dict | None
    profiles: tuple[Profile, ...]
    plugin_kind: PluginKind = PluginKind.PYTHON

    @staticmethod
    def open(path: Path) -> EngineFile:
        sidecar = read_sidecar(path)
        profiles = tuple(Profile.from_json(profile) for profile in sidecar["profiles"]) if sidecar else ()
        return EngineFile(path, sidecar, profiles, recorded_plugin_kind(path, sidecar))

    @property
    def fused_model_path(self) -> Path:
        if self.sidecar is None:
            raise OptionError(
                "inputs",
                f"{self.path}: no sidecar beside the engine; give the inputs with ",
                Choice("inputs"),
                " FILE.npz",
            )
        return self.path.resolve().parent / self.sidecar["fused_model"]

    def feed_shapes(
        self, shapes: Mapping[str, Sequence[int]] | None, dims: Mapping[str, int] | None
    ) -> Mapping[str, Sequence[int]] | None:
        """The shapes to feed the engine: `shapes` as given; without shapes or dims, the first profile's OPT shapes."""
        if not shapes and not dims and self.profiles:
            return self.profiles[0].opt_shapes()
        return shapes

    def generated_feed(
        self,
        seed: int,
        shapes: Mapping[str, Sequence[int]] | None = None,
        dims: Mapping[str, int] | None = None,
    ) -> dict[str, np.ndarray]:
        """Random inputs for the engine's fused model, at `feed_shapes`."""
        model = load_model(self.fused_model_path).model
        return make_feed(model, seed, shapes=self.feed_shapes(shapes, dims), dims=dims)


def import_tensorrt() -> ModuleType:
    """The `tensorrt` module: the one the plugins' `trt_module.load_trt` returns wherever it imports, taken without
    importing trtfuse.plugins (an AOT engine needs none of it). TensorRT-RTX, the plugins' test stand-in, cannot run
    them in an engine, so it is never taken here."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError:
        raise MissingDependencyError(f"TensorRT's Python module `tensorrt` is not installed; {INSTALL_HINT}") from None


def register_plugins(kind: PluginKind) -> None:
    """The trtfuse creators of one kind in TensorRT's plugin registry: the Python (IPluginV3) ones, or the AOT
    quickly deployable plugins. Both kinds go by the same names and namespace, and the registry holds one creator per
    name, so once a process holds one kind the plugins refuse the other, with one line."""
    if kind is PluginKind.AOT:
        from trtfuse.plugins.aot import register_aot

        register_aot()
        return
    from trtfuse import plugins

    plugins.register()


def tensorrt_for(engine: EngineFile) -> ModuleType:
    """TensorRT, ready to deserialise `engine`: the Python plugins registered for an engine of that kind, nothing at
    all for an AOT engine (TensorRT embedded its kernels; no trtfuse.plugins import, no Python plugin)."""
    trt = import_tensorrt()
    if engine.plugin_kind is PluginKind.PYTHON:
        register_plugins(PluginKind.PYTHON)
    else:
        problem = embedded_ptx_problem(engine)
        if problem is not None:
            raise MissingDependencyError(
                f"{engine.path}: {problem}: update the driver, or rebuild the engine where nvidia-cutlass-dsl's "
                "CUDA 12 libraries are installed (their PTX needs CUDA 12.9)"
            )
    return trt


def embedded_ptx_problem(engine: EngineFile) -> str | None:
    """Why this machine's CUDA driver cannot JIT the AOT kernels the sidecar says the engine embeds; None when it can,
    when the sidecar does not say (an engine built before trtfuse recorded it), or without cuda-python to ask."""
    build = engine.sidecar.get("build") if engine.sidecar else None
    isas = build.get("ptx_isa") if isinstance(build, dict) else None
    if not isas:
        return None
    try:
        from trtfuse.kernels.device import current_device, driver_version, isa_driver_problem
    except ImportError:
        return None
    driver = driver_version()
    if driver is None:
        return None
    target = current_device().arch
    problems = [problem for isa in isas if (problem := isa_driver_problem(isa, driver, target))]
    return problems[-1] if problems else None


def plugin_creation_errors() -> list[str]:
    from trtfuse import plugins

    return plugins.take_creation_errors()
