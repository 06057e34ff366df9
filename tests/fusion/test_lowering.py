"""lower_fused_nodes: the standard-op lowering computes exactly the contract's semantics in onnxruntime."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import WeightMode
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.lowering import lower_fused_nodes

HIDDEN = 64
EPSILON = 1e-5
DTYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
NUMPY_DTYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}


def contract_rms_norm(
    x: np.ndarray, weight: np.ndarray | None, offset: float, mode: WeightMode, out_dtype: str | None = None
) -> np.ndarray:
    """contract.WeightMode's definition, written with numpy: T the output dtype, R the node's 16-bit dtype."""
    dtype = NUMPY_DTYPES[out_dtype] if out_dtype else x.dtype
    rounding = x.dtype if x.dtype != np.float32 else dtype
    x32 = x.astype(np.float32)
    inverse_root = np.float32(1) / np.sqrt(np.mean(x32 * x32, axis=-1, keepdims=True) + np.float32(EPSILON))
    normalised = x32 * inverse_root
    if mode == WeightMode.NONE:
        return normalised.astype(dtype)
    scale = weight.astype(np.float32) + np.float32(offset)
    if mode == WeightMode.AFTER_CAST:
        return (normalised.astype(rounding).astype(np.float32) * scale).astype(dtype)
    return (normalised * scale).astype(dtype)


def _attributes(mode: WeightMode, offset: float, **hidden: int) -> dict:
    return {
        contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
        contract.ATTR_VERSION: contract.PLUGIN_VERSION,
        contract.ATTR_EPSILON: EPSILON,
        contract.ATTR_WEIGHT_OFFSET: offset,
        contract.ATTR_WEIGHT_MODE: int(mode),
        **hidden,
    }


def _fused_model(
    op: str,
    inputs: dict[str, np.ndarray],
    weights: dict[str, np.ndarray],
    outputs: list[str],
    attributes: dict,
    opset: int,
    out_dtype: str | None = None,
) -> onnx.ModelProto:
    """Graph inputs are fp32 and cast to the activation dtype inside, so bf16 runs in onnxruntime too. The fused
    outputs are declared `out_dtype` (default: the inputs' dtype)."""
    first = next(iter(inputs.values()))
    elem_type = helper.np_dtype_to_tensor_dtype(first.dtype)
    out_type = DTYPES[out_dtype] if out_dtype else elem_type
    nodes = [helper.make_node("Cast", [f"{name}_fp32"], [name], to=elem_type, name=f"cast_{name}") for name in inputs]
    node_inputs = list(inputs) + list(weights)
    attributes = {contract.ATTR_OUTPUT_DTYPE: out_type, **attributes}
    nodes.append(helper.make_node(op, node_inputs, outputs, name="fused", domain=contract.ONNX_DOMAIN, **attributes))
    nodes += [helper.make_node("Cast", [name], [f"{name}_fp32"], to=TensorProto.FLOAT) for name in outputs]
    graph = helper.make_graph(
        nodes,
        "fused",
        [
            helper.make_tensor_value_info(f"{name}_fp32", TensorProto.FLOAT, value.shape)
            for name, value in inputs.items()
        ],
        [
            helper.make_tensor_value_info(f"{name}_fp32", TensorProto.FLOAT, inputs[source].shape)
            for name, source in zip(outputs, inputs, strict=True)
        ],
        [numpy_helper.from_array(value, name) for name, value in weights.items()],
        value_info=[helper.make_tensor_value_info(name, out_type, None) for name in outputs],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {f"{name}_fp32": value.astype(np.float32) for name, value in feed.items()})


def _mismatch_fraction(actual: np.ndarray, expected: np.ndarray) -> float:
    return float(np.mean(actual.astype(np.float32) != expected.astype(np.float32)))


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("mode", "offset"),
    [
        (WeightMode.NONE, 0.0),
        (WeightMode.AFTER_CAST, 0.0),
        (WeightMode.BEFORE_CAST, 1.0),
        (WeightMode.BEFORE_CAST, 0.0),
    ],
)
def test_rms_norm_lowering_matches_the_contract(dtype: str, mode: WeightMode, offset: float, opset: int) -> None:
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((3, 7, HIDDEN)) * 3).astype(NUMPY_DTYPES[dtype])
    weight = None if mode == WeightMode.NONE else rng.normal(1.0, 0.7, HIDDEN).astype(NUMPY_DTYPES[dtype])
    weights = {} if weight is None else {"w": weight}
    attributes = _attributes(mode, offset, **{contract.ATTR_HIDDEN: HIDDEN})
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, weights, ["y"], attributes, opset)
    lowered = lower_fused_nodes(model)
    onnx.checker.check_model(lowered, full_check=True)
    assert all(node.domain != contract.ONNX_DOMAIN for node in lowered.graph.node)
    assert all(opset.domain != contract.ONNX_DOMAIN for opset in lowered.opset_import)
    (actual,) = _run(lowered, {"x": x})
    expected = contract_rms_norm(x, weight, offset, mode)
    if dtype == "float32":
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    else:
        # Summation order differs between numpy and onnxruntime by an fp32 ulp, which flips a rare rounding to T.
        assert _mismatch_fraction(actual, expected) < 0.01
        np.testing.assert_allclose(actual, expected.astype(np.float32), rtol=1e-2)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_after_cast_and_before_cast_are_told_apart(dtype: str) -> None:
    """Each mode's lowering matches its own definition far better than the other mode's, so a swap is caught."""
    rng = np.random.default_rng(2)
    x = (rng.standard_normal((16, HIDDEN)) * 3).astype(NUMPY_DTYPES[dtype])
    weight = rng.normal(1.0, 0.7, HIDDEN).astype(NUMPY_DTYPES[dtype])
    for mode, other in (
        (WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST),
        (WeightMode.BEFORE_CAST, WeightMode.AFTER_CAST),
    ):
        attributes = _attributes(mode, 0.0, **{contract.ATTR_HIDDEN: HIDDEN})
        model = _fused_model(contract.RMS_NORM_OP, {"x": x}, {"w": weight}, ["y"], attributes, 18)
        (actual,) = _run(lower_fused_nodes(model), {"x": x})
        assert _mismatch_fraction(actual, contract_rms_norm(x, weight, 0.0, mode)) < 0.01
        assert _mismatch_fraction(actual, contract_rms_norm(x, weight, 0.0, other)) > 0.05


