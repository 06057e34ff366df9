"""The quantizer stages in CuTeDSL (docs/plugin-nodes.md, "Quantization"), each a compile-time `Quantizer`:

    Q(v)  = sat(round_half_even(v / s))     v / s the IEEE float32 quotient, as onnxruntime divides
                                            (`ptx.scale_quotient`; div.rn.f32 for an extreme scale)
    DQ(q) = dequant_dtype(float32(q) · s)

The norm kernels call these on register fragments of any layout; a kernel without quantizers traces none of them.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass import Float32, Int8, Int32

from trtfuse.kernels.ptx import e4m3_nan_flagged, int8_codes, int8_level, reciprocal_applies, scale_quotient

# The cutlass types of the contract's dtype names: the float dtypes, and the quantized ones.
FLOAT_CUTLASS_DTYPES = {"float32": cutlass.Float32, "float16": cutlass.Float16, "bfloat16": cutlass.BFloat16}
QUANT_CUTLASS_DTYPES = {"float8_e4m3fn": cutlass.Float8E4M3FN, "int8": cutlass.Int8}


def quotient(value: Float32, quantizer: cutlass.Constexpr) -> Float32:
    """v / s, the correctly rounded float32 quotient by the quantizer's scale."""
    if reciprocal_applies(quantizer.scale):
        return scale_quotient(value, quantizer.scale)
    # `/` on Float32 is the IEEE division (div.rn.f32; the PTX tests check that no approximation appears).
    return value / Float32(quantizer.scale)


@cute.jit
def _int8_levels(values: cute.TensorSSA, quantizer: cutlass.Constexpr, layout: cutlass.Constexpr) -> cute.Tensor:
    """INT8's Q(values) as float32 integers in [-128, 127], in a fragment of `layout`."""
    levels = cute.make_rmem_tensor(layout, Float32)
    levels.store(values)
    for i in cutlass.range_constexpr(cute.size(levels)):
        levels[i] = int8_level(quotient(levels[i], quantizer))
    return levels


@cute.jit
def quantize_into(values: cute.TensorSSA, quantizer: cutlass.Constexpr, codes: cute.Tensor):
    """codes = Q(values): `values` float32, `codes` a register fragment of the quantizer's dtype (FP8 E4M3FN or
    INT8) and of `values`' shape."""
    if cutlass.const_expr(quantizer.dtype == "int8" and cute.size(codes) % 4 == 0):
        # Whole words of 4 codes: rounded and packed by cvt.rni and cvt.pack.sat (`ptx.int8_codes`).
        quotients = cute.make_rmem_tensor(codes.layout, Float32)
        quotients.store(values)
        words = cute.recast_tensor(codes, Int32)
        for w in cutlass.range_constexpr(cute.size(words)):
            group = [quotient(quotients[w * 4 + b], quantizer) for b in range(4)]
            words[w] = int8_codes((group[0], group[1], group[2], group[3]))
    elif cutlass.const_expr(quantizer.dtype == "int8"):
        # The levels are integers in range: the conversion to INT8 is exact whatever its rounding.
        codes.store(_int8_levels(values, quantizer, codes.layout).load().to(Int8))
    else:
        quotients = cute.make_rmem_tensor(codes.layout, Float32)
        quotients.store(values)
        if cutlass.const_expr(quantizer.saturate):
            for i in cutlass.range_constexpr(cute.size(quotients)):
                quotients[i] = quotient(quotients[i], quantizer)
            # cvt.rn.satfinite.e4m3x2.f32: round half to even, ±448 past the range (saturate's meaning), a NaN the
            # NaN code 0x7F, as the reference gives the only NaN a kernel's arithmetic makes (positive, canonical).
            codes.store(quotients.load().to(cutlass.Float8E4M3FN))
        else:
            _store_e4m3_unsaturated(quotients, quantizer, codes)


@cute.jit
def _store_e4m3_unsaturated(quotients: cute.Tensor, quantizer: cutlass.Constexpr, codes: cute.Tensor):
    """E4M3FN's Q without `saturate`: the saturating conversion, then the NaN code (of the value's sign) wherever
    |v / s| > 464. The fix-up works on whole words of 4 codes where the fragment has them (vectors of 4 and more)."""
    group = 4 if cute.size(codes) % 4 == 0 else 1
    words = cute.recast_tensor(codes, Int32 if group == 4 else Int8)
    nan_bits = cute.make_rmem_tensor(words.layout, words.element_type)
    for w in cutlass.range_constexpr(cute.size(words)):
        bits = Int32(0)
        for b in cutlass.range_constexpr(group):
            i = w * group + b
            quotients[i], flag = e4m3_nan_flagged(quotient(quotients[i], quantizer), b)
            bits = bits | flag
        nan_bits[w] = words.element_type(bits)
    codes.store(quotients.load().to(cutlass.Float8E4M3FN))
    # ±448 (S.1111.110) becomes the NaN code of its sign (S.1111.111) where the quotient is NaN-bound.
    for w in cutlass.range_constexpr(cute.size(words)):
        words[w] = words[w] | nan_bits[w]


@cute.jit
def fake_quantized(values: cute.TensorSSA, quantizer: cutlass.Constexpr, layout: cutlass.Constexpr) -> cute.TensorSSA:
    """DQ(Q(values)) as float32: the quantized value, scaled back and rounded once to the dequant dtype. Q reads
    `values` rounded to the quantizer's input dtype where it has a 16-bit one (a graph that casts r to 16 bits
    before its QuantizeLinear)."""
    if cutlass.const_expr(quantizer.input_dtype not in (None, "float32")):
        values = values.to(FLOAT_CUTLASS_DTYPES[quantizer.input_dtype]).to(Float32)
    if cutlass.const_expr(quantizer.dtype == "int8"):
        # The level itself is float32(q): no INT8 code needs forming.
        levels = _int8_levels(values, quantizer, layout).load()
    else:
        codes = cute.make_rmem_tensor(layout, cutlass.Float8E4M3FN)
        quantize_into(values, quantizer, codes)
        levels = codes.load().to(Float32)
    return (levels * Float32(quantizer.scale)).to(FLOAT_CUTLASS_DTYPES[quantizer.dequant_dtype]).to(Float32)


@cute.jit
def fake_quantized_scalar(value: Float32, quantizer: cutlass.Constexpr) -> Float32:
    """`fake_quantized` of one value (a row's inverse root)."""
    one = cute.make_layout(1)
    fragment = cute.make_rmem_tensor(one, Float32)
    fragment[0] = value
    fragment.store(fake_quantized(fragment.load(), quantizer, one))
    return fragment[0]
