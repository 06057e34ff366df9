"""TensorRT's plugin types for the plugin tests: `tensorrt`, or TensorRT-RTX's module standing in for them where
`tensorrt` is absent; a test module importing this skips when neither is there. Fields as the
ONNX parser makes them, and a recorder standing in for the kernels the plugins ask trtfuse.kernels for."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

from trtfuse.errors import MissingDependencyError
from trtfuse.plugins.trt_module import RTX_MODULE, TRT_MODULE_ENV, load_trt

_ASKED = TRT_MODULE_ENV in os.environ
os.environ.setdefault(TRT_MODULE_ENV, RTX_MODULE)
try:
    trt = load_trt()
except MissingDependencyError as missing:
    # Name the variable only to a user who set it; otherwise say what to install.
    reason = (
        str(missing)
        if _ASKED
        else ("neither `tensorrt` nor TensorRT-RTX's `tensorrt_rtx` imports (pip install tensorrt-rtx-cu13)")
    )
    pytest.skip(f"no TensorRT plugin types: {reason}", allow_module_level=True)


@dataclass
class RecordingKernel:
    """Stands in for a trtfuse.kernels kernel: records the spec it was made for and every call."""

    spec: Any
    warm_ups: list[int] = field(default_factory=list)
    launches: list[tuple[int, ...]] = field(default_factory=list)

    def warm_up(self, max_rows: int) -> None:
        self.warm_ups.append(max_rows)

    def launch(self, *args: int) -> None:
        self.launches.append(args)


def fields_of(**values: tuple[Any, Any]) -> tuple[Any, list[np.ndarray]]:
    """A PluginFieldCollection from name=(numpy array, PluginFieldType)."""
    arrays = [array for array, _kind in values.values()]
    collection = trt.PluginFieldCollection(
        [trt.PluginField(name, array, kind) for name, (array, kind) in values.items()]
    )
    return collection, arrays


def f32(value: float) -> tuple[np.ndarray, Any]:
    return np.array([value], dtype=np.float32), trt.PluginFieldType.FLOAT32


def i32(value: int) -> tuple[np.ndarray, Any]:
    return np.array([value], dtype=np.int32), trt.PluginFieldType.INT32


def rms_fields(**overrides: Any) -> dict[str, Any]:
    """An fp16 TrtfuseRmsNorm's fields (hidden 64, Llama's weight mode); an override of None drops the field."""
    values = {
        "epsilon": f32(1e-6),
        "weight_offset": f32(0.0),
        "weight_mode": i32(1),
        "hidden_size": i32(64),
        "output_dtype": i32(10),
    }
    values.update(overrides)
    return {name: value for name, value in values.items() if value is not None}


def create(creator: Any, values: dict[str, Any], node: str = "layers.0.norm", phase: Any = None) -> Any:
    collection, _arrays = fields_of(**values)
    return creator.create_plugin(node, collection, phase or trt.TensorRTPhase.BUILD)
