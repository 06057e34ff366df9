"""The JSON sidecar beside every trtfuse engine (`MODEL.engine.json`): what the engine was built from and with, the
one writer and the one reader of its schema.

The reader holds a sidecar to everything `run`, `compare`, the leak check and `triton-config` rely on: a JSON object
of the format below, a fused model inside the engine's folder (as external data is held to its model's folder, symlinks
followed), well-formed profiles, a known plugin kind, the PTX ISAs an AOT engine embeds, the inputs TensorRT takes as
shape tensors. Any other content is one line naming the sidecar and the key at fault; a sidecar that is not a regular
file (a FIFO, a folder) is refused before it is opened.

Format 2 added `shape_tensor_inputs` (the network inputs TensorRT reported as shape tensors at build time). A format 1
sidecar is still read, with `Sidecar.shape_tensor_inputs` None: it did not record them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trtfuse.contract import PluginKind
from trtfuse.engine.profiles import Profile, ShapeRange
from trtfuse.errors import TrtfuseError
from trtfuse.files import is_inside, json_object, resolved, write_json_atomic

SIDECAR_FORMAT = "trtfuse-engine/2"
# Written before the sidecar recorded the engine's shape-tensor inputs; read with those unknown.
FORMAT_WITHOUT_SHAPE_TENSORS = "trtfuse-engine/1"


def sidecar_path_for(engine_path: Path) -> Path:
    return engine_path.with_name(engine_path.name + ".json")


def layer_information_path(engine_path: Path) -> Path:
    """Where `compile` writes the engine's layer information, as `trtexec --exportLayerInfo` would:
    NAME.engine.layers.json."""
    return engine_path.with_name(engine_path.name + ".layers.json")


def baseline_path(engine_path: Path) -> Path:
    """The name `compile --baseline` gives TensorRT alone's engine for its files beside the trtfuse engine
    (NAME.engine.baseline: its layer information and per-layer profiles; the engine itself is not written)."""
    return engine_path.with_name(engine_path.name + ".baseline")


def layer_profile_path(engine_path: Path, profile_index: int) -> Path:
    """Where `compile --baseline` writes the per-layer profile of optimisation profile N at its OPT shapes, as
    `trtexec --exportProfile` would: NAME.engine.profileN.json."""
    return engine_path.with_name(f"{engine_path.name}.profile{profile_index}.json")


def is_sidecar(path: Path) -> bool:
    """Whether the file at `path` is a sidecar trtfuse wrote (its format says so), which a build may replace."""
    data = json_object(path)
    return data is not None and data.get("format") in (SIDECAR_FORMAT, FORMAT_WITHOUT_SHAPE_TENSORS)


def is_engine_companion(path: Path) -> bool:
    """Whether the file at `path` is one trtfuse wrote beside an engine (its layer information, the A/B's profiles):
    the sidecar of an engine whose name `path`'s name starts with lists it under `files`."""
    parts = path.name.split(".")
    for end in range(len(parts) - 1, 0, -1):
        sidecar = sidecar_path_for(path.with_name(".".join(parts[:end])))
        if is_sidecar(sidecar) and path.name in (json_object(sidecar) or {}).get("files", []):
            return True
    return False


def is_engine_with_sidecar(path: Path) -> bool:
    """Whether the file at `path` is an engine trtfuse built: the sidecar beside it is trtfuse's and names it."""
    sidecar = sidecar_path_for(path)
    return is_sidecar(sidecar) and (json_object(sidecar) or {}).get("engine") == path.name


@dataclass(frozen=True)
class Sidecar:
    """What a sidecar says, validated. `fused_model` is relative to the engine's folder and stays inside it;
    `shape_tensor_inputs` is None for a format 1 sidecar, which did not record them."""

    path: Path
    fused_model: Path
    profiles: tuple[Profile, ...]
    plugin_kind: PluginKind
    ptx_isa: tuple[str, ...]
    versions: dict[str, str]
    gpu: str
    data: dict[str, Any]
    shape_tensor_inputs: frozenset[str] | None = frozenset()


def make_sidecar(
    *,
    engine_path: Path,
    fused_model_path: Path,
    versions: Mapping[str, str],
    gpu: str,
    plugins: Sequence[Mapping[str, Any]],
    profiles: Sequence[Profile],
    build: Mapping[str, Any],
    shape_tensor_inputs: Iterable[str],
) -> dict[str, Any]:
    """The sidecar's content; the fused model path is relative to the engine's folder, which must hold it.
    `shape_tensor_inputs`: the network inputs TensorRT takes as shape tensors (`build.shape_tensor_inputs`)."""
    folder = resolved(engine_path).parent
    fused = Path(os.path.relpath(resolved(fused_model_path), folder))
    if fused.parts[:1] == ("..",):
        raise TrtfuseError(f"{fused_model_path}: the fused model must be in the engine's folder {folder}")
    return {
        "format": SIDECAR_FORMAT,
        "engine": engine_path.name,
        "fused_model": fused.as_posix(),
        "versions": dict(versions),
        "gpu": gpu,
        "plugins": [dict(plugin) for plugin in plugins],
        "profiles": [profile.to_json() for profile in profiles],
        "shape_tensor_inputs": sorted(shape_tensor_inputs),
        "build": dict(build),
    }


def write_sidecar(engine_path: Path, sidecar: Mapping[str, Any]) -> Path:
    path = sidecar_path_for(engine_path)
    write_json_atomic(path, sidecar)
    return path


def read_sidecar(engine_path: Path) -> Sidecar | None:
    """The sidecar beside `engine_path`, validated; None when there is none."""
    path = sidecar_path_for(engine_path)
    if not os.path.lexists(path):
        return None
    if not path.is_file():
        raise TrtfuseError(f"{path}: the engine's sidecar is not a regular file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise TrtfuseError(f"{path}: unreadable engine sidecar ({error})") from None
    if not isinstance(data, dict) or data.get("format") not in (SIDECAR_FORMAT, FORMAT_WITHOUT_SHAPE_TENSORS):
        raise TrtfuseError(f"{path}: not a trtfuse engine sidecar (expected format {SIDECAR_FORMAT})")
    return _Reader(path, data).sidecar()


class _Reader:
    """Reads one sidecar's keys; each problem names the sidecar and the key."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path = path
        self.data = data

    def fail(self, key: str, problem: str) -> TrtfuseError:
        return TrtfuseError(f"{self.path}: '{key}' {problem}")

    def sidecar(self) -> Sidecar:
        build = self._mapping(self.data, "build")
        kind_text = build.get("plugins")
        try:
            kind = PluginKind(kind_text)
        except ValueError:
            kinds = " or ".join(k.value for k in PluginKind)
            raise self.fail("build.plugins", f"is {kind_text!r}, not {kinds}") from None
        isas = build.get("ptx_isa", [])
        if kind is PluginKind.AOT and "ptx_isa" not in build:
            raise self.fail("build.ptx_isa", "is missing: an AOT engine's sidecar records the PTX ISAs it embeds")
        if not isinstance(isas, list) or not all(isinstance(isa, str) for isa in isas):
            raise self.fail("build.ptx_isa", 'must be a list of PTX ISA versions such as "8.8"')
        versions = self._mapping(self.data, "versions")
        if not all(isinstance(value, str) for value in versions.values()):
            raise self.fail("versions", "must map each tool to its version string")
        gpu = self.data.get("gpu")
        if not isinstance(gpu, str):
            raise self.fail("gpu", "must be the GPU's name")
        profiles = self._profiles()
        return Sidecar(
            path=self.path,
            fused_model=self._fused_model(),
            profiles=profiles,
            plugin_kind=kind,
            ptx_isa=tuple(isas),
            versions=dict(versions),
            gpu=gpu,
            data=self.data,
            shape_tensor_inputs=self._shape_tensor_inputs(profiles),
        )

    def _mapping(self, data: Mapping[str, Any], key: str) -> Mapping[str, Any]:
        value = data.get(key)
        if not isinstance(value, dict):
            raise self.fail(key, "is missing or not an object")
        return value

    def _fused_model(self) -> Path:
        value = self.data.get("fused_model")
        if not isinstance(value, str) or not value or "\0" in value:
            raise self.fail("fused_model", "must be the fused model's path relative to the engine's folder")
        relative = Path(value)
        if relative.is_absolute() or ".." in relative.parts:
            raise self.fail("fused_model", f"is {value!r}, outside the engine's folder")
        folder = self.path.absolute().parent
        if not is_inside(folder / relative, folder):
            raise self.fail(
                "fused_model",
                f"is {value!r}, a symlink that leads outside the engine's folder to {resolved(folder / relative)}",
            )
        return relative

    def _shape_tensor_inputs(self, profiles: Sequence[Profile]) -> frozenset[str] | None:
        """The recorded shape-tensor inputs (None in a format 1 sidecar). TensorRT builds no profile that leaves a
        shape-tensor input without a value range, so each one named has values in every profile."""
        if self.data["format"] == FORMAT_WITHOUT_SHAPE_TENSORS:
            return None
        names = self.data.get("shape_tensor_inputs")
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise self.fail("shape_tensor_inputs", "must list the input names TensorRT takes as shape tensors")
        for name in names:
            lacking = next((profile.name for profile in profiles if name not in profile.values), None)
            if lacking is not None:
                raise self.fail(
                    "shape_tensor_inputs", f"names {name!r}, whose values profile {lacking!r} gives no range for"
                )
        return frozenset(names)

    def _profiles(self) -> tuple[Profile, ...]:
        profiles = self.data.get("profiles")
        if not isinstance(profiles, list) or not profiles:
            raise self.fail("profiles", "must be a non-empty list of optimisation profiles")
        return tuple(self._profile(index, profile) for index, profile in enumerate(profiles))

    def _profile(self, index: int, data: Any) -> Profile:
        key = f"profiles[{index}]"
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise self.fail(key, "must be an object with a name")
        shapes = self._ranges(f"{key}.shapes", data.get("shapes"))
        if not shapes:
            raise self.fail(f"{key}.shapes", "must give at least one input's shape range")
        values = self._ranges(f"{key}.values", data.get("values", {}))
        return Profile(name=data["name"], shapes=shapes, values=values)

    def _ranges(self, key: str, data: Any) -> dict[str, ShapeRange]:
        if not isinstance(data, dict):
            raise self.fail(key, "must map input names to min/opt/max shapes")
        ranges = {}
        for name, bounds in data.items():
            where = f"{key}.{name}"
            if not isinstance(bounds, dict):
                raise self.fail(where, "must hold min, opt and max shapes")
            shapes = []
            for bound in ("min", "opt", "max"):
                shape = bounds.get(bound)
                if not isinstance(shape, list) or not all(type(dim) is int and dim >= 0 for dim in shape):
                    raise self.fail(f"{where}.{bound}", "must be a list of non-negative integers")
                shapes.append(tuple(shape))
            low, opt, high = shapes
            if not len(low) == len(opt) == len(high) or not all(
                a <= b <= c for a, b, c in zip(low, opt, high, strict=True)
            ):
                raise self.fail(where, f"is {low}:{opt}:{high}, not min <= opt <= max of one rank")
            ranges[name] = ShapeRange(low, opt, high)
        return ranges
