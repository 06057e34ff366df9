"""The nudged original (`verify.quantizer_flips`): every QuantizeLinear on a computed value reads it times
1 + d x rtol, rtol that of the dtype which computed it; d = 0 is the original bit for bit, d = +-1 moves exactly the
quantized values within rtol of a rounding boundary, by one step; quantizers of constants are left alone."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from trtfuse.model.onnx_file import load_model
from trtfuse.verify.quantizer_flips import NUDGE_INPUT, activation_quantizers, nudged_model

from support.paths import TOOL_FIXTURES

FP8 = TensorProto.FLOAT8E4M3FN


def _quantized(cast_to_float32: bool = False) -> onnx.ModelProto:
    """y = DQ(Q(x)) in FP8 with scale 1 for an fp16 x (read through a Cast to float32 where asked), and a weight
    quantized by a Q of a Cast of a constant."""
    scale_type = TensorProto.FLOAT if cast_to_float32 else TensorProto.FLOAT16
    nodes = [
        helper.make_node("Cast", ["x"], ["x32"], to=TensorProto.FLOAT) if cast_to_float32 else None,
        helper.make_node("QuantizeLinear", ["x32" if cast_to_float32 else "x", "scale", "zero"], ["q"]),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["y"]),
        helper.make_node("Cast", ["weight"], ["weight16"], to=TensorProto.FLOAT16),
        helper.make_node("QuantizeLinear", ["weight16", "weight_scale", "zero"], ["weight_q"]),
        helper.make_node("DequantizeLinear", ["weight_q", "weight_scale", "zero"], ["weight_y"]),
    ]
    graph = helper.make_graph(
        [node for node in nodes if node is not None],
        "quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [None])],
        [
            helper.make_tensor_value_info("y", scale_type, [None]),
            helper.make_tensor_value_info("weight_y", TensorProto.FLOAT16, [4]),
        ],
        [
            numpy_helper.from_array(np.array(1.0, dtype=helper.tensor_dtype_to_np_dtype(scale_type)), "scale"),
            numpy_helper.from_array(np.array(1.0, dtype=np.float16), "weight_scale"),
            helper.make_tensor("zero", FP8, [], [0]),
            numpy_helper.from_array(np.linspace(1, 2, 4, dtype=np.float32), "weight"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)


def _run(model: onnx.ModelProto, x: np.ndarray, direction: float | None = None) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    feed = {"x": x} if direction is None else {"x": x, NUDGE_INPUT: np.array(direction, dtype=np.float32)}
    return session.run(None, feed)


def test_d_0_is_the_original_and_plus_minus_1_flip_the_values_within_rtol_of_a_boundary() -> None:
    # FP8 E4M3 steps by 1 between 8 and 16: 9.5 rounds to 10 (half to even), and fp16's rtol 2e-3 nudges by 2^-9.
    x = np.array([9.49, 9.3, 9.51, 9.7, 12.0], dtype=np.float16)
    original = _quantized()
    nudged = nudged_model(original)
    assert nudged is not None
    assert [value.name for value in nudged.graph.input] == ["x", NUDGE_INPUT]
    expected = _run(original, x)
    for got, want in zip(_run(nudged, x, 0.0), expected, strict=True):
        assert np.array_equal(got.view(np.uint16), want.view(np.uint16))
    up, weight_up = _run(nudged, x, 1.0)
    down, weight_down = _run(nudged, x, -1.0)
    assert up.tolist() == [10.0, 9.0, 10.0, 10.0, 12.0]
    assert down.tolist() == [9.0, 9.0, 9.0, 10.0, 12.0]
    # The weight's quantizer reads a constant: no nudge moves it.
    assert np.array_equal(weight_up, expected[1]) and np.array_equal(weight_down, expected[1])


def test_a_float32_quantizer_input_cast_from_float16_is_nudged_by_float16s_rtol() -> None:
    nudged = nudged_model(_quantized(cast_to_float32=True))
    assert nudged is not None
    rtol = next(tensor for tensor in nudged.graph.initializer if tensor.name.endswith("/rtol"))
    assert rtol.name == f"{NUDGE_INPUT}/float16_as_float32/rtol"
    assert numpy_helper.to_array(rtol) == np.float32(2e-3)
    up, _ = _run(nudged, np.array([9.49, 9.3], dtype=np.float16), 1.0)
    assert up.tolist() == [10.0, 9.0]


def test_only_quantizers_of_computed_values_are_nudged_and_a_graph_without_any_is_left_alone() -> None:
    model = load_model(TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx").model
    constant = {tensor.name for tensor in model.graph.initializer}
    quantizers = [node for node in model.graph.node if node.op_type == "QuantizeLinear"]
    activations = [model.graph.node[index] for index in activation_quantizers(model)]
    assert activations and len(activations) < len(quantizers)
    assert all(node.input[0] in constant for node in quantizers if node not in activations)
    nudged = nudged_model(model)
    assert nudged is not None
    nudged_inputs = {node.input[0] for node in nudged.graph.node if node.op_type == "QuantizeLinear"}
    assert {f"{node.input[0]}/nudged" for node in activations} <= nudged_inputs
    assert nudged_model(load_model(TOOL_FIXTURES / "qwen3-optimum-fp16.onnx").model) is None
