"""An engine in memory, for timing and for reading how it runs: its runtime, engine and one execution context, the
buffers of one shape set at a time, a per-layer profiler, and the engine inspector's layer information.

Every call here is TensorRT's Python API as its bindings declare it (python/src/infer/pyCore.cpp, the same in
10.8 to 11.1): `Runtime.deserialize_cuda_engine`, `ICudaEngine.create_execution_context`,
`create_engine_inspector` / `EngineInspector.get_engine_information(LayerInformationFormat.JSON)`,
`IExecutionContext.set_optimization_profile_async`, `set_input_shape`, `get_tensor_shape`, `set_tensor_address`,
`execute_async_v3`, `profiler` with `IProfiler.report_layer_time(layer_name, ms)`. The CUDA side (stream, buffers,
graphs, events) is `cuda_timing`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from types import ModuleType, TracebackType
from typing import Any

import numpy as np

from trtfuse.engine.cuda_timing import DeviceBuffer, Enqueue, synchronize
from trtfuse.engine.layer_profile import LayerTimeCollector, LayerTimes
from trtfuse.engine.timing_cases import TimingCase
from trtfuse.errors import TrtfuseError, first_line


@dataclass
class BoundCase:
    """A case's buffers bound to the context: what `enqueue` runs. Host arrays of shape-tensor inputs are held here
    so that their addresses stay valid."""

    case: TimingCase
    enqueue: Enqueue
    buffers: list[DeviceBuffer] = field(default_factory=list)
    host_inputs: list[np.ndarray] = field(default_factory=list)

    def release(self) -> None:
        for buffer in self.buffers:
            buffer.free()
        self.buffers.clear()


def _nbytes(shape: tuple[int, ...], itemsize: float) -> int:
    return math.ceil(math.prod(shape) * itemsize)


def _profiler(trt: ModuleType, collector: LayerTimeCollector) -> Any:
    """A `trt.IProfiler` that hands each report to `collector` (made here: the class needs TensorRT to exist)."""

    class Collector(trt.IProfiler):
        def __init__(self) -> None:
            trt.IProfiler.__init__(self)

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            collector.report(layer_name, ms)

    return Collector()


class LoadedEngine:
    """A context manager over one deserialised engine and one execution context on `stream`; `label` names it in
    errors ("the trtfuse engine", "TensorRT's engine of the original")."""

    def __init__(self, trt: ModuleType, engine_bytes: bytes | memoryview, label: str, stream: int) -> None:
        self.trt = trt
        self.label = label
        self.stream = stream
        self._bytes = engine_bytes
        self.runtime: Any = None
        self.engine: Any = None
        self.context: Any = None

    def __enter__(self) -> LoadedEngine:
        trt = self.trt
        self.runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = self.runtime.deserialize_cuda_engine(self._bytes)
        if self.engine is None:
            raise TrtfuseError(f"{self.label}: TensorRT could not deserialise the engine it built (its log above)")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise TrtfuseError(f"{self.label}: TensorRT could not create an execution context (out of GPU memory?)")
        # Engines are built with detailed profiling verbosity, which "will generally increase latency in enqueueV3()"
        # (NvInferRuntime.h, IExecutionContext::setNvtxVerbosity); timed at the default level, as trtexec times them
        # unless asked for more. The inspector's detail does not depend on it.
        self.context.nvtx_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        # The context before the engine before the runtime, as TensorRT requires.
        self.context = None
        self.engine = None
        self.runtime = None

    def bind(self, case: TimingCase) -> BoundCase:
        """Switch to the case's profile, set its input shapes, upload its feed and give every output a buffer."""
        trt, engine, context = self.trt, self.engine, self.context
        try:
            # The binding raises where TensorRT refuses (pyCore.cpp's context_set_optimization_profile_async).
            context.set_optimization_profile_async(case.profile_index, self.stream)
        except RuntimeError as error:
            raise TrtfuseError(
                f"{self.label}: TensorRT refused optimisation profile {case.profile_index} ({first_line(error)})"
            ) from None
        synchronize(self.stream)
        bound = BoundCase(case, lambda stream: bool(context.execute_async_v3(stream)))
        names = [engine.get_tensor_name(index) for index in range(engine.num_io_tensors)]
        inputs = [name for name in names if engine.get_tensor_mode(name) == trt.TensorIOMode.INPUT]
        missing = sorted(set(inputs) - set(case.feed))
        if missing:
            raise TrtfuseError(f"{self.label}: the {case.name} feed lacks input(s) {', '.join(missing)}")
        try:
            for name in inputs:
                self._bind_input(bound, name, np.ascontiguousarray(case.feed[name]))
            for name in names:
                if name not in inputs:
                    self._bind_output(bound, name)
        except BaseException:
            bound.release()
            raise
        return bound

    def _bind_input(self, bound: BoundCase, name: str, array: np.ndarray) -> None:
        trt, engine, context = self.trt, self.engine, self.context
        if not context.set_input_shape(name, array.shape):
            raise TrtfuseError(f"{self.label}: TensorRT refused shape {array.shape} for input '{name}'")
        if engine.get_tensor_location(name) == trt.TensorLocation.HOST:
            # A shape tensor TensorRT reads on the host: its values stay in a host array the case holds.
            bound.host_inputs.append(array)
            address = array.ctypes.data
        else:
            buffer = DeviceBuffer(array.nbytes)
            bound.buffers.append(buffer)
            buffer.upload(array)
            address = buffer.address
        if not context.set_tensor_address(name, address):
            raise TrtfuseError(f"{self.label}: TensorRT refused the address of input '{name}'")

    def _bind_output(self, bound: BoundCase, name: str) -> None:
        shape = tuple(self.context.get_tensor_shape(name))
        if any(dim < 0 for dim in shape):
            raise TrtfuseError(f"{self.label}: output '{name}' has no shape at the {bound.case.name} inputs ({shape})")
        buffer = DeviceBuffer(_nbytes(shape, self.engine.get_tensor_dtype(name).itemsize))
        bound.buffers.append(buffer)
        if not self.context.set_tensor_address(name, buffer.address):
            raise TrtfuseError(f"{self.label}: TensorRT refused the address of output '{name}'")

    def layer_times(self, bound: BoundCase, runs: int) -> tuple[tuple[LayerTimes, ...], int]:
        """Each layer's time in each of `runs` runs of the bound case, TensorRT's profiler attached, and the count of
        runs the profiler saw; enqueue then emits the profile itself and synchronises
        (`IExecutionContext::setEnqueueEmitsProfile`, true by default), so these runs are slower than timed ones and
        serve only to share a run's time out among the layers."""
        collector = LayerTimeCollector()
        self.context.profiler = _profiler(self.trt, collector)
        try:
            for _ in range(runs):
                if not bound.enqueue(self.stream):
                    raise TrtfuseError(f"{self.label}: TensorRT could not enqueue a profiled run")
                synchronize(self.stream)
        finally:
            self.context.profiler = None
        return collector.layer_times(), collector.count


def engine_layer_information(trt: ModuleType, engine_bytes: bytes | memoryview) -> str:
    """The engine inspector's JSON of serialised engine bytes, with no execution context (none is needed, and
    creating one would take the engine's activation memory)."""
    runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
    engine = runtime.deserialize_cuda_engine(engine_bytes)
    if engine is None:
        raise TrtfuseError("TensorRT could not deserialise the engine it built (its log above says why)")
    inspector = engine.create_engine_inspector()
    return inspector.get_engine_information(trt.LayerInformationFormat.JSON)
