"""Plugin fields on TensorRT's side: the creator's advertised list, what TensorRT hands over turned into the
contract codec's `RawField`s, and serialisation.

The ONNX parser turns each node attribute the creator advertises into a `PluginField`; an engine being deserialised
hands back exactly what `get_fields_to_serialize` returned. Both routes arrive at `parse_fields`, and the codec
(`trtfuse.contract.codec`) validates them as it validates every transport.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from trtfuse.contract import FLOAT_FIELDS, OPS
from trtfuse.contract.codec import NodeFields, RawField, from_plugin_fields
from trtfuse.plugins.trt_module import load_trt

trt = load_trt()

# The types whose data TensorRT's binding reads; it raises for FLOAT16, BF16, FP8, INT4, FP4 and DIMS.
_READABLE = frozenset({"FLOAT32", "FLOAT64", "INT32", "INT64", "CHAR", "UNKNOWN"})


def raw_field(field: Any) -> RawField:
    """A PluginField as the codec reads it: the type's name first, the data only for a type TensorRT can read."""
    type_name = field.type.name
    return RawField(field.name, type_name, np.asarray(field.data) if type_name in _READABLE else None)


def parse_fields(op_name: str, fields: Iterable[Any], node: str = "") -> NodeFields:
    """Validate a `PluginFieldCollection` (or any iterable of PluginFields) of `op_name` into its NodeFields.

    `node` (the layer name TensorRT passes to the creator) only makes error messages point at the node at fault."""
    label = f"{op_name} '{node}'" if node else op_name
    return from_plugin_fields(OPS[op_name], [raw_field(field) for field in fields], label)


def _field(name: str, values: np.ndarray) -> Any:
    kind = trt.PluginFieldType.FLOAT32 if name in FLOAT_FIELDS else trt.PluginFieldType.INT32
    return trt.PluginField(name, values, kind)


def serialize_fields(fields: NodeFields) -> tuple[Any, dict[str, np.ndarray]]:
    """The PluginFieldCollection that re-creates `fields`, and the arrays it points into (keep them alive with it)."""
    arrays = fields.plugin_arrays()
    return trt.PluginFieldCollection([_field(name, array) for name, array in arrays.items()]), arrays


def advertised_fields(op_name: str) -> tuple[Any, list[np.ndarray]]:
    """The creator's `field_names`: every field of the op with its type and no value, and the arrays behind them.
    The parser passes on only the attributes a creator advertises."""
    names = OPS[op_name].fields
    arrays = [np.array([], dtype=np.float32 if name in FLOAT_FIELDS else np.int32) for name in names]
    fields = [_field(name, array) for name, array in zip(names, arrays, strict=True)]
    return trt.PluginFieldCollection(fields), arrays
