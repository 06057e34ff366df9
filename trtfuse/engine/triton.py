"""The `config.pbtxt` of a Triton model repository for a trtfuse engine (`platform: "tensorrt_plan"`).

Read off the engine's sidecar (its profiles, its plugin kind) and the fused model it names (each input's and output's
dtype and dims): every input and output with its dims, -1 where the engine's profiles let it vary; `max_batch_size:
0`, since the engine's batch is an explicit dim of every input (Triton's own batching would add another); one
instance group offered every profile, so that Triton's TensorRT backend picks, per request, the profile that holds it
(the prompt in the prefill profile, each next token in the decode one). Only AOT engines: Triton's TensorRT backend
is C++ and runs no Python interpreter, so the Python plugins cannot run in it.
"""

from __future__ import annotations

from collections.abc import Sequence

import onnx

from trtfuse.contract import PluginKind
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile
from trtfuse.errors import TrtfuseError
from trtfuse.model.interface import fed_inputs
from trtfuse.model.onnx_file import load_model

# ONNX element type -> Triton's model configuration type (the TensorRT column of Triton's datatype table).
TRITON_TYPES = {
    onnx.TensorProto.BOOL: "TYPE_BOOL",
    onnx.TensorProto.UINT8: "TYPE_UINT8",
    onnx.TensorProto.INT8: "TYPE_INT8",
    onnx.TensorProto.INT32: "TYPE_INT32",
    onnx.TensorProto.INT64: "TYPE_INT64",
    onnx.TensorProto.FLOAT16: "TYPE_FP16",
    onnx.TensorProto.BFLOAT16: "TYPE_BF16",
    onnx.TensorProto.FLOAT: "TYPE_FP32",
}
DYNAMIC = -1


def _triton_type(value: onnx.ValueInfoProto, where: str) -> str:
    elem_type = value.type.tensor_type.elem_type
    if elem_type not in TRITON_TYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise TrtfuseError(f"{where}: {value.name!r} is {name}, which Triton's TensorRT backend has no type for")
    return TRITON_TYPES[elem_type]


def _input_dims(name: str, profiles: Sequence[Profile]) -> list[int]:
    """Per axis: the size where every profile fixes it to the same one, else -1."""
    ranges = [profile.shapes[name] for profile in profiles if name in profile.shapes]
    dims = []
    for axis in range(len(ranges[0].min)):
        sizes = {size for shape in ranges for size in (shape.min[axis], shape.max[axis])}
        dims.append(sizes.pop() if len(sizes) == 1 else DYNAMIC)
    return dims


def _output_dims(value: onnx.ValueInfoProto) -> list[int]:
    return [dim.dim_value if dim.HasField("dim_value") else DYNAMIC for dim in value.type.tensor_type.shape.dim]


def _tensor(name: str, data_type: str, dims: list[int], shape_tensor: bool) -> list[str]:
    lines = ["  {", f'    name: "{name}"', f"    data_type: {data_type}"]
    # Triton refuses the empty shape: a scalar is one element, reshaped to none for the engine.
    lines.append(f"    dims: [ {', '.join(map(str, dims or [1]))} ]")
    if not dims:
        lines.append("    reshape: { shape: [ ] }")
    if shape_tensor:
        lines.append("    is_shape_tensor: true")
    lines.append("  }")
    return lines


def triton_config(engine: EngineFile, name: str | None = None) -> str:
    """The config.pbtxt text for `engine` (with its sidecar; AOT plugins, or none); `name` is the model's folder name
    in the repository (Triton takes the folder's name when it is left out)."""
    if engine.sidecar is None:
        raise TrtfuseError(
            f"{engine.path}: no sidecar beside the engine (written by trtfuse compile) to read its profiles"
        )
    if engine.plugin_kind is not PluginKind.AOT and engine.sidecar.data.get("plugins"):
        raise TrtfuseError(
            f"{engine.path}: its plugins are Python plugins, which Triton's TensorRT backend (C++, no Python "
            "interpreter) cannot run; build the engine with AOT plugins (trtfuse compile --plugins aot, TensorRT >= "
            "10.14) to serve it from Triton"
        )
    fused = load_model(engine.fused_model_path).model
    profiles = engine.profiles
    where = str(engine.fused_model_path)
    lines = [*([f'name: "{name}"'] if name else []), 'platform: "tensorrt_plan"', "max_batch_size: 0", "input ["]
    inputs = fed_inputs(fused)
    for index, value in enumerate(inputs):
        shape_tensor = any(value.name in profile.values for profile in profiles)
        dims = _input_dims(value.name, profiles)
        lines += _tensor(value.name, _triton_type(value, where), dims, shape_tensor)
        if index < len(inputs) - 1:
            lines[-1] += ","
    lines += ["]", "output ["]
    for index, value in enumerate(fused.graph.output):
        lines += _tensor(value.name, _triton_type(value, where), _output_dims(value), False)
        if index < len(fused.graph.output) - 1:
            lines[-1] += ","
    lines.append("]")
    listed = ", ".join(f'"{index}"' for index in range(len(profiles)))
    names = ", ".join(profile.name for profile in profiles)
    lines += [
        "instance_group [",
        "  {",
        "    kind: KIND_GPU",
        "    count: 1",
        f"    # the engine's optimisation profiles ({names}); the backend picks the one that holds each request",
        f"    profile: [ {listed} ]",
        "  }",
        "]",
    ]
    return "\n".join(lines) + "\n"
