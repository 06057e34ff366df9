"""Drives the trtfuse plugins through TensorRT's documented IPluginV3 call order, without a TensorRT engine.

TensorRT cannot run here, so this harness plays the builder's and the execution context's part, in their order:

  build:   creator.create_plugin(BUILD) -> get_capability_interface(CORE, BUILD, RUNTIME) -> num_outputs
           -> get_output_data_types -> get_output_shapes -> supports_format_combination (every position, every
           dtype) -> configure_plugin -> timing_cache_id -> set_tactic(0) -> get_fields_to_serialize
  runtime: creator.create_plugin(RUNTIME) from the serialised fields -> attach_to_context -> clone
           -> set_tactic(0) -> on_shape_change -> enqueue (raw device pointers, a non-default stream) -> destroy

The build and runtime steps up to `on_shape_change` need only the TensorRT types; `enqueue`, the host-cost
measurement and the CUDA-graph replay need a GPU, torch and trtfuse.kernels. What it cannot reproduce: TensorRT's own
IExprBuilder (not constructible outside a network build, so get_output_shapes sees expression-less DimsExprs) and an
IPluginResourceContext (attach_to_context gets None; the plugins do not use it).

Run `python -m trtfuse.bench.plugin_lifecycle` on a GPU machine for a report of every case.
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from trtfuse.contract import (
    FLOAT_FIELDS,
    QK_NORM,
    QK_NORM_OP,
    RMS_NORM,
    RMS_NORM_OP,
    NormParams,
    WeightMode,
    rounding_dtype,
)
from trtfuse.contract.codec import NodeFields
from trtfuse.plugins.python.base import DEFAULT_TACTIC, DTYPE_NAMES, NormPlugin, NormPluginCreator, trt
from trtfuse.plugins.python.qk_norm import QkNormPluginCreator
from trtfuse.plugins.python.rms_norm import RmsNormPluginCreator
from trtfuse.verify.tolerances import output_error, tolerance_for

Shape = tuple[int, ...]
DTYPE_BY_NAME = {name: data_type for data_type, name in DTYPE_NAMES.items()}
CAPABILITIES = ("CORE", "BUILD", "RUNTIME")
CREATORS: dict[str, type[NormPluginCreator]] = {RMS_NORM_OP: RmsNormPluginCreator, QK_NORM_OP: QkNormPluginCreator}


@dataclass(frozen=True)
class NormCase:
    """One plugin instance: its fields, its dtypes, the activation shapes of its optimisation profile, and the
    activation shapes of the runs that follow (each run is one on_shape_change, then enqueues)."""

    config: NodeFields
    dtype: str
    weight_dtype: str | None
    min_shapes: tuple[Shape, ...]
    opt_shapes: tuple[Shape, ...]
    max_shapes: tuple[Shape, ...]
    runs: tuple[tuple[Shape, ...], ...]

    @property
    def name(self) -> str:
        weight = self.weight_dtype or "none"
        out = f"-to-{self.config.output_dtype}" if self.config.output_dtype != self.dtype else ""
        return (
            f"{self.config.op.name}-{self.dtype}{out}-w{weight}-{self.config.params.weight_mode.name}-"
            f"h{'x'.join(map(str, self.config.hidden_sizes))}-off{self.config.params.weight_offset:g}"
        )

    @property
    def output_dtype(self) -> str:
        return self.config.output_dtype

    @property
    def input_dtypes(self) -> tuple[str, ...]:
        activations = len(self.config.hidden_sizes)
        weights = (self.weight_dtype,) * activations if self.config.has_weight else ()
        return (self.dtype,) * activations + weights

    def input_shapes(self, activation_shapes: Sequence[Shape]) -> list[Shape]:
        weights = [(hidden,) for hidden in self.config.hidden_sizes] if self.config.has_weight else []
        return [*activation_shapes, *weights]


def _float32_params(epsilon: float, weight_offset: float, weight_mode: WeightMode) -> NormParams:
    """The constants as a node's float32 attributes hold them."""
    return NormParams(float(np.float32(epsilon)), float(np.float32(weight_offset)), weight_mode)


