"""Build a TensorRT engine from a fused ONNX model, written atomically with a JSON sidecar.

The TensorRT calls live in `build_engine` and its two helpers; everything around them (options, sidecar content,
parser-error translation, progress lines, atomic writes) is plain Python that the CPU tests exercise.
"""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import ModuleType

import onnx

import trtfuse
from trtfuse import contract
from trtfuse.engine_file import (
    SIDECAR_FORMAT,
    PluginKind,
    import_tensorrt,
    plugin_creation_errors,
    register_plugins,
    write_engine,
)
from trtfuse.errors import Choice, MissingDependencyError, OptionError, TrtfuseError, first_line
from trtfuse.model_io import load_model
from trtfuse.outputs import write_bytes_atomic
from trtfuse.profiles import Profile

# TensorRT documents builder optimisation levels 0 (fastest build) to 5 (most tactics); 3 is its default.
OPTIMIZATION_LEVELS = range(6)
DEFAULT_OPTIMIZATION_LEVEL = 3
# What onnx-tensorrt's FallbackPluginImporter says when no creator has the node's name, version and namespace.
PLUGIN_NOT_FOUND = "Plugin not found"
# From this major version every network is strongly typed and the STRONGLY_TYPED flag is deprecated and ignored.
ALWAYS_STRONGLY_TYPED_MAJOR = 11
# The network flag that asks the parser for a plugin's AOT implementation (NvInfer.h: 3 in 10.9, 2 in 11.x, hence
# the name); trtfuse's AOT nodes also carry the node attribute that demands it.
PREFER_AOT_FLAG = "PREFER_AOT_PYTHON_PLUGINS"


@dataclass(frozen=True)
class BuildOptions:
    profiles: tuple[Profile, ...]
    optimization_level: int = DEFAULT_OPTIMIZATION_LEVEL
    workspace_bytes: int | None = None
    timing_cache: Path | None = None
    # TensorRT allows TF32 for fp32 matmuls by default; that is about fp16-level error, so an fp32 model would fail
    # the fp32 tolerance of `trtfuse compare`. Off unless asked for.
    allow_tf32: bool = False
    # None: AOT where trtfuse builds AOT plugins with the installed TensorRT (>= 10.14), else Python
    # (`plugin_kind_for`); the sidecar records the kind used.
    plugins: PluginKind | None = None

    def __post_init__(self) -> None:
        if not self.profiles:
            raise TrtfuseError("an engine needs at least one optimisation profile")
        if self.optimization_level not in OPTIMIZATION_LEVELS:
            raise TrtfuseError(f"the optimisation level must be 0 to 5, got {self.optimization_level}")
        if self.workspace_bytes is not None and self.workspace_bytes <= 0:
            raise TrtfuseError(f"the workspace limit must be positive, got {self.workspace_bytes} bytes")

    def to_json(self) -> dict:
        return {
            "strongly_typed": True,
            "optimization_level": self.optimization_level,
            "workspace_bytes": self.workspace_bytes,
            "timing_cache": str(self.timing_cache) if self.timing_cache else None,
            "allow_tf32": self.allow_tf32,
            "plugins": None if self.plugins is None else self.plugins.value,
        }


@dataclass(frozen=True)
class BuildResult:
    engine_path: Path
    sidecar_path: Path
    sidecar: dict
    seconds: float


@dataclass(frozen=True)
class ParserIssue:
    """One error of TensorRT's ONNX parser, read off its IParserError."""

    node_index: int
    node_name: str
    op_type: str
    description: str


def plugins_used(model: onnx.ModelProto) -> list[dict]:
    """Each trtfuse plugin the fused graph uses, with its namespace, version and number of nodes."""
    counts = {op: 0 for op in contract.FUSED_OPS}
    for node in model.graph.node:
        if node.domain == contract.ONNX_DOMAIN and node.op_type in counts:
            counts[node.op_type] += 1
    return [
        {"name": op, "namespace": contract.PLUGIN_NAMESPACE, "version": contract.PLUGIN_VERSION, "nodes": count}
        for op, count in counts.items()
        if count
    ]


def parser_error_line(
    model_path: Path, issues: Sequence[ParserIssue], model: onnx.ModelProto, plugin_errors: Sequence[str] = ()
) -> str:
    """One line for a failed parse: the first error, the node it names, and how many more there were.

    `plugin_errors` are the messages of trtfuse plugin creations that failed during the parse: TensorRT's parser
    says only "Could not create the plugin", the plugin knows which field is wrong.
    """
    if not issues:
        return f"{model_path}: TensorRT's ONNX parser rejected the model without saying why"
    first = issues[0]
    name, op_type = first.node_name, first.op_type
    if not name and 0 <= first.node_index < len(model.graph.node):
        node = model.graph.node[first.node_index]
        name, op_type = node.name, op_type or node.op_type
    if name:
        where = f"node '{name}' ({op_type})" if op_type else f"node '{name}'"
    elif first.node_index >= 0:
        where = f"node #{first.node_index}"
    else:
        where = "the graph"
    description = first.description.strip().splitlines()[0] if first.description.strip() else "no description"
    hint = ""
    if op_type in contract.FUSED_OPS:
        if PLUGIN_NOT_FOUND in description:
            hint = f"; is the '{op_type}' plugin registered in namespace '{contract.PLUGIN_NAMESPACE}'?"
        elif plugin_errors:
            hint = f"; the plugin said: {plugin_errors[0]}"
        else:
            hint = "; the plugin's own message is in TensorRT's log above"
    more = f" (and {len(issues) - 1} more parser errors)" if len(issues) > 1 else ""
    return f"{model_path}: TensorRT's ONNX parser failed at {where}: {description}{hint}{more}"


