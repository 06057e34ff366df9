"""Triton's own rules for loading a `tensorrt_plan` model with `max_batch_size: 0`, as its sources write them, applied
to a config (Triton's `ModelConfig` message) and the engine it serves. Each message is Triton's, prefixed with where
it comes from; a config Triton would load gives none.

Sources read: triton-inference-server/core at 73aad7c (`src/model_config_utils.cc` = core mcu,
`src/model_repository_manager/model_repository_manager.cc` = core mrm, `src/model.cc`) and
triton-inference-server/tensorrt_backend at e2ef6d7 (`src/instance_state.cc` = trt is, `src/tensorrt_utils.cc` and
`src/tensorrt_utils.h` = trt tu). What applies to this config and is checked here:

- core mcu 1067-1074 (AutoCompleteBackendFields): an empty name becomes the folder's; mrm 1697-1710: the config's
  name must equal the folder's ("directory name must equal model name").
- core mcu 1130-1133: platform tensorrt_plan selects the tensorrt backend; 1479-1482: max_batch_size >= 0.
- core mcu 1703-1818 (ValidateInstanceGroup): at least one group; KIND_AUTO is unexpected; a profile only for
  tensorrt_plan, each one a non-negative integer (GetProfileIndex 1941-1956, C++ `stoi`).
- core mcu 296-420 (ValidateIOShape, via ValidateModelInput/Output 1820-1879, called by model.cc 100-101 on every
  load): a name; a data type; non-empty dims; no empty reshape when max_batch_size is 0 (323-331); every dim >= 1 or
  -1 (333-341), reshape dims too (343-354); dims and reshape of one element count (356-372).
- core mcu 1826-1837: NHWC/NCHW need 3 dims; is_shape_tensor only for tensorrt_plan; non-linear IO (428-451) only
  for tensorrt_plan with 3 dims.
- trt is 2212-2280 (ValidateIO): no more config inputs than engine inputs; each config input an engine input, each
  output an engine output (core mcu 1846-1905, CheckAllowedModelInput/Output).
- trt is 2283-2366 (ValidateIOHelper): a data type TensorRT has (trt tu 106-139); is_shape_tensor exactly where the
  engine's `isShapeInferenceIO` is; is_non_linear_format_io false for a linear tensor.
- trt is 3052-3063 and 3290-3300: the config's data type is the engine's.
- trt is 3075-3080 and 3308-3312 with trt tu 193-265 (CompareDimsSupported, max_batch_size 0): the config's dims
  (its reshape where it has one: trt is 2450-2456) have the engine's rank and its size wherever both are fixed.
- trt is 3416-3490 with trt tu 268-311 (shape-tensor inputs): INT32 or INT64, the engine's type, a 0-d or 1-D
  engine tensor whose config dims equal its own exactly.
- trt is 4181-4215 with trt tu.h 126-156 (ConfigureInputDimensions): each fixed config dim inside every profile's
  [min, max].
- trt is 2421-2435: every engine input and output is configured.

The engine is described by `EngineTensor`s (`engine_tensors`: what `trtfuse compile` builds from the fused model and
the sidecar: the fused model's inputs and outputs, -1 for a symbolic dim, the recorded shape-tensor inputs, the
profiles' ranges).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.triton import TRITON_TYPES
from trtfuse.model.interface import fed_inputs
from trtfuse.model.onnx_file import load_model

WILDCARD_DIM = -1
TENSORRT_TYPES = {
    "TYPE_FP32",
    "TYPE_FP16",
    "TYPE_INT8",
    "TYPE_UINT8",
    "TYPE_BF16",
    "TYPE_INT32",
    "TYPE_INT64",
    "TYPE_BOOL",
}


@dataclass(frozen=True)
class EngineTensor:
    """One I/O tensor of the engine as the backend sees it: `dims` with -1 where dynamic (`getTensorShape`),
    `shape_tensor` its `isShapeInferenceIO`, `ranges` an input's (min, max) shape in each profile."""

    name: str
    is_input: bool
    data_type: str
    dims: tuple[int, ...]
    shape_tensor: bool = False
    ranges: tuple[tuple[tuple[int, ...], tuple[int, ...]], ...] = ()


def engine_tensors(engine: EngineFile, shape_tensor_inputs: frozenset[str] = frozenset()) -> list[EngineTensor]:
    """The engine trtfuse builds from the sidecar's fused model: its fed inputs and outputs, with the profiles'
    ranges and `shape_tensor_inputs` as shape tensors."""
    model = load_model(engine.fused_model_path).model

    def dims(value) -> tuple[int, ...]:
        return tuple(d.dim_value if d.HasField("dim_value") else WILDCARD_DIM for d in value.type.tensor_type.shape.dim)

    tensors = []
    for value in fed_inputs(model):
        ranges = tuple(
            (profile.shapes[value.name].min, profile.shapes[value.name].max)
            for profile in engine.profiles
            if value.name in profile.shapes
        )
        data_type = TRITON_TYPES[value.type.tensor_type.elem_type]
        tensors.append(
            EngineTensor(value.name, True, data_type, dims(value), value.name in shape_tensor_inputs, ranges)
        )
    for value in model.graph.output:
        tensors.append(EngineTensor(value.name, False, TRITON_TYPES[value.type.tensor_type.elem_type], dims(value)))
    return tensors


