"""The contract's one codec: every transport (ONNX attributes, TensorRT PluginFields, QDP field bytes) decodes a node's
fields into the same validated `NodeFields` and encodes them back, bit-exactly; every bad value is one line naming
where it came from and the field, with the same problem text whatever the transport."""

from __future__ import annotations

import dataclasses
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
def quantizers(draw: st.DrawFn, stage: contract.QuantStage) -> contract.Quantizer:
    dtype = draw(st.sampled_from(sorted(contract.QUANT_DTYPE_CODES)))
    saturate = True if dtype == "int8" else draw(st.booleans())
    float_dtypes = st.sampled_from(sorted(contract.OUTPUT_DTYPE_CODES))
    dequant = draw(float_dtypes) if stage.fake else None
    input_dtype = draw(float_dtypes) if stage.rounds_input else None
    return contract.Quantizer(dtype, draw(float32s.filter(lambda value: value > 0.0)), saturate, dequant, input_dtype)


@st.composite
def quant_params(draw: st.DrawFn, op: contract.FusedOp, output_dtype: str) -> contract.QuantParams:
    """Some of the op's stages on; a rotation's product stages two by two (a part's cos and sin products), each
    rotation stage (normalised, products) dequantized to T, as `contract.rotation_stage_problem` has it."""
    stages = draw(st.sets(st.sampled_from(op.quant_stages), min_size=1))
    for part in op.part_stages:
        if any(stage.product for stage in stages.intersection(part)):
            stages |= {stage for stage in part if stage.product}
    quantizers_on = {stage: draw(quantizers(stage)) for stage in stages}
    for stage in stages:
        if stage.rotation_input:
            quantizers_on[stage] = dataclasses.replace(quantizers_on[stage], dequant_dtype=output_dtype)
    return contract.QuantParams(**{stage.value: quantizer for stage, quantizer in quantizers_on.items()})


