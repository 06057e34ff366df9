"""The lowering of TrtfuseQkNormRope computes the contract (docs/plugin-nodes.md, "Rotary embedding") bit for bit.

Rows of small integers have exact sums of squares, so the norm's float32 y is the same whatever order a runtime sums
in; from there the lowering must equal, bit for bit, the contract written in numpy (each product and the sum one
float32 op, one rounding to T), and where the rotation is exact (tables of quarter turns: cos and sin in {0, ±1}) the
float64 reference rounded to T.
"""

from __future__ import annotations

from dataclasses import replace

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import HeadLayout, RotaryParams, Rotation, WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.lowering import lower_fused_nodes

EPSILON = float(np.float32(1e-6))
DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
BATCH, TOKENS, HEAD = 2, 3, 16
Q_HEADS, K_HEADS = 4, 2


def _shape(layout: HeadLayout, heads: int, flat: bool) -> tuple[int, ...]:
    if layout is HeadLayout.HEAD_MAJOR:
        return (BATCH, heads, TOKENS, HEAD)
    return (BATCH, TOKENS, heads * HEAD) if flat else (BATCH, TOKENS, heads, HEAD)


def _rows(rng: np.random.Generator, shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Small integers: every sum of squares exact in float32, so y is one float32 value whatever the order."""
    return rng.integers(-8, 9, shape).astype(NUMPY[dtype])


def fake_quant(v: np.ndarray, quantizer: contract.Quantizer) -> np.ndarray:
    """DQ(Q(v)) of an INT8 quantizer in float32 ops, its dequantized value rounded to its dequant dtype."""
    scale = np.float32(quantizer.scale)
    codes = np.clip(np.rint(v.astype(np.float32) / scale), -128, 127).astype(np.float32)
    return (codes * scale).astype(NUMPY[quantizer.dequant_dtype]).astype(np.float32)


def contract_y(
    x: np.ndarray,
    weight: np.ndarray | None,
    mode: WeightMode,
    offset: float,
    out: str,
    quant: contract.QuantParams | None = None,
) -> np.ndarray:
    """The norm's float32 y before its rounding to T (contract.WeightMode), over the last axis; with one norm's
    input and rsqrt stages (`quant`, INT8) where on."""
    quant = quant or contract.QuantParams()
    rows = x.astype(np.float32) if quant.input is None else fake_quant(x, quant.input)
    width = x.shape[-1]
    inverse_root = np.float32(1) / np.sqrt(
        (rows * rows).sum(axis=-1, keepdims=True, dtype=np.float32) / np.float32(width) + np.float32(EPSILON)
    )
    if quant.rsqrt is not None:
        inverse_root = fake_quant(inverse_root, quant.rsqrt)
    normalised = rows * inverse_root
    if mode is WeightMode.NONE:
        return normalised
    scale = weight.astype(np.float32) + np.float32(offset)
    if mode is WeightMode.AFTER_CAST:
        rounding = NUMPY[contract.rounding_dtype(x.dtype.name if x.dtype != ml_dtypes.bfloat16 else "bfloat16", out)]
        return normalised.astype(rounding).astype(np.float32) * scale
    return normalised * scale


def contract_rotate(y: np.ndarray, cos: np.ndarray, sin: np.ndarray, rotary: RotaryParams) -> np.ndarray:
    """The contract's rotation of float32 y, in float32 ops: head rows of D, each row's token's cos and sin."""
    token_major = rotary.layout is HeadLayout.TOKEN_MAJOR
    view = y.reshape(BATCH, TOKENS, -1, HEAD) if token_major else y
    c = (cos[:, :, None, :] if token_major else cos[:, None, :, :]).astype(np.float32)
    s = (sin[:, :, None, :] if token_major else sin[:, None, :, :]).astype(np.float32)
    width, half = rotary.rotary_dim, rotary.rotary_dim // 2
    turned = view[..., :width]
    partner = np.empty_like(turned)
    if rotary.rotation is Rotation.HALF_SPLIT:
        partner[..., :half], partner[..., half:] = -turned[..., half:], turned[..., :half]
    else:
        partner[..., 0::2], partner[..., 1::2] = -turned[..., 1::2], turned[..., 0::2]
    rotated = (turned * c) + (partner * s)
    return np.concatenate([rotated, view[..., width:]], axis=-1).reshape(y.shape)


def reference_rotate(y: np.ndarray, cos: np.ndarray, sin: np.ndarray, rotary: RotaryParams) -> np.ndarray:
    """The same rotation in float64 (the reference the kernels are judged against)."""
    return contract_rotate(y.astype(np.float64), cos.astype(np.float64), sin.astype(np.float64), rotary)


def _model(
    fields: NodeFields, shapes: dict[str, tuple[int, ...]], dtype: str, weights: dict, table: str
) -> onnx.ModelProto:
    """One rotary node; graph inputs float32, cast to the activations' (and the tables') dtype inside."""
    names = ["q", "k", *weights, "cos", "sin"]
    casts = [
        helper.make_node("Cast", [f"{name}_in"], [name], to=DTYPES[table if name in ("cos", "sin") else dtype])
        for name in ("q", "k", "cos", "sin")
    ]
    node = helper.make_node(
        fields.op.name, names, ["q_out", "k_out"], name="rope", domain=contract.ONNX_DOMAIN, **fields.onnx_attributes()
    )
    outs = [helper.make_node("Cast", [name], [f"{name}_f32"], to=TensorProto.FLOAT) for name in ("q_out", "k_out")]
    graph = helper.make_graph(
        [*casts, node, *outs],
        "rope",
        [
            helper.make_tensor_value_info(f"{name}_in", TensorProto.FLOAT, shapes[name])
            for name in ("q", "k", "cos", "sin")
        ],
        [
            helper.make_tensor_value_info(f"{name}_f32", TensorProto.FLOAT, shapes[name[0]])
            for name in ("q_out", "k_out")
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
        value_info=[
            helper.make_tensor_value_info(name, DTYPES[fields.output_dtype], shapes[name[0]])
            for name in ("q_out", "k_out")
        ],
    )
    opsets = [helper.make_opsetid("", 18), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets)


def _lowered_run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    lowered = lower_fused_nodes(model)
    onnx.checker.check_model(lowered, full_check=True)
    assert all(node.domain != contract.ONNX_DOMAIN for node in lowered.graph.node)
    session = onnxruntime.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {f"{name}_in": value.astype(np.float32) for name, value in feed.items()})


CASES = [
    # (layout, flat token-major rows, rotation, rotary_dim, dtype, table dtype, mode, batch of the tables)
    (HeadLayout.TOKEN_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "float32", "float32", WeightMode.AFTER_CAST, 1),
    (HeadLayout.TOKEN_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "float16", "float16", WeightMode.AFTER_CAST, BATCH),
    (HeadLayout.TOKEN_MAJOR, True, Rotation.HALF_SPLIT, HEAD, "bfloat16", "float32", WeightMode.BEFORE_CAST, 1),
    (HeadLayout.HEAD_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "bfloat16", "bfloat16", WeightMode.BEFORE_CAST, BATCH),
    (HeadLayout.HEAD_MAJOR, False, Rotation.INTERLEAVED, HEAD, "float32", "float32", WeightMode.NONE, 1),
    (HeadLayout.TOKEN_MAJOR, False, Rotation.INTERLEAVED, 8, "float16", "float32", WeightMode.AFTER_CAST, BATCH),
    (HeadLayout.TOKEN_MAJOR, True, Rotation.HALF_SPLIT, 4, "float32", "float32", WeightMode.AFTER_CAST, BATCH),
    (HeadLayout.HEAD_MAJOR, False, Rotation.HALF_SPLIT, 10, "float16", "float16", WeightMode.NONE, 1),
]
IDS = [f"{c[0].name}{'-flat' if c[1] else ''}-{c[2].name}-r{c[3]}-{c[4]}-{c[5]}-{c[6].name}-b{c[7]}" for c in CASES]


def _case(case: tuple, quarter_turns: bool, seed: int) -> tuple[NodeFields, dict, dict, dict]:
    layout, flat, rotation, rotary_dim, dtype, table, mode, table_batch = case
    rng = np.random.default_rng(seed)
    shapes = {
        "q": _shape(layout, Q_HEADS, flat),
        "k": _shape(layout, K_HEADS, flat),
        "cos": (table_batch, TOKENS, rotary_dim),
        "sin": (table_batch, TOKENS, rotary_dim),
    }
    hidden = tuple(shapes[name][-1] for name in ("q", "k"))
    feed = {name: _rows(rng, shapes[name], dtype) for name in ("q", "k")}
    if quarter_turns:
        turns = rng.integers(0, 4, (table_batch, TOKENS, rotary_dim // 2))
        angles = np.pi / 2 * turns
    else:
        angles = rng.uniform(-40.0, 40.0, (table_batch, TOKENS, rotary_dim // 2))
    widen = np.repeat if rotation is Rotation.INTERLEAVED else (lambda a, n, axis: np.concatenate([a] * n, axis=axis))
    for name, function in (("cos", np.cos), ("sin", np.sin)):
        feed[name] = np.round(function(widen(angles, 2, axis=-1)), 12 if quarter_turns else 20).astype(NUMPY[table])
    weights = {}
    if mode is not WeightMode.NONE:
        weights = {
            f"w{name}": rng.normal(1.0, 0.5, size).astype(NUMPY[dtype]) for name, size in zip("qk", hidden, strict=True)
        }
    rotary = RotaryParams(HEAD, rotary_dim, rotation, layout)
    fields = NodeFields(contract.QK_NORM_ROPE, contract.NormParams(EPSILON, 0.5, mode), hidden, dtype, rotary=rotary)
    return fields, shapes, feed, weights


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_the_lowering_is_the_contract_bit_for_bit(case: tuple) -> None:
    fields, shapes, feed, weights = _case(case, quarter_turns=False, seed=1)
    outputs = _lowered_run(_model(fields, shapes, case[4], weights, case[5]), feed)
    for role, actual in zip("qk", outputs, strict=True):
        weight = weights.get(f"w{role}")
        y = contract_y(feed[role], weight, fields.params.weight_mode, 0.5, fields.output_dtype)
        expected = contract_rotate(y, feed["cos"], feed["sin"], fields.rotary).astype(NUMPY[fields.output_dtype])
        np.testing.assert_array_equal(actual, expected.astype(np.float32))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_quarter_turns_are_the_float64_reference_exactly(case: tuple) -> None:
    """cos and sin in {0, ±1}: each rotated element is ±y of its partner or itself, exactly, so the lowering equals
    the float64 reference rounded to T bit for bit; a wrong pairing, sign, table row or passed-through element
    cannot hide there."""
    fields, shapes, feed, weights = _case(case, quarter_turns=True, seed=2)
    assert set(np.unique(feed["cos"].astype(np.float32))) <= {-1.0, 0.0, 1.0}
    outputs = _lowered_run(_model(fields, shapes, case[4], weights, case[5]), feed)
    for role, actual in zip("qk", outputs, strict=True):
        y = contract_y(feed[role], weights.get(f"w{role}"), fields.params.weight_mode, 0.5, fields.output_dtype)
        expected = reference_rotate(y, feed["cos"], feed["sin"], fields.rotary).astype(NUMPY[fields.output_dtype])
        np.testing.assert_array_equal(actual, expected.astype(np.float32))


def _int8(scale: float, dequant: str, input_dtype: str | None = None) -> contract.Quantizer:
    """An INT8 fake-quant stage's quantizer, its scale the float32 value nearest `scale`."""
    return contract.Quantizer("int8", float(np.float32(scale)), True, dequant, input_dtype)


# ModelOpt's INT8 q/k norm pairs at scales that move values of small integers: OLMo2's input and inverse-root pairs
# (full-width rows), Gemma3's pair on each norm's output (head-major rows of float16), each part its own scales.
NORM_STAGE_CASES = {
    "olmo2-input-rsqrt": (
        (HeadLayout.TOKEN_MAJOR, True, Rotation.HALF_SPLIT, HEAD, "float16", "float16", WeightMode.AFTER_CAST, 1),
        contract.QuantParams(
            q_input=_int8(3.0, "float16"),
            q_rsqrt=_int8(0.0078125, "float32", "float32"),
            k_input=_int8(2.0, "float16"),
            k_rsqrt=_int8(0.01171875, "float32", "float32"),
        ),
    ),
    "gemma3-normalised": (
        (HeadLayout.HEAD_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "float16", "float16", WeightMode.AFTER_CAST, BATCH),
        contract.QuantParams(q_normalised=_int8(0.0269, "float16"), k_normalised=_int8(0.0313, "float16")),
    ),
}


@pytest.mark.parametrize("name", sorted(NORM_STAGE_CASES))
def test_the_norms_stages_of_a_rotary_node_are_the_contract_bit_for_bit(name: str) -> None:
    """The input and rsqrt stages quantize x and r as a QK-norm's do; the normalised stage rounds y to T and fake-
    quantizes it before the rotation, which then rotates that T value in float32 and rounds once."""
    case, quant = NORM_STAGE_CASES[name]
    fields, shapes, feed, weights = _case(case, quarter_turns=False, seed=5)
    fields = replace(fields, op=contract.QK_NORM_ROPE_QUANT, quant=quant)
    outputs = _lowered_run(_model(fields, shapes, case[4], weights, case[5]), feed)
    out = NUMPY[fields.output_dtype]
    for part, (role, actual) in enumerate(zip("qk", outputs, strict=True)):
        part_quant = fields.part_quant(part)
        y = contract_y(feed[role], weights.get(f"w{role}"), fields.params.weight_mode, 0.5, "float16", part_quant)
        if part_quant.normalised is not None:
            y = fake_quant(y.astype(out), part_quant.normalised)
        expected = contract_rotate(y, feed["cos"], feed["sin"], fields.rotary).astype(out)
        np.testing.assert_array_equal(actual, expected.astype(np.float32))
        plain = contract_y(feed[role], weights.get(f"w{role}"), fields.params.weight_mode, 0.5, "float16")
        assert np.any(actual != contract_rotate(plain, feed["cos"], feed["sin"], fields.rotary).astype(out))


def test_the_rotation_is_applied_before_the_only_rounding() -> None:
    """y is rotated in float32 and rounded once: rounding y to T before rotating (the graph's own order) gives
    another float16 result on some elements, which the lowering must not."""
    case = (HeadLayout.HEAD_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "float16", "float32", WeightMode.BEFORE_CAST, 1)
    fields, shapes, feed, weights = _case(case, quarter_turns=False, seed=3)
    (q_out, _) = _lowered_run(_model(fields, shapes, "float16", weights, "float32"), feed)
    y = contract_y(feed["q"], weights["wq"], WeightMode.BEFORE_CAST, 0.5, "float16")
    rounded_first = contract_rotate(y.astype(np.float16).astype(np.float32), feed["cos"], feed["sin"], fields.rotary)
    assert np.any(q_out != rounded_first.astype(np.float16).astype(np.float32))


@pytest.mark.parametrize(
    ("shape", "message"),
    [
        ((1, TOKENS), r"table 'cos_t' has rank 2, not 3 \(\[batch, tokens, rotary_dim\]\)"),
        ((1, TOKENS, 8), "rotary_dim is 16, but table 'cos_t' has last dim 8"),
    ],
)
def test_a_table_of_another_shape_is_one_line_naming_it(shape: tuple[int, ...], message: str) -> None:
    case = (HeadLayout.TOKEN_MAJOR, False, Rotation.HALF_SPLIT, HEAD, "float32", "float32", WeightMode.NONE, 1)
    fields, shapes, _, weights = _case(case, quarter_turns=False, seed=4)
    model = _model(fields, {**shapes, "cos": shape}, "float32", weights, "float32")
    model.graph.node[2].output[0] = "cos_t"
    model.graph.node[4].input[-2] = "cos_t"
    with pytest.raises(TrtfuseError, match=f"^the fused model: node 'rope': {message}$"):
        lower_fused_nodes(model)
