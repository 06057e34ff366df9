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
from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams
from trtfuse.verify.tolerances import KERNEL_ELEMENTWISE

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
    out_name = output_dtype or str(x.dtype).removeprefix("torch.")
    out = getattr(torch, out_name)
    quant = quant or QuantParams()
    y = normalised_reference(x, weight, params, out_name, quant).to(out)
    return y if quant.output is None else quantize_reference(y, quant.output)


def normalised_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    params: NormParams,
    output_dtype: str | None = None,
    quant: QuantParams | None = None,
) -> torch.Tensor:
    """`norm_reference`'s y in float64 before its final rounding to T (AFTER_CAST's rounding to R included; the
    input and rsqrt stages of `quant` applied, its output stage not): what a rotation after the norm reads."""
    x_name = str(x.dtype).removeprefix("torch.")
    rounding = getattr(torch, rounding_dtype(x_name, output_dtype or x_name))
    quant = quant or QuantParams()
    x64 = x.detach().double() if quant.input is None else fake_quant_reference(x, quant.input).double()
    mean_square = x64.pow(2).mean(dim=-1, keepdim=True)
    if quant.rsqrt is None:
        inverse_root = (mean_square + params.epsilon).rsqrt()
    else:
        inverse_root = fake_quant_reference(float32_inverse_root(mean_square, params.epsilon), quant.rsqrt).double()
    return _weighted(x64 * inverse_root, weight, params, rounding)


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
    normed: torch.Tensor, weight: torch.Tensor | None, params: NormParams, rounding: torch.dtype
) -> torch.Tensor:
    """y in float64 from x·r, per weight mode (AFTER_CAST rounds x·r to R first)."""
    if params.weight_mode is WeightMode.NONE:
        return normed
    if weight is None:
        raise ValueError(f"the reference of a {params.weight_mode.name} norm needs a weight")
    scale = weight.detach().double() + params.weight_offset
    if params.weight_mode is WeightMode.AFTER_CAST:
        return normed.to(rounding).double() * scale
    return normed * scale


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


