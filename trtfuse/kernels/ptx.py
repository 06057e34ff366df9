"""PTX CuTeDSL does not expose: 16-byte global loads with an L2 cache-eviction policy, and the quantizer steps whose
exact rounding and saturation the contract fixes (the quotient by a constant scale, INT8's level, E4M3FN's NaN
codes).

`CopyG2ROp` sets L1 eviction priorities but not L2's; a `createpolicy` register plus `.L2::cache_hint` on the load
does (PTX ISA: "createpolicy", "ld"). The loads keep their program order (the asm has side effects), so a load
written after a barrier stays after it. The quantizer steps are pure (no side effects), so the compiler may
schedule them freely.
"""

from __future__ import annotations

import struct

import numpy as np
from cutlass import Float32, Int32, Int64
from cutlass._mlir import ir
from cutlass._mlir.dialects import llvm, vector
from cutlass.cutlass_dsl import T, dsl_user_op


def _asm(
    result: ir.Type, operands: list[ir.Value], text: str, constraints: str, ordered: bool, loc: object, ip: object
) -> ir.Value:
    return llvm.inline_asm(
        result,
        operands,
        text,
        constraints,
        has_side_effects=ordered,
        is_align_stack=False,
        asm_dialect=llvm.AsmDialect.AD_ATT,
        loc=loc,
        ip=ip,
    )


@dsl_user_op
def l2_evict_policy(evict_last: bool, *, loc: ir.Location | None = None, ip: ir.InsertionPoint | None = None) -> Int64:
    """A cache policy covering every line it is applied to: keep them in L2 (evict-last) or drop them first."""
    priority = "evict_last" if evict_last else "evict_first"
    # Ordered like the loads, so that each policy is created where its loads are (before or after the barrier).
    return Int64(_asm(T.i64(), [], f"createpolicy.fractional.L2::{priority}.b64 $0, 1.0;", "=l", True, loc, ip))


@dsl_user_op
def load_16_bytes(
    address: Int64,
    policy: Int64,
    l1_evict_last: bool,
    *,
    loc: ir.Location | None = None,
    ip: ir.InsertionPoint | None = None,
) -> ir.Value:
    """One 16-byte `ld.global` with an L1 priority and an L2 policy; returns vector<4xi32>."""
    l1 = "evict_last" if l1_evict_last else "evict_first"
    i32 = T.i32()
    operands = [Int64(address).ir_value(loc=loc, ip=ip), Int64(policy).ir_value(loc=loc, ip=ip)]
    text = f"ld.global.L1::{l1}.L2::cache_hint.v4.b32 {{$0, $1, $2, $3}}, [$4], $5;"
    words = _asm(llvm.StructType.get_literal([i32] * 4), operands, text, "=r,=r,=r,=r,l,l", True, loc, ip)
    parts = [llvm.extractvalue(i32, words, [i], loc=loc, ip=ip) for i in range(4)]
    return vector.from_elements(ir.VectorType.get([4], Int32.mlir_type), parts, loc=loc, ip=ip)


def _f32(value: float) -> str:
    """A float32 immediate as PTX writes one (0f + its bits), so the constant reaches ptxas exactly."""
    return "0f" + struct.pack(">f", value).hex().upper()


@dsl_user_op
def int8_level(quotient: Float32, *, loc: ir.Location | None = None, ip: ir.InsertionPoint | None = None) -> Float32:
    """INT8's Q of a quotient v / s, as a float32: clamped to [-128, 127], then rounded half to even (the bounds are
    integers, so clamping first changes nothing). max before min takes a NaN to -128, as onnxruntime's does. The
    level goes through int32 (exact in this range): an INT8 code has no sign of zero, so DQ(Q(-0.3·s)) is +0 in the
    graph, where a float rounding (cvt.rni.f32.f32) would keep -0 and the DQ give -0."""
    text = (
        f"{{ .reg .f32 t; .reg .s32 i; max.f32 t, $1, {_f32(-128.0)}; min.f32 t, t, {_f32(127.0)};"
        " cvt.rni.s32.f32 i, t; cvt.rn.f32.s32 $0, i; }"
    )
    return Float32(_asm(T.f32(), [Float32(quotient).ir_value(loc=loc, ip=ip)], text, "=f,f", False, loc, ip))


@dsl_user_op
def int8_codes(
    quotients: tuple[Float32, Float32, Float32, Float32],
    *,
    loc: ir.Location | None = None,
    ip: ir.InsertionPoint | None = None,
) -> Int32:
    """INT8's Q of four quotients v / s, packed little-endian into one word (the first quotient's code in the low
    byte): max takes a NaN to -128 (as onnxruntime does), cvt.rni rounds half to even (a float beyond int32's range
    clamps), and cvt.pack.sat clamps each to [-128, 127] while packing two at a time (the first source into the
    higher byte, the third operand's low half above them)."""
    low = _f32(-128.0)
    text = (
        "{ .reg .f32 m<4>; .reg .s32 i<4>; .reg .b32 high;"
        + "".join(f" max.f32 m{k}, ${k + 1}, {low}; cvt.rni.s32.f32 i{k}, m{k};" for k in range(4))
        + " cvt.pack.sat.s8.s32.b32 high, i3, i2, 0; cvt.pack.sat.s8.s32.b32 $0, i1, i0, high; }"
    )
    operands = [Float32(q).ir_value(loc=loc, ip=ip) for q in quotients]
    return Int32(_asm(T.i32(), operands, text, "=r,f,f,f,f", False, loc, ip))


