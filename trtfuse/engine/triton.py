"""The `config.pbtxt` of a Triton model repository for a trtfuse engine (`platform: "tensorrt_plan"`).

Built as Triton's own `ModelConfig` message (`tritonclient.grpc.model_config_pb2`) and printed by protobuf's
`text_format`, so every name, however quoted, stays a string. Read off the engine's sidecar (its profiles, its plugin
kind, the inputs TensorRT takes as shape tensors) and the fused model it names (each input's and output's dtype and
rank): every input and output with its dims, -1 where the engine's profiles let a dim vary; `max_batch_size` 0, since
the engine's batch is an explicit dim of every input (Triton's own batching would add another); one instance group
offered every profile, so that Triton's TensorRT backend picks, per request, a profile that holds it. Only AOT engines:
Triton's TensorRT backend is C++ and runs no Python interpreter, so the Python plugins cannot run in it.

What Triton refuses is refused here, in one line with Triton's reason (sources: triton-inference-server/core
`src/model_config_utils.cc` and tensorrt_backend `src/instance_state.cc`, `src/tensorrt_utils.cc`, cited in
docs/deploy.md): a scalar (0-d) input or output, which no config form serves with `max_batch_size` 0; a shape-tensor
input that is not a fixed-size 1-D INT32/INT64 tensor; a model name that is not a plain folder name.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from types import ModuleType

import onnx
from google.protobuf import text_format

from trtfuse.contract import PluginKind
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import ShapeRange
from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError
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
# The types the TensorRT backend takes for a shape-tensor input (instance_state.cc, InitializeShapeInputBinding).
SHAPE_TENSOR_TYPES = ("TYPE_INT32", "TYPE_INT64")
# Triton's variable-size dim (triton::common::WILDCARD_DIM).
DYNAMIC = -1
INSTALL_HINT = (
    "install it with `pip install -e '.[triton]'` in a trtfuse checkout, or `pip install 'tritonclient[grpc]'`"
)
SCALAR_REFUSAL = (
    "is a scalar (0-d), which Triton cannot serve from a TensorRT engine: its core refuses empty dims, and with "
    "max_batch_size 0 the empty reshape a scalar would need (model_config_utils.cc, ValidateIOShape), while its "
    "TensorRT backend needs the config's rank to equal the engine's; export the model with it as a 1-element tensor"
)


def model_config_module() -> ModuleType:
    """Triton's model configuration messages, as tritonclient ships them."""
    try:
        from tritonclient.grpc import model_config_pb2
    except (ImportError, RuntimeError):
        # tritonclient without its grpc extra raises RuntimeError from tritonclient.grpc.
        raise MissingDependencyError(
            f"`trtfuse triton-config` needs Triton's ModelConfig from tritonclient; {INSTALL_HINT}"
        ) from None
    return model_config_pb2


def check_model_name(name: str) -> None:
    """Triton names a model by its folder in the repository and loads a config only where the two are equal
    (core `src/model_repository_manager/model_repository_manager.cc`, "directory name must equal model name"): a name
    that is no plain folder name would never load."""
    if name in ("", ".", "..") or "/" in name or "\\" in name or not name.isprintable():
        raise OptionError(
            "name",
            Choice("name"),
            f" {name!r}: not a plain folder name (no path separator, no control character, not . or ..); Triton "
            "names a model by its folder in the model repository",
        )


def _triton_type(value: onnx.ValueInfoProto, where: str) -> str:
    elem_type = value.type.tensor_type.elem_type
    if elem_type not in TRITON_TYPES:
        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type else "undefined"
        raise TrtfuseError(f"{where}: {value.name!r} is {name}, which Triton's TensorRT backend has no type for")
    return TRITON_TYPES[elem_type]


def _model_dims(value: onnx.ValueInfoProto) -> list[int | None] | None:
    """Per axis the fixed size, None where symbolic; None for no static rank."""
    if not value.type.tensor_type.HasField("shape"):
        return None
    return [dim.dim_value if dim.HasField("dim_value") else None for dim in value.type.tensor_type.shape.dim]


def _config_dim(sizes: set[int]) -> int:
    """One size where it is fixed; -1 where it varies, and where it is fixed at 0 (a prefill-only engine's past
    length): Triton takes only dims >= 1 or -1 (ValidateIOShape), and -1 lets the request give 0."""
    return sizes.pop() if len(sizes) == 1 and min(sizes) >= 1 else DYNAMIC


def _input_ranges(engine: EngineFile, value: onnx.ValueInfoProto) -> list[ShapeRange]:
    """The input's shape range in each profile; a fully static input left out of a profile has its one shape."""
    model_dims = _model_dims(value)
    static = model_dims is not None and all(size is not None for size in model_dims)
    rebuild = "rebuild the engine with trtfuse compile"
    ranges = []
    for profile in engine.profiles:
        shape = profile.shapes.get(value.name)
        if shape is None and not static:
            raise TrtfuseError(
                f"{engine.sidecar.path}: profile {profile.name!r} gives no shape for input {value.name!r} of the "
                f"fused model {engine.fused_model_path.name}; {rebuild}"
            )
        if shape is None:
            fixed = tuple(model_dims)
            shape = ShapeRange(fixed, fixed, fixed)
        ranges.append(shape)
    ranks = {len(shape.min) for shape in ranges} | ({len(model_dims)} if model_dims is not None else set())
    if len(ranks) > 1:
        raise TrtfuseError(
            f"{engine.sidecar.path}: input {value.name!r} has ranks {sorted(ranks)} across the fused model "
            f"{engine.fused_model_path.name} and the profiles, where the engine has one; {rebuild}"
        )
    for axis, size in enumerate(model_dims or ()):
        outside = next((str(shape) for shape in ranges if {shape.min[axis], shape.max[axis]} - {size}), None)
        if size is not None and outside is not None:
            raise TrtfuseError(
                f"{engine.sidecar.path}: a profile gives input {value.name!r} the shapes {outside}, where the fused "
                f"model {engine.fused_model_path.name} fixes dim {axis} at {size}; {rebuild}"
            )
    return ranges