def rotary_tables(
    positions: torch.Tensor, rotary_dim: int, theta: float, rotation: str, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [Bc, S, R] of integer `positions` [Bc, S] as a model computes them: frequency i of the R/2 is
    theta^(-2i/R); "half" repeats the R/2 angles as two halves (Hugging Face's cat(freqs, freqs)), "interleaved"
    repeats each angle twice in place. In float64, rounded once to `dtype`."""
    inverse = theta ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64, device=positions.device) / rotary_dim)
    angles = positions.double()[..., None] * inverse
    angles = torch.cat((angles, angles), -1) if rotation == "half" else angles.repeat_interleave(2, -1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def _heads_view(t: torch.Tensor, rope: RopeParams, batch: int, seq_len: int) -> torch.Tensor:
    """`t` (any shape of the layout, or flat) as [B, S, H, D] (token-major) or [B, H, S, D] (head-major)."""
    if rope.layout == "head_major":
        return t.reshape(batch, -1, seq_len, rope.head_dim)
    return t.reshape(batch, seq_len, -1, rope.head_dim)


def _tables_view(table: torch.Tensor, rope: RopeParams, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """cos or sin [Bc, S, R] broadcast against `_heads_view`'s heads, widened to `dtype`."""
    return table.to(dtype)[:, :, None, :] if rope.layout == "token_major" else table.to(dtype)[:, None, :, :]


def rotate_half_of(y: torch.Tensor, rope: RopeParams) -> torch.Tensor:
    """rot(y) of the first R elements of each head: -y[j + R/2], y[j - R/2] (half) or -y[2i + 1], y[2i]
    (interleaved)."""
    rotated = y[..., : rope.rotary_dim]
    if rope.rotation == "half":
        first, second = rotated.chunk(2, dim=-1)
        return torch.cat((-second, first), -1)
    pairs = rotated.unflatten(-1, (-1, 2))
    return torch.stack((-pairs[..., 1], pairs[..., 0]), -1).flatten(-2)


def rope_reference(
    y: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rope: RopeParams, batch: int, seq_len: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, magnitude) in float64 of `y` (the float64 normalised value, of q's or k's shape or flat): out[j] =
    y[j]·cos[j] + rot(y)[j]·sin[j] for j < R, y[j] beyond; each head row of (b, h, s) reads cos/sin row (b if
    Bc == B else 0, s). `magnitude` is |y·cos| + |rot(y)·sin| (|y| beyond R), what a rounding of y moves out by."""
    heads = _heads_view(y.double(), rope, batch, seq_len)
    c, s = _tables_view(cos, rope), _tables_view(sin, rope)
    rotary = rope.rotary_dim
    kept, rot = heads[..., :rotary], rotate_half_of(heads, rope)
    out, magnitude = heads.clone(), heads.abs()
    out[..., :rotary] = kept * c + rot * s
    magnitude[..., :rotary] = (kept * c).abs() + (rot * s).abs()
    return out.reshape(y.shape), magnitude.reshape(y.shape)


def quantized_products_reference(
    y: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    rope: RopeParams,
    quant: QuantParams,
    batch: int,
    seq_len: int,
) -> torch.Tensor:
    """out in T of `y`, the normalised value already rounded to T (its dtype), rotated with a part's product stages
    (`quant.cos_product`, `quant.sin_product`; docs/plugin-nodes.md, "Rotary embedding"): each product y·c and
    rot(y)·s a float32 product rounded to T, through its stage's DQ(Q(·)) into T, the two added in float32 and
    rounded to T; y itself beyond R. Float32 arithmetic, as the contract rounds it, so a kernel's codes and this
    agree bit for bit on the same rounded y."""
    out_dtype = y.dtype
    heads = _heads_view(y.float(), rope, batch, seq_len)
    c, s = (_tables_view(table, rope, torch.float32) for table in (cos, sin))
    rotary = rope.rotary_dim
    cos_term, sin_term = (
        fake_quant_reference((part * table).to(out_dtype), quantizer).float()
        for part, table, quantizer in (
            (heads[..., :rotary], c, quant.cos_product),
            (rotate_half_of(heads, rope), s, quant.sin_product),
        )
    )
    out = heads.clone()
    out[..., :rotary] = (cos_term + sin_term).to(out_dtype).float()
    return out.reshape(y.shape).to(out_dtype)


def qk_norm_rope_reference(
    x: torch.Tensor,
    weight: torch.Tensor | None,
    cos: torch.Tensor,
    sin: torch.Tensor,
    spec: QkNormRopeSpec,
    part: int,
    batch: int,
    seq_len: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, magnitude) of part `part` (0: q, 1: k) of the QK-norm + rotary kernel: the norm's y in float64 before
    its rounding (`normalised_reference`, with the part's input and rsqrt stages; with its normalised stage y
    rounded to T and through that stage's DQ(Q(·))), rotated (`rope_reference`), rounded once to T (with the part's
    product stages: y rounded to T, then `quantized_products_reference`) and, where the part has an output
    quantizer, quantized; `magnitude` as `rope_reference`'s. x is the part's activation (any shape of the layout, or
    rows of its hidden size); both results have its shape, or its [B, H, S, D] where the spec moves heads."""
    hidden = (spec.q_hidden, spec.k_hidden)[part]
    rows = x.reshape(-1, hidden)
    out_dtype = getattr(torch, spec.out_dtype)
    quant = spec.part_quant(part)
    y = normalised_reference(rows, weight, spec.params, spec.out_dtype, quant)
    if quant is not None and quant.normalised is not None:
        y = fake_quant_reference(y.to(out_dtype), quant.normalised).double()
    out, magnitude = rope_reference(y, cos, sin, spec.rope, batch, seq_len)
    out = out.reshape(x.shape).to(out_dtype)
    if quant is not None and quant.cos_product is not None:
        out = quantized_products_reference(y.to(out_dtype), cos, sin, spec.rope, quant, batch, seq_len)
        out = out.reshape(x.shape)
    magnitude = magnitude.reshape(x.shape)
    if spec.rope.moves_heads:
        out, magnitude = (
            _heads_view(t, spec.rope, batch, seq_len).transpose(1, 2).contiguous() for t in (out, magnitude)
        )
    if quant is not None and quant.output is not None:
        out = quantize_reference(out, quant.output)
    return out, magnitude


def rotated_tolerance(spec: QkNormRopeSpec, reference: torch.Tensor, magnitude: torch.Tensor) -> torch.Tensor:
    """What a rotated output may differ from `reference` (its T value, float64) by: two units in the last place of
    T (KERNEL_ELEMENTWISE), plus two of R times `magnitude` (the rotated terms' sizes): AFTER_CAST rounds x·r to the
    16-bit R before the weight, and the kernel's float32 x·r and the reference's float64 one may round to
    neighbours there, in y and in its partner alike (float32's two units without that rounding)."""
    rtol, atol = KERNEL_ELEMENTWISE[spec.out_dtype]
    inner = rounding_dtype(spec.dtype, spec.out_dtype) if spec.params.weight_mode is WeightMode.AFTER_CAST else None
    return atol + rtol * reference.double().abs() + KERNEL_ELEMENTWISE[inner or "float32"][0] * magnitude
