"""Build a TensorRT engine from a fused model, written atomically with its sidecar.

The TensorRT calls live in `build_engine` and its helpers here; the options and plugin-kind policy
(`build_options`), the parser's errors (`parser_errors`), the progress lines (`progress`) and the sidecar's schema
(`sidecar`) are plain Python that the CPU tests exercise.
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import onnx

import trtfuse
from trtfuse import contract
from trtfuse.contract import PluginKind
from trtfuse.contract.codec import NodeFields, from_node
from trtfuse.engine.build_options import BuildOptions, aot_refusal_of, plugin_kind_for, quant_refusal_of
from trtfuse.engine.engine_report import EngineReport, analyse
from trtfuse.engine.layer_info import parse_layer_information
from trtfuse.engine.layer_profile import write_layer_information
from trtfuse.engine.parser_errors import ParserIssue, parser_error_line
from trtfuse.engine.profiles import Profile
from trtfuse.engine.progress import BuildProgress, progress_monitor
from trtfuse.engine.sidecar import layer_information_path, make_sidecar, write_sidecar
from trtfuse.engine.tensorrt import import_tensorrt, plugin_creation_errors, register_plugins
from trtfuse.engine.timing_cache import read_timing_cache, write_timing_cache
from trtfuse.errors import MissingDependencyError, TrtfuseError, first_line
from trtfuse.files import resolved, write_bytes_atomic
from trtfuse.fusion.aot_form import prepare_for_aot
from trtfuse.fusion.fused_nodes import plugin_node_counts
from trtfuse.model.onnx_file import LoadedModel

# From this major version every network is strongly typed and the STRONGLY_TYPED flag is deprecated and ignored.
ALWAYS_STRONGLY_TYPED_MAJOR = 11
# The network flag that asks the parser for a plugin's AOT implementation (NvInfer.h: 3 in 10.9, 2 in 11.x, hence
# the name); trtfuse's AOT nodes also carry the node attribute that demands it.
PREFER_AOT_FLAG = "PREFER_AOT_PYTHON_PLUGINS"


@dataclass(frozen=True)
class BuildResult:
    engine_path: Path
    sidecar_path: Path
    sidecar: dict
    seconds: float
    # The engine inspector's JSON (None where it could not be read), as written to `layer_information_path`, and
    # what it says of the trtfuse nodes (None without either).
    layer_information: str | None = None
    engine_report: EngineReport | None = None

    @property
    def plugin_kind(self) -> PluginKind:
        return PluginKind(self.sidecar["build"]["plugins"])


def plugins_used(model: onnx.ModelProto) -> list[dict]:
    """Each trtfuse plugin the fused graph uses, with its namespace, version and number of nodes (the sidecar's
    `plugins`)."""
    return [
        {"name": op, "namespace": contract.PLUGIN_NAMESPACE, "version": contract.PLUGIN_VERSION, "nodes": count}
        for op, count in plugin_node_counts(model).items()
        if count
    ]


def tool_versions(tensorrt_version: str) -> dict[str, str]:
    return {
        "trtfuse": trtfuse.__version__,
        "tensorrt": tensorrt_version,
        "nvidia-cutlass-dsl": _distribution_version("nvidia-cutlass-dsl"),
    }


def _distribution_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def gpu_name() -> str:
    """The name of GPU 0 as the driver reports it (nvidia-smi needs no Python CUDA package)."""
    try:
        result = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader", "--id=0"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() or "unknown"


def network_flags(trt: ModuleType, plugins: PluginKind | None = PluginKind.PYTHON) -> int:
    """Strongly typed, so the fp16/bf16 types of the ONNX graph are kept as written: the flag below TensorRT 11, where
    it is deprecated (and every network is strongly typed). It is also what a quantized node's FP8 / INT8 outputs
    need: in a strongly typed network they are the types its getOutputDataTypes gives and the DequantizeLinear after
    it takes (onnx-tensorrt's QuantDequantLinearHelper infers a strongly typed DQ's input type), with no precision
    flag and no dynamic range (`plugins.registry.QUANT_MIN_TENSORRT`). For AOT plugins, the flag that prefers them,
    where this TensorRT has it."""
    flags = 0
    major = int(str(trt.__version__).split(".", 1)[0])
    if major < ALWAYS_STRONGLY_TYPED_MAJOR:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    prefer_aot = getattr(trt.NetworkDefinitionCreationFlag, PREFER_AOT_FLAG, None)
    if plugins is PluginKind.AOT and prefer_aot is not None:
        flags |= 1 << int(prefer_aot)
    return flags


def quantized_nodes(fused: LoadedModel) -> dict[str, NodeFields]:
    """Each quantized trtfuse node's fields, by node name."""
    nodes = {}
    for node in fused.model.graph.node:
        op = contract.OPS.get(node.op_type) if node.domain == contract.ONNX_DOMAIN else None
        if op is not None and op.quantized:
            nodes[node.name] = from_node(node, f"{fused.path}: node '{node.name}'")
    return nodes


