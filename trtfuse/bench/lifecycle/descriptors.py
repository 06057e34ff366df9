"""What TensorRT hands a plugin, built from a case: the parser's plugin fields and the tensor descriptors of the
build (min / opt / max of the profile) and of a run (concrete shapes)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from trtfuse.bench.lifecycle.cases import NormCase, Shape
from trtfuse.contract import FLOAT_FIELDS
from trtfuse.contract.codec import NodeFields
from trtfuse.plugins.python.base import OUTPUT_DATA_TYPES, trt

# Every dtype a plugin tensor may have by its contract name: the float dtypes, and a quantized output's.
DTYPE_BY_NAME = OUTPUT_DATA_TYPES


def parser_fields(config: NodeFields) -> tuple[Any, list[np.ndarray]]:
    """The fields TensorRT's ONNX parser builds from a fused node's attributes (float -> FLOAT32, int -> INT32),
    from the numbers alone rather than the plugins' own serialiser; the arrays must outlive the collection."""
    arrays, fields = [], []
    for name, value in config.numbers().items():
        is_float = name in FLOAT_FIELDS
        array = np.array([value], dtype=np.float32 if is_float else np.int32)
        kind = trt.PluginFieldType.FLOAT32 if is_float else trt.PluginFieldType.INT32
        arrays.append(array)
        fields.append(trt.PluginField(name, array, kind))
    return trt.PluginFieldCollection(fields), arrays


def tensor_desc(shape: Shape, dtype: str) -> Any:
    desc = trt.PluginTensorDesc()
    desc.dims = trt.Dims(list(shape))
    desc.type = DTYPE_BY_NAME[dtype]
    desc.format = trt.TensorFormat.LINEAR
    return desc


def dynamic_desc(min_shape: Shape, opt_shape: Shape, max_shape: Shape, dtype: str) -> Any:
    """What the builder passes to configure_plugin: -1 where the profile lets a dim vary, and min / opt / max."""
    desc_dims = tuple(lo if lo == hi else -1 for lo, hi in zip(min_shape, max_shape, strict=True))
    desc = trt.DynamicPluginTensorDesc()
    desc.desc = tensor_desc(desc_dims, dtype)
    desc.min = trt.Dims(list(min_shape))
    desc.opt = trt.Dims(list(opt_shape))
    desc.max = trt.Dims(list(max_shape))
    return desc


def profile_descs(case: NormCase) -> tuple[list[Any], list[Any]]:
    """configure_plugin's descriptors: every input and output with the min / opt / max of its part."""

    def descs(shapes_of: Callable[[Sequence[Shape]], list[Shape]], dtypes: Sequence[str]) -> list[Any]:
        lows, opts, highs = shapes_of(case.min_shapes), shapes_of(case.opt_shapes), shapes_of(case.max_shapes)
        profile = zip(lows, opts, highs, dtypes, strict=True)
        return [dynamic_desc(lo, opt, hi, dtype) for lo, opt, hi, dtype in profile]

    return descs(case.input_shapes, case.input_dtypes), descs(case.output_shapes, case.output_dtypes)


def run_descs(case: NormCase, part_shapes: Sequence[Shape]) -> tuple[list[Any], list[Any]]:
    """on_shape_change's and enqueue's descriptors for one run's part shapes."""
    inputs = [
        tensor_desc(shape, dtype)
        for shape, dtype in zip(case.input_shapes(part_shapes), case.input_dtypes, strict=True)
    ]
    outputs = [
        tensor_desc(shape, dtype)
        for shape, dtype in zip(case.output_shapes(part_shapes), case.output_dtypes, strict=True)
    ]
    return inputs, outputs
