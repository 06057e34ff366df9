"""The engine artefact: a serialised TensorRT engine and its sidecar (`engine.sidecar`), opened once.

`run`, `compare`, the leak check and `polygraphy run --trtfuse` open an engine with `EngineFile.open` and hand the
object on; the sidecar gives the fused model the engine was built from, its optimisation profiles and its plugin
kind. An engine without a sidecar runs as a Python-plugin engine on inputs the user gives.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np

from trtfuse.contract import PluginKind
from trtfuse.engine.profiles import Profile
from trtfuse.engine.sidecar import Sidecar, read_sidecar, sidecar_path_for
from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.files import check_readable
from trtfuse.model.feeds import make_feed
from trtfuse.model.onnx_file import load_model

T = TypeVar("T")


# What names an ONNX model rather than an engine: onnx's own file suffixes for a model (binary and text).
ONNX_SUFFIXES = (".onnx", ".onnxtxt")


def is_onnx_model_path(path: Path) -> bool:
    """Whether `path` names an ONNX model (else an engine): the one rule by which `compare`, `compare --generate` and
    `generate` choose the CPU or TensorRT, and by which engine paths are refused."""
    return path.suffix.lower() in ONNX_SUFFIXES


def check_engine_path(path: Path) -> None:
    """An engine is a regular file and no ONNX model: one line for a missing path, a folder, a FIFO or a device, and
    for an ONNX model given where an engine is expected (before anything looks for TensorRT)."""
    check_readable(path, "engine file")
    if is_onnx_model_path(path):
        raise TrtfuseError(f"{path}: this is an ONNX model, not an engine; build one with trtfuse compile")
    if path.suffix.lower() == ".json":
        engine = path.with_suffix("")
        hint = f"; give the engine it describes, {engine}" if engine.suffix == ".engine" else ""
        raise TrtfuseError(f"{path}: this is a JSON file (a sidecar or a report), not an engine{hint}")


def check_engine_output_path(path: Path) -> None:
    """An engine written under an ONNX model's name would pass for one: one line, before anything is written."""
    if is_onnx_model_path(path):
        raise TrtfuseError(
            f"{path}: an engine is not an ONNX model; give it another name, such as "
            f"{path.with_suffix('.engine').name} (the fused model is written beside it)"
        )


@dataclass(frozen=True)
class EngineFile:
    """An engine path and its sidecar, read once; without a sidecar, no profiles, no fused model and the Python
    plugin kind."""

    path: Path
    sidecar: Sidecar | None

    @staticmethod
    def open(path: Path) -> EngineFile:
        check_engine_path(path)
        return EngineFile(path, read_sidecar(path))

    @property
    def profiles(self) -> tuple[Profile, ...]:
        return self.sidecar.profiles if self.sidecar else ()

    @property
    def plugin_kind(self) -> PluginKind:
        return self.sidecar.plugin_kind if self.sidecar else PluginKind.PYTHON

    @property
    def fused_model_path(self) -> Path:
        """The fused model the sidecar names, in the engine's folder."""
        if self.sidecar is None:
            raise OptionError(
                "inputs",
                f"{self.path}: no sidecar beside the engine ({sidecar_path_for(self.path).name}, written by trtfuse "
                "compile) to make inputs from; give them with ",
                Choice("inputs"),
                " FILE.npz",
            )
        return self.path.absolute().parent / self.sidecar.fused_model

    def files(self) -> tuple[Path, ...]:
        """Every file the engine is read from, for an output plan: the engine, its sidecar, and the fused model it
        names with that model's external data files."""
        if self.sidecar is None:
            return (self.path,)
        fused = self.fused_model_path
        data = load_model(fused).data_files if fused.is_file() else ()
        return (self.path, self.sidecar.path, fused, *data)

    def _feed_shapes(
        self, shapes: Mapping[str, Sequence[int]] | None, dims: Mapping[str, int] | None
    ) -> Mapping[str, Sequence[int]] | None:
        """The shapes to feed the engine: `shapes` as given; without shapes or dims, the first profile's OPT shapes."""
        if not shapes and not dims and self.profiles:
            return self.profiles[0].opt_shapes()
        return shapes

    def at_sidecar_shapes(
        self,
        shapes: Mapping[str, Sequence[int]] | None,
        dims: Mapping[str, int] | None,
        make: Callable[[Mapping[str, Sequence[int]] | None], T],
    ) -> T:
        """`make(_feed_shapes(...))`. Shapes taken from the sidecar are the sidecar's fault, not a choice of the user's:
        those the fused model cannot take are one line naming the sidecar and its profile."""
        chosen = self._feed_shapes(shapes, dims)
        if chosen is shapes:
            return make(shapes)
        try:
            return make(chosen)
        except OptionError as error:
            raise TrtfuseError(
                f"{sidecar_path_for(self.path)}: profile '{self.profiles[0].name}' does not fit the fused model "
                f"{self.fused_model_path.name} ({error.spelled(lambda choice: f'OPT {choice}')}); rebuild the engine "
                "with trtfuse compile, or give the inputs' shapes"
            ) from None

    def generated_feed(
        self,
        seed: int,
        shapes: Mapping[str, Sequence[int]] | None = None,
        dims: Mapping[str, int] | None = None,
    ) -> dict[str, np.ndarray]:
        """Random inputs for the engine's fused model, at `_feed_shapes`."""
        model = load_model(self.fused_model_path).model
        return self.at_sidecar_shapes(shapes, dims, lambda chosen: make_feed(model, seed, shapes=chosen, dims=dims))
