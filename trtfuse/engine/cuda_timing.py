"""The CUDA side of timing an engine: a stream, device buffers, a CUDA graph of one run, and event timing of graph
replays, through cuda-python's runtime bindings.

It knows nothing of TensorRT: what it times is an `Enqueue`, a function that puts one run on a stream and says
whether it could (`IExecutionContext.execute_async_v3` is one), so the GPU tests time plain CUDA work with it.
Capture follows trtexec (`samples/common/sampleInference.cpp`, `sampleDevice.h`): one eager run and a
synchronise first, so that what runs once per shape (a plugin's `on_shape_change`, a module load) stays out of the
graph, then a thread-local capture; a run that cannot be captured (TensorRT returns false, or the capture is
invalidated) is timed eagerly instead, and the result says which.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtfuse.errors import MissingDependencyError, TrtfuseError

# Puts one run on the stream (a CUDA stream handle as an int); False when it could not.
Enqueue = Callable[[int], bool]


def _runtime() -> Any:
    try:
        from cuda.bindings import runtime as cudart
    except ImportError:
        raise MissingDependencyError(
            "timing an engine takes cuda-python's runtime bindings (`pip install cuda-python`)"
        ) from None
    return cudart


def checked(result: tuple, what: str) -> Any:
    """The value of a cuda-python call's (error, value...) result; a failure is one line naming the call."""
    cudart = _runtime()
    error, *values = result
    if error != cudart.cudaError_t.cudaSuccess:
        raise TrtfuseError(f"CUDA {what} failed: {error.name}")
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)


class DeviceBuffer:
    """`nbytes` of device memory (at least one byte, so that every tensor has an address), freed by `free`."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = max(int(nbytes), 1)
        self.address: int = int(checked(_runtime().cudaMalloc(self.nbytes), "cudaMalloc"))

    def upload(self, array: np.ndarray) -> None:
        """The array's bytes to the start of the buffer (the caller sized the buffer for them)."""
        cudart = _runtime()
        host = np.ascontiguousarray(array)
        if host.nbytes > self.nbytes:
            raise TrtfuseError(f"an input of {host.nbytes} bytes does not fit its buffer of {self.nbytes}")
        kind = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
        checked(cudart.cudaMemcpy(self.address, host.ctypes.data, host.nbytes, kind), "cudaMemcpy")

    def free(self) -> None:
        if self.address:
            checked(_runtime().cudaFree(self.address), "cudaFree")
            self.address = 0


@contextmanager
def cuda_stream() -> Iterator[int]:
    """A non-blocking stream, destroyed on exit; yields its handle as TensorRT takes it."""
    cudart = _runtime()
    stream = checked(cudart.cudaStreamCreateWithFlags(cudart.cudaStreamNonBlocking), "cudaStreamCreateWithFlags")
    try:
        yield int(stream)
    finally:
        checked(cudart.cudaStreamDestroy(stream), "cudaStreamDestroy")


def synchronize(stream: int) -> None:
    checked(_runtime().cudaStreamSynchronize(stream), "cudaStreamSynchronize")


@dataclass
class Replay:
    """One run ready to repeat: a CUDA graph of it where the capture succeeded (`graph` True), else the eager
    enqueue. `release` destroys the graph."""

    stream: int
    enqueue: Enqueue
    graph_exec: Any = None

    @property
    def graph(self) -> bool:
        return self.graph_exec is not None

    def launch(self) -> None:
        if self.graph_exec is not None:
            checked(_runtime().cudaGraphLaunch(self.graph_exec, self.stream), "cudaGraphLaunch")
        elif not self.enqueue(self.stream):
            raise TrtfuseError("TensorRT could not enqueue the run (its log above says why)")

    def release(self) -> None:
        if self.graph_exec is not None:
            checked(_runtime().cudaGraphExecDestroy(self.graph_exec), "cudaGraphExecDestroy")
            self.graph_exec = None


def prepare_replay(enqueue: Enqueue, stream: int, use_graph: bool = True) -> Replay:
    """One eager run and a synchronise (a failure there is an error: the run itself does not work), then, with
    `use_graph`, a capture of one run into a CUDA graph; a run that cannot be captured falls back to eager runs."""
    cudart = _runtime()
    if not enqueue(stream):
        raise TrtfuseError("TensorRT could not enqueue the run (its log above says why)")
    synchronize(stream)
    replay = Replay(stream, enqueue)
    if not use_graph:
        return replay
    mode = cudart.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
    checked(cudart.cudaStreamBeginCapture(stream, mode), "cudaStreamBeginCapture")
    captured = enqueue(stream)
    error, graph = cudart.cudaStreamEndCapture(stream)
    if captured and error == cudart.cudaError_t.cudaSuccess:
        replay.graph_exec = checked(cudart.cudaGraphInstantiate(graph, 0), "cudaGraphInstantiate")
    # A graph that came back but is not used (TensorRT said no) is destroyed; an invalidated capture returns none.
    if error == cudart.cudaError_t.cudaSuccess and graph is not None and int(graph) != 0:
        checked(cudart.cudaGraphDestroy(graph), "cudaGraphDestroy")
    # Clears the error an invalidated capture leaves, as trtexec does.
    cudart.cudaGetLastError()
    return replay


def time_replays_ms(replay: Replay, runs: int) -> float:
    """The mean time of one run over `runs` back-to-back launches, from events around them (ms)."""
    cudart = _runtime()
    start = checked(cudart.cudaEventCreate(), "cudaEventCreate")
    end = checked(cudart.cudaEventCreate(), "cudaEventCreate")
    try:
        checked(cudart.cudaEventRecord(start, replay.stream), "cudaEventRecord")
        for _ in range(runs):
            replay.launch()
        checked(cudart.cudaEventRecord(end, replay.stream), "cudaEventRecord")
        checked(cudart.cudaEventSynchronize(end), "cudaEventSynchronize")
        elapsed = float(checked(cudart.cudaEventElapsedTime(start, end), "cudaEventElapsedTime"))
    finally:
        checked(cudart.cudaEventDestroy(start), "cudaEventDestroy")
        checked(cudart.cudaEventDestroy(end), "cudaEventDestroy")
    return elapsed / runs


def round_ms(replay: Replay, runs: int, batches: int) -> float:
    """One round's time of a run: the median over `batches` event-timed batches of `runs` launches."""
    return statistics.median(time_replays_ms(replay, runs) for _ in range(batches))


def gpu_memory_in_use() -> int:
    """Bytes in use on the current GPU, device-wide (other processes count too), after the device is idle; no usable
    GPU is a missing dependency."""
    cudart = _runtime()
    (error,) = cudart.cudaDeviceSynchronize()
    if error == cudart.cudaError_t.cudaSuccess:
        error, free, total = cudart.cudaMemGetInfo()
    if error != cudart.cudaError_t.cudaSuccess:
        raise MissingDependencyError(f"no usable NVIDIA GPU (CUDA: {error.name})")
    return int(total) - int(free)
