"""The quantizers' reference (trtfuse/bench/reference.py) against onnxruntime's QuantizeLinear and DequantizeLinear,
bit for bit, on every input dtype onnxruntime's CPU provider runs (float32, float16), both quantized dtypes and both
`saturate` settings: the reference is what every kernel and plugin is checked against, so it must be what the
original graph computes. Values cover rounding ties of both formats, their neighbours, the ranges' edges, zeros,
infinities and NaN."""

from __future__ import annotations

import math

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from trtfuse.bench.reference import (
    dequantize_reference,
    fake_quant_reference,
    float32_inverse_root,
    norm_reference,
    quantize_reference,
)
from trtfuse.contract import NormParams, Quantizer, QuantParams, WeightMode

QUANT_TYPES = {"float8_e4m3fn": TensorProto.FLOAT8E4M3FN, "int8": TensorProto.INT8}
FLOAT_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}
SCALES = (1.0, 0.02882, 0.000955, 3.7)


def _scale_tensor(name: str, value: float, dtype: str) -> object:
    return numpy_helper.from_array(np.array(value, dtype=dtype), name)


def _quantize_model(in_dtype: str, quant_dtype: str, scale: float, saturate: int | None) -> bytes:
    attributes = {} if saturate is None else {"saturate": saturate}
    node = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], **attributes)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", FLOAT_TYPES[in_dtype], [None])],
        [helper.make_tensor_value_info("y", QUANT_TYPES[quant_dtype], [None])],
        [_scale_tensor("s", scale, in_dtype), helper.make_tensor("zp", QUANT_TYPES[quant_dtype], [], [0])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)], ir_version=9).SerializeToString()


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def _hard_values() -> np.ndarray:
    rng = np.random.default_rng(0)
    spread = rng.standard_normal(20000).astype(np.float32) * np.float32(10.0) ** rng.uniform(-4, 3, 20000).astype(
        np.float32
    )
    grid = np.arange(-600, 600, 0.25, dtype=np.float32)
    fp8 = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
    fp8 = np.unique(fp8[np.isfinite(fp8)]).astype(np.float64)
    ties = ((fp8[1:] + fp8[:-1]) / 2).astype(np.float32)  # E4M3FN's rounding ties
    halves = np.arange(-140, 140, dtype=np.float32) + np.float32(0.5)  # INT8's
    edges = np.array([448, 464, 480, 496, 512, 1e30, np.inf, -np.inf, 0.0, -0.0, 2**-10, 2**-9], np.float32)
    values = np.concatenate([spread, grid, ties, halves, edges, -edges])
    return np.concatenate([values, np.nextafter(values, np.inf), np.nextafter(values, -np.inf)]).astype(np.float32)


def _bits(values: torch.Tensor) -> np.ndarray:
    return values.view(torch.uint8).numpy() if values.dtype == torch.float8_e4m3fn else values.numpy()


# `saturate` is float8's attribute: INT8 always saturates.
QUANTIZE_CASES = [("float8_e4m3fn", None), ("float8_e4m3fn", 1), ("float8_e4m3fn", 0), ("int8", None), ("int8", 1)]


@pytest.mark.parametrize("in_dtype", sorted(FLOAT_TYPES))
@pytest.mark.parametrize(("quant_dtype", "saturate"), QUANTIZE_CASES)
def test_quantize_equals_onnxruntime_bit_for_bit(in_dtype: str, quant_dtype: str, saturate: int | None) -> None:
    values = _hard_values()
    if in_dtype == "float16":
        values = values[~(np.abs(values) > 65504) | ~np.isfinite(values)].astype(np.float16)
    if quant_dtype == "int8":
        values = values[~np.isnan(values)]
    for scale in SCALES:
        scale = float(np.array(scale, dtype=in_dtype))
        quantizer = Quantizer(quant_dtype, scale, saturate != 0)
        got = _ort(_quantize_model(in_dtype, quant_dtype, scale, saturate), values)
        want = _bits(quantize_reference(torch.from_numpy(values), quantizer))
        got = got.view(np.uint8) if quant_dtype == "float8_e4m3fn" else got
        differ = got != want
        if quant_dtype == "float8_e4m3fn" and saturate == 0:
            # onnxruntime 1.32 gives ±448 for |v/s| in [480, 496) without saturation; ONNX defines NaN there.
            with np.errstate(over="ignore"):
                scaled = np.abs(values.astype(np.float32) / np.float32(scale))
            quirk = (scaled >= 480) & (scaled < 496)
            assert np.all((got[quirk] & 0x7F) == 0x7E) and np.all((want[quirk] & 0x7F) == 0x7F)
            differ &= ~quirk
        assert not differ.any(), (scale, values[differ][:5], got[differ][:5], want[differ][:5])