def _stoi(text: str) -> int | None:
    """C++ `std::stoi`: leading whitespace, a sign, digits; the rest ignored; None where it throws."""
    match = re.match(r"\s*([+-]?\d+)", text)
    return int(match.group(1)) if match else None


def _element_count(dims: Sequence[int]) -> int:
    count = 1
    for dim in dims:
        if dim == WILDCARD_DIM:
            return WILDCARD_DIM
        count *= dim
    return count


def _io_shape_errors(io, max_batch_size: int, prefix: str) -> list[str]:
    """core mcu 296-420, ValidateIOShape."""
    if not io.name:
        return [f"core mcu 300-304: {prefix}must specify 'name'"]
    named = f"{prefix}'{io.name}' "
    if io.data_type == 0:
        return [f"core mcu 309-313: {named}must specify 'data_type'"]
    if not io.dims:
        return [f"core mcu 315-319: {named}must specify 'dims'"]
    has_reshape = io.HasField("reshape")
    if has_reshape and not io.reshape.shape and max_batch_size == 0:
        return [
            f"core mcu 323-331: {named}cannot have empty reshape for non-batching model as scalar tensors are not "
            "supported"
        ]
    if any(dim < 1 and dim != WILDCARD_DIM for dim in io.dims):
        return [f"core mcu 333-341: {named}dimension must be integer >= 1, or -1 to indicate a variable-size dimension"]
    if has_reshape:
        if any(dim < 1 and dim != WILDCARD_DIM for dim in io.reshape.shape):
            return [f"core mcu 343-354: {named}reshape dimensions must be integer >= 1, or -1"]
        dims_size, reshape_size = _element_count(io.dims), _element_count(io.reshape.shape)
        if dims_size != reshape_size and (reshape_size != 0 or dims_size != 1):
            return [f"core mcu 356-372: {named}has different size for dims and reshape"]
    return []


def _core_errors(config, pb, folder_name: str) -> list[str]:
    errors = []
    name = config.name or folder_name  # core mcu 1071-1074
    if name != folder_name:
        errors.append(
            f"core mrm 1703-1709: unexpected directory name '{folder_name}' for model '{name}', directory name must "
            "equal model name"
        )
    if config.platform != "tensorrt_plan":
        errors.append(f"core mcu 1130-1133: platform {config.platform!r} does not select the TensorRT backend")
    if config.max_batch_size < 0:
        errors.append("core mcu 1479-1482: 'max_batch_size' must be non-negative value")
    if not config.instance_group:
        errors.append("core mcu 1711-1715: must specify one or more 'instance group's")
    for group in config.instance_group:
        if group.kind == pb.ModelInstanceGroup.KIND_AUTO:
            errors.append("core mcu 1785-1790: instance group has unexpected kind KIND_AUTO")
        for profile in group.profile:
            index = _stoi(profile) if profile else None
            if index is None or index < 0:
                errors.append(f"core mcu 1800-1816: instance group specifies invalid profile {profile}")
    for io in config.input:
        errors += _io_shape_errors(io, config.max_batch_size, "model input ")
        if io.format in (pb.ModelInput.FORMAT_NHWC, pb.ModelInput.FORMAT_NCHW) and len(io.dims) != 3:
            errors.append("core mcu 1826-1831: model input NHWC/NCHW require 3 dims")
    for io in config.output:
        errors += _io_shape_errors(io, config.max_batch_size, "model output ")
    for io in [*config.input, *config.output]:
        if io.is_non_linear_format_io and len(io.dims) != 3:
            errors.append(f"core mcu 442-448: Non-linear IO format '{io.name}' requires 3 dims")
    return errors


def _dims_errors(io, tensor: EngineTensor) -> list[str]:
    """trt tu 193-265, CompareDimsSupported without batching and not exact: the config's dims (or reshape) against the
    engine's."""
    config_dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    same = len(config_dims) == len(tensor.dims) and all(
        model_dim == dim or WILDCARD_DIM in (model_dim, dim)
        for model_dim, dim in zip(tensor.dims, config_dims, strict=True)
    )
    if same:
        return []
    return [
        f"trt tu 246-261: tensor '{io.name}': the model expects {len(tensor.dims)} dimensions (shape "
        f"{list(tensor.dims)}) but the model configuration specifies {len(config_dims)} dimensions (shape "
        f"{config_dims})"
    ]


