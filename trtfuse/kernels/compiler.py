"""Turns a variant (spec + tiling + arch) into a compiled TVM-FFI function, with placeholder pointers and stream."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cutlass.cute as cute
from cutlass import Int32
from cutlass.cute.runtime import make_ptr
from cutlass.runtime import make_fake_stream

from trtfuse.contract import QuantParams, rounding_dtype
from trtfuse.kernels.device import FP8_MIN_SM, arch_sm
from trtfuse.kernels.norm_kernel import (
    CUTLASS_DTYPES,
    NormMath,
    RopeConstants,
    add_rms_norm_aot_kernel,
    add_rms_norm_launcher,
    qk_norm_aot_kernel,
    qk_norm_launcher,
    qk_norm_rope_kernel,
    qk_norm_rope_launcher,
    rms_norm_aot_kernel,
    rms_norm_launcher,
)
from trtfuse.kernels.specs import DTYPE_BYTES, AddRmsNormSpec, QkNormRopeSpec, QkNormSpec, RmsNormSpec, has_fp8_stage
from trtfuse.kernels.tiling import ACCESS_BYTES, RowTiling, rotation_plan


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


@dataclass(frozen=True)
class QkNormRopeVariant:
    """The QK-norm + rotary kernel: one variant per spec and arch (it tests its pointers' alignment itself)."""

    spec: QkNormRopeSpec
    q_tiling: RowTiling
    k_tiling: RowTiling
    arch: str

    def rope(self) -> RopeConstants:
        """The rotation's compile-time constants: the parameters and each part's register exchange."""
        rope = self.spec.rope
        plans = tuple(
            rotation_plan(tiling, rope.head_dim, rope.rotary_dim, rope.rotation)
            for tiling in (self.q_tiling, self.k_tiling)
        )
        return RopeConstants(rope, plans)


Variant = RmsNormVariant | AddRmsNormVariant | QkNormVariant | QkNormRopeVariant


def _norm_math(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, quant: QuantParams | None) -> NormMath:
    """One norm's math with its quantizers `quant` (one norm's stages)."""
    rounding = rounding_dtype(spec.dtype, spec.out_dtype)
    if quant is None:
        return NormMath(spec.params, rounding)
    rounds_to_t = any(stage is not None for stage in (quant.normalised, quant.cos_product, quant.output))
    return NormMath(spec.params, rounding, quant, spec.out_dtype if rounds_to_t else None)


def _math(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec) -> NormMath | tuple[NormMath, NormMath]:
    """The kernel's math: one NormMath, or a quantized QK-norm's pair (q's, k's), each part with its own output
    quantizer (a plain QK-norm's one NormMath serves both parts, as its PTX always has)."""
    if isinstance(spec, QkNormSpec):
        if spec.quant is None:
            return _norm_math(spec, None)
        return (_norm_math(spec, spec.part_quant(0)), _norm_math(spec, spec.part_quant(1)))
    return _norm_math(spec, spec.quant)


def _check_arch(spec: RmsNormSpec | AddRmsNormSpec | QkNormSpec, arch: str) -> None:
    if has_fp8_stage(spec) and arch_sm(arch) < FP8_MIN_SM:
        raise ValueError(f"an FP8 quantizer needs sm_{FP8_MIN_SM} or newer (its conversions), not {arch}: {spec}")


def _launch_arguments(variant: Variant, pointer: Callable[[str, RowTiling], cute.Pointer]) -> tuple:
    """The variant's host entry's arguments: its pointers, each `pointer(dtype, tiling)` (the weights' in the
    activations' dtype without a weight: a no-weight kernel still takes the never-read pointer, so every variant has
    the same calling convention), a row count per part, a stream, its tilings and its math."""
    spec = variant.spec
    weight = spec.weight_dtype or spec.dtype
    extra: tuple = ()
    if isinstance(variant, (QkNormVariant, QkNormRopeVariant)):
        tilings = (variant.q_tiling, variant.k_tiling)
        # q, k; their weights; q_out, k_out: each in its part's tiling, each output in its part's stored dtype.
        pointers = [(dtype, tiling) for dtype in (spec.dtype, weight) for tiling in tilings]
        if isinstance(variant, QkNormRopeVariant):
            # cos and sin (promised only element alignment: the kernel tests every pointer itself); then the
            # batch, sequence length and cos batch after the row counts, and the rotation's constants last.
            pointers += [(spec.cos_dtype, tiling) for tiling in tilings]
            extra = (Int32(1), Int32(1), Int32(1))
        pointers += [(spec.part_y_dtype(part), tiling) for part, tiling in enumerate(tilings)]
    else:
        t = variant.tiling
        if isinstance(variant, AddRmsNormVariant):
            pointers = ((spec.dtype, t), (spec.dtype, t), (weight, t), (spec.y_dtype, t), (spec.dtype, t))
        else:
            pointers = ((spec.dtype, t), (weight, t), (spec.y_dtype, t))
        tilings = (t,)
    rows = (Int32(1),) * len(tilings)
    arguments = (*(pointer(dtype, tiling) for dtype, tiling in pointers), *rows, *extra, make_fake_stream())
    if isinstance(variant, QkNormRopeVariant):
        return (*arguments, *tilings, _math(spec), variant.rope())
    return (*arguments, *tilings, _math(spec))


def _vector_ptr(dtype: str, tiling: RowTiling) -> cute.Pointer:
    # The alignment promised here is what lets the compiler emit 16-byte accesses: one per vector, or two for the
    # fp32 side of a row whose other side is 16-bit (a 32-byte vector, aligned to 16).
    align = min(ACCESS_BYTES, tiling.vector * DTYPE_BYTES[dtype])
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=align)