def make_sidecar(
    *,
    engine_path: Path,
    fused_model_path: Path,
    versions: dict[str, str],
    gpu: str,
    plugins: list[dict],
    options: BuildOptions,
) -> dict:
    """What an engine was built from and with; the fused model path is relative to the engine's folder if possible."""
    fused = Path(os.path.relpath(fused_model_path.resolve(), engine_path.resolve().parent))
    return {
        "format": SIDECAR_FORMAT,
        "engine": engine_path.name,
        "fused_model": fused.as_posix(),
        "versions": versions,
        "gpu": gpu,
        "plugins": plugins,
        "profiles": [profile.to_json() for profile in options.profiles],
        "build": options.to_json(),
    }


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


class BuildProgress:
    """Turns TensorRT's progress callbacks into indented lines: one when a phase starts, one when it ends.

    TensorRT calls these from its own threads, hence the lock.
    """

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._depth: dict[str, int] = {}
        self._started: dict[str, float] = {}

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self._lock:
            depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self._depth[phase_name] = depth
            self._started[phase_name] = time.monotonic()
            self._emit(f"{'  ' * depth}{phase_name} ({num_steps} steps)")

    def step_complete(self, phase_name: str, step: int) -> bool:
        # True lets the build go on; False would cancel it.
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            depth = self._depth.pop(phase_name, 0)
            seconds = time.monotonic() - self._started.pop(phase_name, time.monotonic())
            self._emit(f"{'  ' * depth}{phase_name} done in {seconds:.1f} s")


def plugin_kind_for(requested: PluginKind | None, aot_refusal: str | None) -> PluginKind:
    """The plugin kind to build with: as requested, or by default AOT where trtfuse builds AOT plugins with this
    TensorRT (`aot_refusal` None) and Python otherwise. AOT asked for where it is refused: one line with the reason."""
    if requested is None:
        return PluginKind.AOT if aot_refusal is None else PluginKind.PYTHON
    if requested is PluginKind.AOT and aot_refusal is not None:
        from trtfuse.plugins.aot import min_tensorrt_text

        raise OptionError(
            "plugins",
            f"{aot_refusal}; trtfuse builds AOT plugins with TensorRT >= {min_tensorrt_text()}: install it or build "
            "with ",
            Choice("plugins"),
            f" {PluginKind.PYTHON.value}",
        )
    return requested


def _aot_refusal(trt: ModuleType) -> str | None:
    from trtfuse.plugins.aot import aot_refusal

    return aot_refusal(trt)


def check_plugin_kind(requested: PluginKind | None) -> None:
    """Fail before any work when AOT is asked for and the installed TensorRT has none; without TensorRT, say
    nothing: the build says it is missing once the model is fused."""
    if requested is not PluginKind.AOT:
        return
    try:
        trt = import_tensorrt()
    except MissingDependencyError:
        return
    plugin_kind_for(requested, _aot_refusal(trt))


def network_flags(trt: ModuleType, plugins: PluginKind = PluginKind.PYTHON) -> int:
    """Strongly typed, so the fp16/bf16 types of the ONNX graph are kept as written: the flag below TensorRT 11, where
    it is deprecated (and every network is strongly typed). For AOT plugins, the flag that prefers them, where this
    TensorRT has it."""
    flags = 0
    major = int(str(trt.__version__).split(".", 1)[0])
    if major < ALWAYS_STRONGLY_TYPED_MAJOR:
        flags |= 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
    prefer_aot = getattr(trt.NetworkDefinitionCreationFlag, PREFER_AOT_FLAG, None)
    if plugins is PluginKind.AOT and prefer_aot is not None:
        flags |= 1 << int(prefer_aot)
    return flags


def shape_tensor_inputs(network: object) -> set[str]:
    """Names of the network inputs TensorRT reads as shape tensors (their values, not only their shapes, shape the
    network): a profile gives them value ranges."""
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


def _progress_monitor(trt: ModuleType, progress: BuildProgress) -> object:
    class ProgressMonitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return progress.step_complete(phase_name, step)

        def phase_finish(self, phase_name: str) -> None:
            progress.phase_finish(phase_name)

    return ProgressMonitor()