@pytest.mark.parametrize("mode", [WeightMode.NONE, WeightMode.AFTER_CAST, WeightMode.BEFORE_CAST])
def test_qk_norm_lowering_normalises_q_and_k_separately(mode: WeightMode) -> None:
    rng = np.random.default_rng(3)
    head = 16
    q = rng.standard_normal((2, 5, 4, head)).astype(np.float16)
    k = (rng.standard_normal((2, 5, 2, head)) * 4).astype(np.float16)
    weights = {}
    if mode != WeightMode.NONE:
        weights = {name: rng.normal(1.0, 0.5, head).astype(np.float16) for name in ("wq", "wk")}
    attributes = _attributes(mode, 1.0, **{contract.ATTR_Q_HIDDEN: head, contract.ATTR_K_HIDDEN: head})
    model = _fused_model(contract.QK_NORM_OP, {"q": q, "k": k}, weights, ["q_out", "k_out"], attributes, 18)
    q_out, k_out = _run(lower_fused_nodes(model), {"q": q, "k": k})
    for actual, source, weight in ((q_out, q, weights.get("wq")), (k_out, k, weights.get("wk"))):
        expected = contract_rms_norm(source, weight, 1.0, mode)
        assert _mismatch_fraction(actual, expected) < 0.01
        np.testing.assert_allclose(actual, expected.astype(np.float32), rtol=1e-2)


def test_unfused_nodes_are_left_alone() -> None:
    x = np.ones((2, HIDDEN), np.float32)
    model = _fused_model(
        contract.RMS_NORM_OP, {"x": x}, {}, ["y"], _attributes(WeightMode.NONE, 0.0, hidden_size=HIDDEN), 18
    )
    lowered = lower_fused_nodes(model)
    assert [node.name for node in lowered.graph.node[:1]] == ["cast_x"]
    assert lowered.graph.node[-1].op_type == "Cast"
    assert model.graph.node[1].op_type == contract.RMS_NORM_OP


def test_missing_attribute_is_reported() -> None:
    x = np.ones((2, HIDDEN), np.float32)
    attributes = _attributes(WeightMode.NONE, 0.0, hidden_size=HIDDEN)
    del attributes[contract.ATTR_EPSILON]
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, {}, ["y"], attributes, 18)
    with pytest.raises(TrtfuseError, match="node 'fused': attribute epsilon is missing"):
        lower_fused_nodes(model)