def _element_ptr(dtype: str, tiling: RowTiling) -> cute.Pointer:
    # TensorRT promises a plugin's pointers no alignment beyond the element: the kernel checks for the vector path.
    del tiling
    return make_ptr(CUTLASS_DTYPES[dtype], 0, cute.AddressSpace.gmem, assumed_align=DTYPE_BYTES[dtype])


# Each variant's host entry, and the AOT kernel it launches with `aot=True`.
_ENTRIES = {
    RmsNormVariant: (rms_norm_launcher, rms_norm_aot_kernel),
    AddRmsNormVariant: (add_rms_norm_launcher, add_rms_norm_aot_kernel),
    QkNormVariant: (qk_norm_launcher, qk_norm_aot_kernel),
    QkNormRopeVariant: (qk_norm_rope_launcher, qk_norm_rope_kernel),
}


def compile_variant(variant: Variant, ptx_dir: Path | None = None) -> Any:
    """Compile one variant; its PTX lands in `ptx_dir` when given. Returns CuTeDSL's TVM-FFI compiled function."""
    _check_arch(variant.spec, variant.arch)
    options = f"--enable-tvm-ffi --gpu-arch {variant.arch}"
    if ptx_dir is not None:
        options += f" --keep-ptx --dump-dir {ptx_dir}"
    launcher, _ = _ENTRIES[type(variant)]
    # The rotary kernel tests its pointers itself, so its JIT compile promises what its AOT compile does.
    pointer = _element_ptr if isinstance(variant, QkNormRopeVariant) else _vector_ptr
    return cute.compile(launcher, *_launch_arguments(variant, pointer), options=options)


@dataclass(frozen=True)
class AotCompiled:
    kernel_name: str
    ptx: str
    cubin: bytes


def compile_aot_variant(variant: Variant, entry_prefix: str, dump_dir: Path) -> AotCompiled:
    """Compile `variant` as an ahead-of-time kernel (TensorRT's parameter order, alignment checked in the kernel):
    its PTX, its cubin for `variant.arch`, and the device entry's name, `entry_prefix` plus CuTeDSL's `_0`.

    Sets the entry name on the shared kernel function: the caller serialises compilations."""
    _check_arch(variant.spec, variant.arch)
    launcher, kernel = _ENTRIES[type(variant)]
    # Without a unique prefix, variants differing only in an immediate (epsilon) would share an entry name.
    kernel.set_name_prefix(entry_prefix, remove_cutlass_symbol=True, keep_mangled_name=False)
    options = f"--gpu-arch {variant.arch} --keep-ptx --keep-cubin --dump-dir {dump_dir}"
    compiled = cute.compile(launcher, *_launch_arguments(variant, _element_ptr), aot=True, options=options)
    (kernel_name,) = compiled.kernel_info
    return AotCompiled(kernel_name=kernel_name, ptx=compiled.artifacts.PTX, cubin=bytes(compiled.artifacts.CUBIN))
