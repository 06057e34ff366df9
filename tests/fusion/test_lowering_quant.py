"""The lowering of the quantized ops (docs/plugin-nodes.md, "Quantization") run in onnxruntime equals the contract's
reference (trtfuse/bench/reference.py) bit for bit: every stage, both quantized dtypes, both saturate settings, the
input dtypes onnxruntime's CPU provider runs, both ops. The reference is itself checked against onnxruntime's
QuantizeLinear (tests/bench/test_quant_reference.py), so this is the lowered graph against what the original graph
computes, with the norm values equal (float64 in the reference, float32 in the lowering: the norms' inputs are drawn
so that the two round alike; a flip is reported with its values). onnxruntime's QuantizeLinear gives the same values
read in float32 (the lowering) as in fp16 (the graph), and on the ModelOpt FP8 fixture the lowered fused model with
its quantizers taken in computes what it computes without them, bit for bit."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.bench.reference import add_norm_reference, norm_reference
from trtfuse.contract import NormParams, Quantizer, QuantParams, WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.feeds import default_feeds
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file
from trtfuse.verify.onnxrt import lowered_session

from support.paths import TOOL_FIXTURES

HIDDEN = 64
ROWS = 96
ELEM = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, **contract.QUANT_DTYPE_CODES}
EPSILON = float(np.float32(1e-6))


def _model(fields: NodeFields, dtype: str, opset: int = 19) -> onnx.ModelProto:
    op = fields.op
    activations = list(op.activations)
    y_type = ELEM[fields.normalised_dtype(0)]
    outputs = [helper.make_tensor_value_info("y", y_type, [ROWS, HIDDEN])]
    if len(op.outputs) == 2:
        outputs.append(helper.make_tensor_value_info("h", ELEM[dtype], [ROWS, HIDDEN]))
    rng = np.random.default_rng(1)
    weight = numpy_helper.from_array((1 + 0.1 * rng.standard_normal(HIDDEN)).astype(dtype), "weight")
    node = helper.make_node(
        op.name,
        [*activations, "weight"],
        [output.name for output in outputs],
        name="norm",
        domain=contract.ONNX_DOMAIN,
        **fields.onnx_attributes(),
    )
    graph = helper.make_graph(
        [node],
        "quantized",
        [helper.make_tensor_value_info(name, ELEM[dtype], [ROWS, HIDDEN]) for name in activations],
        outputs,
        [weight],
    )
    opsets = [helper.make_opsetid("", opset), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    lowered = lower_fused_nodes(model)
    session = ort.InferenceSession(lowered.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _bits(values: torch.Tensor | np.ndarray) -> np.ndarray:
    if isinstance(values, torch.Tensor):
        values = values.view(torch.uint8) if values.dtype == torch.float8_e4m3fn else values
        return values.numpy().view(np.uint8)
    return np.ascontiguousarray(values).view(np.uint8)


STAGE_CASES = {
    "output fp8": QuantParams(output=Quantizer("float8_e4m3fn", 0.0078125)),
    "output fp8 unsaturated": QuantParams(output=Quantizer("float8_e4m3fn", 0.0029296875, saturate=False)),
    "output int8": QuantParams(output=Quantizer("int8", 0.02880859375)),
    "input int8 + output fp8": QuantParams(
        input=Quantizer("int8", 0.0277099609375, True, "float16"), output=Quantizer("float8_e4m3fn", 0.01)
    ),
    "input fp8 in float32": QuantParams(input=Quantizer("float8_e4m3fn", 0.0125, True, "float32")),
    "rsqrt int8": QuantParams(rsqrt=Quantizer("int8", 0.0107421875, True, "float16")),
    "rsqrt int8 of a float16 r + output int8": QuantParams(
        rsqrt=Quantizer("int8", 0.0107421875, True, "float16", "float16"), output=Quantizer("int8", 0.02880859375)
    ),
}


@pytest.mark.parametrize("case", sorted(STAGE_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("op", [contract.RMS_NORM_QUANT, contract.ADD_RMS_NORM_QUANT], ids=lambda op: op.name)
@pytest.mark.parametrize("opset", [19, 23])
def test_the_lowered_quantized_node_is_the_contract_bit_for_bit(
    case: str, dtype: str, op: contract.FusedOp, opset: int
) -> None:
    # At opset 23 a QuantizeLinear divides in its scale's dtype: the lowering's read a float32 value with a float32
    # scale, so they divide in float32 at every opset, as the contract says.
    quant = STAGE_CASES[case]
    params = NormParams(EPSILON, 0.0, WeightMode.AFTER_CAST)
    fields = NodeFields(op, params, (HIDDEN,), dtype, quant)
    model = _model(fields, dtype, opset)
    rng = np.random.default_rng(0)
    feed = {name: rng.standard_normal((ROWS, HIDDEN)).astype(dtype) for name in op.activations}
    got = _run(model, feed)
    weight = torch.from_numpy(numpy_helper.to_array(model.graph.initializer[0]).copy())
    tensors = [torch.from_numpy(feed[name]) for name in op.activations]
    if op is contract.ADD_RMS_NORM_QUANT:
        want, h = add_norm_reference(*tensors, weight, params, dtype, quant)
        assert got[1].tobytes() == h.numpy().tobytes()
    else:
        want = norm_reference(*tensors, weight, params, dtype, quant)
    assert got[0].dtype.itemsize == want.element_size()
    if quant.output is None:
        np.testing.assert_allclose(got[0], want.numpy(), rtol=2e-6 if dtype == "float32" else 1e-3, atol=1e-6)
        return
    differ = _bits(got[0]) != _bits(want)
    if not quant.output.saturate:
        # onnxruntime 1.32 gives ±448 for |y/s| in [480, 496) without saturation, where ONNX defines NaN (the
        # reference is ONNX's: tests/bench/test_quant_reference.py).
        plain = norm_reference(*_normalised_input(op, tensors), weight, params, dtype).float() / quant.output.scale
        differ &= ~((plain.abs() >= 480) & (plain.abs() < 496)).numpy()
    if quant.rsqrt is not None or dtype == "float32":
        # The reference's float64 norm and the lowering's float32 one round to different float32 values now and
        # then; a quantized value flips only where that lands on a quantizer's tie.
        assert differ.mean() < 1e-3, differ.sum()
    else:
        assert not differ.any(), np.flatnonzero(differ)[:5]


def _normalised_input(op: contract.FusedOp, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    if op is contract.ADD_RMS_NORM_QUANT:
        return [(tensors[0].float() + tensors[1].float()).to(tensors[0].dtype)]
    return tensors


QK_CASES = {
    "q fp8, k int8": QuantParams(
        q_output=Quantizer("float8_e4m3fn", 0.0078125), k_output=Quantizer("int8", 0.02880859375)
    ),
    "k int8 alone": QuantParams(k_output=Quantizer("int8", 0.0251464843750)),
}


def _qk_model(fields: NodeFields, dtype: str, q_hidden: int, k_hidden: int) -> onnx.ModelProto:
    rng = np.random.default_rng(2)
    weights = [
        numpy_helper.from_array((1 + 0.1 * rng.standard_normal(width)).astype(dtype), name)
        for name, width in (("q_weight", q_hidden), ("k_weight", k_hidden))
    ]
    widths = (q_hidden, k_hidden)
    outputs = [
        helper.make_tensor_value_info(name, ELEM[fields.normalised_dtype(index)], [ROWS, widths[index]])
        for index, name in enumerate(("q_out", "k_out"))
    ]
    node = helper.make_node(
        contract.QK_NORM_QUANT_OP,
        ["q", "k", "q_weight", "k_weight"],
        ["q_out", "k_out"],
        name="qk_norm",
        domain=contract.ONNX_DOMAIN,
        **fields.onnx_attributes(),
    )
    inputs = [
        helper.make_tensor_value_info(name, ELEM[dtype], [ROWS, width])
        for name, width in zip("qk", widths, strict=True)
    ]
    graph = helper.make_graph([node], "quantized_qk", inputs, outputs, weights)
    opsets = [helper.make_opsetid("", 19), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=9)


@pytest.mark.parametrize("case", sorted(QK_CASES))
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_lowered_quantized_qk_norm_quantizes_each_output_at_its_own_scale(case: str, dtype: str) -> None:
    """q and k of different widths (DeepSeek-V3's latents), each output by its own quantizer or none: each equals
    the contract's reference of its own norm."""
    quant, widths = QK_CASES[case], (48, 32)
    params = NormParams(EPSILON, 0.0, WeightMode.AFTER_CAST)
    fields = NodeFields(contract.QK_NORM_QUANT, params, widths, dtype, quant)
    model = _qk_model(fields, dtype, *widths)
    rng = np.random.default_rng(0)
    feed = {name: rng.standard_normal((ROWS, width)).astype(dtype) for name, width in zip("qk", widths, strict=True)}
    got = _run(model, feed)
    for part, name in enumerate("qk"):
        weight = torch.from_numpy(numpy_helper.to_array(model.graph.initializer[part]).copy())
        want = norm_reference(torch.from_numpy(feed[name]), weight, params, dtype, fields.part_quant(part))
        assert got[part].dtype.itemsize == want.element_size()
        if fields.part_quant(part) is None:
            np.testing.assert_allclose(got[part], want.numpy(), rtol=2e-6 if dtype == "float32" else 1e-3, atol=1e-6)
            continue
        differ = _bits(got[part]) != _bits(want)
        # As above: the float64 and float32 norms round apart now and then, onto a quantizer's tie at most.
        assert differ.mean() < 1e-3 if dtype == "float32" else not differ.any(), np.flatnonzero(differ)[:5]


def test_the_output_stage_writes_the_quantized_dtype_and_keeps_the_plain_nodes_alone() -> None:
    quant = QuantParams(output=Quantizer("float8_e4m3fn", 0.5))
    fields = NodeFields(
        contract.RMS_NORM_QUANT, NormParams(EPSILON, 0.0, WeightMode.AFTER_CAST), (HIDDEN,), "float16", quant
    )
    lowered = lower_fused_nodes(_model(fields, "float16"))
    quantizers = [node for node in lowered.graph.node if node.op_type == "QuantizeLinear"]
    assert [node.output[0] for node in quantizers] == ["y"]
    assert helper.get_attribute_value(quantizers[0].attribute[0]) == 1
    assert not [node for node in lowered.graph.node if node.domain == contract.ONNX_DOMAIN]


def test_a_declared_output_type_other_than_the_quantized_dtype_is_one_line() -> None:
    quant = QuantParams(output=Quantizer("int8", 0.5))
    fields = NodeFields(
        contract.RMS_NORM_QUANT, NormParams(EPSILON, 0.0, WeightMode.AFTER_CAST), (HIDDEN,), "float16", quant
    )
    model = _model(fields, "float16")
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT16
    with pytest.raises(TrtfuseError, match=r"output 'y' is declared float16, but output_quant_dtype is int8$"):
        lower_fused_nodes(model)


def _quantize_linear(values: np.ndarray, scale: np.ndarray, dtype: str) -> np.ndarray:
    elem = helper.np_dtype_to_tensor_dtype(values.dtype)
    code = contract.QUANT_DTYPE_CODES[dtype]
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"])
    graph = helper.make_graph(
        [node],
        "quantize",
        [helper.make_tensor_value_info("x", elem, [values.size])],
        [helper.make_tensor_value_info("q", code, [values.size])],
        [numpy_helper.from_array(scale, "scale"), helper.make_tensor("zero_point", code, [], [0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return _bits(session.run(None, {"x": values})[0])


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "int8"])
def test_onnxruntime_quantizes_every_fp16_value_read_as_float32_as_it_does_read_as_fp16(dtype: str) -> None:
    # The graph's QuantizeLinear reads the norm's fp16 value and an fp16 scale, the lowering's their float32
    # widenings: the same quantized values, for every finite fp16 and the scales of the ModelOpt FP8 fixture.
    values = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16)
    values = values[np.isfinite(values)]
    for scale in (0.1016845703125, 0.0019969940185546875, 0.0931396484375):
        graph = _quantize_linear(values, np.array(scale, dtype=np.float16), dtype)
        lowered = _quantize_linear(values.astype(np.float32), np.array(scale, dtype=np.float32), dtype)
        assert np.array_equal(graph, lowered), scale


def test_taking_the_fp8_fixtures_quantizers_in_changes_no_value(tmp_path) -> None:
    # What the lowered fused model computes differently from the original is the norm's rounding (float32 inside,
    # where the original rounds every op to fp16), not the quantizers: with and without them taken in
    # (--no-fuse-quant), every output is the same bit for bit.
    original = TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"
    taken_in = fuse_file(original, tmp_path / "taken-in.onnx").output_path
    kept_out = fuse_file(original, tmp_path / "kept-out.onnx", fusion=FusionOptions(fuse_quant=False)).output_path
    models = [load_model(path) for path in (taken_in, kept_out)]
    assert sum(
        node.domain == contract.ONNX_DOMAIN and node.op_type.endswith("Quant") for node in models[0].model.graph.node
    )
    for step in default_feeds(load_model(original).model, seed=0):
        outputs = []
        for model in models:
            with lowered_session(model, evaluator=False) as session:
                outputs.append(session.run(step.feed))
        assert outputs[0].keys() == outputs[1].keys()
        for name, value in outputs[0].items():
            assert value.tobytes() == outputs[1][name].tobytes(), (step.step, name)