def test_weight_mode_without_weight_is_reported() -> None:
    x = np.ones((2, HIDDEN), np.float32)
    attributes = _attributes(WeightMode.AFTER_CAST, 0.0, hidden_size=HIDDEN)
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, {}, ["y"], attributes, 18)
    with pytest.raises(TrtfuseError, match=r"with weight_mode AFTER_CAST takes 2 input\(s\) \(x, weight\)"):
        lower_fused_nodes(model)


MIXED_PAIRS = [("float32", "float16"), ("float32", "bfloat16"), ("float16", "float32"), ("bfloat16", "float32")]


@pytest.mark.parametrize(("dtype", "out_dtype"), MIXED_PAIRS)
@pytest.mark.parametrize("weight_dtype", ["float32", "sixteen-bit side"])
@pytest.mark.parametrize(
    ("mode", "offset"), [(WeightMode.NONE, 0.0), (WeightMode.AFTER_CAST, 0.0), (WeightMode.BEFORE_CAST, 1.0)]
)
def test_mixed_precision_lowering_matches_the_contract(
    dtype: str, out_dtype: str, weight_dtype: str, mode: WeightMode, offset: float
) -> None:
    rng = np.random.default_rng(4)
    x = (rng.standard_normal((3, 7, HIDDEN)) * 3).astype(NUMPY_DTYPES[dtype])
    if weight_dtype != "float32":
        weight_dtype = dtype if dtype != "float32" else out_dtype
    weight = None if mode == WeightMode.NONE else rng.normal(1.0, 0.7, HIDDEN).astype(NUMPY_DTYPES[weight_dtype])
    weights = {} if weight is None else {"w": weight}
    attributes = _attributes(
        mode, offset, **{contract.ATTR_HIDDEN: HIDDEN, contract.ATTR_OUTPUT_DTYPE: DTYPES[out_dtype]}
    )
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, weights, ["y"], attributes, 18, out_dtype)
    lowered = lower_fused_nodes(model)
    onnx.checker.check_model(lowered, full_check=True)
    (actual,) = _run(lowered, {"x": x})
    expected = contract_rms_norm(x, weight, offset, mode, out_dtype).astype(np.float32)
    if out_dtype == "float32" and mode != WeightMode.AFTER_CAST:
        np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)
    else:
        assert _mismatch_fraction(actual, expected) < 0.01
        np.testing.assert_allclose(actual, expected, rtol=1e-2)


@pytest.mark.parametrize(("dtype", "out_dtype"), MIXED_PAIRS)
def test_after_cast_rounds_to_the_sixteen_bit_side(dtype: str, out_dtype: str) -> None:
    """fp16 -> fp32 AFTER_CAST rounds x·r to fp16 before the weight (ONNX RMSNormalization), fp32 -> fp16 to fp16:
    the lowering matches that far better than BEFORE_CAST's single rounding, so a rounding to the wrong side is
    caught."""
    rng = np.random.default_rng(5)
    x = (rng.standard_normal((16, HIDDEN)) * 3).astype(NUMPY_DTYPES[dtype])
    weight = rng.normal(1.0, 0.7, HIDDEN).astype(np.float32)
    attributes = _attributes(
        WeightMode.AFTER_CAST, 0.0, **{contract.ATTR_HIDDEN: HIDDEN, contract.ATTR_OUTPUT_DTYPE: DTYPES[out_dtype]}
    )
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, {"w": weight}, ["y"], attributes, 18, out_dtype)
    (actual,) = _run(lower_fused_nodes(model), {"x": x})
    after = contract_rms_norm(x, weight, 0.0, WeightMode.AFTER_CAST, out_dtype)
    before = contract_rms_norm(x, weight, 0.0, WeightMode.BEFORE_CAST, out_dtype)
    assert actual.dtype == np.float32 and _mismatch_fraction(actual, after) < 0.01
    assert _mismatch_fraction(actual, before) > 0.05


