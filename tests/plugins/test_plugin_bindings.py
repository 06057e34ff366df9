"""What TensorRT's Python bindings demand of a Python IPluginV3, read off their source, checked against the plugins.

TensorRT's `python/src/infer/pyPlugin.cpp` (10.8 to 11.1) looks each plugin method up with `getOverride` and, for
the methods listed below, raises "no implementation provided for X()" and returns an error code when the Python
class lacks it: the engine build (or the engine run) stops there. Attributes such as `num_outputs` must be set, or the
binding raises "X not initialized". These tests need only the plugin types (TensorRT-RTX's stand in where TensorRT is
absent), not an engine.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import pytest

import trtfuse
from trtfuse.bench.lifecycle.cases import rms_case
from trtfuse.bench.lifecycle.phases import build_phase, runtime_phase
from trtfuse.contract import RMS_NORM, NormParams, WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.errors import TrtfuseError
from trtfuse.plugins import creation_errors, registry
from trtfuse.plugins.python.add_rms_norm import AddRmsNormPlugin, AddRmsNormPluginCreator
from trtfuse.plugins.python.base import DEFAULT_TACTIC, NormPlugin, NormPluginCreator, timing_cache_id
from trtfuse.plugins.python.qk_norm import QkNormPlugin, QkNormPluginCreator
from trtfuse.plugins.python.rms_norm import RmsNormPlugin, RmsNormPluginCreator

from support.plugin_fields import trt

# pyPlugin.cpp: getOverride(...) followed by throwPyError("no implementation provided for ...()").
REQUIRED_PLUGIN_METHODS = (
    "get_capability_interface",  # IPluginV3
    "clone",  # IPluginV3
    "supports_format_combination",  # IPluginV3OneBuild
    "get_output_data_types",  # IPluginV3OneBuild
    "get_output_shapes",  # IPluginV3OneBuild
    "configure_plugin",  # IPluginV3OneBuild
    "enqueue",  # IPluginV3OneRuntime
    "set_tactic",  # IPluginV3OneRuntime
    "on_shape_change",  # IPluginV3OneRuntime
    "attach_to_context",  # IPluginV3OneRuntime
    "get_fields_to_serialize",  # IPluginV3OneRuntime
)
REQUIRED_CREATOR_METHODS = ("create_plugin",)  # IPluginCreatorV3One
# Properties the binding reads and raises "... not initialized" for when they were never set.
REQUIRED_PLUGIN_ATTRIBUTES = ("plugin_name", "plugin_namespace", "plugin_version", "num_outputs")
REQUIRED_CREATOR_ATTRIBUTES = ("name", "plugin_namespace", "plugin_version", "field_names")


def python_methods(cls: type) -> set[str]:
    """Names defined by the Python classes of cls's MRO: what pybind11's get_override can find (the C++ bases'
    methods do not count)."""
    return {name for klass in cls.__mro__ if klass.__module__.startswith("trtfuse") for name in vars(klass)}


@pytest.mark.parametrize("plugin_class", [RmsNormPlugin, QkNormPlugin, AddRmsNormPlugin])
def test_every_method_the_bindings_require_is_written_in_python(plugin_class: type[NormPlugin]) -> None:
    missing = [name for name in REQUIRED_PLUGIN_METHODS if name not in python_methods(plugin_class)]
    assert not missing, f"{plugin_class.__name__} lacks {missing}: TensorRT would stop the build there"


@pytest.mark.parametrize("creator_class", [RmsNormPluginCreator, QkNormPluginCreator, AddRmsNormPluginCreator])
def test_creators_have_what_the_bindings_read(creator_class: type[NormPluginCreator]) -> None:
    assert set(REQUIRED_CREATOR_METHODS) <= python_methods(creator_class)
    creator = creator_class()
    for name in REQUIRED_CREATOR_ATTRIBUTES:
        assert getattr(creator, name), name


def rms_plugin(**changes: Any) -> RmsNormPlugin:
    config = replace(NodeFields(RMS_NORM, NormParams(1e-6, 0.0, WeightMode.AFTER_CAST), (64,), "float16"), **changes)
    return RmsNormPlugin(config, trt.TensorRTPhase.BUILD, "layers.0.norm")


def test_plugins_set_what_the_bindings_read() -> None:
    plugin = rms_plugin()
    for name in REQUIRED_PLUGIN_ATTRIBUTES:
        assert getattr(plugin, name), name
    assert plugin.num_outputs == 1


def test_set_tactic_takes_the_default_and_refuses_others() -> None:
    plugin = rms_plugin()
    plugin.set_tactic(DEFAULT_TACTIC)
    with pytest.raises(TrtfuseError, match=r"TrtfuseRmsNorm 'layers.0.norm': TensorRT asked for tactic 3"):
        plugin.set_tactic(3)


def test_timing_cache_id_tells_apart_nodes_that_compile_differently() -> None:
    """An empty or shared ID would let TensorRT reuse one node's timings for a node with another epsilon, offset,
    mode or width."""
    base = NodeFields(RMS_NORM, NormParams(1e-6, 0.0, WeightMode.AFTER_CAST), (64,), "float16")
    variants = [
        base,
        replace(base, params=replace(base.params, epsilon=1e-5)),
        replace(base, params=replace(base.params, epsilon=float(np.nextafter(np.float32(1e-6), np.float32(1))))),
        replace(base, params=replace(base.params, weight_offset=1.0)),
        replace(base, params=replace(base.params, weight_mode=WeightMode.BEFORE_CAST)),
        replace(base, hidden_sizes=(128,)),
    ]
    ids = [timing_cache_id(config) for config in variants]
    assert len(set(ids)) == len(ids)
    assert all(trtfuse.__version__ in identifier for identifier in ids)
    assert rms_plugin().timing_cache_id == ids[0]


def test_lifecycle_driver_calls_set_tactic_in_both_phases(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, int]] = []
    original = NormPlugin.set_tactic

    def recording(self: NormPlugin, tactic: int) -> None:
        calls.append((self.phase.name, tactic))
        original(self, tactic)

    monkeypatch.setattr(NormPlugin, "set_tactic", recording)
    monkeypatch.setattr(NormPlugin, "_prepare", lambda self, types, rows: None)
    case = rms_case(64, "float16", "float16", WeightMode.AFTER_CAST)
    creator = RmsNormPluginCreator()
    runtime_phase(creator, build_phase(creator, case))
    assert calls == [("BUILD", 0), ("RUNTIME", 0), ("RUNTIME", 0)]


@pytest.mark.parametrize("field_type", ["FLOAT16", "BF16"])
def test_sixteen_bit_fields_are_refused_by_type_before_their_data_is_read(field_type: str) -> None:
    """A hand-edited node can carry epsilon as a float16 tensor attribute; the parser passes it as a FLOAT16 field,
    whose `data` the binding refuses to read."""
    kind = getattr(trt.PluginFieldType, field_type)
    arrays = {
        "epsilon": (np.array([1e-6], np.float16), kind),
        "weight_offset": (np.array([0.0], np.float32), trt.PluginFieldType.FLOAT32),
        "weight_mode": (np.array([1], np.int32), trt.PluginFieldType.INT32),
        "hidden_size": (np.array([64], np.int32), trt.PluginFieldType.INT32),
    }
    collection = trt.PluginFieldCollection([trt.PluginField(n, a, k) for n, (a, k) in arrays.items()])
    creation_errors.take_creation_errors()
    with pytest.raises(TrtfuseError, match=rf"field epsilon must be FLOAT32, got {field_type}"):
        RmsNormPluginCreator().create_plugin("n", collection, trt.TensorRTPhase.BUILD)
    assert creation_errors.take_creation_errors() == [
        f"TrtfuseRmsNorm 'n': field epsilon must be FLOAT32, got {field_type}"
    ]
    assert creation_errors.take_creation_errors() == []


def test_a_string_field_of_another_type_is_refused() -> None:
    arrays = {
        "plugin_namespace": (np.array([1], np.int32), trt.PluginFieldType.INT32),
        "epsilon": (np.array([1e-6], np.float32), trt.PluginFieldType.FLOAT32),
    }
    collection = trt.PluginFieldCollection([trt.PluginField(n, a, k) for n, (a, k) in arrays.items()])
    with pytest.raises(TrtfuseError, match=r"field plugin_namespace must be a string \(CHAR\), got INT32"):
        RmsNormPluginCreator().create_plugin("n", collection, trt.TensorRTPhase.BUILD)
    creation_errors.take_creation_errors()


class RefusingRegistry:
    """A plugin registry whose register_creator returns False, as TensorRT's does when it refuses a creator."""

    all_creators: tuple[Any, ...] = ()

    def register_creator(self, creator: Any, namespace: str) -> bool:
        return False


def test_register_fails_loudly_when_the_registry_refuses(monkeypatch: pytest.MonkeyPatch) -> None:
    class Module:
        @staticmethod
        def get_plugin_registry() -> RefusingRegistry:
            return RefusingRegistry()

    monkeypatch.setattr(registry, "load_trt", lambda: Module)
    with pytest.raises(TrtfuseError, match=r"refused the TrtfuseRmsNorm creator in namespace 'trtfuse'"):
        registry.register_python()