def rms_case(
    hidden: int,
    dtype: str,
    weight_dtype: str | None,
    weight_mode: WeightMode = WeightMode.AFTER_CAST,
    weight_offset: float = 0.0,
    epsilon: float = 1e-6,
    max_leading: Shape = (4, 256),
    runs: Sequence[Shape] = ((4, 256), (1, 3), (1, 1)),
    output_dtype: str | None = None,
) -> NormCase:
    """An RMSNorm over [*leading, hidden]; `runs` are the leading dims of successive runs. The defaults go from
    prefill (1024 rows: more rows than an H200 has SMs, the prefill kernel) to decode (3 rows, then 1).
    `output_dtype` is the node's attribute (None: the activation's dtype)."""
    params = _float32_params(epsilon, weight_offset, weight_mode)
    config = NodeFields(RMS_NORM, params, (hidden,), output_dtype or dtype)
    return NormCase(
        config=config,
        dtype=dtype,
        weight_dtype=weight_dtype if weight_mode is not WeightMode.NONE else None,
        min_shapes=(((1,) * len(max_leading)) + (hidden,),),
        opt_shapes=((*max_leading, hidden),),
        max_shapes=((*max_leading, hidden),),
        runs=tuple(((*leading, hidden),) for leading in runs),
    )


def qk_case(
    q_heads: int,
    k_heads: int,
    head_dim: int,
    dtype: str,
    weight_dtype: str | None,
    weight_mode: WeightMode = WeightMode.AFTER_CAST,
    weight_offset: float = 0.0,
    epsilon: float = 1e-6,
    max_tokens: int = 64,
    runs: Sequence[int] = (64, 5, 1),
) -> NormCase:
    """A QK-norm over q [1, tokens, q_heads, head_dim] and k [1, tokens, k_heads, head_dim] (Qwen3's layout)."""
    params = _float32_params(epsilon, weight_offset, weight_mode)
    config = NodeFields(QK_NORM, params, (head_dim, head_dim), dtype)

    def shapes(tokens: int) -> tuple[Shape, ...]:
        return ((1, tokens, q_heads, head_dim), (1, tokens, k_heads, head_dim))

    return NormCase(
        config=config,
        dtype=dtype,
        weight_dtype=weight_dtype if weight_mode is not WeightMode.NONE else None,
        min_shapes=shapes(1),
        opt_shapes=shapes(max_tokens),
        max_shapes=shapes(max_tokens),
        runs=tuple(shapes(tokens) for tokens in runs),
    )


# --- TensorRT descriptors ----------------------------------------------------------------------------------------


def parser_fields(config: NodeFields) -> tuple[Any, list[np.ndarray]]:
    """The fields TensorRT's ONNX parser builds from a fused node's attributes (float -> FLOAT32, int -> INT32),
    from the numbers alone rather than the plugins' own serialiser; the arrays must outlive the collection."""
    arrays, fields = [], []
    for name, value in config.numbers().items():
        is_float = name in FLOAT_FIELDS
        array = np.array([value], dtype=np.float32 if is_float else np.int32)
        kind = trt.PluginFieldType.FLOAT32 if is_float else trt.PluginFieldType.INT32
        arrays.append(array)
        fields.append(trt.PluginField(name, array, kind))
    return trt.PluginFieldCollection(fields), arrays


def tensor_desc(shape: Shape, dtype: str) -> Any:
    desc = trt.PluginTensorDesc()
    desc.dims = trt.Dims(list(shape))
    desc.type = DTYPE_BY_NAME[dtype]
    desc.format = trt.TensorFormat.LINEAR
    return desc


def dynamic_desc(min_shape: Shape, opt_shape: Shape, max_shape: Shape, dtype: str) -> Any:
    """What the builder passes to configure_plugin: -1 where the profile lets a dim vary, and min / opt / max."""
    desc_dims = tuple(lo if lo == hi else -1 for lo, hi in zip(min_shape, max_shape, strict=True))
    desc = trt.DynamicPluginTensorDesc()
    desc.desc = tensor_desc(desc_dims, dtype)
    desc.min = trt.Dims(list(min_shape))
    desc.opt = trt.Dims(list(opt_shape))
    desc.max = trt.Dims(list(max_shape))
    return desc


def _output_dtypes(case: NormCase) -> tuple[str, ...]:
    return (case.output_dtype,) * len(case.config.hidden_sizes)


def profile_descs(case: NormCase) -> tuple[list[Any], list[Any]]:
    inputs = [
        dynamic_desc(lo, opt, hi, dtype)
        for lo, opt, hi, dtype in zip(
            case.input_shapes(case.min_shapes),
            case.input_shapes(case.opt_shapes),
            case.input_shapes(case.max_shapes),
            case.input_dtypes,
            strict=True,
        )
    ]
    profile = zip(case.min_shapes, case.opt_shapes, case.max_shapes, _output_dtypes(case), strict=True)
    outputs = [dynamic_desc(lo, opt, hi, dtype) for lo, opt, hi, dtype in profile]
    return inputs, outputs


