"""What a fused model must keep of its original before any number is compared: the same inputs and outputs, its
declared output types (changes reported or failed), and well-formed trtfuse nodes (a foreign or hand-edited file may
hold anything). Each problem is one line naming the file and the input, output or node."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import onnx
from onnx import helper

from trtfuse import contract
from trtfuse.errors import TrtfuseError
from trtfuse.graph_inputs import fed_inputs
from trtfuse.model_io import LoadedModel


def check_same_inputs(original: LoadedModel, fused: LoadedModel) -> None:
    """The two models must take the same inputs, of the same dtypes, and give the same outputs by name."""
    original_inputs = {value.name: value for value in fed_inputs(original.model)}
    fused_inputs = {value.name: value for value in fed_inputs(fused.model)}
    original_outputs = _interface(original.model.graph.output, original.model)
    fused_outputs = _interface(fused.model.graph.output, fused.model)
    for kind, original_names, fused_names in (
        ("inputs", set(original_inputs), set(fused_inputs)),
        ("outputs", set(original_outputs), set(fused_outputs)),
    ):
        if original_names != fused_names:
            difference = ", ".join(sorted(original_names ^ fused_names))
            raise TrtfuseError(f"{fused.path}: graph {kind} differ from {original.path}'s: {difference}")
    for name, value in original_inputs.items():
        if _type_text(value) != _type_text(fused_inputs[name]):
            raise TrtfuseError(
                f"{fused.path}: input '{name}' is {_type_text(fused_inputs[name])}, in {original.path} "
                f"{_type_text(value)}"
            )


def declared_output_differences(original: LoadedModel, fused: LoadedModel) -> tuple[dict[str, str], dict[str, str]]:
    """Per output, what the fused model changed in its declared type: changes that fail it (no dtype, another dtype,
    rank or static dim) and changes that do not (a symbolic dim renamed or made static, as shape inference in the
    pass may do: the graph computes the same values, and its numbers are still judged)."""
    fused_outputs = _interface(fused.model.graph.output, fused.model)
    failures, remarks = {}, {}
    for name, value in _interface(original.model.graph.output, original.model).items():
        declared, candidate = value.type.tensor_type, fused_outputs[name].type.tensor_type
        change = f"declared {_type_text(fused_outputs[name])} in the fused model, {_type_text(value)} originally"
        if declared.elem_type and not candidate.elem_type:
            failures[name] = "the fused model declares no dtype for it"
        elif declared.elem_type != candidate.elem_type or not _same_static_dims(declared, candidate):
            failures[name] = change
        elif declared.HasField("shape") and _type_text(value) != _type_text(fused_outputs[name]):
            remarks[name] = change
    return failures, remarks


def _same_static_dims(declared: onnx.TypeProto.Tensor, candidate: onnx.TypeProto.Tensor) -> bool:
    if not declared.HasField("shape") or not candidate.HasField("shape"):
        return True
    if len(declared.shape.dim) != len(candidate.shape.dim):
        return False
    return all(
        not dim.HasField("dim_value") or (other.HasField("dim_value") and other.dim_value == dim.dim_value)
        for dim, other in zip(declared.shape.dim, candidate.shape.dim, strict=True)
    )


def _interface(values: Sequence[onnx.ValueInfoProto], model: onnx.ModelProto) -> dict[str, onnx.ValueInfoProto]:
    initializers = {tensor.name for tensor in model.graph.initializer}
    return {value.name: value for value in values if value.name not in initializers}


def _type_text(value: onnx.ValueInfoProto) -> str:
    tensor = value.type.tensor_type
    dtype = dtype_name(tensor.elem_type) if tensor.elem_type else "no dtype"
    if not tensor.HasField("shape"):
        return dtype
    dims = [str(dim.dim_value) if dim.HasField("dim_value") else dim.dim_param or "?" for dim in tensor.shape.dim]
    return f"{dtype}[{','.join(dims)}]"


def dtype_name(elem_type: int) -> str:
    """The numpy name of an ONNX element type (`float16`), else its ONNX name in lower case (`string`)."""
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type)).name
    except (KeyError, TypeError):
        return onnx.TensorProto.DataType.Name(elem_type).lower()


_FIELD_TYPES = {
    contract.ATTR_NAMESPACE: onnx.AttributeProto.STRING,
    contract.ATTR_VERSION: onnx.AttributeProto.STRING,
    contract.ATTR_EPSILON: onnx.AttributeProto.FLOAT,
    contract.ATTR_WEIGHT_OFFSET: onnx.AttributeProto.FLOAT,
    contract.ATTR_WEIGHT_MODE: onnx.AttributeProto.INT,
    contract.ATTR_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_Q_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_K_HIDDEN: onnx.AttributeProto.INT,
    contract.ATTR_OUTPUT_DTYPE: onnx.AttributeProto.INT,
}

_ARITY = {contract.RMS_NORM_OP: ((1, 2), 1), contract.QK_NORM_OP: ((2, 4), 2)}


def check_fused_nodes(fused: LoadedModel) -> None:
    """Every node in the trtfuse domain must be a contract op with its fields of the right types and values (a foreign
    or hand-edited file may hold anything); each problem is one line naming the node."""
    for node in fused.model.graph.node:
        if node.domain != contract.ONNX_DOMAIN:
            continue
        where = f"{fused.path}: node '{node.name or (node.output[0] if node.output else '')}'"
        if node.op_type not in contract.FUSED_OPS:
            raise TrtfuseError(f"{where}: {node.op_type} is no trtfuse op ({', '.join(contract.FUSED_OPS)})")
        (min_inputs, max_inputs), outputs = _ARITY[node.op_type]
        if not min_inputs <= len(node.input) <= max_inputs or len(node.output) != outputs:
            raise TrtfuseError(
                f"{where}: {node.op_type} takes {min_inputs}-{max_inputs} inputs and gives {outputs} output(s), "
                f"not {len(node.input)} and {len(node.output)}"
            )
        fields = contract.RMS_NORM_FIELDS if node.op_type == contract.RMS_NORM_OP else contract.QK_NORM_FIELDS
        attributes = {attribute.name: attribute for attribute in node.attribute}
        for name in (*fields, *contract.OPTIONAL_FIELDS):
            attribute = attributes.get(name)
            expected = _FIELD_TYPES.get(name)
            if attribute is None and name in contract.OPTIONAL_FIELDS:
                continue
            if attribute is None:
                raise TrtfuseError(f"{where}: {node.op_type} lacks attribute {name}")
            if expected is None:
                continue
            if attribute.type != expected:
                kind = onnx.AttributeProto.AttributeType.Name(expected).lower()
                raise TrtfuseError(f"{where}: attribute {name} must be one {kind}")
            _check_field_value(where, name, helper.get_attribute_value(attribute))


def _check_field_value(where: str, name: str, value: object) -> None:
    if name == contract.ATTR_EPSILON and not (math.isfinite(value) and value >= 0.0):
        raise TrtfuseError(f"{where}: epsilon {value} is not a finite non-negative number")
    if name == contract.ATTR_WEIGHT_OFFSET and not math.isfinite(value):
        raise TrtfuseError(f"{where}: weight_offset {value} is not finite")
    if name == contract.ATTR_WEIGHT_MODE and value not in {mode.value for mode in contract.WeightMode}:
        modes = ", ".join(f"{mode.value} ({mode.name})" for mode in contract.WeightMode)
        raise TrtfuseError(f"{where}: weight_mode {value} is none of {modes}")
    if name == contract.ATTR_OUTPUT_DTYPE and value not in contract.OUTPUT_DTYPE_CODES.values():
        codes = ", ".join(f"{code} ({dtype})" for dtype, code in contract.OUTPUT_DTYPE_CODES.items())
        raise TrtfuseError(f"{where}: output_dtype {value} is none of {codes}")
    if name in (contract.ATTR_HIDDEN, contract.ATTR_Q_HIDDEN, contract.ATTR_K_HIDDEN) and value < 1:
        raise TrtfuseError(f"{where}: {name} {value} is not a positive length")
