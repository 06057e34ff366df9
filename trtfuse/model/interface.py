"""A model's interface as a caller sees it: the inputs it feeds, the names of ONNX element types, and the element
type of each tensor of its graph."""

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


def value_types(model: onnx.ModelProto) -> tuple[onnx.GraphProto, dict[str, int]]:
    """The main graph after shape inference (as it is where inference raises) and the element type of every tensor
    it declares or infers one for."""
    try:
        graph = onnx.shape_inference.infer_shapes(model).graph
    except Exception:
        # Shape inference raises for graphs onnxruntime still runs; their tensors keep the types they declare.
        graph = model.graph
    types = {value.name: value.type.tensor_type.elem_type for value in [*graph.input, *graph.value_info]}
    types.update({value.name: value.type.tensor_type.elem_type for value in graph.output})
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return graph, types
