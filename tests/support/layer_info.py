"""The layer-information fixtures (tests/engine/layer_info, README.md there says which TensorRT output each follows)
and the fused models they describe, made by the real fusion pass from ModelOpt's exports in models/fixtures/tools."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from trtfuse.engine.layer_info import LayerInformation, parse_layer_information
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.pipeline import fuse_file

from support.paths import FIXTURES, REPO_ROOT

LAYER_INFO = REPO_ROOT / "tests" / "engine" / "layer_info"
# Each fixture's fused model: the export of models/fixtures/tools it was made from.
EXPORTS = {
    "qwen3-fp8": "qwen3-modelopt-fp8-kv",
    "qwen3-int8": "qwen3-modelopt-int8-fp16",
    "gemma3-int8": "gemma3-modelopt-int8-fp16",
}


def fused_export(model: str, folder: Path) -> tuple[Path, Path]:
    """The fused model of EXPORTS[model] and its fusion report, written into `folder` by `trtfuse fuse`'s code with
    the rotations left in the graph (`--no-fuse-rope`): the layer information files name that fusion's nodes."""
    fused, report = folder / f"{model}.fused.onnx", folder / f"{model}.fusion.json"
    if not fused.exists():
        fuse_file(FIXTURES / "tools" / f"{EXPORTS[model]}.onnx", fused, report, fusion=FusionOptions(fuse_rope=False))
    return fused, report


def fused_model(model: str, folder: Path) -> LoadedModel:
    return load_model(fused_export(model, folder)[0])


def fixture_data(name: str) -> dict[str, Any]:
    return json.loads((LAYER_INFO / name).read_text(encoding="utf-8"))


def edited(name: str, edit: Any) -> LayerInformation:
    """A fixture read after `edit(data)` changed its parsed JSON in place."""
    data = fixture_data(name)
    edit(data)
    return parse_layer_information(json.dumps(data), f"{name} (edited)")


def layer_named(data: dict[str, Any], name: str) -> dict[str, Any]:
    return next(layer for layer in data["Layers"] if layer["Name"] == name)


def refusal(read: Callable[[Path], object], path: Path, content: str) -> str:
    """The one-line error `read` raises for a file of `content` at `path`, checked to name the file."""
    path.write_text(content)
    with pytest.raises(TrtfuseError) as raised:
        read(path)
    message = str(raised.value)
    assert message.startswith(f"{path}: ") and "\n" not in message
    return message
