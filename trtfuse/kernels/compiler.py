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
from trtfuse.kernels.device import FP8_MIN_SM, arch_sm
from trtfuse.kernels.norm_kernel import (
    CUTLASS_DTYPES,
    NormMath,
    add_rms_norm_aot_kernel,
    add_rms_norm_aot_launcher,
    add_rms_norm_launcher,
    qk_norm_aot_kernel,
    qk_norm_aot_launcher,
    qk_norm_launcher,
    rms_norm_aot_kernel,
    rms_norm_aot_launcher,
    rms_norm_launcher,
)
from trtfuse.kernels.specs import DTYPE_BYTES, AddRmsNormSpec, QkNormSpec, RmsNormSpec, has_fp8_stage
from trtfuse.kernels.tiling import ACCESS_BYTES, RowTiling


@dataclass(frozen=True)
class RmsNormVariant:
    spec: RmsNormSpec
    tiling: RowTiling
    arch: str


@dataclass(frozen=True)
class AddRmsNormVariant:
    spec: AddRmsNormSpec
    tiling: RowTiling
    arch: str


@dataclass(frozen=True)
class QkNormVariant:
    spec: QkNormSpec
    q_tiling: RowTiling
    k_tiling: RowTiling
    arch: str


Variant = RmsNormVariant | AddRmsNormVariant | QkNormVariant


def _math(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> NormMath:
    rounding = rounding_dtype(spec.dtype, spec.out_dtype)
    quant = getattr(spec, "quant", None)
    if quant is None:
        return NormMath(spec.params, rounding)
    return NormMath(spec.params, rounding, quant, spec.out_dtype if quant.output is not None else None)


def _check_arch(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, arch: str) -> None:
    if has_fp8_stage(spec) and arch_sm(arch) < FP8_MIN_SM:
        raise ValueError(f"an FP8 quantizer needs sm_{FP8_MIN_SM} or newer (its conversions), not {arch}: {spec}")


def _activation_ptr(dtype: str, tiling: RowTiling) -> cute.Pointer:
    # The alignment promised here is what lets the compiler emit 16-byte accesses: one per vector, or two for the
    # fp32 side of a row whose other side is 16-bit (a 32-byte vector, aligned to 16).
    align = min(ACCESS_BYTES, tiling.vector * DTYPE_BYTES[dtype])
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def _weight_ptr(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, tiling: RowTiling) -> cute.Pointer:
    # A no-weight kernel still takes the (never read) pointer, so every variant has the same calling convention.
    dtype = spec.weight_dtype or spec.dtype
    align = min(ACCESS_BYTES, tiling.vector * DTYPE_BYTES[dtype])
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def _options(arch: str, ptx_dir: Path | None) -> str:
    options = f"--enable-tvm-ffi --gpu-arch {arch}"
    if ptx_dir is not None:
        options += f" --keep-ptx --dump-dir {ptx_dir}"
    return options


def compile_variant(variant: Variant, ptx_dir: Path | None = None) -> Any:
    """Compile one variant; its PTX lands in `ptx_dir` when given. Returns CuTeDSL's TVM-FFI compiled function."""
    spec = variant.spec
    _check_arch(spec, variant.arch)
    options = _options(variant.arch, ptx_dir)
    if isinstance(variant, AddRmsNormVariant):
        return cute.compile(
            add_rms_norm_launcher,
            _activation_ptr(spec.dtype, variant.tiling),
            _activation_ptr(spec.dtype, variant.tiling),
            _weight_ptr(spec, variant.tiling),
            _activation_ptr(spec.y_dtype, variant.tiling),
            _activation_ptr(spec.dtype, variant.tiling),
            Int32(1),
            make_fake_stream(),
            variant.tiling,
            _math(spec),
            options=options,
        )
    if isinstance(variant, RmsNormVariant):
        return cute.compile(
            rms_norm_launcher,
            _activation_ptr(spec.dtype, variant.tiling),
            _weight_ptr(spec, variant.tiling),
            _activation_ptr(spec.y_dtype, variant.tiling),
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


@dataclass(frozen=True)
class AotCompiled:
    kernel_name: str
    ptx: str
    cubin: bytes


def _element_ptr(dtype: str) -> cute.Pointer:
    # TensorRT promises a plugin's pointers no alignment beyond the element: the kernel checks for the vector path.
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=DTYPE_BYTES[dtype])


def compile_aot_variant(variant: Variant, entry_prefix: str, dump_dir: Path) -> AotCompiled:
    """Compile `variant` as an ahead-of-time kernel (TensorRT's parameter order, alignment checked in the kernel):
    its PTX, its cubin for `variant.arch`, and the device entry's name, `entry_prefix` plus CuTeDSL's `_0`.

    Sets the entry name on the shared kernel function: the caller serialises compilations."""
    spec = variant.spec
    _check_arch(spec, variant.arch)
    weight_dtype = spec.weight_dtype or spec.dtype
    options = f"--gpu-arch {variant.arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    if isinstance(variant, RmsNormVariant):
        kernel = rms_norm_aot_kernel
        args = (
            _element_ptr(spec.dtype),
            _element_ptr(weight_dtype),
            Int32(1),
            _element_ptr(spec.y_dtype),
            make_fake_stream(),
            variant.tiling,
            _math(spec),
        )
        launcher = rms_norm_aot_launcher
    elif isinstance(variant, AddRmsNormVariant):
        kernel = add_rms_norm_aot_kernel
        args = (
            _element_ptr(spec.dtype),
            _element_ptr(spec.dtype),
            _element_ptr(weight_dtype),
            Int32(1),
            _element_ptr(spec.y_dtype),
            _element_ptr(spec.dtype),
            make_fake_stream(),
            variant.tiling,
            _math(spec),
        )
        launcher = add_rms_norm_aot_launcher
    else:
        kernel = qk_norm_aot_kernel
        args = (
            _element_ptr(spec.dtype),
            _element_ptr(spec.dtype),
            _element_ptr(weight_dtype),
            _element_ptr(weight_dtype),
            Int32(1),
            Int32(1),
            _element_ptr(spec.out_dtype),
            _element_ptr(spec.out_dtype),
            make_fake_stream(),
            variant.q_tiling,
            variant.k_tiling,
            _math(spec),
        )
        launcher = qk_norm_aot_launcher
    # Without a unique prefix, variants differing only in an immediate (epsilon) would share an entry name.
    kernel.set_name_prefix(entry_prefix, remove_cutlass_symbol=True, keep_mangled_name=False)
    compiled = cute.compile(launcher, *args, options=options)
    (kernel_name,) = compiled.kernel_info
    return AotCompiled(kernel_name=kernel_name, ptx=compiled.artifacts.PTX, cubin=bytes(compiled.artifacts.CUBIN))