def _shape_tensor_errors(io, data_type: str, tensor: EngineTensor) -> list[str]:
    """trt is 3458-3489 and trt tu 268-311, a shape-tensor input."""
    if data_type not in ("TYPE_INT32", "TYPE_INT64"):
        return [f"trt is 3458-3467: unexpected datatype {data_type} for shape input '{io.name}'"]
    config_dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    if len(tensor.dims) > 1:
        return [f"trt tu 289-296: shape binding '{io.name}' can only be 0-d or 1-D tensor, got {list(tensor.dims)}"]
    if len(config_dims) != len(tensor.dims) or (
        len(tensor.dims) == 1 and (config_dims[0] != tensor.dims[0] or config_dims[0] == WILDCARD_DIM)
    ):
        return [
            f"trt tu 299-308: binding '{io.name}' shape expected by framework {list(tensor.dims)} doesn't match "
            f"model configuration shape {config_dims}"
        ]
    return []


def _range_errors(io, tensor: EngineTensor) -> list[str]:
    """trt is 4181-4215 with trt tu.h 126-156: each fixed config dim inside every profile's range."""
    config_dims = list(io.reshape.shape) if io.HasField("reshape") else list(io.dims)
    errors = []
    for low, high in tensor.ranges:
        if len(config_dims) != len(high):
            errors.append(f"trt tu.h 132-140: model expected {len(high)} dimensions but received {len(config_dims)}")
            continue
        for axis, dim in enumerate(config_dims):
            if dim != WILDCARD_DIM and not low[axis] <= dim <= high[axis]:
                errors.append(
                    f"trt is 4193-4206: model configuration specified invalid shape for input '{io.name}': dimension "
                    f"{axis} to be between {low[axis]} and {high[axis]} but received {dim}"
                )
    return errors


def _backend_errors(config, pb, tensors: Sequence[EngineTensor]) -> list[str]:
    errors = []
    engine_inputs = {t.name: t for t in tensors if t.is_input}
    engine_outputs = {t.name: t for t in tensors if not t.is_input}
    if len(config.input) > len(engine_inputs):
        errors.append(
            f"trt is 2245-2256: configuration expects {len(config.input)} inputs, model provides at most "
            f"{len(engine_inputs)}"
        )
    for ios, engine_ios, kind in ((config.input, engine_inputs, "input"), (config.output, engine_outputs, "output")):
        for io in ios:
            data_type = pb.DataType.Name(io.data_type)
            tensor = engine_ios.get(io.name)
            if tensor is None:
                errors.append(f"trt is 2258-2271: unexpected inference {kind} '{io.name}'")
                continue
            if data_type not in TENSORRT_TYPES:
                errors.append(f"trt is 2299-2308: unsupported datatype {data_type} for {kind} '{io.name}'")
            if tensor.shape_tensor and not io.is_shape_tensor:
                errors.append(
                    f"trt is 2313-2322: {kind} '{io.name}' is a shape tensor but the model configuration doesn't mark "
                    "it as a shape tensor."
                )
            if not tensor.shape_tensor and io.is_shape_tensor:
                errors.append(
                    f"trt is 2325-2334: {kind} '{io.name}' is incorrectly marked as a shape tensor in the model "
                    "configuration."
                )
            if io.is_non_linear_format_io:
                errors.append(
                    f"trt is 2350-2362: {kind} '{io.name}' uses a linear IO format, but 'is_non_linear_format_io' "
                    "is incorrectly set to true in the model configuration."
                )
            if data_type != tensor.data_type:
                errors.append(
                    f"trt is 3052-3063: unexpected datatype {tensor.data_type} for inference {kind} '{io.name}', "
                    f"expecting {data_type}"
                )
            if tensor.shape_tensor:
                errors += _shape_tensor_errors(io, data_type, tensor)
            else:
                errors += _dims_errors(io, tensor)
                if tensor.is_input:
                    errors += _range_errors(io, tensor)
    configured = {io.name for io in [*config.input, *config.output]}
    for tensor in tensors:
        if tensor.name not in configured:
            kind = "input" if tensor.is_input else "output"
            errors.append(f"trt is 2421-2435: expected configuration for {kind} '{tensor.name}'")
    return errors


def triton_errors(config, tensors: Sequence[EngineTensor], folder_name: str) -> list[str]:
    """Every rule above that `config` (a `model_config_pb2.ModelConfig`, in the repository folder `folder_name`)
    breaks when it serves the engine of `tensors`; empty where Triton would load it."""
    from tritonclient.grpc import model_config_pb2 as pb

    return _core_errors(config, pb, folder_name) + _backend_errors(config, pb, tensors)