def _input_dims(ranges: Sequence[ShapeRange]) -> list[int]:
    return [
        _config_dim({size for shape in ranges for size in (shape.min[axis], shape.max[axis])})
        for axis in range(len(ranges[0].min))
    ]


def _output_dims(value: onnx.ValueInfoProto, where: str) -> list[int]:
    model_dims = _model_dims(value)
    if model_dims is None:
        raise TrtfuseError(
            f"{where}: output {value.name!r} has no static rank, which Triton's TensorRT backend must be given"
        )
    return [_config_dim({size}) if size is not None else DYNAMIC for size in model_dims]


def _shape_tensor_inputs(engine: EngineFile, names: set[str]) -> frozenset[str]:
    """The inputs the engine takes as shape tensors, as the build recorded them. A format 1 sidecar recorded none:
    without value ranges in its profiles the engine has none (TensorRT builds no profile without a range for each
    shape-tensor input); with them, which ones TensorRT took is not known."""
    sidecar = engine.sidecar
    recorded = sidecar.shape_tensor_inputs
    if recorded is None:
        ranged = sorted({name for profile in engine.profiles for name in profile.values})
        if ranged:
            raise TrtfuseError(
                f"{sidecar.path}: written by an older trtfuse, it does not record which of {', '.join(ranged)} the "
                "engine takes as shape tensors (Triton checks is_shape_tensor against the engine); rebuild the "
                "engine with trtfuse compile"
            )
        return frozenset()
    unknown = sorted(recorded - names)
    if unknown:
        raise TrtfuseError(
            f"{sidecar.path}: 'shape_tensor_inputs' names {unknown[0]!r}, which the fused model "
            f"{engine.fused_model_path.name} has no input of"
        )
    return recorded


def _check_shape_tensor(name: str, data_type: str, dims: list[int], where: str) -> None:
    """The TensorRT backend binds a shape-tensor input only as a fixed-size 1-D INT32/INT64 tensor whose config dims
    equal the engine's (tensorrt_utils.cc, CompareShapeDimsSupported; instance_state.cc,
    InitializeShapeInputBinding)."""
    if data_type not in SHAPE_TENSOR_TYPES:
        raise TrtfuseError(f"{where}: shape-tensor input {name!r} is {data_type}; Triton takes only INT32 or INT64")
    if len(dims) != 1 or dims[0] == DYNAMIC:
        raise TrtfuseError(
            f"{where}: shape-tensor input {name!r} has dims {dims}; Triton's TensorRT backend takes a shape tensor "
            "only as a 1-D tensor of one fixed size"
        )


def _profile_comment(engine: EngineFile) -> str:
    # JSON strings are ASCII with every control character escaped: a profile name cannot end the comment line.
    named = ", ".join(f'"{index}" = {json.dumps(profile.name)}' for index, profile in enumerate(engine.profiles))
    return (
        "# Written by trtfuse triton-config. max_batch_size is 0 (protobuf's default, so not printed):\n"
        "# the batch is an explicit dim of every input.\n"
        f"# The engine's optimisation profiles, all offered to the instance: {named}.\n"
    )


def triton_config(engine: EngineFile, name: str | None = None) -> str:
    """The config.pbtxt text for `engine` (with its sidecar; AOT plugins, or none); `name` is the model's folder name
    in the repository (Triton takes the folder's name when it is left out)."""
    if name is not None:
        check_model_name(name)
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
    pb = model_config_module()
    fused = load_model(engine.fused_model_path).model
    where = str(engine.fused_model_path)
    inputs = fed_inputs(fused)
    shape_inputs = _shape_tensor_inputs(engine, {value.name for value in inputs})
    config = pb.ModelConfig(name=name or "", platform="tensorrt_plan", max_batch_size=0)
    for value in inputs:
        data_type = _triton_type(value, where)
        dims = _input_dims(_input_ranges(engine, value))
        if not dims:
            raise TrtfuseError(f"{where}: input {value.name!r} {SCALAR_REFUSAL}")
        if value.name in shape_inputs:
            _check_shape_tensor(value.name, data_type, dims, where)
        tensor = config.input.add(name=value.name, data_type=pb.DataType.Value(data_type), dims=dims)
        tensor.is_shape_tensor = value.name in shape_inputs
    for value in fused.graph.output:
        data_type = _triton_type(value, where)
        dims = _output_dims(value, where)
        if not dims:
            raise TrtfuseError(f"{where}: output {value.name!r} {SCALAR_REFUSAL}")
        config.output.add(name=value.name, data_type=pb.DataType.Value(data_type), dims=dims)
    config.instance_group.add(
        kind=pb.ModelInstanceGroup.KIND_GPU, count=1, profile=[str(index) for index in range(len(engine.profiles))]
    )
    return _profile_comment(engine) + text_format.MessageToString(config, use_short_repeated_primitives=True)
