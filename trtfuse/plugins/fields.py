"""Plugin fields: the creator's advertised list, validation of what TensorRT hands over, and serialisation.

The ONNX parser turns each node attribute the creator advertises into a `PluginField`; an engine being deserialised
hands back exactly what `get_fields_to_serialize` returned. Both routes arrive here, so a bad value is rejected with a
one-line error naming the plugin and the field whatever its origin.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtfuse.contract import (
    ATTR_EPSILON,
    ATTR_NAMESPACE,
    ATTR_OUTPUT_DTYPE,
    ATTR_VERSION,
    ATTR_WEIGHT_MODE,
    ATTR_WEIGHT_OFFSET,
    OPTIONAL_FIELDS,
    OUTPUT_DTYPE_CODES,
    PLUGIN_NAMESPACE,
    PLUGIN_VERSION,
    QK_NORM_FIELDS,
    QK_NORM_OP,
    RMS_NORM_FIELDS,
    RMS_NORM_OP,
    NormParams,
    WeightMode,
)
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.trt_module import load_trt

trt = load_trt()

FIELD_NAMES = {RMS_NORM_OP: RMS_NORM_FIELDS, QK_NORM_OP: QK_NORM_FIELDS}
# The parser passes on only the attributes a creator advertises: the optional ones are advertised too.
ADVERTISED_NAMES = {plugin: (*names, *OPTIONAL_FIELDS) for plugin, names in FIELD_NAMES.items()}
_DTYPE_BY_CODE = {code: name for name, code in OUTPUT_DTYPE_CODES.items()}
_FLOAT_FIELDS = frozenset({ATTR_EPSILON, ATTR_WEIGHT_OFFSET})
# The ONNX parser looks the creator up by these attributes; a caller that passes them on as fields is tolerated as
# long as they name this plugin.
_LOOKUP_FIELDS = {ATTR_NAMESPACE: PLUGIN_NAMESPACE, ATTR_VERSION: PLUGIN_VERSION}
_INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class NormConfig:
    """A fused norm node's fields. `hidden_sizes` follows the activation inputs: (hidden,) or (q_hidden, k_hidden)."""

    plugin: str
    params: NormParams
    hidden_sizes: tuple[int, ...]
    # The outputs' dtype; None for a node without `output_dtype` (written before it existed): the activations'.
    output_dtype: str | None = None

    @property
    def has_weight(self) -> bool:
        return self.params.weight_mode is not WeightMode.NONE


def _field_error(label: str, name: str, problem: str) -> TrtfuseError:
    return TrtfuseError(f"{label}: field '{name}' {problem}")


def _char_value(label: str, field: Any) -> str:
    # Check the type before reading `data`: TensorRT's binding raises for FLOAT16, BF16, FP8, INT4, FP4 and DIMS.
    # UNKNOWN is what a PluginField made without a type has; its data reads as bytes.
    if field.type not in (trt.PluginFieldType.CHAR, trt.PluginFieldType.UNKNOWN):
        raise _field_error(label, field.name, f"must be a string (CHAR), got {field.type.name}")
    return bytes(np.asarray(field.data, dtype=np.int8).tobytes()).rstrip(b"\0").decode("utf-8", "replace")


def _scalar(label: str, field: Any) -> float | int:
    """The single number a field holds, exactly as TensorRT would read it."""
    name = field.name
    # The type first: TensorRT's binding raises on reading `data` of FLOAT16, BF16, FP8, INT4, FP4 and DIMS fields,
    # which a hand-edited tensor attribute of the node can produce.
    if name in _FLOAT_FIELDS:
        if field.type not in (trt.PluginFieldType.FLOAT32, trt.PluginFieldType.FLOAT64):
            raise _field_error(label, name, f"must be FLOAT32, got {field.type.name}")
    elif field.type not in (trt.PluginFieldType.INT32, trt.PluginFieldType.INT64):
        raise _field_error(label, name, f"must be INT32, got {field.type.name}")
    data = np.asarray(field.data).reshape(-1)
    if data.size != 1:
        raise _field_error(label, name, f"must hold exactly one value, got {data.size}")
    if name not in _FLOAT_FIELDS:
        return int(data[0])
    value = float(data[0])
    if field.type == trt.PluginFieldType.FLOAT64 and float(np.float32(value)) != value and math.isfinite(value):
        raise _field_error(label, name, f"must be a float32 value, got the float64 {value!r}")
    if not math.isfinite(value):
        raise _field_error(label, name, f"must be finite, got {value!r}")
    return value