def run_descs(case: NormCase, activation_shapes: Sequence[Shape]) -> tuple[list[Any], list[Any]]:
    inputs = [
        tensor_desc(shape, dtype)
        for shape, dtype in zip(case.input_shapes(activation_shapes), case.input_dtypes, strict=True)
    ]
    outputs = [tensor_desc(shape, dtype) for shape, dtype in zip(activation_shapes, _output_dtypes(case), strict=True)]
    return inputs, outputs


# --- build phase -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SerializedField:
    """A field as an engine stores it: copied out of the plugin's collection at serialisation time."""

    name: str
    type: Any
    data: np.ndarray


@dataclass
class BuildPhase:
    """What the build phase left: the configured plugin, its answers, and its serialised fields."""

    plugin: NormPlugin
    output_dtypes: tuple[str, ...]
    output_ranks: tuple[int, ...]
    accepted: dict[int, tuple[str, ...]]  # per position: the dtypes accepted in LINEAR, earlier positions as the case
    non_linear_accepted: list[tuple[int, str]]  # (position, format) pairs wrongly accepted
    serialized: list[SerializedField]


def probe_formats(plugin: NormPlugin, case: NormCase) -> tuple[dict[int, tuple[str, ...]], list[tuple[int, str]]]:
    """supports_format_combination over every position, every DataType and a few formats, as the builder queries
    it: positions before `pos` hold the case's own dtypes, LINEAR."""
    chosen = [*case.input_dtypes, *_output_dtypes(case)]
    shapes = [*case.input_shapes(case.max_shapes), *case.max_shapes]
    num_inputs = len(case.input_dtypes)
    accepted: dict[int, tuple[str, ...]] = {}
    non_linear: list[tuple[int, str]] = []
    formats = [name for name in ("CHW2", "HWC8", "CHW4", "CHW32") if hasattr(trt.TensorFormat, name)]
    for pos in range(len(chosen)):
        in_out = [dynamic_desc(shape, shape, shape, dtype) for shape, dtype in zip(shapes, chosen, strict=True)]
        names = []
        for data_type_name, data_type in trt.DataType.__members__.items():
            in_out[pos].desc.type = data_type
            if plugin.supports_format_combination(pos, in_out, num_inputs):
                names.append(DTYPE_NAMES.get(data_type, data_type_name))
        accepted[pos] = tuple(names)
        in_out[pos].desc.type = DTYPE_BY_NAME[chosen[pos]]
        for format_name in formats:
            in_out[pos].desc.format = getattr(trt.TensorFormat, format_name)
            if plugin.supports_format_combination(pos, in_out, num_inputs):
                non_linear.append((pos, format_name))
    return accepted, non_linear


def build_phase(creator: NormPluginCreator, case: NormCase, node: str = "node") -> BuildPhase:
    collection, _arrays = parser_fields(case.config)
    plugin = creator.create_plugin(node, collection, trt.TensorRTPhase.BUILD)
    for capability in CAPABILITIES:
        if plugin.get_capability_interface(getattr(trt.PluginCapabilityType, capability)) is None:
            raise AssertionError(f"{case.name}: no {capability} capability interface")
    if plugin.num_outputs != len(plugin.OP.outputs):
        raise AssertionError(f"{case.name}: num_outputs is {plugin.num_outputs}")
    output_types = plugin.get_output_data_types([DTYPE_BY_NAME[dtype] for dtype in case.input_dtypes])
    shapes = plugin.get_output_shapes([trt.DimsExprs(len(s)) for s in case.input_shapes(case.max_shapes)], [], None)
    accepted, non_linear = probe_formats(plugin, case)
    inputs, outputs = profile_descs(case)
    plugin.configure_plugin(inputs, outputs)
    if not plugin.timing_cache_id:
        raise AssertionError(f"{case.name}: an empty timing_cache_id would share timings with every other node")
    plugin.set_tactic(DEFAULT_TACTIC)
    fields = plugin.get_fields_to_serialize()
    serialized = [SerializedField(f.name, f.type, np.array(f.data, copy=True)) for f in fields]
    return BuildPhase(
        plugin=plugin,
        output_dtypes=tuple(DTYPE_NAMES.get(t, t.name) for t in output_types),
        output_ranks=tuple(len(s) for s in shapes),
        accepted=accepted,
        non_linear_accepted=non_linear,
        serialized=serialized,
    )


