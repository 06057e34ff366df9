"""The one codec of a fused node's fields: every transport decodes into `NodeFields`, validated here, and encodes
from it.

Transports: the node's ONNX attributes (what the pass writes, what `check`, the lowering and the AOT form read),
TensorRT PluginFields (what the ONNX parser and a deserialised engine hand the Python plugins, as `RawField`s: the
TensorRT side converts its own types), and QDP field bytes (what tensorrt.plugin hands the AOT plugins, by position).
A bad value is one line naming where it came from, the field and the problem, whatever the transport.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtfuse.contract.nodes import (
    ATTR_OUTPUT_DTYPE,
    ATTR_WEIGHT_MODE,
    FLOAT_FIELDS,
    LOOKUP_ATTRIBUTES,
    OPS,
    OUTPUT_DTYPE_CODES,
    QUANT_DTYPE_CODES,
    QUANT_OFF,
    ROTARY_FIELDS,
    FusedOp,
    HeadLayout,
    NormParams,
    Quantizer,
    QuantParams,
    QuantStage,
    RotaryParams,
    Rotation,
    WeightMode,
    dtype_of_code,
    norm_quant,
    quant_dtype_of_code,
    rotary_problem,
    rotation_stage_problem,
)
from trtfuse.errors import TrtfuseError

INT32_MAX = 2**31 - 1
_MODES = ", ".join(f"{mode.value} ({mode.name})" for mode in WeightMode)
_CODES = ", ".join(f"{code} ({name})" for name, code in OUTPUT_DTYPE_CODES.items())
_ROTARY_ENUMS = dict(zip(ROTARY_FIELDS[2:], (Rotation, HeadLayout, HeadLayout), strict=True))
_QUANT_CODES = ", ".join([f"{QUANT_OFF} (off)", *(f"{code} ({name})" for name, code in QUANT_DTYPE_CODES.items())])


class FieldError(TrtfuseError):
    """One field's problem, before a transport says where the field came from."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field} {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class NodeFields:
    """A fused node's fields, validated: `hidden_sizes` follows the op's parts, `output_dtype` is the normalised
    value's dtype T (a contract dtype name), `quant` the quantizers of a quantized op (None for a plain op),
    `rotary` the rotation of a rotary op (None for the others). Each output's dtype is in `output_dtypes`: a
    normalised one's is T, or its output quantizer's dtype."""

    op: FusedOp
    params: NormParams
    hidden_sizes: tuple[int, ...]
    output_dtype: str
    quant: QuantParams | None = None
    rotary: RotaryParams | None = None

    def __post_init__(self) -> None:
        if self.op.quantized != (self.quant is not None):
            raise ValueError(f"{self.op.name}: quant must be given exactly for a quantized op")
        if self.op.rotary != (self.rotary is not None):
            raise ValueError(f"{self.op.name}: rotary must be given exactly for a rotary op")
        if len(self.hidden_sizes) != len(self.op.hidden_fields):
            raise ValueError(f"{self.op.name} takes {len(self.op.hidden_fields)} hidden sizes, not {self.hidden_sizes}")
        stages = self.quant.stages if self.quant is not None else ()
        stray = [stage.value for stage in stages if stage not in self.op.quant_stages]
        if stray:
            own = ", ".join(stage.value for stage in self.op.quant_stages)
            raise ValueError(f"{self.op.name} has no stage {', '.join(stray)} (its stages: {own})")
        problem = rotation_stage_problem(self.quant, self.op.part_stages, self.output_dtype)
        if problem is not None:
            raise ValueError(f"{self.op.name}: {' '.join(problem)}")

    @property
    def has_weight(self) -> bool:
        return self.params.weight_mode is not WeightMode.NONE

    def output_quantizer(self, index: int) -> Quantizer | None:
        """The quantizer of output `index` (the op's `output_stages`), None where the node does not quantize it."""
        stage = self.op.output_stages[index]
        return None if self.quant is None or stage is None else self.quant.at(stage)

    def part_quant(self, part: int) -> QuantParams | None:
        """The quantizers of part `part`'s norm, as one norm's stages (`contract.norm_quant`)."""
        return norm_quant(self.quant, self.op.part_stages[part])

    def normalised_dtype(self, index: int) -> str:
        """Normalised output `index`'s dtype: its quantizer's where the node quantizes it, else T (`output_dtype`)."""
        quantizer = self.output_quantizer(index)
        return self.output_dtype if quantizer is None else quantizer.dtype

    def output_dtypes(self, dtype: str) -> tuple[str, ...]:
        """Each output's dtype for activations of `dtype`: a normalised output's `normalised_dtype`, the others'
        (the add-norm's h) the activations'."""
        normalised = self.op.normalised_outputs
        return tuple(self.normalised_dtype(index) if normalised[index] else dtype for index in range(len(normalised)))

    @property
    def quantized_dtypes(self) -> frozenset[str]:
        """The quantized dtypes of the outputs the node quantizes (empty for a plain node)."""
        return frozenset(
            quantizer.dtype
            for quantizer in map(self.output_quantizer, range(len(self.op.outputs)))
            if quantizer is not None
        )

    def numbers(self) -> dict[str, float | int]:
        """Every field's number, in the op's field order (`output_dtype` as its ONNX code)."""
        params = self.params
        values = (
            params.epsilon,
            params.weight_offset,
            int(params.weight_mode),
            *self.hidden_sizes,
            OUTPUT_DTYPE_CODES[self.output_dtype],
            *(self.rotary.numbers() if self.rotary is not None else ()),
            *(number for stage in self.op.quant_stages for number in _stage_numbers(stage, self.quant)),
        )
        return dict(zip(self.op.fields, values, strict=True))

    def onnx_attributes(self) -> dict[str, str | float | int]:
        """The node's attributes: the parser's lookup strings, then every field."""
        return {**LOOKUP_ATTRIBUTES, **self.numbers()}

    def plugin_arrays(self) -> dict[str, np.ndarray]:
        """Every field as the one-element float32 or int32 array a PluginField points at."""
        return {
            name: np.array([value], dtype=np.float32 if name in FLOAT_FIELDS else np.int32)
            for name, value in self.numbers().items()
        }


