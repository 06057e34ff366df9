"""The contract's one codec: every transport (ONNX attributes, TensorRT PluginFields, QDP field bytes) decodes a node's
fields into the same validated `NodeFields` and encodes them back, bit-exactly; every bad value is one line naming
where it came from and the field, with the same problem text whatever the transport."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from trtfuse import contract
from trtfuse.contract import OPS, NormParams, WeightMode
from trtfuse.contract.codec import NodeFields, RawField, decode, from_node, from_plugin_fields, from_qdp
from trtfuse.errors import TrtfuseError

float32s = st.floats(width=32, allow_nan=False, allow_infinity=False)


@st.composite
def node_fields(draw: st.DrawFn) -> NodeFields:
    op = OPS[draw(st.sampled_from(contract.FUSED_OPS))]
    params = NormParams(
        draw(float32s.filter(lambda value: value >= 0.0)), draw(float32s), draw(st.sampled_from(WeightMode))
    )
    hidden = tuple(draw(st.integers(1, 2**31 - 1)) for _ in op.hidden_fields)
    return NodeFields(op, params, hidden, draw(st.sampled_from(sorted(contract.OUTPUT_DTYPE_CODES))))


def _node(fields: NodeFields, **changes: object) -> object:
    attributes = {**fields.onnx_attributes(), **changes}
    inputs = list(fields.op.inputs(fields.has_weight))
    return helper.make_node(
        fields.op.name, inputs, list(fields.op.outputs), name="n", domain=contract.ONNX_DOMAIN, **attributes
    )


def _raw_fields(fields: NodeFields) -> list[RawField]:
    return [
        RawField(name, "FLOAT32" if array.dtype == np.float32 else "INT32", array)
        for name, array in fields.plugin_arrays().items()
    ]


@given(node_fields())
def test_every_transport_round_trips_bit_exactly(fields: NodeFields) -> None:
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    raw = [array.tobytes() for array in fields.plugin_arrays().values()]
    assert from_qdp(fields.op, raw) == fields
    assert list(fields.numbers()) == list(fields.op.fields)


def test_each_op_lists_its_fields_in_serialisation_order() -> None:
    assert contract.RMS_NORM.fields == ("epsilon", "weight_offset", "weight_mode", "hidden_size", "output_dtype")
    assert contract.QK_NORM.fields == (
        "epsilon",
        "weight_offset",
        "weight_mode",
        "q_hidden_size",
        "k_hidden_size",
        "output_dtype",
    )
    assert contract.ADD_RMS_NORM.fields == contract.RMS_NORM.fields


def test_the_add_norm_is_one_part_of_two_activations_with_a_normalised_and_a_residual_output() -> None:
    op = contract.OPS[contract.ADD_RMS_NORM_OP]
    assert (op.activations, op.activation_parts, op.weights) == (("x", "residual"), (0, 0), ("weight",))
    assert (op.outputs, op.output_parts, op.normalised_outputs) == (("y", "h"), (0, 0), (True, False))
    assert op.inputs(True) == ("x", "residual", "weight") and op.inputs(False) == ("x", "residual")


@pytest.mark.parametrize("op", contract.FUSED_OPS)
@pytest.mark.parametrize("mode", list(WeightMode), ids=[mode.name for mode in WeightMode])
def test_each_op_round_trips_through_every_transport(op: str, mode: WeightMode) -> None:
    """The property test samples the ops; this names each one, so a new op's round trip is never left to chance."""
    fields = NodeFields(OPS[op], NormParams(EPSILON, 1.0, mode), (64,) * len(OPS[op].hidden_fields), "bfloat16")
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    assert from_qdp(fields.op, [array.tobytes() for array in fields.plugin_arrays().values()]) == fields


EPSILON = float(np.float32(1e-6))
GOOD = NodeFields(contract.RMS_NORM, NormParams(EPSILON, 0.0, WeightMode.AFTER_CAST), (64,), "float16")


def _array(name: str, value: float, wide: bool = False) -> np.ndarray:
    """A field's one-element array: float32 or int32, or float64 / int64 where `wide`."""
    kind = ("f" if name in contract.FLOAT_FIELDS else "i") + ("8" if wide else "4")
    return np.array([value], dtype=np.dtype(kind))


BAD_VALUES = [
    ("epsilon", -1.0, "epsilon is -1.0, not a finite non-negative number"),
    ("epsilon", math.nan, "epsilon is nan, not a finite non-negative number"),
    ("epsilon", math.inf, "epsilon is inf, not a finite non-negative number"),
    ("weight_offset", math.inf, "weight_offset is inf, not a finite number"),
    ("weight_mode", 7, "weight_mode is 7, none of 0 (NONE), 1 (AFTER_CAST), 2 (BEFORE_CAST)"),
    ("hidden_size", 0, "hidden_size is 0, not a positive int32 length"),
    ("hidden_size", 2**31, "hidden_size is 2147483648, not a positive int32 length"),
    ("output_dtype", 7, "output_dtype is 7, none of 1 (float32), 10 (float16), 16 (bfloat16)"),
]