# --- runtime phase -----------------------------------------------------------------------------------------------


def recreate(creator: NormPluginCreator, serialized: Sequence[SerializedField], node: str = "node") -> NormPlugin:
    """What deserialising an engine does: the creator gets the stored fields back, in the RUNTIME phase."""
    arrays = [np.array(f.data, copy=True) for f in serialized]
    collection = trt.PluginFieldCollection(
        [trt.PluginField(f.name, array, f.type) for f, array in zip(serialized, arrays, strict=True)]
    )
    return creator.create_plugin(node, collection, trt.TensorRTPhase.RUNTIME)


def runtime_phase(creator: NormPluginCreator, build: BuildPhase, node: str = "node") -> tuple[NormPlugin, NormPlugin]:
    """Re-create from the serialised fields, attach to a (resource-less) context and clone: (attached, clone)."""
    plugin = recreate(creator, build.serialized, node)
    attached = plugin.attach_to_context(None)
    clone = attached.clone()
    for runtime_plugin in (attached, clone):
        runtime_plugin.set_tactic(DEFAULT_TACTIC)
    return attached, clone


# --- GPU: enqueue, reference, host cost, CUDA graph --------------------------------------------------------------


def _torch_dtype(name: str) -> Any:
    import torch

    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


@dataclass
class DeviceTensors:
    """A run's tensors on the GPU. Each output is the head of a NaN-filled buffer with a guard tail: a kernel that
    writes too little leaves NaNs, one that writes too far spoils the tail."""

    inputs: list[Any]
    outputs: list[Any]
    output_buffers: list[Any]

    @property
    def input_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.inputs]

    @property
    def output_ptrs(self) -> list[int]:
        return [t.data_ptr() for t in self.outputs]

    def refill(self, generator: Any) -> None:
        """New random activations and weights in place (same addresses), outputs poisoned again."""
        import torch

        for tensor in self.inputs:
            tensor.copy_(torch.randn(tensor.shape, generator=generator, dtype=torch.float32).to(tensor.dtype))
        for buffer in self.output_buffers:
            buffer.fill_(float("nan"))

    def guards_intact(self) -> bool:
        pairs = zip(self.output_buffers, self.outputs, strict=True)
        return all(bool(buffer[out.numel() :].isnan().all()) for buffer, out in pairs)


GUARD_ELEMENTS = 4096


def device_tensors(
    case: NormCase, activation_shapes: Sequence[Shape], seed: int, device: str = "cuda"
) -> DeviceTensors:
    import torch

    generator = torch.Generator().manual_seed(seed)
    inputs = []
    for shape, dtype in zip(case.input_shapes(activation_shapes), case.input_dtypes, strict=True):
        values = torch.randn(shape, generator=generator, dtype=torch.float32)
        inputs.append(values.to(device=device, dtype=_torch_dtype(dtype)))
    buffers, outputs = [], []
    for shape in activation_shapes:
        size = math.prod(shape)
        buffer = torch.full(
            (size + GUARD_ELEMENTS,), float("nan"), device=device, dtype=_torch_dtype(case.output_dtype)
        )
        buffers.append(buffer)
        outputs.append(buffer[:size].view(shape))
    return DeviceTensors(inputs, outputs, buffers)


def reference_norm(x: Any, weight: Any, config: NodeFields) -> Any:
    """The plugin node's output for x (and its weight) by the shared float64 reference, computed on the CPU."""
    from trtfuse.bench.reference import norm_reference  # torch: only the GPU steps need it

    cpu_weight = None if weight is None else weight.cpu()
    return norm_reference(x.cpu(), cpu_weight, config.params, config.output_dtype)


@dataclass(frozen=True)
class OutputCheck:
    name: str
    max_abs: float
    max_rel: float
    rtol: float
    unwritten: int  # NaNs left in the output: elements the kernel did not write

    @property
    def passed(self) -> bool:
        return self.unwritten == 0 and self.max_rel <= self.rtol


def check_outputs(case: NormCase, tensors: DeviceTensors) -> list[OutputCheck]:
    activations = len(case.config.hidden_sizes)
    names = ("y",) if activations == 1 else ("q_out", "k_out")
    checks = []
    for i in range(activations):
        weight = tensors.inputs[activations + i] if case.config.has_weight else None
        reference = reference_norm(tensors.inputs[i], weight, case.config).double()
        actual = tensors.outputs[i].detach().cpu().double()
        unwritten = int(actual.isnan().sum())
        error = output_error(names[i], actual.numpy(), reference.numpy())
        # The coarser of the output dtype and AFTER_CAST's intermediate R sets the tolerance.
        after_cast = case.config.params.weight_mode is WeightMode.AFTER_CAST
        coarse = rounding_dtype(case.dtype, case.output_dtype) if after_cast else case.output_dtype
        rtol = max(tolerance_for(case.output_dtype).rtol, tolerance_for(coarse).rtol)
        checks.append(OutputCheck(names[i], error.max_abs, error.max_rel, rtol, unwritten))
    return checks