def _stage_numbers(stage: QuantStage, quant: QuantParams | None) -> tuple[float | int, ...]:
    """The stage's numbers in its field order; an off stage is written as scale 1, saturating, float32 dtypes."""
    quantizer = None if quant is None else quant.at(stage)
    if quantizer is None:
        head, dtypes = (QUANT_OFF, 1.0, 1), (None, None)
    else:
        head = (QUANT_DTYPE_CODES[quantizer.dtype], quantizer.scale, int(quantizer.saturate))
        dtypes = (quantizer.dequant_dtype, quantizer.input_dtype)
    numbers = (*head, *(OUTPUT_DTYPE_CODES[dtype or "float32"] for dtype in dtypes))
    return tuple(number for name, number in zip(stage.field_slots, numbers, strict=True) if name is not None)


def op_named(name: str) -> FusedOp:
    op = OPS.get(name)
    if op is None:
        raise TrtfuseError(f"{name} is no trtfuse op ({', '.join(OPS)})")
    return op


def decode(op: FusedOp, values: Mapping[str, float | int]) -> NodeFields:
    """NodeFields from every field's number (`output_dtype` as its ONNX code); FieldError for the first field that
    is missing or out of the contract."""
    for name in op.fields:
        if name not in values:
            raise FieldError(name, f"is missing ({op.name} takes {', '.join(op.fields)})")
    epsilon, offset = float(values[op.fields[0]]), float(values[op.fields[1]])
    if not (math.isfinite(epsilon) and epsilon >= 0.0):
        raise FieldError(op.fields[0], f"is {epsilon!r}, not a finite non-negative number")
    if not math.isfinite(offset):
        raise FieldError(op.fields[1], f"is {offset!r}, not a finite number")
    for name in FLOAT_FIELDS.intersection(op.fields):
        if float(np.float32(values[name])) != float(values[name]):
            raise FieldError(name, f"is {float(values[name])!r}, not a float32 value")
    mode = int(values[ATTR_WEIGHT_MODE])
    if mode not in {member.value for member in WeightMode}:
        raise FieldError(ATTR_WEIGHT_MODE, f"is {mode}, none of {_MODES}")
    for name in op.hidden_fields:
        if not 1 <= int(values[name]) <= INT32_MAX:
            raise FieldError(name, f"is {values[name]}, not a positive int32 length")
    output_dtype = dtype_of_code(int(values[ATTR_OUTPUT_DTYPE]))
    if output_dtype is None:
        raise FieldError(ATTR_OUTPUT_DTYPE, f"is {values[ATTR_OUTPUT_DTYPE]}, none of {_CODES}")
    hidden_sizes = tuple(int(values[name]) for name in op.hidden_fields)
    quant = _decode_quant(op, values) if op.quantized else None
    problem = rotation_stage_problem(quant, op.part_stages, output_dtype)
    if problem is not None:
        raise FieldError(*problem)
    return NodeFields(
        op=op,
        params=NormParams(epsilon, offset, WeightMode(mode)),
        hidden_sizes=hidden_sizes,
        output_dtype=output_dtype,
        quant=quant,
        rotary=_decode_rotary(values, hidden_sizes) if op.rotary else None,
    )