@pytest.mark.parametrize(("name", "value", "problem"), BAD_VALUES)
def test_a_bad_value_is_the_same_problem_in_every_transport(name: str, value: float, problem: str) -> None:
    numbers = {**GOOD.numbers(), name: value}
    with pytest.raises(TrtfuseError, match="^" + problem.replace("(", r"\(").replace(")", r"\)")):
        decode(GOOD.op, numbers)
    if name != "hidden_size" or value < 2**31:
        with pytest.raises(TrtfuseError) as onnx_error:
            from_node(_node(GOOD, **{name: value}), "m.onnx: node 'n'")
        assert str(onnx_error.value) == f"m.onnx: node 'n': attribute {problem}"
    wide = {n: n not in contract.FLOAT_FIELDS for n in numbers}  # ints as INT64: hidden sizes past int32 stay exact
    raw = [RawField(n, "INT64" if wide[n] else "FLOAT32", _array(n, v, wide[n])) for n, v in numbers.items()]
    with pytest.raises(TrtfuseError) as plugin_error:
        from_plugin_fields(GOOD.op, raw, "TrtfuseRmsNorm 'n'")
    assert str(plugin_error.value) == f"TrtfuseRmsNorm 'n': field {problem}"
    with pytest.raises(TrtfuseError) as qdp_error:
        from_qdp(GOOD.op, [_array(n, v, wide[n]).tobytes() for n, v in numbers.items()])
    assert str(qdp_error.value) == f"TrtfuseRmsNorm: field {problem}"


def test_an_attribute_of_the_wrong_type_and_foreign_lookups_are_one_line() -> None:
    with pytest.raises(TrtfuseError, match=r"^m: attribute epsilon must be one float$"):
        from_node(_node(GOOD, epsilon="1e-6"), "m")
    with pytest.raises(TrtfuseError, match=r"^m: attribute output_dtype must be one int$"):
        from_node(_node(GOOD, output_dtype=1.0), "m")
    with pytest.raises(TrtfuseError, match=r"^m: attribute plugin_namespace is 'other', not the string 'trtfuse'$"):
        from_node(_node(GOOD, plugin_namespace="other"), "m")
    node = _node(GOOD)
    node.op_type = "TrtfuseLayerNorm"
    with pytest.raises(TrtfuseError, match=r"^m: TrtfuseLayerNorm is no trtfuse op \(TrtfuseRmsNorm, TrtfuseQkNorm"):
        from_node(node, "m")


def test_a_missing_field_names_every_field_the_op_takes() -> None:
    numbers = GOOD.numbers()
    del numbers["output_dtype"]
    with pytest.raises(TrtfuseError, match=r"output_dtype is missing \(TrtfuseRmsNorm takes epsilon, weight_offset"):
        decode(GOOD.op, numbers)


def test_plugin_fields_the_binding_cannot_read_are_refused_by_type_first() -> None:
    raw = _raw_fields(GOOD)
    raw[0] = RawField("epsilon", "FLOAT16", None)
    with pytest.raises(TrtfuseError, match=r"^op: field epsilon must be FLOAT32, got FLOAT16$"):
        from_plugin_fields(GOOD.op, raw, "op")
    raw[0] = RawField("epsilon", "FLOAT64", np.array([1e-6]))
    with pytest.raises(TrtfuseError, match=r"^op: field epsilon is 1e-06, not a float32 value$"):
        from_plugin_fields(GOOD.op, raw, "op")


def test_qdp_bytes_of_4_or_8_bytes_per_number() -> None:
    raw = [
        np.float64(1e-6 if n == "epsilon" else 0.0).tobytes() if n in contract.FLOAT_FIELDS else np.int64(v).tobytes()
        for n, v in GOOD.numbers().items()
    ]
    raw[0] = np.float32(1e-6).tobytes()
    assert from_qdp(GOOD.op, raw) == GOOD
    raw[3] = np.array([1, 2, 3], np.float32).tobytes()
    with pytest.raises(TrtfuseError, match=r"^TrtfuseRmsNorm: field hidden_size holds 12 bytes, not one 4- or 8-byte"):
        from_qdp(GOOD.op, raw)
    with pytest.raises(TrtfuseError, match=r"5 fields, expected 6"):
        from_qdp(contract.QK_NORM, raw)
