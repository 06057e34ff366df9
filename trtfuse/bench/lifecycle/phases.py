"""The IPluginV3 calls in TensorRT's order: the build phase up to the serialised fields, then the runtime phase's
re-creation, attach, clone, on_shape_change and enqueue."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from trtfuse.bench.lifecycle.cases import NormCase, Shape
from trtfuse.bench.lifecycle.descriptors import DTYPE_BY_NAME, dynamic_desc, parser_fields, profile_descs, run_descs
from trtfuse.plugins.python.base import DEFAULT_TACTIC, OUTPUT_DTYPE_NAMES, NormPlugin, NormPluginCreator, trt

if TYPE_CHECKING:
    from trtfuse.bench.lifecycle.tensors import DeviceTensors

CAPABILITIES = ("CORE", "BUILD", "RUNTIME")


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
    chosen = [*case.input_dtypes, *case.output_dtypes]
    shapes = [*case.input_shapes(case.max_shapes), *case.output_shapes(case.max_shapes)]
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
                names.append(OUTPUT_DTYPE_NAMES.get(data_type, data_type_name))
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
        output_dtypes=tuple(OUTPUT_DTYPE_NAMES.get(t, t.name) for t in output_types),
        output_ranks=tuple(len(s) for s in shapes),
        accepted=accepted,
        non_linear_accepted=non_linear,
        serialized=serialized,
    )


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


def shape_change(plugin: NormPlugin, case: NormCase, part_shapes: Sequence[Shape]) -> tuple[list[Any], list[Any]]:
    """on_shape_change for a run (one shape per part); returns the (input, output) descriptors its enqueues get."""
    input_descs, output_descs = run_descs(case, part_shapes)
    plugin.on_shape_change(input_descs, output_descs)
    return input_descs, output_descs


def enqueue(plugin: NormPlugin, descs: tuple[list[Any], list[Any]], tensors: DeviceTensors, stream: int) -> None:
    plugin.enqueue(descs[0], descs[1], tensors.input_ptrs, tensors.output_ptrs, 0, stream)