def _decode_rotary(values: Mapping[str, float | int], hidden_sizes: tuple[int, ...]) -> RotaryParams:
    head_dim, rotary_dim, *codes = (int(values[name]) for name in ROTARY_FIELDS)
    if not 1 <= head_dim <= INT32_MAX:
        raise FieldError(ROTARY_FIELDS[0], f"is {head_dim}, not a positive int32 length")
    for (name, kind), code in zip(_ROTARY_ENUMS.items(), codes, strict=True):
        if code not in {member.value for member in kind}:
            named = ", ".join(f"{member.value} ({member.name})" for member in kind)
            raise FieldError(name, f"is {code}, none of {named}")
    rotary = RotaryParams(head_dim, rotary_dim, *codes)
    problem = rotary_problem(rotary, hidden_sizes)
    if problem is not None:
        raise FieldError(*problem)
    return rotary


def _decode_quant(op: FusedOp, values: Mapping[str, float | int]) -> QuantParams:
    """Every stage's quantizer; an off stage's other fields must still be well-formed numbers."""
    quantizers: dict[str, Quantizer | None] = {}
    for stage in op.quant_stages:
        code = int(values[stage.dtype_field])
        dtype = quant_dtype_of_code(code)
        if dtype is None and code != QUANT_OFF:
            raise FieldError(stage.dtype_field, f"is {code}, none of {_QUANT_CODES}")
        scale = float(values[stage.scale_field])
        if not (math.isfinite(scale) and scale > 0.0):
            raise FieldError(stage.scale_field, f"is {scale!r}, not a finite positive number")
        saturate = int(values[stage.saturate_field])
        if saturate not in (0, 1):
            raise FieldError(stage.saturate_field, f"is {saturate}, not 0 or 1")
        if dtype == "int8" and saturate == 0:
            raise FieldError(stage.saturate_field, "is 0, but INT8 always saturates (ONNX's saturate is float8's)")
        dequant_dtype, input_dtype = (
            _float_dtype(values, name) for name in (stage.dequant_field, stage.input_dtype_field)
        )
        on = dtype is not None
        quantizers[stage.value] = Quantizer(dtype, scale, bool(saturate), dequant_dtype, input_dtype) if on else None
    quant = QuantParams(**quantizers)
    if not quant.stages:
        raise FieldError(op.quant_stages[0].fields[0], f"and every other stage is off: a plain {op.base} node")
    return quant


def _float_dtype(values: Mapping[str, float | int], name: str | None) -> str | None:
    """The float dtype a stage's dtype field names (None for a field the stage does not have)."""
    if name is None:
        return None
    dtype = dtype_of_code(int(values[name]))
    if dtype is None:
        raise FieldError(name, f"is {values[name]}, none of {_CODES}")
    return dtype


# --- ONNX attributes -------------------------------------------------------------------------------------------------


def from_node(node: onnx.NodeProto, where: str) -> NodeFields:
    """The fields of a trtfuse node from its attributes. `where` ("FILE: node 'NAME'") starts every error line.

    The lookup attributes, where present, must name trtfuse; other attributes (the parser's `aot`) are left alone."""
    try:
        op = op_named(node.op_type)
    except TrtfuseError as error:
        raise TrtfuseError(f"{where}: {error}") from None
    values: dict[str, float | int] = {}
    for attribute in node.attribute:
        name = attribute.name
        if name in LOOKUP_ATTRIBUTES:
            given = helper.get_attribute_value(attribute)
            if attribute.type != onnx.AttributeProto.STRING or given != LOOKUP_ATTRIBUTES[name].encode():
                shown = given.decode(errors="replace") if isinstance(given, bytes) else given
                raise TrtfuseError(
                    f"{where}: attribute {name} is {shown!r}, not the string {LOOKUP_ATTRIBUTES[name]!r}"
                )
        elif name in op.fields:
            expected = onnx.AttributeProto.FLOAT if name in FLOAT_FIELDS else onnx.AttributeProto.INT
            if attribute.type != expected:
                kind = onnx.AttributeProto.AttributeType.Name(expected).lower()
                raise TrtfuseError(f"{where}: attribute {name} must be one {kind}")
            values[name] = helper.get_attribute_value(attribute)
    try:
        return decode(op, values)
    except FieldError as error:
        raise TrtfuseError(f"{where}: attribute {error}") from None


