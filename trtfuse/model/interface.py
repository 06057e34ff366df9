"""A model's interface as a caller sees it: the inputs it feeds, and the names of ONNX element types."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The main graph's inputs that are not initializers, in the graph's order."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]


def elem_type_name(elem_type: int) -> str:
    """The numpy name of an ONNX element type (`float16`), else its ONNX name in lower case (`string`)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()