def _read_timing_cache(path: Path | None) -> bytes:
    if path is None or not path.exists():
        return b""
    try:
        return path.read_bytes()
    except OSError as error:
        raise TrtfuseError(f"{path}: cannot read the timing cache ({error.strerror})") from None


def _stderr_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _model_to_parse(plugins: PluginKind, model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """The model TensorRT's parser reads: the fused model as written for the Python plugins; for AOT, its AOT form
    (every attribute present, the node attribute that asks for AOT), made in memory so the file stays as `fuse`
    writes it."""
    if plugins is PluginKind.PYTHON:
        return model
    from trtfuse.plugins.aot_nodes import prepare_for_aot

    return prepare_for_aot(model, source=path)


def _parse(parser: object, plugins: PluginKind, fused_model_path: Path, model: onnx.ModelProto) -> bool:
    if plugins is PluginKind.PYTHON:
        # parse_from_file resolves external data files relative to the model.
        return parser.parse_from_file(str(fused_model_path))
    # `path` is the model file, not its folder: onnx-tensorrt replaces the path's last component with each tensor's
    # location (WeightsContext::parseExternalWeights), so external data resolves as for parse_from_file.
    return parser.parse(model.SerializeToString(), str(fused_model_path.absolute()))


def build_engine(
    fused_model_path: Path,
    engine_path: Path,
    options: BuildOptions,
    emit: Callable[[str], None] = _stderr_line,
) -> BuildResult:
    """Parse the fused model with one kind of trtfuse plugins registered (`options.plugins`, else the default for the
    installed TensorRT), build one engine for all profiles, write it with a sidecar that records the kind."""
    for path in (engine_path, options.timing_cache):
        if path is not None and not path.resolve().parent.is_dir():
            raise TrtfuseError(f"{path}: output folder does not exist")
    model = load_model(fused_model_path).model
    timing_cache_bytes = _read_timing_cache(options.timing_cache)
    trt = import_tensorrt()
    options = replace(options, plugins=plugin_kind_for(options.plugins, _aot_refusal(trt)))
    model_to_parse = _model_to_parse(options.plugins, model, fused_model_path)
    register_plugins(options.plugins)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = create_builder(trt, logger)
    network = builder.create_network(network_flags(trt, options.plugins))
    parser = trt.OnnxParser(network, logger)
    plugin_creation_errors()
    parsed = _parse(parser, options.plugins, fused_model_path, model_to_parse)
    if not parsed or parser.num_errors:
        issues = [_parse_issue(parser.get_error(index)) for index in range(parser.num_errors)]
        # The parser's node indices are those of the model it read.
        raise TrtfuseError(parser_error_line(fused_model_path, issues, model_to_parse, plugin_creation_errors()))

    config = builder.create_builder_config()
    add_profiles(builder, config, options.profiles, shape_tensor_inputs(network))
    config.builder_optimization_level = options.optimization_level
    if not options.allow_tf32:
        config.clear_flag(trt.BuilderFlag.TF32)
    if options.workspace_bytes is not None:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_bytes)
    if not config.set_timing_cache(config.create_timing_cache(timing_cache_bytes), ignore_mismatch=False):
        # A cache from another TensorRT version or GPU: start a fresh one (written back after the build).
        emit(f"timing cache {options.timing_cache} does not fit this TensorRT and GPU; starting a fresh one")
        config.set_timing_cache(config.create_timing_cache(b""), ignore_mismatch=False)
    # Held in a local: TensorRT requires the monitor to outlive every object that uses it.
    monitor = _progress_monitor(trt, BuildProgress(emit))
    config.progress_monitor = monitor

    if options.plugins is PluginKind.AOT:
        from trtfuse.plugins.aot import take_embedded_ptx_isas

        take_embedded_ptx_isas()  # what an earlier build in this process embedded
    started = time.monotonic()
    serialized = builder.build_serialized_network(network, config)
    seconds = time.monotonic() - started
    if serialized is None:
        raise TrtfuseError(f"{fused_model_path}: TensorRT could not build an engine; its messages above say why")
    timing_cache = config.get_timing_cache()
    if options.timing_cache is not None and timing_cache is not None:
        write_bytes_atomic(options.timing_cache, memoryview(timing_cache.serialize()))
    sidecar = make_sidecar(
        engine_path=engine_path,
        fused_model_path=fused_model_path,
        versions=tool_versions(trt.__version__),
        gpu=gpu_name(),
        plugins=plugins_used(model),
        options=options,
    )
    if options.plugins is PluginKind.AOT:
        from trtfuse.plugins.aot import take_embedded_ptx_isas

        # The driver that runs the engine JIT-compiles this PTX: `trtfuse run` checks it against the driver it finds.
        sidecar["build"]["ptx_isa"] = take_embedded_ptx_isas()
    sidecar_path = write_engine(engine_path, memoryview(serialized), sidecar)
    return BuildResult(engine_path, sidecar_path, sidecar, seconds)