def test_qk_norm_lowering_gives_both_outputs_the_output_dtype() -> None:
    rng = np.random.default_rng(6)
    q = rng.standard_normal((2, 5, 4, 16)).astype(np.float32)
    k = (rng.standard_normal((2, 5, 2, 16)) * 4).astype(np.float32)
    weights = {name: rng.normal(1.0, 0.5, 16).astype(np.float16) for name in ("wq", "wk")}
    hidden = {contract.ATTR_Q_HIDDEN: 16, contract.ATTR_K_HIDDEN: 16, contract.ATTR_OUTPUT_DTYPE: TensorProto.FLOAT16}
    attributes = _attributes(WeightMode.AFTER_CAST, 0.0, **hidden)
    model = _fused_model(contract.QK_NORM_OP, {"q": q, "k": k}, weights, ["q_out", "k_out"], attributes, 18, "float16")
    q_out, k_out = _run(lower_fused_nodes(model), {"q": q, "k": k})
    for actual, source, weight in ((q_out, q, weights["wq"]), (k_out, k, weights["wk"])):
        expected = contract_rms_norm(source, weight, 0.0, WeightMode.AFTER_CAST, "float16")
        assert _mismatch_fraction(actual, expected) < 0.01
        assert _mismatch_fraction(actual, source / np.sqrt(np.mean(source**2, -1, keepdims=True))) > 0.5


@pytest.mark.parametrize(
    ("code", "out_dtype", "message"),
    [
        (11, "float16", "attribute output_dtype is 11, none of 1 (float32), 10 (float16), 16 (bfloat16)"),
        (TensorProto.BFLOAT16, "bfloat16", "input dtype float16 and output dtype bfloat16 are two different 16-bit"),
        (TensorProto.FLOAT, "float16", "output 'y' is declared float16, but output_dtype is float32"),
    ],
)
def test_bad_output_dtype_is_reported(code: int, out_dtype: str, message: str) -> None:
    x = np.ones((2, HIDDEN), np.float16)
    attributes = _attributes(WeightMode.NONE, 0.0, hidden_size=HIDDEN, output_dtype=code)
    model = _fused_model(contract.RMS_NORM_OP, {"x": x}, {}, ["y"], attributes, 18, out_dtype)
    with pytest.raises(TrtfuseError) as error:
        lower_fused_nodes(model)
    assert str(error.value).startswith("the fused model: node 'fused': ") and message in str(error.value)


# --- TrtfuseAddRmsNorm: h = D(x + residual), y = the norm of the rounded h ------------------------------------------

SAME_PAIRS = [("float32", "float32"), ("float16", "float16"), ("bfloat16", "bfloat16")]


def contract_add_rms_norm(
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray | None,
    offset: float,
    mode: WeightMode,
    out_dtype: str,
    round_h: bool = True,
) -> tuple[np.ndarray, np.ndarray]:
    """(y, h) by the contract in float64: h is the sum rounded once to D (a float64 sum of two D values rounded to D
    is the correctly rounded sum, which is what fp32-then-D gives too); y is the norm of the rounded h, cast to R
    before an AFTER_CAST weight and to T at the end. `round_h=False` normalises the unrounded sum instead: the
    mistake the lowering must not make."""
    dtype, out = x.dtype, NUMPY_DTYPES[out_dtype]
    rounding = NUMPY_DTYPES[contract.rounding_dtype(_name(dtype), out_dtype)]
    exact = x.astype(np.float64) + residual.astype(np.float64)
    h = exact.astype(dtype)
    h64 = h.astype(np.float64) if round_h else exact
    normalised = h64 / np.sqrt(np.mean(h64 * h64, axis=-1, keepdims=True) + np.float64(np.float32(EPSILON)))
    if mode == WeightMode.NONE:
        return normalised.astype(out), h
    scale = weight.astype(np.float64) + offset
    if mode == WeightMode.AFTER_CAST:
        return (normalised.astype(rounding).astype(np.float64) * scale).astype(out), h
    return (normalised * scale).astype(out), h


def _name(dtype: np.dtype) -> str:
    return next(name for name, numpy_dtype in NUMPY_DTYPES.items() if np.dtype(numpy_dtype) == dtype)


