"""The GPU the kernels are built for: architecture string and SM count, read once through the CUDA driver."""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass

import cuda.bindings.driver as cuda

# Without a GPU (CI), kernels are compiled for CUTE_DSL_ARCH, default Hopper, and tiled for an H100/H200's 132 SMs.
DEFAULT_ARCH = "sm_90a"
DEFAULT_SM_COUNT = 132


# cvt.rn.satfinite.e4m3x2.f32 and cvt.rn.f16x2.e4m3x2 (PTX ISA: sm_89 and newer).
FP8_MIN_SM = 89


def arch_sm(arch: str) -> int:
    """The compute capability of a CuTeDSL arch string as a number: "sm_90a" -> 90."""
    return int("".join(c for c in arch if c.isdigit()))


@dataclass(frozen=True)
class DeviceInfo:
    arch: str  # CuTeDSL's --gpu-arch, e.g. "sm_90a"
    sm_count: int
    has_gpu: bool
    name: str = ""  # the driver's name of the GPU ("NVIDIA H100 80GB HBM3"); "" without one


def arch_for(major: int, minor: int) -> str:
    """CuTeDSL names Hopper and Blackwell datacenter parts with the 'a' suffix that unlocks their own instructions."""
    suffix = "a" if major in (9, 10) and minor == 0 else ""
    return f"sm_{major}{minor}{suffix}"


def _attribute(attr: cuda.CUdevice_attribute, device: cuda.CUdevice) -> int:
    err, value = cuda.cuDeviceGetAttribute(attr, device)
    if err != cuda.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"cuDeviceGetAttribute({attr.name}) failed: {err.name}")
    return int(value)


@functools.cache
def current_device() -> DeviceInfo:
    """The current context's device (device 0 when no context is current); a compile-only target without a GPU."""
    try:
        (err,) = cuda.cuInit(0)
    except RuntimeError:  # cuda-bindings raises when libcuda itself is missing (no driver installed)
        err = cuda.CUresult.CUDA_ERROR_NO_DEVICE
    count = cuda.cuDeviceGetCount()[1] if err == cuda.CUresult.CUDA_SUCCESS else 0
    if count == 0:
        return DeviceInfo(arch=os.environ.get("CUTE_DSL_ARCH", DEFAULT_ARCH), sm_count=DEFAULT_SM_COUNT, has_gpu=False)
    err, device = cuda.cuCtxGetDevice()
    if err != cuda.CUresult.CUDA_SUCCESS:
        device = cuda.cuDeviceGet(0)[1]
    attrs = cuda.CUdevice_attribute
    major = _attribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, device)
    minor = _attribute(attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, device)
    sms = _attribute(attrs.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device)
    err, name = cuda.cuDeviceGetName(256, device)
    name = name.split(b"\0", 1)[0].decode(errors="replace") if err == cuda.CUresult.CUDA_SUCCESS else ""
    return DeviceInfo(arch=arch_for(major, minor), sm_count=sms, has_gpu=True, name=name)


def fp8_refusal(device: DeviceInfo) -> str | None:
    """Why `device` cannot run an FP8 quantizer stage, naming its architecture; None where it can (or, without a
    GPU, where nothing runs here)."""
    if device.has_gpu and arch_sm(device.arch) < FP8_MIN_SM:
        return f"FP8 needs a GPU of sm_{FP8_MIN_SM} or newer and this one is {device.arch}"
    return None


def driver_version() -> int | None:
    """The CUDA driver's version as cuDriverGetVersion gives it (13000 for 13.0); None without a driver."""
    try:
        err, version = cuda.cuDriverGetVersion()
    except RuntimeError:  # libcuda missing
        return None
    return int(version) if err == cuda.CUresult.CUDA_SUCCESS else None


def _cuda_text(version: int) -> str:
    return f"{version // 1000}.{version % 1000 // 10}"


def ptx_isa(ptx: str) -> str:
    """The PTX ISA version `ptx` declares (".version 8.8" -> "8.8")."""
    found = re.search(r"^\s*\.version\s+(\d+\.\d+)", ptx, re.MULTILINE)
    if found is None:
        raise ValueError("the PTX has no .version directive")
    return found.group(1)


def ptx_target(ptx: str) -> str:
    """The architecture `ptx` is for (".target sm_90a" -> "sm_90a")."""
    found = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
    if found is None:
        raise ValueError("the PTX has no .target directive")
    return found.group(1)


def ptx_driver_problem(ptx: str, driver: int | None) -> str | None:
    """Why a CUDA driver of version `driver` cannot JIT-compile `ptx` (its ISA is newer than the driver knows);
    None when it can, or when there is no driver to ask."""
    if driver is None:
        return None
    return isa_driver_problem(ptx_isa(ptx), driver, ptx_target(ptx))


def isa_driver_problem(isa: str, driver: int, target: str) -> str | None:
    """`ptx_driver_problem` for PTX of ISA `isa` for `target`. CUDA's PTX ISA table (cuda-bindings >= 12.9.1) says
    which driver an ISA needs; an ISA the installed table does not know (newer than that cuda-bindings: the H200's
    13.3.1 did not know CuTeDSL-cu13's 9.4) is put to the driver itself (`driver_accepts_isa`)."""
    needed = _cuda_for_isa(isa)
    if needed is not None:
        if driver >= needed:
            return None
        return (
            f"the kernels' PTX is ISA {isa}, which needs a CUDA {_cuda_text(needed)} driver; "
            f"this machine's driver is CUDA {_cuda_text(driver)}"
        )
    if driver_accepts_isa(isa, target) is False:
        return f"the kernels' PTX is ISA {isa}, which this machine's CUDA {_cuda_text(driver)} driver does not accept"
    return None


def _cuda_for_isa(isa: str) -> int | None:
    """The CUDA version PTX ISA `isa` first shipped with, from cuda-bindings' table; None where it does not know."""
    try:
        from cuda.bindings.utils import get_minimal_required_cuda_ver_from_ptx_ver
    except ImportError:
        return None
    try:
        return int(get_minimal_required_cuda_ver_from_ptx_ver(isa))
    except ValueError:
        return None


def driver_accepts_isa(isa: str, target: str) -> bool | None:
    """Whether this machine's CUDA driver JIT-compiles PTX of ISA `isa` for `target`: an empty kernel declaring both
    is loaded into device 0's primary context. None when no GPU can be asked."""
    probe = f".version {isa}\n.target {target}\n.address_size 64\n.visible .entry trtfuse_isa_probe()\n{{\n\tret;\n}}\n"
    success = cuda.CUresult.CUDA_SUCCESS
    try:
        (err,) = cuda.cuInit(0)
    except RuntimeError:  # libcuda missing
        return None
    if err != success:
        return None
    err, device = cuda.cuDeviceGet(0)
    if err != success:
        return None
    err, context = cuda.cuDevicePrimaryCtxRetain(device)
    if err != success:
        return None
    try:
        (err,) = cuda.cuCtxPushCurrent(context)
        if err != success:
            return None
        try:
            err, module = cuda.cuModuleLoadData(probe.encode() + b"\0")
            if err == success:
                cuda.cuModuleUnload(module)
                return True
            return False if err == cuda.CUresult.CUDA_ERROR_UNSUPPORTED_PTX_VERSION else None
        finally:
            cuda.cuCtxPopCurrent()
    finally:
        cuda.cuDevicePrimaryCtxRelease(device)
