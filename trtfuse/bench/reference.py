"""The contract's semantics (trtfuse/contract.py, WeightMode, the quantizers) in torch: the one reference every
harness and GPU test checks the kernels and plugins against. The norm is computed in float64; a quantizer's
arithmetic is float32, as the contract defines it (docs/plugin-nodes.md, "Quantization")."""

from __future__ import annotations

import torch

from trtfuse.contract import (
    FLOAT8E4M3FN_MAX,
    INT8_RANGE,
    NormParams,
    Quantizer,
    QuantParams,
    WeightMode,
    rounding_dtype,
)

# The torch dtype each quantized dtype is stored in.
QUANT_TORCH_DTYPES = {"float8_e4m3fn": torch.float8_e4m3fn, "int8": torch.int8}
# Past this magnitude a float32 value rounds (ties to even) beyond E4M3FN's largest finite value: the midpoint of 448
# and the 480 the format would have next, which rounds down to 448's even mantissa.
_FLOAT8E4M3FN_ROUNDS_PAST = 464.0
_FLOAT8E4M3FN_NAN = 0x7F


def quantize_reference(v: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """Q(v) of the contract, as an int8 or float8_e4m3fn tensor: float32(v), rounded to the quantizer's input dtype
    where it has one, divided by the scale in float32 (IEEE division), rounded half to even and saturated. INT8
    clamps to [-128, 127], and a NaN is -128, as onnxruntime's CPU QuantizeLinear gives it; E4M3FN past ±464 is ±448
    when `saturate` is set, else NaN (ONNX's definition: its reference evaluator and onnxruntime agree everywhere
    except that onnxruntime 1.32 gives ±448 for |v/s| in [480, 496) without saturation)."""
    read = v.detach().float()
    if quantizer.input_dtype is not None:
        read = read.to(getattr(torch, quantizer.input_dtype)).float()
    scaled = read / torch.tensor(quantizer.scale, dtype=torch.float32, device=v.device)
    if quantizer.dtype == "int8":
        low, high = INT8_RANGE
        rounded = torch.where(scaled.isnan(), float(low), scaled.round().clamp(low, high))
        return rounded.to(torch.int8)
    # torch's float32 -> E4M3FN conversion rounds ties to even and saturates finite values; NaN stays NaN.
    quantized = scaled.clamp(-FLOAT8E4M3FN_MAX, FLOAT8E4M3FN_MAX).where(~scaled.isnan(), scaled)
    bits = quantized.to(torch.float8_e4m3fn).view(torch.uint8)
    if not quantizer.saturate:
        overflow = scaled.abs() > _FLOAT8E4M3FN_ROUNDS_PAST
        sign = (scaled < 0).to(torch.uint8) << 7
        bits = torch.where(overflow, sign | _FLOAT8E4M3FN_NAN, bits)
    return bits.view(torch.float8_e4m3fn)


def dequantize_reference(q: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """DQ(q) of the contract: float32(q) · scale in float32, rounded once to the quantizer's dequant dtype."""
    if quantizer.dequant_dtype is None:
        raise ValueError("an output quantizer does not dequantize")
    product = q.float() * torch.tensor(quantizer.scale, dtype=torch.float32, device=q.device)
    return product.to(getattr(torch, quantizer.dequant_dtype))


def fake_quant_reference(v: torch.Tensor, quantizer: Quantizer) -> torch.Tensor:
    """DQ(Q(v)): what a fake-quant stage hands on, in its dequant dtype."""
    return dequantize_reference(quantize_reference(v, quantizer), quantizer)


def norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    params: NormParams,
    output_dtype: str | None = None,
    quant: QuantParams | None = None,
) -> torch.Tensor:
    """y for x over its last axis, computed in float64 on x's device, with the casts where the weight mode puts
    them: to the output dtype T (`output_dtype`, default x's) at the end and, in AFTER_CAST, to the node's 16-bit
    dtype R before the weight multiply. `weight` is unused in WeightMode.NONE. With `quant`, x is fake-quantized
    first (input stage), the inverse root r after it is fake-quantized as the contract computes it in float32
    (rsqrt stage: `float32_inverse_root`), and the T value of y is quantized (output stage: the result is int8 or
    float8_e4m3fn)."""
    x_name = str(x.dtype).removeprefix("torch.")
    out_name = output_dtype or x_name
    out, rounding = getattr(torch, out_name), getattr(torch, rounding_dtype(x_name, out_name))
    quant = quant or QuantParams()
    x64 = x.detach().double() if quant.input is None else fake_quant_reference(x, quant.input).double()
    mean_square = x64.pow(2).mean(dim=-1, keepdim=True)
    if quant.rsqrt is None:
        inverse_root = (mean_square + params.epsilon).rsqrt()
    else:
        inverse_root = fake_quant_reference(float32_inverse_root(mean_square, params.epsilon), quant.rsqrt).double()
    y = _weighted(x64 * inverse_root, weight, params, out, rounding)
    return y if quant.output is None else quantize_reference(y, quant.output)


def float32_inverse_root(mean_square: torch.Tensor, epsilon: float) -> torch.Tensor:
    """r = 1 / sqrt(mean + epsilon) from the mean of squares, as the contract computes r in float32 (the graph's
    Add, Sqrt and Reciprocal, each an IEEE float32 operation): r' = DQ(Q(r)) is a step function of r, so the float64
    root rounded to float32, up to an ulp away, would put some rows a quantization step off. The mean is rounded
    once to float32 (the float32 mean exactly where a row's sum of squares is exact in float32); the root and the
    reciprocal go through float64, which rounds each to float32 exactly as the IEEE float32 operation does (torch's
    own float32 sqrt is not correctly rounded on every CPU)."""
    variance = mean_square.float() + torch.tensor(epsilon, dtype=torch.float32, device=mean_square.device)
    root = variance.double().sqrt().float()
    return (1.0 / root.double()).float()


def _weighted(
    normed: torch.Tensor, weight: torch.Tensor | None, params: NormParams, out: torch.dtype, rounding: torch.dtype
) -> torch.Tensor:
    if params.weight_mode is WeightMode.NONE:
        return normed.to(out)
    if weight is None:
        raise ValueError(f"the reference of a {params.weight_mode.name} norm needs a weight")
    scale = weight.detach().double() + params.weight_offset
    if params.weight_mode is WeightMode.AFTER_CAST:
        return (normed.to(rounding).double() * scale).to(out)
    return (normed * scale).to(out)


def add_norm_reference(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor | None,
    params: NormParams,
    output_dtype: str | None = None,
    quant: QuantParams | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, h) of the fused residual add+norm: h = D(x + residual), the sum in float32 rounded once to x's dtype D
    (the contract's definition; for 16-bit D the correctly rounded sum), then y = `norm_reference` of the rounded h
    (its quantizers included: h itself is never quantized)."""
    h = (x.detach().float() + residual.detach().float()).to(x.dtype)
    return norm_reference(h, weight, params, output_dtype, quant), h