def test_float8_without_saturation_is_onnx_s_definition() -> None:
    """ONNX's reference evaluator: NaN past 464 (the tie above 448 rounds down to 448's even mantissa)."""
    values = np.array([448, 464, 464.00003, 480, 490, 500, np.inf, -np.inf, -464.00003, np.nan], np.float32)
    node = helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"], saturate=0)
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT8E4M3FN, [None])],
        [_scale_tensor("s", 1.0, "float32"), helper.make_tensor("zp", TensorProto.FLOAT8E4M3FN, [], [0])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    want = np.asarray(ReferenceEvaluator(model).run(None, {"x": values})[0]).view(np.uint8)
    got = _bits(quantize_reference(torch.from_numpy(values), Quantizer("float8_e4m3fn", 1.0, saturate=False)))
    assert got.tolist() == want.tolist() == [0x7E, 0x7E, 0x7F, 0x7F, 0x7F, 0x7F, 0x7F, 0xFF, 0xFF, 0x7F]


def test_int8_nan_is_minus_128_as_onnxruntime_gives_it() -> None:
    values = np.array([np.nan, np.inf, -np.inf, 127.5, -128.5, 126.5, -0.5, 0.5, 1.5, 2.5], np.float32)
    got = _ort(_quantize_model("float32", "int8", 1.0, None), values)
    want = quantize_reference(torch.from_numpy(values), Quantizer("int8", 1.0)).numpy()
    assert got.tolist() == want.tolist() == [-128, 127, -128, 127, -128, 126, 0, 0, 2, 2]


@pytest.mark.parametrize("dequant_dtype", sorted(FLOAT_TYPES))
@pytest.mark.parametrize("quant_dtype", sorted(QUANT_TYPES))
def test_dequantize_is_the_float32_product_rounded_once(dequant_dtype: str, quant_dtype: str) -> None:
    """onnxruntime's DequantizeLinear, fed every value of the quantized dtype through an exact QuantizeLinear."""
    if quant_dtype == "int8":
        codes = np.arange(-128, 128).astype(np.float32)
    else:
        codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn).float().numpy()
        codes = codes[np.isfinite(codes)]
    for scale in SCALES:
        scale = float(np.array(scale, dtype=dequant_dtype))
        nodes = [
            helper.make_node("QuantizeLinear", ["x", "one", "zp"], ["q"]),
            helper.make_node("DequantizeLinear", ["q", "s", "zp"], ["y"]),
        ]
        graph = helper.make_graph(
            nodes,
            "qdq",
            [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None])],
            [helper.make_tensor_value_info("y", FLOAT_TYPES[dequant_dtype], [None])],
            [
                _scale_tensor("one", 1.0, "float32"),
                _scale_tensor("s", scale, dequant_dtype),
                helper.make_tensor("zp", QUANT_TYPES[quant_dtype], [], [0]),
            ],
        )
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
        got = _ort(model.SerializeToString(), codes)
        quantizer = Quantizer(quant_dtype, scale, True, dequant_dtype)
        quantized = quantize_reference(torch.from_numpy(codes), Quantizer(quant_dtype, 1.0))
        want = dequantize_reference(quantized, quantizer).numpy()
        assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
        assert fake_quant_reference(
            torch.from_numpy(codes * np.float32(scale)), quantizer
        ).dtype == quantized.dtype or (dequant_dtype in ("float32", "float16"))


def test_the_norm_reference_applies_each_stage_where_the_contract_puts_it() -> None:
    x = torch.randn(4, 64, dtype=torch.float16)
    weight = torch.randn(64, dtype=torch.float16)
    params = NormParams(float(np.float32(1e-6)), 0.0, WeightMode.AFTER_CAST)
    plain = norm_reference(x, weight, params)
    out = Quantizer("float8_e4m3fn", 0.0625)
    quantized = norm_reference(x, weight, params, quant=QuantParams(output=out))
    assert quantized.dtype == torch.float8_e4m3fn
    assert torch.equal(quantized.view(torch.uint8), quantize_reference(plain, out).view(torch.uint8))
    fake = Quantizer("int8", 0.01, True, "float16")
    from_fake = norm_reference(x, weight, params, quant=QuantParams(input=fake))
    assert torch.equal(from_fake, norm_reference(fake_quant_reference(x, fake), weight, params))
    assert not torch.equal(from_fake, plain)


