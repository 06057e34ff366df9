"""What a fused model must keep of its original's interface before any number is compared: the same inputs and
outputs, and its declared output types (changes reported or failed). Each problem is one line naming the file and the
input or output."""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from trtfuse import contract
from trtfuse.errors import TrtfuseError
from trtfuse.model.interface import elem_type_name, fed_inputs
from trtfuse.model.onnx_file import LoadedModel


def check_original_unfused(original: LoadedModel) -> None:
    """The original must hold no trtfuse node: it runs as it is, and a fused model in its place (the arguments
    swapped) would fail as a runtime's refusal of an unknown op."""
    total = _plugin_node_count(original.model)
    if total:
        raise TrtfuseError(
            f"{original.path}: holds {total} trtfuse plugin node(s), so it is a fused model where the original is "
            "expected: the arguments look swapped (ORIGINAL.onnx first, then FUSED.onnx)"
        )


def unfused_candidate_warning(fused: LoadedModel) -> str:
    """'' when `fused` holds a trtfuse node; else the warning that the check compares the original with a model
    that was not fused (the same file given twice, say), which checks no fusion."""
    if _plugin_node_count(fused.model):
        return ""
    return f"{fused.path} holds no trtfuse plugin node: nothing fused is checked (was it written by trtfuse fuse?)"


def _plugin_node_count(model: onnx.ModelProto) -> int:
    return sum(node.domain == contract.ONNX_DOMAIN for node in model.graph.node)


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
    dtype = elem_type_name(tensor.elem_type) if tensor.elem_type else "no dtype"
    if not tensor.HasField("shape"):
        return dtype
    dims = [str(dim.dim_value) if dim.HasField("dim_value") else dim.dim_param or "?" for dim in tensor.shape.dim]
    return f"{dtype}[{','.join(dims)}]"
