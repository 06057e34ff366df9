"""CPU/CI: `ptx.scale_quotient`'s instruction sequence (the quantizers' v / s from the scale's reciprocal) gives the
IEEE float32 quotient for every float32 mantissa, emulated here with exact float64 fused multiply-adds; its PTX is
tested in tests/kernels/test_quant_compile.py."""

from __future__ import annotations

import numpy as np
import pytest

from trtfuse.kernels.ptx import RECIPROCAL_SCALES, reciprocal_applies

F32, F64 = np.float32, np.float64


@np.errstate(invalid="ignore", over="ignore")
def fma32(a: np.ndarray, b: np.ndarray | float, c: np.ndarray) -> np.ndarray:
    """RN32(a·b + c) with a single rounding: a·b is exact in float64 (48 bits); the sum is s + t exactly (TwoSum),
    and RN32(s + t) is RN32(s) except where s is a float32 midpoint and t breaks the tie."""
    p = a.astype(F64) * F64(b)  # infinities make NaNs here, as the hardware's fma does
    c64 = c.astype(F64)
    s = p + c64
    z = s - p
    t = (p - (s - z)) + (c64 - z)
    f = s.astype(F32)
    g = np.nextafter(f, np.where(s > f.astype(F64), F32(np.inf), F32(-np.inf)))
    tie = (f.astype(F64) != s) & ((f.astype(F64) + g.astype(F64)) / 2 == s) & (t != 0)
    toward_t = np.where(t > 0, np.maximum(f, g), np.minimum(f, g))
    return np.where(tie, toward_t, f)


def emulated_quotient(v: np.ndarray, scale: float) -> np.ndarray:
    """The sequence `scale_quotient` emits, instruction by instruction."""
    s = F32(scale)
    y = F32(1.0) / s
    q0 = (v.astype(F64) * F64(y)).astype(F32)
    q1 = fma32(fma32(-q0, s, v), y, q0)
    q2 = fma32(fma32(-q1, s, v), y, q1)
    q = np.where(np.abs(q0) < F32(2.0**64), q2, q0)
    return np.copysign(q, v)


# ModelOpt-like amax / 448 and amax / 127 scales, powers of two and their neighbours, extremes of the range.
SCALES = [
    float(F32(4.5 / 448)),
    float(F32(4.5 / 127)),
    float(F32(12.0 / 448)),
    float(F32(0.0173)),
    0.015625,
    float(np.nextafter(F32(0.25), F32(1))),
    float(np.nextafter(F32(0.25), F32(0))),
    float(F32(1 / 3)),
    float(F32(3.0)),
    float(F32(1e-5)),
    RECIPROCAL_SCALES[0],
    float(np.nextafter(F32(RECIPROCAL_SCALES[1]), F32(0))),
]


@pytest.mark.parametrize("scale", SCALES)
def test_every_float32_mantissa_divides_exactly(scale: float) -> None:
    """All 2^23 mantissas of [1, 2), both signs: scaling v by 2^k scales the quotient exactly, so one binade covers
    every v whose quotient and remainders stay normal (the range RECIPROCAL_SCALES keeps)."""
    assert reciprocal_applies(scale)
    v = (np.arange(2**23, dtype=np.uint32) | np.uint32(0x3F800000)).view(F32)
    for signed in (v, -v):
        ours, exact = emulated_quotient(signed, scale), signed / F32(scale)
        wrong = np.flatnonzero(ours.view(np.uint32) != exact.view(np.uint32))
        assert wrong.size == 0, (scale, signed[wrong[:4]], ours[wrong[:4]], exact[wrong[:4]])


@pytest.mark.parametrize("scale", SCALES[:4])
def test_zeros_infinities_nans_and_extreme_values_divide_as_ieee_does(scale: float) -> None:
    special = np.array(
        [0.0, -0.0, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.2e-38, 3.4e38, -3.4e38, 2.0**-100, 2.0**100],
        dtype=F32,
    )
    with np.errstate(over="ignore", invalid="ignore"):
        ours, exact = emulated_quotient(special, scale), special / F32(scale)
    # Exact from 2^-10 (the smallest quotient a code boundary is near: half E4M3FN's least subnormal) to 2^64;
    # below, zero's sign and the side of 2^-10 hold (every such quotient is the code 0 of its sign).
    finite = np.isfinite(exact) & (np.abs(exact) < 2.0**64)
    exact_range = finite & (np.abs(exact) >= 2.0**-10)
    assert np.array_equal(ours.view(np.uint32)[exact_range], exact.view(np.uint32)[exact_range])
    tiny = finite & ~exact_range
    assert np.all((np.abs(ours[tiny]) < 2.0**-10) & (np.signbit(ours[tiny]) == np.signbit(exact[tiny])))
    # Beyond 2^64 (and infinities) every code is the same: the sign and the magnitude's side of 2^64 must hold.
    assert np.array_equal(np.isnan(ours), np.isnan(exact))
    big = ~finite & ~np.isnan(exact)
    assert np.all((np.abs(ours[big]) >= 2.0**64) & (np.sign(ours[big]) == np.sign(exact[big])))


def test_extreme_scales_keep_the_division() -> None:
    low, high = RECIPROCAL_SCALES
    assert not reciprocal_applies(float(np.nextafter(F32(low), F32(0))))
    assert not reciprocal_applies(float(np.nextafter(F32(high), F32(np.inf))))
