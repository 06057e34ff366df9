"""Which Python module provides TensorRT's plugin types: `tensorrt`, or TensorRT-RTX's only when asked for."""

from __future__ import annotations

import importlib
import os
from types import ModuleType

from trtfuse.errors import MissingDependencyError

# TensorRT-RTX shares TensorRT's plugin and descriptor types but cannot run these plugins in an engine, so it is a
# stand-in for tests and never taken silently.
TRT_MODULE_ENV = "TRTFUSE_TRT_MODULE"
RTX_MODULE = "tensorrt_rtx"


def load_trt() -> ModuleType:
    """The `tensorrt` module; `tensorrt_rtx` only where `tensorrt` is absent and TRTFUSE_TRT_MODULE names it."""
    try:
        return importlib.import_module("tensorrt")
    except ImportError as tensorrt_error:
        requested = os.environ.get(TRT_MODULE_ENV, "")
        if requested != RTX_MODULE:
            raise MissingDependencyError(
                f"the trtfuse plugins need TensorRT's Python module `tensorrt` (pip install tensorrt): {tensorrt_error}"
            ) from tensorrt_error
        try:
            return importlib.import_module(RTX_MODULE)
        except ImportError as rtx_error:
            raise MissingDependencyError(
                f"{TRT_MODULE_ENV}={RTX_MODULE} but `tensorrt_rtx` does not import (pip install tensorrt-rtx-cu13): "
                f"{rtx_error}"
            ) from rtx_error


def contract_data_types(trt: ModuleType) -> dict[str, object]:
    """The contract's dtype names as `trt`'s DataType members: the one mapping of the TensorRT side."""
    return {"float32": trt.DataType.FLOAT, "float16": trt.DataType.HALF, "bfloat16": trt.DataType.BF16}


def quant_data_types(trt: ModuleType) -> dict[str, object]:
    """The contract's quantized dtypes (`contract.QUANT_DTYPE_CODES`) as `trt`'s DataType members: a quantized node's
    normalised outputs only, never an activation or a weight."""
    return {"float8_e4m3fn": trt.DataType.FP8, "int8": trt.DataType.INT8}