@pytest.mark.parametrize(("quant_dtype", "saturate"), [("int8", None), ("float8_e4m3fn", 1), ("float8_e4m3fn", 0)])
def test_a_quantizer_with_a_16_bit_input_dtype_reads_its_value_rounded_to_it(
    quant_dtype: str, saturate: int | None
) -> None:
    """The rsqrt stage of a graph that casts r to float16 first: onnxruntime's Cast(float16) -> QuantizeLinear of
    float32 values is the reference's Q with input dtype float16, bit for bit (and not the Q of the float32 values)."""
    values = _hard_values()
    values = values[np.isfinite(values) & (np.abs(values) < 65504)]
    for scale in SCALES:
        scale = float(np.float16(scale))
        model = _quantize_model("float16", quant_dtype, scale, saturate)
        cast = onnx.load_from_string(model)
        cast.graph.node.insert(0, helper.make_node("Cast", ["x32"], ["x"], to=TensorProto.FLOAT16))
        cast.graph.input[0].CopyFrom(helper.make_tensor_value_info("x32", TensorProto.FLOAT, [None]))
        session = ort.InferenceSession(cast.SerializeToString(), providers=["CPUExecutionProvider"])
        got = session.run(None, {"x32": values})[0]
        got = got.view(np.uint8) if quant_dtype == "float8_e4m3fn" else got
        quantizer = Quantizer(quant_dtype, scale, saturate != 0, "float32", "float16")
        want = _bits(quantize_reference(torch.from_numpy(values), quantizer))
        keep = np.ones(len(values), dtype=bool)
        if quant_dtype == "float8_e4m3fn" and saturate == 0:
            # onnxruntime's quirk of `test_quantize_equals_onnxruntime_bit_for_bit`, on the float16 values.
            with np.errstate(over="ignore"):
                scaled = np.abs(values.astype(np.float16).astype(np.float32) / np.float32(scale))
            keep = ~((scaled >= 480) & (scaled < 496))
        assert np.array_equal(got[keep], want[keep]), scale
        unrounded = _bits(quantize_reference(torch.from_numpy(values), Quantizer(quant_dtype, scale, saturate != 0)))
        assert not np.array_equal(got[keep], unrounded[keep])


def test_the_rsqrt_stage_reads_the_ieee_float32_root_and_reciprocal() -> None:
    """r for the rsqrt stage is the graph's float32 Add, Sqrt and Reciprocal of the mean rounded to float32 (numpy's
    float32 operations are IEEE), not the float64 root rounded once (an ulp away now and then, enough for a step)."""
    mean_square = torch.rand(200_000, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * 20
    r = float32_inverse_root(mean_square, float(np.float32(1e-6))).numpy()
    variance = mean_square.float().numpy() + np.float32(1e-6)
    # The IEEE float32 Sqrt and Reciprocal from Python's correctly rounded float64 ones, each rounded to float32
    # (exact: float64 has more than twice float32's precision), independent of any vector library's code path.
    roots = [np.float32(math.sqrt(float(v))) for v in variance.ravel()]
    ieee = np.array([np.float32(1.0 / float(root)) for root in roots], dtype=np.float32).reshape(r.shape)
    assert r.dtype == np.float32 and r.tobytes() == ieee.tobytes()
    assert not np.array_equal(r, (mean_square + float(np.float32(1e-6))).rsqrt().float().numpy())
    x = torch.randn(4, 64, dtype=torch.float16)
    params = NormParams(float(np.float32(1e-6)), 0.0, WeightMode.NONE)
    quantizer = Quantizer("int8", 0.01, True, "float32", "float16")
    rounded = norm_reference(x, None, params, "float32", QuantParams(rsqrt=quantizer))
    mean = x.double().pow(2).mean(dim=-1, keepdim=True)
    inverse = fake_quant_reference(float32_inverse_root(mean, params.epsilon), quantizer).double()
    assert torch.equal(rounded, (x.double() * inverse).float())