def shape_change(plugin: NormPlugin, case: NormCase, activation_shapes: Sequence[Shape]) -> tuple[list[Any], list[Any]]:
    """on_shape_change for a run; returns the (input, output) descriptors its enqueues get."""
    input_descs, output_descs = run_descs(case, activation_shapes)
    plugin.on_shape_change(input_descs, output_descs)
    return input_descs, output_descs


def enqueue(plugin: NormPlugin, descs: tuple[list[Any], list[Any]], tensors: DeviceTensors, stream: int) -> None:
    plugin.enqueue(descs[0], descs[1], tensors.input_ptrs, tensors.output_ptrs, 0, stream)


@dataclass(frozen=True)
class HostCost:
    """Median host time of one call, in µs: through the plugin's enqueue, and of the bare kernel launch under it."""

    enqueue_us: float
    launch_us: float


def host_cost(
    plugin: NormPlugin, descs: tuple[list[Any], list[Any]], tensors: DeviceTensors, stream: Any, calls: int = 400
) -> HostCost:
    """Time `calls` enqueues one by one (synchronising every 100 so the launch queue never fills up)."""
    import torch

    handle = stream.cuda_stream
    inputs, outputs = tensors.input_ptrs, tensors.output_ptrs
    launch_args = _launch_args(plugin, inputs, outputs, handle)
    kernel_launch = plugin.kernel.launch

    def median_us(call: Any) -> float:
        samples = []
        for i in range(calls):
            if i % 100 == 0:
                torch.cuda.synchronize()
            start = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - start)
        torch.cuda.synchronize()
        return statistics.median(samples) / 1000.0

    for _ in range(20):
        plugin.enqueue(descs[0], descs[1], inputs, outputs, 0, handle)
    return HostCost(
        enqueue_us=median_us(lambda: plugin.enqueue(descs[0], descs[1], inputs, outputs, 0, handle)),
        launch_us=median_us(lambda: kernel_launch(*launch_args)),
    )


def _launch_args(plugin: NormPlugin, inputs: Sequence[int], outputs: Sequence[int], stream: int) -> tuple[int, ...]:
    """The kernel-launch arguments enqueue passes: activations, weights (0 without), outputs, rows, stream."""
    activations = len(plugin.OP.activations)
    weights = tuple(inputs[activations:]) if len(inputs) > activations else (0,) * activations
    return (*inputs[:activations], *weights, *outputs, *plugin.rows, stream)


@dataclass
class GraphReplay:
    """Outputs of every plugin after each replay of one captured CUDA graph, with fresh inputs before each."""

    checks: list[list[OutputCheck]]  # per replay, every output of every plugin
    guards_intact: bool

    @property
    def passed(self) -> bool:
        return self.guards_intact and all(c.passed for replay in self.checks for c in replay)


def graph_replay(cases: Sequence[NormCase], replays: int = 2, seed: int = 100) -> GraphReplay:
    """Capture one enqueue per case, in order, into a CUDA graph on a side stream, then replay it with new inputs.

    Where a case's first activation has the shape and dtype of the previous case's first output, it reads that
    output: the graph is a chain, as in a network. Each plugin is prepared as TensorRT prepares it before a
    capture (build phase, runtime re-creation, on_shape_change, one eager enqueue).
    """
    import torch

    stream = torch.cuda.Stream()
    steps = []
    for index, case in enumerate(cases):
        creator = CREATORS[case.config.op.name]()
        plugin, _clone = runtime_phase(creator, build_phase(creator, case))
        shapes = case.runs[0]
        tensors = device_tensors(case, shapes, seed + index)
        if steps:
            previous = steps[-1][2].outputs[0]
            if previous.shape == tensors.inputs[0].shape and previous.dtype == tensors.inputs[0].dtype:
                tensors.inputs[0] = previous
        descs = shape_change(plugin, case, shapes)
        torch.cuda.synchronize()  # the tensors were written on the default stream
        enqueue(plugin, descs, tensors, stream.cuda_stream)
        steps.append((plugin, descs, tensors, case))
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        capture_stream = torch.cuda.current_stream().cuda_stream
        for plugin, descs, tensors, _case in steps:
            enqueue(plugin, descs, tensors, capture_stream)
    generator = torch.Generator().manual_seed(seed)
    checks = []
    for _ in range(replays):
        for _plugin, _descs, tensors, _case in steps:
            tensors.refill(generator)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        checks.append([check for _p, _d, tensors, case in steps for check in check_outputs(case, tensors)])
    guards = all(tensors.guards_intact() for _p, _d, tensors, _c in steps)
    for plugin, *_rest in steps:
        plugin.destroy()
    return GraphReplay(checks, guards)


