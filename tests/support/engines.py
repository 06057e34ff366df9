"""Engines on disk as `trtfuse compile` leaves them: a fused model, the engine file (stand-in bytes, never
deserialised) and its sidecar."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import onnx

from trtfuse.contract import PluginKind
from trtfuse.engine.build import tool_versions
from trtfuse.engine.build_options import BuildOptions
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile, ShapeRange
from trtfuse.engine.sidecar import Sidecar, make_sidecar, write_sidecar
from trtfuse.files import write_bytes_atomic

from support.models import save_model_file, tiny_lm

DECODE = Profile("decode", {"input_ids": ShapeRange((1, 1), (1, 1), (4, 1))})
PREFILL = Profile("prefill", {"input_ids": ShapeRange((1, 2), (1, 64), (1, 128))})


def write_engine_files(engine: Path, engine_bytes: bytes, sidecar: dict) -> Path:
    """The engine file and its sidecar, as the build writes them; returns the sidecar's path."""
    write_bytes_atomic(engine, engine_bytes)
    return write_sidecar(engine, sidecar)


def engine_with_sidecar(
    tmp_path: Path,
    profiles: Sequence[Profile] = (DECODE, PREFILL),
    plugins: PluginKind = PluginKind.PYTHON,
    model: onnx.ModelProto | None = None,
    ptx_isa: Sequence[str] = ("8.8",),
    shape_tensor_inputs: Sequence[str] = (),
) -> Path:
    """A fused model (`model`, default a tiny fp16 LM) and a sidecar as `compile` writes them beside a stand-in
    engine; `shape_tensor_inputs` are those the build found the network to take as shape tensors."""
    fused = save_model_file(model if model is not None else tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    engine = tmp_path / "m.engine"
    build = BuildOptions(profiles=tuple(profiles), plugins=plugins).to_json()
    if plugins is PluginKind.AOT:
        build["ptx_isa"] = list(ptx_isa)
    sidecar = make_sidecar(
        engine_path=engine,
        fused_model_path=fused,
        versions=tool_versions("none"),
        gpu="none",
        plugins=[],
        profiles=profiles,
        build=build,
        shape_tensor_inputs=shape_tensor_inputs,
    )
    write_engine_files(engine, b"not an engine", sidecar)
    return engine


def engine_in_memory(path: Path, profiles: Sequence[Profile], plugins: PluginKind = PluginKind.PYTHON) -> EngineFile:
    """An opened engine whose sidecar gives `profiles`, with nothing on disk (for sessions whose runner is a fake)."""
    sidecar = Sidecar(
        path=path.with_name(path.name + ".json"),
        fused_model=Path("model.fused.onnx"),
        profiles=tuple(profiles),
        plugin_kind=plugins,
        ptx_isa=(),
        versions={},
        gpu="none",
        data={},
    )
    return EngineFile(path, sidecar)
