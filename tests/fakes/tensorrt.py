"""Stand-ins for TensorRT's builder side: just enough of `tensorrt` for `build_engine` to run its calls in order,
recording the network flags and how the model was parsed. They check trtfuse's calls, never an engine."""

from __future__ import annotations

import types


class Flags:
    """NetworkDefinitionCreationFlag of a TensorRT without AOT plugins (before 10.9)."""

    STRONGLY_TYPED = 1


class OptimizationProfile:
    def __init__(self, refuse_shapes: bool) -> None:
        self.refuse_shapes = refuse_shapes
        self.values: dict[str, tuple] = {}

    def set_shape(self, name, low, opt, high):
        if self.refuse_shapes:
            # What TensorRT's binding raises (PY_ASSERT_RUNTIME_ERROR in pyCore.cpp's opt_profile_set_shape).
            raise RuntimeError("Shape provided for opt is inconsistent with other shapes.")

    def set_shape_input(self, name, low, opt, high):
        self.values[name] = (low, opt, high)


class ProfileBuilder:
    def __init__(self, refuse_shapes: bool) -> None:
        self.refuse_shapes = refuse_shapes

    def create_optimization_profile(self):
        return OptimizationProfile(self.refuse_shapes)


class ProfileConfig:
    def __init__(self, index: int) -> None:
        self.index = index
        self.profiles: list[OptimizationProfile] = []

    def add_optimization_profile(self, profile):
        self.profiles.append(profile)
        return self.index


class AotFlags:
    """NetworkDefinitionCreationFlag's values in NvInfer.h at v10.9.0 (STRONGLY_TYPED 1, PREFER_AOT 3)."""

    STRONGLY_TYPED = 1
    PREFER_JIT_PYTHON_PLUGINS = 2
    PREFER_AOT_PYTHON_PLUGINS = 3


class AotFlags11:
    """The same at v11.1, where STRONGLY_TYPED is deprecated (ignored) and the others moved down by one."""

    STRONGLY_TYPED = 0
    PREFER_JIT_PYTHON_PLUGINS = 1
    PREFER_AOT_PYTHON_PLUGINS = 2


class Parser:
    def __init__(self, calls: dict) -> None:
        self.calls = calls
        self.num_errors = 0

    def parse(self, model: bytes, path: str) -> bool:
        self.calls["parse"] = (model, path)
        return True

    def parse_from_file(self, path: str) -> bool:
        self.calls["parse_from_file"] = path
        return True


class BuilderConfig:
    builder_optimization_level = 3
    progress_monitor = None
    # IBuilderConfig.profiling_verbosity: TensorRT's default, kLAYER_NAMES_ONLY (NvInferRuntime.h@v10.16:2974).
    profiling_verbosity = 0

    def clear_flag(self, flag):
        pass

    def set_memory_pool_limit(self, pool, size):
        pass

    timing_cache = None

    def create_timing_cache(self, data):
        return bytes(data)

    def set_timing_cache(self, cache, ignore_mismatch):
        self.timing_cache = cache
        return True

    def get_timing_cache(self):
        """The cache the build started from, with b"+timed" added for the timings this build made."""
        if self.timing_cache is None:
            return None
        return types.SimpleNamespace(serialize=lambda: self.timing_cache + b"+timed")

    def add_optimization_profile(self, profile):
        return 0


class Network:
    """The parsed network's inputs, as `INetworkDefinition.num_inputs` / `get_input(i)` give them: each with its
    name and `is_shape_tensor` (`shape_inputs` says which)."""

    def __init__(self, inputs: tuple[str, ...] = (), shape_inputs: frozenset[str] = frozenset()) -> None:
        self.inputs = [types.SimpleNamespace(name=name, is_shape_tensor=name in shape_inputs) for name in inputs]

    @property
    def num_inputs(self) -> int:
        return len(self.inputs)

    def get_input(self, index: int):
        return self.inputs[index]


# An engine inspector's answer for an engine of no layers, in the JSON writer's layout (shared/trt-layer-info).
NO_LAYERS = '{"Layers": [],\n"Bindings": []}\n'


def fake_tensorrt(
    version: str,
    calls: dict,
    inputs: tuple[str, ...] = (),
    shape_inputs: frozenset[str] = frozenset(),
    layer_information: str = NO_LAYERS,
) -> types.ModuleType:
    """Just enough of `tensorrt` for `build_engine` to run its calls in order; it records the network flags, how
    the model was parsed and the builder config's profiling verbosity, and builds the bytes b"engine", whose engine
    inspector answers `layer_information`. Its network has `inputs`, of which `shape_inputs` are shape tensors."""

    class Builder:
        def __init__(self, logger):
            pass

        def create_network(self, flags):
            calls["flags"] = flags
            return Network(inputs, shape_inputs)

        def create_optimization_profile(self):
            return OptimizationProfile(refuse_shapes=False)

        def create_builder_config(self):
            return BuilderConfig()

        def build_serialized_network(self, network, config):
            calls["profiling_verbosity"] = config.profiling_verbosity
            return b"engine"

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data):
            calls["deserialized"] = bytes(data)
            inspector = types.SimpleNamespace(get_engine_information=lambda form: _inspected(form))
            return types.SimpleNamespace(create_engine_inspector=lambda: inspector)

    def _inspected(form):
        calls["layer_information_format"] = form
        return layer_information

    class Logger:
        WARNING = 2

        def __init__(self, severity):
            pass

    class IProgressMonitor:
        def __init__(self):
            pass

    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.Builder, trt.Logger, trt.IProgressMonitor, trt.Runtime = Builder, Logger, IProgressMonitor, Runtime
    trt.OnnxParser = lambda network, logger: Parser(calls)
    trt.NetworkDefinitionCreationFlag = AotFlags
    trt.BuilderFlag = types.SimpleNamespace(TF32=0)
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE=0)
    # NvInferRuntime.h@v10.16: ProfilingVerbosity 2972-2977, LayerInformationFormat 5255-5259.
    trt.ProfilingVerbosity = types.SimpleNamespace(LAYER_NAMES_ONLY=0, NONE=1, DETAILED=2)
    trt.LayerInformationFormat = types.SimpleNamespace(ONELINE=0, JSON=1)
    return trt
