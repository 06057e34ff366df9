"""The checks Triton's TensorRT backend makes of a `tensorrt_plan` config with `max_batch_size: 0` against the engine
it serves, as its sources write them, applied to a config (Triton's `ModelConfig` message) and the engine trtfuse
builds. Each message is the backend's, prefixed with where it comes from; a config the backend would take gives none.

Triton's core checks the config itself (tests/support/triton_server.py runs it); these are what it cannot: they need
the backend and the deserialised engine, which no machine of this project has (docs/deploy.md, "What CI checks").

Sources read: triton-inference-server/tensorrt_backend at e2ef6d7 (`src/instance_state.cc` = trt is,
`src/tensorrt_utils.cc` and `src/tensorrt_utils.h` = trt tu) and, for what the backend calls there,
triton-inference-server/core at 73aad7c (`src/model_config_utils.cc` = core mcu):

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


def backend_errors(config, tensors: Sequence[EngineTensor]) -> list[str]:
    """Every rule above that `config` (a `model_config_pb2.ModelConfig`) breaks when it serves the engine of
    `tensors`; empty where the TensorRT backend would take it."""
    from tritonclient.grpc import model_config_pb2 as pb

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