def quantized_output_dtypes(fused: LoadedModel) -> set[str]:
    """The quantized dtypes (FP8 / INT8) of the fused graph's plugin outputs: each quantized node's output stages'."""
    return {dtype for fields in quantized_nodes(fused).values() for dtype in fields.quantized_dtypes}


def fp8_nodes(fused: LoadedModel) -> list[str]:
    """The quantized nodes with an FP8 stage (output, fake-quantized input or inverse root), whose kernels need an
    sm_89 GPU."""
    return [
        name
        for name, fields in quantized_nodes(fused).items()
        if any(fields.quant.at(stage).dtype == "float8_e4m3fn" for stage in fields.quant.stages)
    ]


def refuse_fp8_on_older_gpus(fused: LoadedModel) -> None:
    """One line before any work where this GPU cannot run the model's FP8 stages (TensorRT would otherwise fail
    inside the plugins' callbacks)."""
    names = fp8_nodes(fused)
    if not names:
        return
    from trtfuse.kernels.device import current_device, fp8_refusal

    refusal = fp8_refusal(current_device())
    if refusal is not None:
        nodes = (
            f"node '{names[0]}' and {len(names) - 1} more quantize"
            if len(names) > 1
            else f"node '{names[0]}' quantizes"
        )
        raise MissingDependencyError(f"{fused.path}: {nodes} to FP8: {refusal}")


def shape_tensor_inputs(network: object) -> set[str]:
    """Names of the network inputs TensorRT reads as shape tensors (their values, not only their shapes, shape the
    network): a profile gives them value ranges, and the sidecar records them. Read once the network is complete (after
    parsing), when `ITensor.is_shape_tensor` is reliable; such an input is one the engine reports as a shape-inference
    I/O (NvInfer.h, `ITensor::isShapeTensor`), the flag Triton's TensorRT backend checks."""
    inputs = (network.get_input(index) for index in range(network.num_inputs))
    return {tensor.name for tensor in inputs if tensor.is_shape_tensor}


def add_profiles(
    trt_builder: object,
    config: object,
    profiles: Sequence[Profile],
    shape_inputs: frozenset[str] | set[str] = frozenset(),
) -> None:
    """Each trtfuse profile as a TensorRT optimisation profile; a profile TensorRT refuses is a one-line error.

    `shape_inputs` (from `shape_tensor_inputs`) get the value ranges a profile records for length inputs
    (`past_sequence_length`, `total_sequence_length`); other inputs need only their shapes."""
    for profile in profiles:
        trt_profile = trt_builder.create_optimization_profile()
        ranges = [("shapes", trt_profile.set_shape, name, shape) for name, shape in profile.shapes.items()]
        ranges += [
            ("values", trt_profile.set_shape_input, name, values)
            for name, values in profile.values.items()
            if name in shape_inputs
        ]
        for what, setter, name, bounds in ranges:
            try:
                setter(name, bounds.min, bounds.opt, bounds.max)
            except (RuntimeError, TypeError) as error:
                raise TrtfuseError(
                    f"profile '{profile.name}': TensorRT refused the {what} of input '{name}' ({bounds}): "
                    f"{first_line(error)}"
                ) from None
        if config.add_optimization_profile(trt_profile) < 0:
            raise TrtfuseError(
                f"profile '{profile.name}': TensorRT refused the optimisation profile (an input without shapes, or "
                "shapes not ordered min <= opt <= max); its log above says which"
            )


def create_builder(trt: ModuleType, logger: object) -> object:
    """A TensorRT builder, or MissingDependencyError when TensorRT finds no GPU it can use."""
    try:
        builder = trt.Builder(logger)
    except (TypeError, RuntimeError) as error:
        raise MissingDependencyError(
            f"TensorRT {trt.__version__} could not start: no usable NVIDIA GPU or driver ({error})"
        ) from None
    if builder is None:
        raise MissingDependencyError(f"TensorRT {trt.__version__} could not start: no usable NVIDIA GPU or driver")
    return builder


def _parse_issue(error: object) -> ParserIssue:
    return ParserIssue(error.node(), error.node_name(), error.node_operator(), error.desc())


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _model_to_parse(plugins: PluginKind, fused: LoadedModel) -> onnx.ModelProto:
    """The model TensorRT's parser reads: the fused model as written for the Python plugins; for AOT, its AOT form
    (every attribute present, the node attribute that asks for AOT), made in memory so the file stays as `fuse`
    writes it."""
    if plugins is PluginKind.PYTHON:
        return fused.model
    return prepare_for_aot(fused.model, source=fused.path)