def _collect(plugin: str, label: str, fields: Iterable[Any]) -> dict[str, float | int]:
    expected = FIELD_NAMES[plugin]
    known = ADVERTISED_NAMES[plugin]
    values: dict[str, float | int] = {}
    for field in fields:
        name = field.name
        if name in _LOOKUP_FIELDS:
            given = _char_value(label, field)
            if given != _LOOKUP_FIELDS[name]:
                raise _field_error(label, name, f"is {given!r}, but this creator is {_LOOKUP_FIELDS[name]!r}")
            continue
        if name not in known:
            raise _field_error(label, name, f"is not a field of this plugin (expected {', '.join(known)})")
        if name in values:
            raise _field_error(label, name, "is given twice")
        values[name] = _scalar(label, field)
    missing = [name for name in expected if name not in values]
    if missing:
        raise _field_error(label, missing[0], f"is missing (required: {', '.join(expected)})")
    return values


def parse_fields(plugin: str, fields: Iterable[Any], node: str = "") -> NormConfig:
    """Validate a `PluginFieldCollection` (or any iterable of PluginFields) for `plugin` into a NormConfig.

    `node` (the layer name TensorRT passes to the creator) only makes error messages point at the node at fault.
    """
    label = f"{plugin} '{node}'" if node else plugin
    values = _collect(plugin, label, fields)
    epsilon = float(values[ATTR_EPSILON])
    if epsilon < 0.0:
        raise _field_error(label, ATTR_EPSILON, f"must be >= 0, got {epsilon!r}")
    mode = int(values[ATTR_WEIGHT_MODE])
    if mode not in {member.value for member in WeightMode}:
        allowed = ", ".join(f"{m.value} ({m.name})" for m in WeightMode)
        raise _field_error(label, ATTR_WEIGHT_MODE, f"must be one of {allowed}, got {mode}")
    hidden_names = FIELD_NAMES[plugin][3:]
    for name in hidden_names:
        if not 1 <= int(values[name]) <= _INT32_MAX:
            raise _field_error(label, name, f"must be a positive int32, got {values[name]}")
    output_dtype = None
    if ATTR_OUTPUT_DTYPE in values:
        code = int(values[ATTR_OUTPUT_DTYPE])
        if code not in _DTYPE_BY_CODE:
            allowed = ", ".join(f"{code} ({name})" for code, name in _DTYPE_BY_CODE.items())
            raise _field_error(label, ATTR_OUTPUT_DTYPE, f"must be one of {allowed}, got {code}")
        output_dtype = _DTYPE_BY_CODE[code]
    return NormConfig(
        plugin=plugin,
        params=NormParams(epsilon, float(values[ATTR_WEIGHT_OFFSET]), WeightMode(mode)),
        hidden_sizes=tuple(int(values[name]) for name in hidden_names),
        output_dtype=output_dtype,
    )


def _field(name: str, values: np.ndarray) -> Any:
    kind = trt.PluginFieldType.FLOAT32 if name in _FLOAT_FIELDS else trt.PluginFieldType.INT32
    return trt.PluginField(name, values, kind)


def _field_arrays(config: NormConfig) -> dict[str, np.ndarray]:
    params = config.params
    scalars = (params.epsilon, params.weight_offset, int(params.weight_mode), *config.hidden_sizes)
    arrays = {
        name: np.array([value], dtype=np.float32 if name in _FLOAT_FIELDS else np.int32)
        for name, value in zip(FIELD_NAMES[config.plugin], scalars, strict=True)
    }
    # Left out when the node had none, so that re-creating the plugin gives back the same config.
    if config.output_dtype is not None:
        arrays[ATTR_OUTPUT_DTYPE] = np.array([OUTPUT_DTYPE_CODES[config.output_dtype]], dtype=np.int32)
    return arrays


def serialize_fields(config: NormConfig) -> tuple[Any, dict[str, np.ndarray]]:
    """The PluginFieldCollection that re-creates `config`, and the arrays it points into (keep them alive with it)."""
    arrays = _field_arrays(config)
    return trt.PluginFieldCollection([_field(name, array) for name, array in arrays.items()]), arrays


def advertised_fields(plugin: str) -> tuple[Any, list[np.ndarray]]:
    """The creator's `field_names`: every field of `plugin` with its type and no value, and the arrays behind them."""
    names = ADVERTISED_NAMES[plugin]
    arrays = [np.array([], dtype=np.float32 if name in _FLOAT_FIELDS else np.int32) for name in names]
    fields = [_field(name, array) for name, array in zip(names, arrays, strict=True)]
    return trt.PluginFieldCollection(fields), arrays
