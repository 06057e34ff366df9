"""A kernel's arguments as its launch declaration orders and types them, packed for cuLaunchKernel."""

from __future__ import annotations

import ctypes
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from trtfuse.kernels.declaration import LaunchDeclaration, ParamRole

U32_LIMIT = 1 << 32
U64_LIMIT = 1 << 64


@dataclass(frozen=True)
class PackedParams:
    """cuLaunchKernel's `kernelParams`: an array of pointers, one per kernel parameter, each to its value's bytes.

    cuda-bindings takes the array's address as an int (cuda/bindings/_lib/utils.pxi, _HelperKernelParams); the
    driver copies the values at the call (or at capture, in a CUDA graph), so these must live only until it returns.
    """

    values: tuple[ctypes.c_uint64 | ctypes.c_uint32, ...]
    array: ctypes.Array

    @property
    def address(self) -> int:
        return ctypes.addressof(self.array)


def pointer_names(declaration: LaunchDeclaration) -> tuple[str, ...]:
    return tuple(p.name for p in declaration.params if p.role is not ParamRole.SCALAR)


def argument_values(
    declaration: LaunchDeclaration, pointers: Mapping[str, int], rows: Sequence[int], extents: Sequence[int] = ()
) -> list[int]:
    """Each kernel parameter's value in declaration order: pointers by parameter name, the scalars from the row
    counts and the declaration's extents (declaration.scalars)."""
    expected = set(pointer_names(declaration))
    if set(pointers) != expected:
        raise ValueError(f"{declaration.kernel_name} takes pointers {sorted(expected)}, got {sorted(pointers)}")
    scalars = list(declaration.scalars(rows, extents))
    scalar_params = [p for p in declaration.params if p.role is ParamRole.SCALAR]
    if len(scalars) != len(scalar_params):
        raise ValueError(f"{declaration.kernel_name}: {len(scalar_params)} scalar parameters, {len(scalars)} scalars")
    by_name = dict(zip((p.name for p in scalar_params), scalars, strict=True)) | dict(pointers)
    return [by_name[p.name] for p in declaration.params]


def pack_params(declaration: LaunchDeclaration, values: Sequence[int]) -> PackedParams:
    """Pointers as u64 and scalars as u32, in parameter order (the `.param` types of the PTX entry)."""
    if len(values) != len(declaration.params):
        raise ValueError(f"{declaration.kernel_name} has {len(declaration.params)} parameters, got {len(values)}")
    packed: list[ctypes.c_uint64 | ctypes.c_uint32] = []
    for param, value in zip(declaration.params, values, strict=True):
        scalar = param.role is ParamRole.SCALAR
        limit = U32_LIMIT if scalar else U64_LIMIT
        if not 0 <= value < limit:
            raise ValueError(f"{declaration.kernel_name}: {param.name} = {value} does not fit {param.ptx_type}")
        packed.append(ctypes.c_uint32(value) if scalar else ctypes.c_uint64(value))
    array = (ctypes.c_void_p * len(packed))(*(ctypes.addressof(v) for v in packed))
    return PackedParams(tuple(packed), array)