@dataclass(frozen=True)
class SerializedEngine:
    """A built engine in memory: its bytes, the inputs it takes as shape tensors, and how long the build took."""

    engine: memoryview
    shape_inputs: set[str]
    seconds: float


def serialize_network(
    trt: ModuleType,
    model: onnx.ModelProto,
    model_path: Path,
    options: BuildOptions,
    plugins: PluginKind | None,
    emit: Callable[[str], None] = _stderr_line,
) -> SerializedEngine:
    """Parse `model` (its external data resolving beside `model_path`) and build one engine for all of `options`'
    profiles, with `options`' optimisation level, TF32 choice, workspace and timing cache (read first, written back).
    `plugins` is the kind of trtfuse plugins registered for the parser (None: a network of standard ops, what
    TensorRT builds from an unfused export on its own). Every build records detailed layer information
    (`ProfilingVerbosity.DETAILED`), which the engine inspector needs to name each layer's inputs, outputs, types and
    tactics (docs/engine.md, "How the engine runs")."""
    timing_cache_bytes, set_aside = read_timing_cache(
        options.timing_cache, plugins or PluginKind.PYTHON, trtfuse.__version__
    )
    if set_aside is not None:
        emit(set_aside)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = create_builder(trt, logger)
    network = builder.create_network(network_flags(trt, plugins))
    parser = trt.OnnxParser(network, logger)
    if plugins is not None:
        plugin_creation_errors()
    # `path` is the model file, not its folder: onnx-tensorrt replaces the path's last component with each tensor's
    # location (WeightsContext::parseExternalWeights), so external data resolves as for parse_from_file.
    parsed = parser.parse(model.SerializeToString(), str(model_path.absolute()))
    if not parsed or parser.num_errors:
        issues = [_parse_issue(parser.get_error(index)) for index in range(parser.num_errors)]
        # The parser's node indices are those of the model it read.
        creation = plugin_creation_errors() if plugins is not None else []
        raise TrtfuseError(parser_error_line(model_path, issues, model, creation))

    config = builder.create_builder_config()
    # Recorded in the sidecar: Triton's TensorRT backend refuses a config whose is_shape_tensor flags differ from
    # the engine's, and these are the inputs the engine takes as shape tensors.
    shape_inputs = shape_tensor_inputs(network)
    add_profiles(builder, config, options.profiles, shape_inputs)
    config.builder_optimization_level = options.optimization_level
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
    if not options.allow_tf32:
        config.clear_flag(trt.BuilderFlag.TF32)
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if not config.set_timing_cache(config.create_timing_cache(timing_cache_bytes), ignore_mismatch=False):
        # A cache from another TensorRT version or GPU: start a fresh one (written back after the build).
        emit(f"timing cache {options.timing_cache} does not fit this TensorRT and GPU; starting a fresh one")
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    # Held in a local: TensorRT requires the monitor to outlive every object that uses it.
    monitor = progress_monitor(trt, BuildProgress(emit))
    config.progress_monitor = monitor

    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.monotonic() - started
    if serialized is None:
        raise TrtfuseError(f"{model_path}: TensorRT could not build an engine; its messages above say why")
    timing_cache = config.get_timing_cache()
    if options.timing_cache is not None and timing_cache is not None:
        write_timing_cache(options.timing_cache, memoryview(timing_cache.serialize()), trtfuse.__version__)
    return SerializedEngine(memoryview(serialized), shape_inputs, seconds)


def inspected_layers(trt: ModuleType, engine: memoryview, emit: Callable[[str], None] = _stderr_line) -> str | None:
    """The engine inspector's JSON of a just-built engine (`engine_runner.engine_layer_information`); None, with
    one line saying why, where TensorRT cannot deserialise it here (the engine itself is still good)."""
    from trtfuse.engine.engine_runner import engine_layer_information

    try:
        return engine_layer_information(trt, engine)
    except (TrtfuseError, RuntimeError, TypeError, AttributeError) as error:
        emit(f"the engine's layer information could not be read ({first_line(error)}); no layer report")
        return None


@dataclass(frozen=True)
class FusedBuild:
    """A trtfuse engine built in memory: the fused model it was parsed from, the options with the plugin kind
    resolved, the engine, and the sidecar's `build` section (the options, and for AOT the PTX ISAs embedded)."""

    fused: LoadedModel
    options: BuildOptions
    serialized: SerializedEngine
    build: dict