# E4M3FN's Q without `saturate` (ONNX's definition, trtfuse.bench.reference): NaN past this magnitude, the midpoint
# of 448 and the 480 the format would have next (a tie there rounds to 448's even mantissa).
E4M3_NAN_PAST = 464.0


@dsl_user_op
def e4m3_nan_flagged(
    quotient: Float32, byte: int, *, loc: ir.Location | None = None, ip: ir.InsertionPoint | None = None
) -> tuple[Float32, Int32]:
    """For E4M3FN's Q without `saturate`: (what to convert, the low bit of byte `byte` of a word where the code
    must be the NaN of the quotient's sign, else 0).

    NaN-bound is a quotient past ±464 (or NaN). It is replaced by the infinity of its sign, which the saturating
    conversion makes ±448 (S.1111.110): the NaN code of that sign (S.1111.111) less its low bit, which the caller
    then sets."""
    text = (
        f"{{ .reg .pred nan; .reg .f32 a; abs.f32 a, $2; setp.gtu.f32 nan, a, {_f32(E4M3_NAN_PAST)};"
        f" copysign.f32 a, $2, {_f32(float('inf'))}; selp.f32 $0, a, $2, nan; selp.b32 $1, {1 << 8 * byte}, 0, nan; }}"
    )
    f32, i32 = T.f32(), T.i32()
    operands = [Float32(quotient).ir_value(loc=loc, ip=ip)]
    result = _asm(llvm.StructType.get_literal([f32, i32]), operands, text, "=f,=r,f", False, loc, ip)
    value = llvm.extractvalue(f32, result, [0], loc=loc, ip=ip)
    return Float32(value), Int32(llvm.extractvalue(i32, result, [1], loc=loc, ip=ip))


# Scales whose quotients `scale_quotient` computes from the reciprocal: within [2^-64, 2^64] every remainder a
# quotient near a code boundary (|v / s| >= 2^-10) leaves is a float32 of at least 2^-149 ulp grid, so exact.
RECIPROCAL_SCALES = (2.0**-64, 2.0**64)
# Past this magnitude every quotient gives the same code (±448, NaN past 464, INT8's clamp): RN(v · 1/s) is used as
# is, which keeps an infinite v's infinity (the refinement would make it NaN).
_REFINED_BELOW = 2.0**64


def reciprocal_applies(scale: float) -> bool:
    """Whether `scale_quotient` divides by `scale` through its reciprocal (else `v / s`, div.rn.f32)."""
    low, high = RECIPROCAL_SCALES
    return low <= scale <= high


@dsl_user_op
def scale_quotient(
    value: Float32, scale: float, *, loc: ir.Location | None = None, ip: ir.InsertionPoint | None = None
) -> Float32:
    """RN(v / s), the IEEE float32 quotient div.rn.f32 gives, for a positive constant s (`reciprocal_applies`),
    without div.rn's reciprocal approximation (a quarter-rate MUFU op), range check and slow path: with
    y = RN(1/s), q0 = RN(v·y) is within 1.5 ulp of v/s; one correction q1 = RN(q0 + RN(v - s·q0)·y) is within
    1 ulp, so its remainder is exact and, y being within half an ulp of 1/s, Markstein's theorem makes the second
    correction q2 = RN(q1 + (v - s·q1)·y) the correctly rounded quotient. copysign keeps -0's sign (the remainders
    of a zero are +0). tests/kernels/test_scale_quotient.py checks every float32 mantissa against division."""
    s, y, limit = _f32(scale), _f32(float(np.float32(1.0) / np.float32(scale))), _f32(_REFINED_BELOW)
    text = (
        "{ .reg .f32 q0, q1, q2, n, e, a; .reg .pred refined;"
        f" mul.rn.f32 q0, $1, {y};"
        f" neg.f32 n, q0; fma.rn.f32 e, n, {s}, $1; fma.rn.f32 q1, e, {y}, q0;"
        f" neg.f32 n, q1; fma.rn.f32 e, n, {s}, $1; fma.rn.f32 q2, e, {y}, q1;"
        f" abs.f32 a, q0; setp.lt.f32 refined, a, {limit}; selp.f32 q2, q2, q0, refined;"
        " copysign.f32 $0, $1, q2; }"
    )
    return Float32(_asm(T.f32(), [Float32(value).ir_value(loc=loc, ip=ip)], text, "=f,f", False, loc, ip))