@st.composite
def rotary_params(draw: st.DrawFn) -> contract.RotaryParams:
    head_dim = draw(st.integers(2, 2**20))
    rotary_dim = 2 * draw(st.integers(1, head_dim // 2))
    return contract.RotaryParams(
        head_dim, rotary_dim, draw(st.sampled_from(contract.Rotation)), draw(st.sampled_from(contract.HeadLayout))
    )


@st.composite
def node_fields(draw: st.DrawFn) -> NodeFields:
    op = OPS[draw(st.sampled_from(contract.FUSED_OPS))]
    params = NormParams(
        draw(float32s.filter(lambda value: value >= 0.0)), draw(float32s), draw(st.sampled_from(WeightMode))
    )
    rotary = draw(rotary_params()) if op.rotary else None
    if rotary is None:
        hidden = tuple(draw(st.integers(1, 2**31 - 1)) for _ in op.hidden_fields)
    else:
        heads = st.just(1) if rotary.layout is contract.HeadLayout.HEAD_MAJOR else st.integers(1, 2**10)
        hidden = tuple(rotary.head_dim * draw(heads) for _ in op.hidden_fields)
    output_dtype = draw(st.sampled_from(sorted(contract.OUTPUT_DTYPE_CODES)))
    quant = draw(quant_params(op, output_dtype)) if op.quantized else None
    return NodeFields(op, params, hidden, output_dtype, quant, rotary)


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
    fp8 = contract.Quantizer("float8_e4m3fn", 0.5)
    quant = contract.QuantParams(**{stage.value: fp8 for stage in OPS[op].output_stages if stage is not None})
    quant = quant if OPS[op].quantized else None
    rotary = ROTARY if OPS[op].rotary else None
    hidden = (64,) * len(OPS[op].hidden_fields)
    fields = NodeFields(OPS[op], NormParams(EPSILON, 1.0, mode), hidden, "bfloat16", quant, rotary)
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    assert from_qdp(fields.op, [array.tobytes() for array in fields.plugin_arrays().values()]) == fields


EPSILON = float(np.float32(1e-6))
ROTARY = contract.RotaryParams(32, 16, contract.Rotation.INTERLEAVED, contract.HeadLayout.TOKEN_MAJOR)
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


def test_a_quantized_op_is_its_base_op_then_every_stage_of_quantizer_fields() -> None:
    for base, quantized in contract.QUANTIZED_OPS.items():
        plain = OPS[base]
        assert quantized.name == f"{base}Quant" and quantized.base == base
        assert quantized.fields[: len(plain.fields)] == plain.fields
        assert quantized.quant_stages == plain.quantizable
        assert quantized.fields[len(plain.fields) :] == tuple(
            name for stage in plain.quantizable for name in stage.fields
        )
        assert (quantized.inputs(True), quantized.outputs) == (plain.inputs(True), plain.outputs)
    assert contract.RMS_NORM_QUANT.fields[5:9] == (
        "input_quant_dtype",
        "input_quant_scale",
        "input_quant_saturate",
        "input_dequant_dtype",
    )
    assert contract.RMS_NORM_QUANT.fields[9:14] == (
        "rsqrt_quant_dtype",
        "rsqrt_quant_scale",
        "rsqrt_quant_saturate",
        "rsqrt_dequant_dtype",
        "rsqrt_quant_input_dtype",
    )
    assert contract.RMS_NORM_QUANT.fields[-3:] == ("output_quant_dtype", "output_quant_scale", "output_quant_saturate")
    # The QK-norm's quantizers are its two norms', each with its own input, rsqrt and output stage: q's, then k's.
    for part, role in enumerate(("q", "k")):
        start = 6 + 12 * part
        assert contract.QK_NORM_QUANT.fields[start : start + 12] == (
            f"{role}_input_quant_dtype",
            f"{role}_input_quant_scale",
            f"{role}_input_quant_saturate",
            f"{role}_input_dequant_dtype",
            f"{role}_rsqrt_quant_dtype",
            f"{role}_rsqrt_quant_scale",
            f"{role}_rsqrt_quant_saturate",
            f"{role}_rsqrt_dequant_dtype",
            f"{role}_rsqrt_quant_input_dtype",
            f"{role}_output_quant_dtype",
            f"{role}_output_quant_scale",
            f"{role}_output_quant_saturate",
        )
    assert len(contract.QK_NORM_QUANT.fields) == 6 + 24
    # The rotary QK-norm's, after its rotary fields, per part in formula order: the norm's input and rsqrt stages
    # (as the QK-norm's), the normalised stage, the rotation's cos and sin product stages, then the output stage.
    for part, role in enumerate(("q", "k")):
        start = 11 + 24 * part
        norm_stages = contract.QK_NORM_QUANT.fields[6 + 12 * part : 6 + 12 * part + 9]
        assert contract.QK_NORM_ROPE_QUANT.fields[start : start + 24] == (
            *norm_stages,
            *(f"{role}_normalised_{name}" for name in PRODUCT_FIELDS),
            *(f"{role}_{product}_product_{name}" for product in ("cos", "sin") for name in PRODUCT_FIELDS),
            f"{role}_output_quant_dtype",
            f"{role}_output_quant_scale",
            f"{role}_output_quant_saturate",
        )
    assert len(contract.QK_NORM_ROPE_QUANT.fields) == 11 + 48
    assert set(contract.QUANTIZED_OPS) == {
        contract.RMS_NORM_OP,
        contract.ADD_RMS_NORM_OP,
        contract.QK_NORM_OP,
        contract.QK_NORM_ROPE_OP,
    }


PRODUCT_FIELDS = ("quant_dtype", "quant_scale", "quant_saturate", "dequant_dtype")


def test_the_rotary_qk_norm_is_the_qk_norm_then_cos_sin_and_its_rotary_fields() -> None:
    op = contract.QK_NORM_ROPE
    assert op.inputs(True) == ("q", "k", "q_weight", "k_weight", "cos", "sin")
    assert op.inputs(False) == ("q", "k", "cos", "sin")
    assert op.outputs == contract.QK_NORM.outputs and op.normalised_outputs == (True, True)
    rotary = ("head_dim", "rotary_dim", "rotation", "layout", "output_layout")
    assert op.fields == (*contract.QK_NORM.fields, *rotary)
    assert not op.listed_when_absent and not contract.QK_NORM_ROPE_QUANT.listed_when_absent
    assert all(OPS[name].listed_when_absent for name in (contract.RMS_NORM_OP, contract.QK_NORM_OP))


ROPE = NodeFields(contract.QK_NORM_ROPE, GOOD.params, (128, 64), "float16", rotary=ROTARY)
BAD_ROTARY = [
    ({"head_dim": 0}, "head_dim is 0, not a positive int32 length"),
    ({"rotary_dim": 15}, "rotary_dim is 15, not an even length from 2 to head_dim 32"),
    ({"rotary_dim": 0}, "rotary_dim is 0, not an even length from 2 to head_dim 32"),
    ({"rotary_dim": 34}, "rotary_dim is 34, not an even length from 2 to head_dim 32"),
    ({"head_dim": 48, "rotary_dim": 16}, "head_dim is 48, which does not divide the hidden size 128"),
    ({"rotation": 2}, "rotation is 2, none of 0 (HALF_SPLIT), 1 (INTERLEAVED)"),
    ({"layout": -1}, "layout is -1, none of 0 (TOKEN_MAJOR), 1 (HEAD_MAJOR)"),
    ({"layout": 1}, "layout is 1 (HEAD_MAJOR), but hidden size 128 is not one head row of 32"),
    ({"output_layout": 2}, "output_layout is 2, none of 0 (TOKEN_MAJOR), 1 (HEAD_MAJOR)"),
]


def test_a_head_major_node_writes_head_major_and_a_token_major_one_either_layout() -> None:
    """output_layout: the inputs' layout, or HEAD_MAJOR after TOKEN_MAJOR (the node writes [B, H, S, D] itself);
    never TOKEN_MAJOR after HEAD_MAJOR. Given as None it is the inputs' layout."""
    token, head = contract.HeadLayout.TOKEN_MAJOR, contract.HeadLayout.HEAD_MAJOR
    moving = contract.RotaryParams(32, 32, contract.Rotation.HALF_SPLIT, token, head)
    assert moving.moves_heads and moving.numbers() == (32, 32, 0, 0, 1)
    assert contract.rotary_problem(moving, (128, 64)) is None
    assert not contract.RotaryParams(32, 32, contract.Rotation.HALF_SPLIT, head).moves_heads
    backwards = contract.RotaryParams(32, 32, contract.Rotation.HALF_SPLIT, head, token)
    assert contract.rotary_problem(backwards, (32, 32)) == (
        "output_layout",
        "is 0 (TOKEN_MAJOR), but layout is 1 (HEAD_MAJOR): a node moves heads only forward",
    )


@pytest.mark.parametrize(("changes", "problem"), BAD_ROTARY)
def test_a_bad_rotary_field_is_the_same_problem_in_every_transport(changes: dict, problem: str) -> None:
    numbers = {**ROPE.numbers(), **changes}
    escaped = "^" + problem.replace("(", r"\(").replace(")", r"\)") + "$"
    with pytest.raises(TrtfuseError, match=escaped):
        decode(ROPE.op, numbers)
    with pytest.raises(TrtfuseError) as onnx_error:
        from_node(_node(ROPE, **changes), "m.onnx: node 'n'")
    assert str(onnx_error.value) == f"m.onnx: node 'n': attribute {problem}"
    raw = [RawField(n, "FLOAT32" if n in contract.FLOAT_FIELDS else "INT32", _array(n, v)) for n, v in numbers.items()]
    with pytest.raises(TrtfuseError) as plugin_error:
        from_plugin_fields(ROPE.op, raw, "TrtfuseQkNormRope 'n'")
    assert str(plugin_error.value) == f"TrtfuseQkNormRope 'n': field {problem}"
    with pytest.raises(TrtfuseError) as qdp_error:
        from_qdp(ROPE.op, [_array(n, v).tobytes() for n, v in numbers.items()])
    assert str(qdp_error.value) == f"TrtfuseQkNormRope: field {problem}"


def test_rotary_fields_are_given_exactly_for_a_rotary_op() -> None:
    with pytest.raises(ValueError, match="rotary must be given exactly for a rotary op"):
        NodeFields(contract.QK_NORM, GOOD.params, (64, 64), "float16", rotary=ROTARY)
    with pytest.raises(ValueError, match="rotary must be given exactly for a rotary op"):
        NodeFields(contract.QK_NORM_ROPE, GOOD.params, (64, 64), "float16")


def test_an_off_stage_is_written_as_code_0_and_the_output_dtype_follows_the_output_stage() -> None:
    quant = contract.QuantParams(rsqrt=contract.Quantizer("int8", 0.25, True, "float16"))
    fields = NodeFields(contract.RMS_NORM_QUANT, GOOD.params, (64,), "float16", quant)
    numbers = fields.numbers()
    assert (numbers["input_quant_dtype"], numbers["input_quant_scale"], numbers["input_dequant_dtype"]) == (0, 1.0, 1)
    assert (numbers["rsqrt_quant_dtype"], numbers["rsqrt_dequant_dtype"], numbers["rsqrt_quant_input_dtype"]) == (
        3,
        10,
        1,
    )
    assert fields.normalised_dtype(0) == "float16" and fields.output_quantizer(0) is None
    fp8 = NodeFields(
        contract.RMS_NORM_QUANT,
        GOOD.params,
        (64,),
        "float16",
        contract.QuantParams(output=contract.Quantizer("float8_e4m3fn", 0.25, False)),
    )
    assert fp8.normalised_dtype(0) == "float8_e4m3fn" and fp8.numbers()["output_quant_saturate"] == 0


def test_each_qk_norm_output_has_its_own_quantizer_and_dtype() -> None:
    """q_out quantized to INT8 at its scale, k_out left in T: each output's dtype follows its own stage, every
    transport keeps both, and a single norm's stage on the QK-norm is refused."""
    quant = contract.QuantParams(q_output=contract.Quantizer("int8", 0.25))
    fields = NodeFields(contract.QK_NORM_QUANT, GOOD.params, (128, 64), "float16", quant)
    assert fields.output_dtypes("float16") == ("int8", "float16")
    assert (fields.output_quantizer(0), fields.output_quantizer(1)) == (quant.q_output, None)
    assert fields.part_quant(0) == contract.QuantParams(output=quant.q_output) and fields.part_quant(1) is None
    numbers = fields.numbers()
    assert (numbers["q_output_quant_dtype"], numbers["q_output_quant_scale"], numbers["k_output_quant_dtype"]) == (
        3,
        0.25,
        0,
    )
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    with pytest.raises(ValueError, match="has no stage output"):
        NodeFields(
            contract.QK_NORM_QUANT, GOOD.params, (128, 64), "float16", contract.QuantParams(output=quant.q_output)
        )
    with pytest.raises(TrtfuseError, match=r"q_input_quant_dtype and every other stage is off"):
        from_node(_node(fields, q_output_quant_dtype=0), "m.onnx: node 'n'")


def test_each_qk_norm_part_has_its_own_input_and_rsqrt_stages() -> None:
    """OLMo2's INT8 q and k norms: each part's input and inverse-root pairs at its own scales, as that part's norm's
    input and rsqrt stages (`part_quant`), kept by every transport; the outputs stay in T."""
    fake = contract.Quantizer("int8", 0.0625, True, "float16")
    quant = contract.QuantParams(
        q_input=fake,
        q_rsqrt=contract.Quantizer("int8", 0.5, True, "float16", "float16"),
        k_input=contract.Quantizer("int8", 0.125, True, "float16"),
        k_rsqrt=contract.Quantizer("int8", 0.25, True, "float16"),
    )
    assert quant.k_rsqrt.input_dtype == "float32"  # given none, r is read as computed, as a single norm's
    fields = NodeFields(contract.QK_NORM_QUANT, GOOD.params, (64, 32), "float16", quant)
    assert fields.output_dtypes("float16") == ("float16", "float16")
    assert fields.part_quant(0) == contract.QuantParams(input=fake, rsqrt=quant.q_rsqrt)
    assert fields.part_quant(1) == contract.QuantParams(input=quant.k_input, rsqrt=quant.k_rsqrt)
    numbers = fields.numbers()
    assert (
        numbers["q_rsqrt_quant_scale"],
        numbers["q_rsqrt_quant_input_dtype"],
        numbers["k_rsqrt_quant_input_dtype"],
    ) == (
        0.5,
        10,
        1,
    )
    assert (numbers["k_input_quant_scale"], numbers["k_input_dequant_dtype"], numbers["q_output_quant_dtype"]) == (
        0.125,
        10,
        0,
    )
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert decode(contract.QK_NORM_QUANT, fields.numbers()) == fields


def test_the_rsqrt_stage_carries_the_dtype_its_quantizer_reads_r_in() -> None:
    """A graph that casts r to 16 bits before its QuantizeLinear: the dtype is a field of its own, every transport
    keeps it; an rsqrt quantizer given none reads r in float32, as the contract had it before the field."""
    rounded = contract.Quantizer("int8", 0.25, True, "float16", "float16")
    fields = NodeFields(contract.RMS_NORM_QUANT, GOOD.params, (64,), "float16", contract.QuantParams(rsqrt=rounded))
    assert fields.numbers()["rsqrt_quant_input_dtype"] == 10
    assert from_node(_node(fields), "m.onnx: node 'n'").quant.rsqrt == rounded
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    assert from_qdp(fields.op, [array.tobytes() for array in fields.plugin_arrays().values()]) == fields
    unrounded = contract.QuantParams(rsqrt=contract.Quantizer("int8", 0.25, True, "float16"))
    assert unrounded.rsqrt.input_dtype == "float32"
    assert contract.QuantParams(input=contract.Quantizer("int8", 0.25, True, "float16")).input.input_dtype is None


QUANT_GOOD = NodeFields(
    contract.RMS_NORM_QUANT,
    GOOD.params,
    (64,),
    "float16",
    contract.QuantParams(output=contract.Quantizer("float8_e4m3fn", 0.25)),
)
QUANT_BAD_VALUES = [
    ("output_quant_dtype", 2, "output_quant_dtype is 2, none of 0 (off), 17 (float8_e4m3fn), 3 (int8)"),
    ("output_quant_scale", 0.0, "output_quant_scale is 0.0, not a finite positive number"),
    ("input_quant_scale", -1.0, "input_quant_scale is -1.0, not a finite positive number"),
    ("output_quant_scale", math.inf, "output_quant_scale is inf, not a finite positive number"),
    ("output_quant_saturate", 2, "output_quant_saturate is 2, not 0 or 1"),
    ("input_dequant_dtype", 17, "input_dequant_dtype is 17, none of 1 (float32), 10 (float16), 16 (bfloat16)"),
    ("rsqrt_quant_input_dtype", 3, "rsqrt_quant_input_dtype is 3, none of 1 (float32), 10 (float16), 16 (bfloat16)"),
    ("output_quant_dtype", 0, "input_quant_dtype and every other stage is off: a plain TrtfuseRmsNorm node"),
]


@pytest.mark.parametrize(("name", "value", "problem"), QUANT_BAD_VALUES)
def test_a_bad_quantizer_field_is_one_line_in_every_transport(name: str, value: float, problem: str) -> None:
    numbers = {**QUANT_GOOD.numbers(), name: value}
    escaped = problem.replace("(", r"\(").replace(")", r"\)")
    with pytest.raises(TrtfuseError, match="^" + escaped):
        decode(QUANT_GOOD.op, numbers)
    with pytest.raises(TrtfuseError, match=f"^m.onnx: node 'n': attribute {escaped}$"):
        from_node(_node(QUANT_GOOD, **{name: value}), "m.onnx: node 'n'")
    with pytest.raises(TrtfuseError, match=f"^TrtfuseRmsNormQuant: field {escaped}$"):
        from_qdp(QUANT_GOOD.op, [_array(n, v).tobytes() for n, v in numbers.items()])


def test_int8_never_runs_unsaturated() -> None:
    numbers = {**QUANT_GOOD.numbers(), "output_quant_dtype": 3, "output_quant_saturate": 0}
    with pytest.raises(TrtfuseError, match="output_quant_saturate is 0, but INT8 always saturates"):
        decode(QUANT_GOOD.op, numbers)


def test_quant_must_be_given_exactly_for_a_quantized_op() -> None:
    with pytest.raises(ValueError, match="quant must be given exactly for a quantized op"):
        NodeFields(contract.RMS_NORM_QUANT, GOOD.params, (64,), "float16")
    with pytest.raises(ValueError, match="quant must be given exactly for a quantized op"):
        NodeFields(contract.RMS_NORM, GOOD.params, (64,), "float16", QUANT_GOOD.quant)


FP8_PRODUCT = contract.Quantizer("float8_e4m3fn", 0.09283447265625, True, "float16")


def test_each_rotated_part_quantizes_its_two_products_at_their_own_scales() -> None:
    """ModelOpt's FP8 Qwen3 rotation: q's and k's cos and sin products each through a pair of its own, q's result
    quantized, k's not: each part's product stages are that part's norm's cos_product and sin_product, every
    transport keeps them, and q_out alone is FP8."""
    quant = contract.QuantParams(
        q_cos_product=FP8_PRODUCT,
        q_sin_product=contract.Quantizer("float8_e4m3fn", float(np.float16(0.0735)), True, "float16"),
        q_output=contract.Quantizer("float8_e4m3fn", float(np.float16(0.0992))),
        k_cos_product=contract.Quantizer("float8_e4m3fn", float(np.float16(0.0962)), True, "float16"),
        k_sin_product=contract.Quantizer("float8_e4m3fn", float(np.float16(0.07275)), True, "float16"),
    )
    fields = NodeFields(contract.QK_NORM_ROPE_QUANT, GOOD.params, (128, 64), "float16", quant, ROTARY)
    assert fields.output_dtypes("float16") == ("float8_e4m3fn", "float16")
    assert fields.part_quant(0) == contract.QuantParams(
        cos_product=quant.q_cos_product, sin_product=quant.q_sin_product, output=quant.q_output
    )
    assert fields.part_quant(1) == contract.QuantParams(
        cos_product=quant.k_cos_product, sin_product=quant.k_sin_product
    )
    numbers = fields.numbers()
    assert (numbers["q_cos_product_quant_dtype"], numbers["k_sin_product_dequant_dtype"]) == (17, 10)
    assert numbers["q_cos_product_quant_scale"] == FP8_PRODUCT.scale
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    assert from_qdp(fields.op, [array.tobytes() for array in fields.plugin_arrays().values()]) == fields


def test_a_parts_products_are_quantized_together_and_dequantized_to_t() -> None:
    """One product quantized alone, or dequantized to another dtype than T (the dtype the rotation sums them in),
    is no node of the contract: one line naming the field, in every transport; a stray product stage on the plain
    QK-norm is refused."""
    quant = contract.QuantParams(q_cos_product=FP8_PRODUCT, q_sin_product=FP8_PRODUCT)
    fields = NodeFields(contract.QK_NORM_ROPE_QUANT, GOOD.params, (128, 64), "float16", quant, ROTARY)
    with pytest.raises(TrtfuseError, match=r"node 'n': attribute q_sin_product_quant_dtype is 0 \(off\), but q_cos_"):
        from_node(_node(fields, q_sin_product_quant_dtype=0), "m.onnx: node 'n'")
    arrays = {**fields.plugin_arrays(), "q_cos_product_dequant_dtype": np.array([1], dtype=np.int32)}
    with pytest.raises(TrtfuseError, match=r"q_cos_product_dequant_dtype is 1 \(float32\), not output_dtype's 10"):
        from_qdp(fields.op, [array.tobytes() for array in arrays.values()])
    with pytest.raises(ValueError, match="products are quantized together"):
        NodeFields(
            contract.QK_NORM_ROPE_QUANT,
            GOOD.params,
            (128, 64),
            "float16",
            contract.QuantParams(k_sin_product=FP8_PRODUCT),
            ROTARY,
        )
    with pytest.raises(ValueError, match="has no stage q_cos_product"):
        NodeFields(contract.QK_NORM_QUANT, GOOD.params, (128, 64), "float16", quant)


def test_a_rotated_norms_own_stages_are_its_parts_norm_stages_and_the_normalised_one_dequantizes_to_t() -> None:
    """ModelOpt's INT8 OLMo2 (each norm's input and inverse-root pairs) and Gemma3 (a pair on each norm's output
    before the rotation) rotary nodes: every transport gives them back, each part's stages are its norm's; a
    normalised stage dequantized to another dtype than T is one line naming the field, in every transport."""
    int8 = contract.Quantizer("int8", float(np.float32(0.0269)), True, "float16")
    rsqrt = contract.Quantizer("int8", float(np.float32(0.0253)), True, "float32", "float16")
    quant = contract.QuantParams(q_input=int8, q_rsqrt=rsqrt, q_normalised=int8, k_normalised=int8, k_rsqrt=rsqrt)
    fields = NodeFields(contract.QK_NORM_ROPE_QUANT, GOOD.params, (128, 64), "float16", quant, ROTARY)
    assert fields.part_quant(0) == contract.QuantParams(input=int8, rsqrt=rsqrt, normalised=int8)
    assert fields.part_quant(1) == contract.QuantParams(rsqrt=rsqrt, normalised=int8)
    assert from_node(_node(fields), "m.onnx: node 'n'") == fields
    assert from_plugin_fields(fields.op, _raw_fields(fields), "op 'n'") == fields
    assert from_qdp(fields.op, [array.tobytes() for array in fields.plugin_arrays().values()]) == fields
    message = r"k_normalised_dequant_dtype is 1 \(float32\), not output_dtype's 10 \(float16\)"
    with pytest.raises(TrtfuseError, match=f"node 'n': attribute {message}"):
        from_node(_node(fields, k_normalised_dequant_dtype=1), "m.onnx: node 'n'")
    arrays = {**fields.plugin_arrays(), "k_normalised_dequant_dtype": np.array([1], dtype=np.int32)}
    with pytest.raises(TrtfuseError, match=message):
        from_qdp(fields.op, [array.tobytes() for array in arrays.values()])
    with pytest.raises(ValueError, match=message.replace("k_", "q_")):
        NodeFields(
            contract.QK_NORM_ROPE_QUANT,
            GOOD.params,
            (128, 64),
            "float16",
            contract.QuantParams(q_normalised=dataclasses.replace(int8, dequant_dtype="float32")),
            ROTARY,
        )
    with pytest.raises(ValueError, match="has no stage q_normalised"):
        NodeFields(contract.QK_NORM_QUANT, GOOD.params, (128, 64), "float16", quant)
