"""The engine artefact: a serialised TensorRT engine and the JSON sidecar beside it (`MODEL.engine.json`), which
records the fused model it was built from, its optimisation profiles and the tools that built it.

`build` writes it through `write_engine`; `run`, `compare` and `polygraphy run --trtfuse` read it once, with
`EngineFile.open`, and hand the object on. TensorRT is imported, and the trtfuse plugins registered, here and
nowhere else on the engine side.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np

from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError
from trtfuse.inputs import make_feed
from trtfuse.model_io import load_model
from trtfuse.outputs import write_bytes_atomic, write_json_atomic
from trtfuse.plugins.trt_module import RTX_MODULE, load_trt
from trtfuse.profiles import Profile

SIDECAR_FORMAT = "trtfuse-engine/1"
INSTALL_HINT = (
    "install it with `pip install -e '.[gpu]'` in a trtfuse checkout (tensorrt>=10.8) on a machine with an NVIDIA GPU"
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


@dataclass(frozen=True)
class EngineFile:
    """An engine path and what its sidecar says, read once; without a sidecar, no profiles and no fused model."""

    path: Path
    sidecar: dict | None
    profiles: tuple[Profile, ...]

    @staticmethod
    def open(path: Path) -> EngineFile:
        sidecar = read_sidecar(path)
        profiles = tuple(Profile.from_json(profile) for profile in sidecar["profiles"]) if sidecar else ()
        return EngineFile(path=path, sidecar=sidecar, profiles=profiles)

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
    """TensorRT as the plugins load it (`trt_module.load_trt`), so engine and plugins share one module; its stand-in
    TensorRT-RTX cannot run the plugins in an engine, so here it counts as no TensorRT."""
    try:
        trt = load_trt()
    except MissingDependencyError:
        trt = None
    if trt is None or trt.__name__ == RTX_MODULE:
        raise MissingDependencyError(f"TensorRT's Python module `tensorrt` is not installed; {INSTALL_HINT}") from None
    return trt


def register_plugins() -> None:
    from trtfuse import plugins

    plugins.register()


def plugin_creation_errors() -> list[str]:
    from trtfuse import plugins

    return plugins.take_creation_errors()