def _add_norm_model(
    x: np.ndarray,
    residual: np.ndarray,
    weight: np.ndarray | None,
    mode: WeightMode,
    offset: float,
    out_dtype: str,
    opset: int = 18,
    h_dtype: str | None = None,
) -> onnx.ModelProto:
    """One TrtfuseAddRmsNorm between fp32 graph inputs and outputs (casts inside, so bf16 runs in onnxruntime): y
    declared in `out_dtype`, h in D (or `h_dtype`, to declare it wrongly)."""
    elem_type = DTYPES[_name(x.dtype)]
    nodes = [
        helper.make_node("Cast", [f"{name}_fp32"], [name], to=elem_type, name=f"cast_{name}") for name in ("x", "r")
    ]
    inputs = ["x", "r"] + (["w"] if weight is not None else [])
    attributes = _attributes(
        mode, offset, **{contract.ATTR_HIDDEN: x.shape[-1], contract.ATTR_OUTPUT_DTYPE: DTYPES[out_dtype]}
    )
    nodes.append(
        helper.make_node(
            contract.ADD_RMS_NORM_OP, inputs, ["y", "h"], name="fused", domain=contract.ONNX_DOMAIN, **attributes
        )
    )
    nodes += [helper.make_node("Cast", [name], [f"{name}_fp32"], to=TensorProto.FLOAT) for name in ("y", "h")]
    shapes = {"x": x.shape, "r": residual.shape}
    graph = helper.make_graph(
        nodes,
        "fused",
        [helper.make_tensor_value_info(f"{name}_fp32", TensorProto.FLOAT, shape) for name, shape in shapes.items()],
        [helper.make_tensor_value_info(f"{name}_fp32", TensorProto.FLOAT, x.shape) for name in ("y", "h")],
        [] if weight is None else [numpy_helper.from_array(weight, "w")],
        value_info=[
            helper.make_tensor_value_info("y", DTYPES[out_dtype], x.shape),
            helper.make_tensor_value_info("h", DTYPES[h_dtype or _name(x.dtype)], x.shape),
        ],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets)


