"""An artifact loaded and launched with the CUDA driver API alone: cuModuleLoadData, cuLaunchKernel."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import cuda.bindings.driver as cuda_driver
import torch

from trtfuse.bench.aot.params import argument_values, pack_params
from trtfuse.kernels.declaration import KernelArtifact

DEFAULT_SHARED_LIMIT_BYTES = 48 * 1024  # more needs CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES first


def check_cu(result: Any, what: str) -> Any:
    """Unwrap a cuda-bindings (CUresult, values...) tuple, raising with the call and the error name on failure."""
    err, *values = result
    if err != cuda_driver.CUresult.CUDA_SUCCESS:
        raise RuntimeError(f"{what} failed: {err.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def bind_torch_context() -> None:
    """Make torch's CUDA context (the device's primary context) current on this thread for the driver calls."""
    torch.empty(1, device="cuda")  # the runtime creates the primary context on first use
    check_cu(cuda_driver.cuInit(0), "cuInit")
    context = check_cu(cuda_driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
    if int(context) == 0:
        device = check_cu(cuda_driver.cuDeviceGet(torch.cuda.current_device()), "cuDeviceGet")
        context = check_cu(cuda_driver.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        check_cu(cuda_driver.cuCtxSetCurrent(context), "cuCtxSetCurrent")


def module_image(artifact: KernelArtifact, image: str) -> bytes:
    """What cuModuleLoadData takes: the PTX as NUL-terminated text, or the cubin's bytes."""
    if image == "ptx":
        return artifact.ptx.encode() + b"\0"
    if image == "cubin":
        return artifact.cubin
    raise ValueError(f"image must be 'ptx' or 'cubin', got {image!r}")


class DriverKernel:
    """One artifact loaded into the current context, launched only through the CUDA driver API."""

    def __init__(self, artifact: KernelArtifact, image: str) -> None:
        self.declaration = artifact.declaration
        self.image = image
        loaded = cuda_driver.cuModuleLoadData(module_image(artifact, image))
        self._module = check_cu(loaded, f"cuModuleLoadData({image})")
        name = self.declaration.kernel_name
        self._function = check_cu(
            cuda_driver.cuModuleGetFunction(self._module, name.encode()), f"cuModuleGetFunction({name})"
        )
        if self.declaration.shared_mem > DEFAULT_SHARED_LIMIT_BYTES:
            attribute = cuda_driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
            result = cuda_driver.cuFuncSetAttribute(self._function, attribute, self.declaration.shared_mem)
            check_cu(result, "cuFuncSetAttribute")

    def launch(
        self, pointers: Mapping[str, int], rows: Sequence[int], stream: int, extents: Sequence[int] = ()
    ) -> None:
        """Enqueue on `stream` (a CUstream as int): grid from the row counts, block and shared memory as declared;
        `extents` the values of the declaration's extents (the rotary kernel's shapes)."""
        declaration = self.declaration
        packed = pack_params(declaration, argument_values(declaration, pointers, rows, extents))
        result = cuda_driver.cuLaunchKernel(
            self._function,
            declaration.grid_x(rows),
            1,
            1,
            declaration.block_threads,
            1,
            1,
            declaration.shared_mem,
            stream,
            packed.address,
            0,
        )
        check_cu(result, f"cuLaunchKernel({declaration.kernel_name})")

    def unload(self) -> None:
        check_cu(cuda_driver.cuModuleUnload(self._module), "cuModuleUnload")


def captured_launch(
    kernel: DriverKernel, pointers: Mapping[str, int], rows: Sequence[int], extents: Sequence[int] = ()
) -> torch.cuda.CUDAGraph:
    """One launch captured into a graph on a side stream, as an enqueue is under its caller's capture. Without
    torch.cuda.graph's context manager, whose gc.collect and empty_cache per capture would cost more than the
    hundreds of captures here."""
    torch.cuda.synchronize()  # the inputs were written on the default stream
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream):
        graph.capture_begin()
        try:
            kernel.launch(pointers, rows, stream.cuda_stream, extents)
        finally:
            graph.capture_end()
    return graph