def prepare_build(fused: LoadedModel, options: BuildOptions) -> tuple[ModuleType, BuildOptions]:
    """TensorRT, after the refusals that need no build (a TensorRT too old for the model's FP8 / INT8 plugin outputs,
    a GPU below sm_89 for FP8 stages), with one kind of trtfuse plugins registered: the options' kind, else the
    installed TensorRT's default. The options come back with that kind."""
    trt = import_tensorrt()
    quant_refusal = quant_refusal_of(trt, quantized_output_dtypes(fused))
    if quant_refusal is not None:
        raise MissingDependencyError(f"{fused.path}: {quant_refusal}; its quantized trtfuse nodes output FP8 or INT8")
    refuse_fp8_on_older_gpus(fused)
    options = replace(options, plugins=plugin_kind_for(options.plugins, aot_refusal_of(trt)))
    register_plugins(options.plugins)
    return trt, options


def build_fused_engine(
    trt: ModuleType, fused: LoadedModel, options: BuildOptions, emit: Callable[[str], None] = _stderr_line
) -> FusedBuild:
    """The engine of a fused model (`fused.model`, its external data resolving beside `fused.path`), with the plugin
    kind `prepare_build` registered."""
    if options.plugins is PluginKind.AOT:
        from trtfuse.plugins.qdp import take_embedded_ptx_isas

        take_embedded_ptx_isas()  # what an earlier build in this process embedded
    serialized = serialize_network(
        trt, _model_to_parse(options.plugins, fused), fused.path, options, options.plugins, emit
    )
    build = options.to_json()
    if options.plugins is PluginKind.AOT:
        from trtfuse.plugins.qdp import take_embedded_ptx_isas

        # The driver that runs the engine JIT-compiles this PTX: `trtfuse run` checks it against the driver it finds.
        build["ptx_isa"] = take_embedded_ptx_isas()
    return FusedBuild(fused, options, serialized, build)


def layer_report(
    layers: str | None, fused: LoadedModel, source: Path, emit: Callable[[str], None] = _stderr_line
) -> EngineReport | None:
    """How the engine runs the fused model's trtfuse nodes (`engine_report.analyse` of its layer information, read
    as written to `source`); None without layer information or trtfuse nodes, or, with one line, where the
    analysis finds none of the nodes (the engine itself is still good)."""
    if layers is None or not any(plugin_node_counts(fused.model).values()):
        return None
    try:
        return analyse(parse_layer_information(layers, str(source)), fused)
    except TrtfuseError as error:
        emit(f"no layer report: {error}")
        return None


def write_engine(
    trt: ModuleType,
    built: FusedBuild,
    engine_path: Path,
    emit: Callable[[str], None] = _stderr_line,
    sections: Mapping[str, Any] | None = None,
    companions: Sequence[str] = (),
) -> BuildResult:
    """Write a built engine with its sidecar (`sections` added to it: the A/B, the fusion choice; always the layer
    report, where there is one) and its layer information beside it (`layer_information_path`, trtexec's
    `--exportLayerInfo` format). The sidecar's `files` lists what trtfuse wrote beside the engine (the layer
    information and `companions`, file names in the engine's folder), so a later build replaces them."""
    layers = inspected_layers(trt, built.serialized.engine, emit)
    layers_path = layer_information_path(engine_path)
    report = layer_report(layers, built.fused, layers_path, emit)
    sidecar = make_sidecar(
        engine_path=engine_path,
        fused_model_path=built.fused.path,
        versions=tool_versions(trt.__version__),
        gpu=gpu_name(),
        plugins=plugins_used(built.fused.model),
        profiles=built.options.profiles,
        build=built.build,
        shape_tensor_inputs=built.serialized.shape_inputs,
    )
    if report is not None:
        sidecar["engine_report"] = report.to_json()
    sidecar.update(sections or {})
    sidecar["files"] = [*([layers_path.name] if layers is not None else []), *companions]
    write_bytes_atomic(engine_path, built.serialized.engine)
    if layers is not None:
        write_layer_information(layers_path, layers)
    sidecar_path = write_sidecar(engine_path, sidecar)
    return BuildResult(engine_path, sidecar_path, sidecar, built.serialized.seconds, layers, report)


def check_output_folders(engine_path: Path, options: BuildOptions) -> None:
    for path in (engine_path, options.timing_cache):
        if path is not None and not resolved(path).parent.is_dir():
            raise TrtfuseError(f"{path}: output folder does not exist")


def build_engine(
    fused: LoadedModel,
    engine_path: Path,
    options: BuildOptions,
    emit: Callable[[str], None] = _stderr_line,
) -> BuildResult:
    """Parse the fused model (`fused.model`, written at `fused.path`, against which its external data resolves) with
    one kind of trtfuse plugins registered (`options.plugins`, else the default for the installed TensorRT), build one
    engine for all profiles, write it with a sidecar that records the kind, and its layer information beside it."""
    check_output_folders(engine_path, options)
    trt, options = prepare_build(fused, options)
    return write_engine(trt, build_fused_engine(trt, fused, options, emit), engine_path, emit)