def _add_norm_inputs(dtype: str, weight_dtype: str | None, seed: int) -> tuple[np.ndarray, ...]:
    """x and a residual of a larger scale (as a residual stream is), so the sum rounds in most elements."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((3, 7, HIDDEN)) * 3).astype(NUMPY_DTYPES[dtype])
    residual = (rng.standard_normal((3, 7, HIDDEN)) * 7).astype(NUMPY_DTYPES[dtype])
    weight = None if weight_dtype is None else rng.normal(1.0, 0.7, HIDDEN).astype(NUMPY_DTYPES[weight_dtype])
    return x, residual, weight


# (mode, offset, weight dtype: fp32, or the pair's 16-bit side, or none)
ADD_NORM_MODES = [
    (WeightMode.NONE, 0.0, None),
    (WeightMode.AFTER_CAST, 0.0, "float32"),
    (WeightMode.AFTER_CAST, 0.0, "sixteen-bit side"),
    (WeightMode.BEFORE_CAST, 1.0, "float32"),
    (WeightMode.BEFORE_CAST, 1.0, "sixteen-bit side"),
]


@pytest.mark.parametrize(("dtype", "out_dtype"), SAME_PAIRS + MIXED_PAIRS)
@pytest.mark.parametrize(
    ("mode", "offset", "weight_dtype"), ADD_NORM_MODES, ids=[f"{m.name}-{w}" for m, _, w in ADD_NORM_MODES]
)
def test_add_rms_norm_lowering_matches_the_contract(
    dtype: str, out_dtype: str, mode: WeightMode, offset: float, weight_dtype: str | None
) -> None:
    if weight_dtype == "sixteen-bit side":
        weight_dtype = dtype if dtype != "float32" else out_dtype
    x, residual, weight = _add_norm_inputs(dtype, weight_dtype, seed=7)
    model = _add_norm_model(x, residual, weight, mode, offset, out_dtype)
    lowered = lower_fused_nodes(model)
    onnx.checker.check_model(lowered, full_check=True)
    assert all(node.domain != contract.ONNX_DOMAIN for node in lowered.graph.node)
    actual_y, actual_h = _run(lowered, {"x": x, "r": residual})
    expected_y, expected_h = contract_add_rms_norm(x, residual, weight, offset, mode, out_dtype)
    # h is one rounding of an exact sum: bit for bit.
    np.testing.assert_array_equal(actual_h, expected_h.astype(np.float32))
    expected_y = expected_y.astype(np.float32)
    sixteen_bit_rounding = contract.rounding_dtype(dtype, out_dtype) != "float32" and mode == WeightMode.AFTER_CAST
    if out_dtype == "float32" and not sixteen_bit_rounding:
        np.testing.assert_allclose(actual_y, expected_y, rtol=1e-5, atol=1e-6)
    else:
        # fp32 arithmetic against float64 flips a rare rounding to a 16-bit dtype.
        assert _mismatch_fraction(actual_y, expected_y) < 0.01
        np.testing.assert_allclose(actual_y, expected_y, rtol=1e-2)


@pytest.mark.parametrize("opset", [17, 18])
def test_add_rms_norm_lowering_in_both_reduce_mean_forms(opset: int) -> None:
    x, residual, weight = _add_norm_inputs("float16", "float16", seed=8)
    model = _add_norm_model(x, residual, weight, WeightMode.AFTER_CAST, 0.0, "float16", opset)
    actual_y, actual_h = _run(lower_fused_nodes(model), {"x": x, "r": residual})
    expected_y, expected_h = contract_add_rms_norm(x, residual, weight, 0.0, WeightMode.AFTER_CAST, "float16")
    np.testing.assert_array_equal(actual_h, expected_h.astype(np.float32))
    assert _mismatch_fraction(actual_y, expected_y) < 0.01


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_add_rms_norm_normalises_the_rounded_sum(dtype: str) -> None:
    """r and the normalised value come from h as rounded to D, not from the fp32 sum: the lowering matches the
    contract far better than the unrounded variant, so normalising the wrong value is caught."""
    x, residual, _ = _add_norm_inputs(dtype, None, seed=9)
    model = _add_norm_model(x, residual, None, WeightMode.NONE, 0.0, "float32")
    actual_y, _ = _run(lower_fused_nodes(model), {"x": x, "r": residual})
    rounded, _ = contract_add_rms_norm(x, residual, None, 0.0, WeightMode.NONE, "float32")
    unrounded, _ = contract_add_rms_norm(x, residual, None, 0.0, WeightMode.NONE, "float32", round_h=False)
    np.testing.assert_allclose(actual_y, rounded, rtol=1e-5, atol=1e-6)
    assert _mismatch_fraction(actual_y, unrounded) > 0.5


def test_add_rms_norm_h_is_the_correctly_rounded_sum_where_fp32_is_not_exact() -> None:
    """bf16 values far apart in magnitude: their fp32 sum is rounded, and the second rounding to bf16 still gives the
    correctly rounded sum (fp32 holds more than twice bf16's precision)."""
    x = np.array([[1.0, 256.0, 3.0e4, -7.5, 1e-3, 65504.0, 1.0, -1.0]], dtype=ml_dtypes.bfloat16)
    residual = np.array([[2.0**-9, 0.75, 0.5, 2.0**-30, 5.0, 3.0, -(2.0**-8), 2.0**-8 + 2.0**-16]])
    residual = residual.astype(ml_dtypes.bfloat16)
    in_fp32 = x.astype(np.float32) + residual.astype(np.float32)
    assert (in_fp32.astype(np.float64) != x.astype(np.float64) + residual.astype(np.float64)).any()
    model = _add_norm_model(x, residual, None, WeightMode.NONE, 0.0, "bfloat16")
    _, actual_h = _run(lower_fused_nodes(model), {"x": x, "r": residual})
    _, expected_h = contract_add_rms_norm(x, residual, None, 0.0, WeightMode.NONE, "bfloat16")
    np.testing.assert_array_equal(actual_h, expected_h.astype(np.float32))


ADD_NORM_BAD = {
    "residual of another shape": (
        {"residual_shape": (3, 1, HIDDEN)},
        "inputs 'x' [3, 7, 64] and 'r' [3, 1, 64] must have one shape (no broadcasting)",
    ),
    "residual of another rank": (
        {"residual_shape": (7, HIDDEN)},
        "inputs 'x' [3, 7, 64] and 'r' [7, 64] must have one shape (no broadcasting)",
    ),
    "h declared in output_dtype": ({"h_dtype": "float16"}, "output 'h' is declared float16, but its activations'"),
    "residual of another dtype": ({"residual_dtype": "float16"}, "its activations must share one dtype, got 'x'"),
}


@pytest.mark.parametrize("case", ADD_NORM_BAD, ids=list(ADD_NORM_BAD))
def test_a_bad_add_norm_node_is_one_line_naming_it(case: str) -> None:
    changes, message = ADD_NORM_BAD[case]
    x, residual, weight = _add_norm_inputs("float32", "float32", seed=10)
    residual = np.zeros(changes.get("residual_shape", residual.shape), np.float32)
    model = _add_norm_model(x, residual, weight, WeightMode.AFTER_CAST, 0.0, "float16", h_dtype=changes.get("h_dtype"))
    if "residual_dtype" in changes:
        cast_r = next(node for node in model.graph.node if node.name == "cast_r")
        cast_r.attribute[0].i = DTYPES[changes["residual_dtype"]]
    with pytest.raises(TrtfuseError) as error:
        lower_fused_nodes(model)
    text = str(error.value)
    assert text.startswith("the fused model: node 'fused': ") and message in text and "\n" not in text, text
