"""Turns a variant (spec + tiling + arch) into a compiled TVM-FFI function, with placeholder pointers and stream."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_ptr
from cutlass.runtime import make_fake_stream

from trtfuse.contract import rounding_dtype
from trtfuse.kernels.norm_kernel import CUTLASS_DTYPES, NormMath, qk_norm_launcher, rms_norm_launcher
from trtfuse.kernels.specs import DTYPE_BYTES, QkNormSpec, RmsNormSpec
from trtfuse.kernels.tiling import ACCESS_BYTES, RowTiling


@dataclass(frozen=True)
class RmsNormVariant:
    spec: RmsNormSpec
    tiling: RowTiling
    arch: str


@dataclass(frozen=True)
class QkNormVariant:
    spec: QkNormSpec
    q_tiling: RowTiling
    k_tiling: RowTiling
    arch: str


def _math(spec: RmsNormSpec | QkNormSpec) -> NormMath:
    rounding = rounding_dtype(spec.dtype, spec.out_dtype)
    return NormMath(spec.params, rounding)


def _activation_ptr(dtype: str, tiling: RowTiling) -> cute.Pointer:
    # The alignment promised here is what lets the compiler emit 16-byte accesses: one per vector, or two for the
    # fp32 side of a row whose other side is 16-bit (a 32-byte vector, aligned to 16).
    align = min(ACCESS_BYTES, tiling.vector * DTYPE_BYTES[dtype])
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def _weight_ptr(spec: RmsNormSpec | QkNormSpec, tiling: RowTiling) -> cute.Pointer:
    # A no-weight kernel still takes the (never read) pointer, so every variant has the same calling convention.
    dtype = spec.weight_dtype or spec.dtype
    align = min(ACCESS_BYTES, tiling.vector * DTYPE_BYTES[dtype])
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def _options(arch: str, ptx_dir: Path | None) -> str:
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if ptx_dir is not None:
        options += f" --keep-ptx --dump-dir {ptx_dir}"
    return options


def compile_variant(variant: RmsNormVariant | QkNormVariant, ptx_dir: Path | None = None) -> Any:
    """Compile one variant; its PTX lands in `ptx_dir` when given. Returns CuTeDSL's TVM-FFI compiled function."""
    spec = variant.spec
    options = _options(variant.arch, ptx_dir)
    if isinstance(variant, RmsNormVariant):
        return cute.compile(
            rms_norm_launcher,
            _activation_ptr(spec.dtype, variant.tiling),
            _weight_ptr(spec, variant.tiling),
            _activation_ptr(spec.out_dtype, variant.tiling),
            Int32(1),
            make_fake_stream(),
            variant.tiling,
            _math(spec),
            options=options,
        )
    return cute.compile(
        qk_norm_launcher,
        _activation_ptr(spec.dtype, variant.q_tiling),
        _activation_ptr(spec.dtype, variant.k_tiling),
        _weight_ptr(spec, variant.q_tiling),
        _weight_ptr(spec, variant.k_tiling),
        _activation_ptr(spec.out_dtype, variant.q_tiling),
        _activation_ptr(spec.out_dtype, variant.k_tiling),
        Int32(1),
        Int32(1),
        make_fake_stream(),
        variant.q_tiling,
        variant.k_tiling,
        _math(spec),
        options=options,
    )