# --- the whole lifecycle -----------------------------------------------------------------------------------------


@dataclass
class RunResult:
    shapes: tuple[Shape, ...]
    plugin: str  # which per-context plugin enqueued: "attached" or its "clone"
    checks: list[OutputCheck]
    guards_intact: bool


@dataclass
class LifecycleReport:
    case: NormCase
    build: BuildPhase
    runs: list[RunResult]
    host: HostCost

    @property
    def passed(self) -> bool:
        return all(run.guards_intact and all(c.passed for c in run.checks) for run in self.runs)


def drive(case: NormCase, seed: int = 0) -> LifecycleReport:
    """The full documented order on the GPU: build phase, runtime re-creation, attach and clone, then per run
    on_shape_change and an enqueue on a side stream (runs alternate between the attached plugin and its clone),
    checked against the reference; host cost at the last run's shapes; destroy."""
    import torch

    creator = CREATORS[case.config.op.name]()
    build = build_phase(creator, case)
    attached, clone = runtime_phase(creator, build)
    stream = torch.cuda.Stream()
    runs = []
    for index, shapes in enumerate(case.runs):
        role, plugin = (("attached", attached), ("clone", clone))[index % 2]
        tensors = device_tensors(case, shapes, seed + index)
        descs = shape_change(plugin, case, shapes)
        torch.cuda.synchronize()
        enqueue(plugin, descs, tensors, stream.cuda_stream)
        stream.synchronize()
        runs.append(RunResult(shapes, role, check_outputs(case, tensors), tensors.guards_intact()))
    cost = host_cost(plugin, descs, tensors, stream)
    for plugin in (attached, clone, build.plugin):
        plugin.destroy()
    return LifecycleReport(case, build, runs, cost)


def default_cases() -> list[NormCase]:
    """Every activation dtype with an fp32 and a same-dtype weight, every weight mode, Gemma's offset, an odd hidden
    size, Qwen3- and Gemma-like QK-norms, and fp32 -> bf16 and bf16 -> fp32 norms."""
    cases = []
    for dtype in ("float32", "float16", "bfloat16"):
        for weight_dtype in sorted({dtype, "float32"}):
            cases.append(rms_case(4096, dtype, weight_dtype, WeightMode.AFTER_CAST))
        cases.append(rms_case(2048, dtype, "float32", WeightMode.BEFORE_CAST, weight_offset=1.0))
        cases.append(rms_case(1000, dtype, None, WeightMode.NONE))
    cases.append(qk_case(32, 8, 128, "bfloat16", "bfloat16"))
    cases.append(qk_case(8, 4, 256, "float16", "float32", WeightMode.BEFORE_CAST, weight_offset=1.0))
    cases.append(qk_case(16, 16, 64, "float32", None, WeightMode.NONE))
    # Mixed precision (output_dtype): an optimum fp16/bf16 norm on an fp32 residual stream, and its reverse.
    cases.append(rms_case(4096, "float32", "bfloat16", WeightMode.AFTER_CAST, output_dtype="bfloat16"))
    cases.append(rms_case(4096, "bfloat16", "float32", WeightMode.AFTER_CAST, output_dtype="float32"))
    return cases


def main() -> int:
    import torch

    if not torch.cuda.is_available():
        print("trtfuse.bench.plugin_lifecycle: no CUDA device; run it on the GPU machine", file=sys.stderr)
        return 2
    failed = 0
    for case in default_cases():
        report = drive(case)
        worst = max((c.max_rel for run in report.runs for c in run.checks), default=0.0)
        status = "ok  " if report.passed else "FAIL"
        failed += not report.passed
        print(
            f"{status} {case.name:58s} worst rel err {worst:.2e}  enqueue {report.host.enqueue_us:6.2f} us"
            f"  (kernel launch {report.host.launch_us:6.2f} us)"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