# --- TensorRT PluginFields -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class RawField:
    """A PluginField as the TensorRT side reads it: its name, its type's name (FLOAT32, INT32, CHAR...) and, for the
    types whose data it can read, the data."""

    name: str
    type_name: str
    data: np.ndarray | None


_FLOAT_TYPES = ("FLOAT32", "FLOAT64")
_INT_TYPES = ("INT32", "INT64")
# A PluginField made without a type reads as bytes: tolerated for the lookup strings.
_STRING_TYPES = ("CHAR", "UNKNOWN")


def from_plugin_fields(op: FusedOp, fields: Iterable[RawField], label: str) -> NodeFields:
    """The fields of a plugin from what TensorRT handed its creator. `label` ("OP 'node'") starts every error line.

    The lookup attributes, which a caller may pass on as fields, must name trtfuse."""
    values: dict[str, float | int] = {}
    for field in fields:
        name = field.name
        try:
            if name in LOOKUP_ATTRIBUTES:
                _check_lookup_field(field)
                continue
            if name not in op.fields:
                raise FieldError(name, f"is not a field of {op.name} (its fields: {', '.join(op.fields)})")
            if name in values:
                raise FieldError(name, "is given twice")
            values[name] = _plugin_number(field)
        except FieldError as error:
            raise TrtfuseError(f"{label}: field {error}") from None
    try:
        return decode(op, values)
    except FieldError as error:
        raise TrtfuseError(f"{label}: field {error}") from None


def _check_lookup_field(field: RawField) -> None:
    if field.type_name not in _STRING_TYPES or field.data is None:
        raise FieldError(field.name, f"must be a string (CHAR), got {field.type_name}")
    given = np.asarray(field.data, dtype=np.int8).tobytes().rstrip(b"\0").decode("utf-8", "replace")
    if given != LOOKUP_ATTRIBUTES[field.name]:
        raise FieldError(field.name, f"is {given!r}, but this creator is {LOOKUP_ATTRIBUTES[field.name]!r}")


def _plugin_number(field: RawField) -> float | int:
    """The one number a field holds, exactly as TensorRT would read it (its type checked first: TensorRT's binding
    cannot read the data of FLOAT16, BF16, FP8, INT4, FP4 or DIMS fields)."""
    if field.name in FLOAT_FIELDS:
        if field.type_name not in _FLOAT_TYPES:
            raise FieldError(field.name, f"must be FLOAT32, got {field.type_name}")
    elif field.type_name not in _INT_TYPES:
        raise FieldError(field.name, f"must be INT32, got {field.type_name}")
    data = np.asarray(field.data).reshape(-1)
    if data.size != 1:
        raise FieldError(field.name, f"must hold exactly one value, got {data.size}")
    return float(data[0]) if field.name in FLOAT_FIELDS else int(data[0])


# --- QDP field bytes ----------------------------------------------------------------------------------------------


def from_qdp(op: FusedOp, raw: Sequence[bytes]) -> NodeFields:
    """The fields of an AOT plugin from the raw bytes tensorrt.plugin hands each field, in the op's field order: 4
    bytes as the ONNX parser sends FLOAT and INT attributes (FLOAT32, INT32), or 8 should a parser send them 64-bit."""
    if len(raw) != len(op.fields):
        raise TrtfuseError(f"{op.name}: {len(raw)} fields, expected {len(op.fields)} ({', '.join(op.fields)})")
    values: dict[str, float | int] = {}
    try:
        for name, data in zip(op.fields, raw, strict=True):
            values[name] = _qdp_number(name, data)
        return decode(op, values)
    except FieldError as error:
        raise TrtfuseError(f"{op.name}: field {error}") from None


def _qdp_number(name: str, data: bytes) -> float | int:
    raw = bytes(data)
    if len(raw) not in (4, 8):
        raise FieldError(name, f"holds {len(raw)} bytes, not one 4- or 8-byte number")
    kind = "f" if name in FLOAT_FIELDS else "i"
    return np.frombuffer(raw, dtype=np.dtype(f"{kind}{len(raw)}"))[0].item()
