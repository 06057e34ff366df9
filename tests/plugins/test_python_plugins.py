"""The trtfuse TensorRT plugins on the CPU: creation from fields, validation, the build phase, serialisation, runtime
re-creation, clone / attach_to_context, and what enqueue hands the kernel.

TensorRT cannot be installed here; TensorRT-RTX's Python module provides the same plugin and descriptor types, so
where `tensorrt` is absent these tests ask for `tensorrt_rtx` (TRTFUSE_TRT_MODULE) and skip if it is missing too. The
kernels are replaced by a recorder of the calls the plugins make on them (the GPU tests run the real ones).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np
import pytest

from trtfuse import contract
from trtfuse import kernels as kernels_module
from trtfuse.bench.lifecycle.cases import NormCase, qk_case, rms_case
from trtfuse.bench.lifecycle.descriptors import dynamic_desc, run_descs
from trtfuse.bench.lifecycle.outputs import check_outputs, reference_norm
from trtfuse.bench.lifecycle.phases import build_phase, recreate, runtime_phase, shape_change
from trtfuse.bench.lifecycle.tensors import device_tensors
from trtfuse.contract import QK_NORM, QK_NORM_OP, RMS_NORM, RMS_NORM_OP, NormParams, WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.errors import TrtfuseError
from trtfuse.plugins import registry as plugin_registry
from trtfuse.plugins.python.creators import CREATORS
from trtfuse.plugins.python.fields import parse_fields
from trtfuse.plugins.python.qk_norm import QkNormPluginCreator
from trtfuse.plugins.python.rms_norm import RmsNormPluginCreator
from trtfuse.plugins.trt_module import RTX_MODULE, TRT_MODULE_ENV

from support.plugin_fields import RecordingKernel, create, f32, fields_of, i32, rms_fields, trt

FLOATS = ("float32", "float16", "bfloat16")


CASES = [
    rms_case(64, "bfloat16", "float32"),
    rms_case(64, "float16", "float16", WeightMode.BEFORE_CAST, weight_offset=1.0),
    rms_case(40, "float32", None, WeightMode.NONE),
    qk_case(4, 2, 128, "bfloat16", "bfloat16"),
    qk_case(2, 1, 64, "float16", None, WeightMode.NONE),
]


@pytest.fixture(params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> NormCase:
    return request.param


# --- registration and creators -----------------------------------------------------------------------------------


@pytest.fixture
def registry() -> Iterator[Any]:
    """TensorRT's plugin registry, left without trtfuse creators afterwards: with TensorRT-RTX standing in, a
    registered Python plugin would make a later test's network build abort the process."""
    registry = trt.get_plugin_registry()
    yield registry
    for creator in list(registry.all_creators):
        if getattr(creator, "plugin_namespace", None) == "trtfuse":
            registry.deregister_creator(creator)


def test_register_adds_one_creator_per_node_kind_once(registry: Any) -> None:
    first = plugin_registry.register_python()
    second = plugin_registry.register_python()
    assert set(first) == set(contract.FUSED_OPS)
    assert first == second
    for op in contract.FUSED_OPS:
        assert registry.get_creator(op, "1", "trtfuse") is first[op]
    trtfuse_creators = [c for c in registry.all_creators if getattr(c, "plugin_namespace", None) == "trtfuse"]
    assert len(trtfuse_creators) == len(contract.FUSED_OPS)


@pytest.mark.parametrize(
    ("creator_class", "op", "names"),
    [(RmsNormPluginCreator, RMS_NORM_OP, RMS_NORM.fields), (QkNormPluginCreator, QK_NORM_OP, QK_NORM.fields)],
)
def test_creator_advertises_the_contract_fields(creator_class: type, op: str, names: tuple[str, ...]) -> None:
    creator = creator_class()
    assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (op, "trtfuse", "1")
    advertised = [(f.name, f.type) for f in creator.field_names]
    floats = {"epsilon", "weight_offset"}
    expected = [(n, trt.PluginFieldType.FLOAT32 if n in floats else trt.PluginFieldType.INT32) for n in names]
    assert advertised == expected


# --- field validation --------------------------------------------------------------------------------------------

BAD_FIELDS = [
    ("missing", {"epsilon": None}, "epsilon is missing (TrtfuseRmsNorm takes epsilon, weight_offset, weight_mode"),
    ("output dtype missing", {"output_dtype": None}, "output_dtype is missing"),
    ("unknown", {"momentum": f32(0.9)}, "momentum is not a field of TrtfuseRmsNorm"),
    ("wrong type", {"epsilon": i32(1)}, "epsilon must be FLOAT32, got INT32"),
    ("int as float", {"hidden_size": f32(64.0)}, "hidden_size must be INT32, got FLOAT32"),
    ("two values", {"epsilon": (np.array([1e-6, 1e-5], np.float32), trt.PluginFieldType.FLOAT32)}, "exactly one"),
    ("no value", {"epsilon": (np.array([], np.float32), trt.PluginFieldType.FLOAT32)}, "exactly one value, got 0"),
    (
        "negative epsilon",
        {"epsilon": f32(-1e-6)},
        "epsilon is -9.999999974752427e-07, not a finite non-negative number",
    ),
    ("nan epsilon", {"epsilon": f32(float("nan"))}, "epsilon is nan, not a finite non-negative number"),
    ("inf offset", {"weight_offset": f32(float("inf"))}, "weight_offset is inf, not a finite number"),
    ("bad mode", {"weight_mode": i32(3)}, "weight_mode is 3, none of 0 (NONE), 1 (AFTER_CAST), 2 (BEFORE_CAST)"),
    ("zero hidden", {"hidden_size": i32(0)}, "hidden_size is 0, not a positive int32 length"),
    ("inexact float64", {"epsilon": (np.array([1e-6]), trt.PluginFieldType.FLOAT64)}, "not a float32 value"),
    ("qk field", {"q_hidden_size": i32(64)}, "q_hidden_size is not a field of TrtfuseRmsNorm"),
    (
        "other namespace",
        {"plugin_namespace": (np.frombuffer(b"other", np.int8).copy(), trt.PluginFieldType.CHAR)},
        "plugin_namespace is 'other', but this creator is 'trtfuse'",
    ),
]


@pytest.mark.parametrize(("overrides", "message"), [c[1:] for c in BAD_FIELDS], ids=[c[0] for c in BAD_FIELDS])
def test_bad_fields_are_rejected_at_creation_with_one_line(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(TrtfuseError) as raised:
        create(RmsNormPluginCreator(), rms_fields(**overrides))
    text = str(raised.value)
    assert message in text
    assert text.startswith("TrtfuseRmsNorm 'layers.0.norm': field ")
    assert "\n" not in text


def test_duplicate_field_is_rejected() -> None:
    values = rms_fields()
    collection, _arrays = fields_of(**values)
    duplicate = trt.PluginFieldCollection([*collection, trt.PluginField("epsilon", *f32(1e-5))])
    with pytest.raises(TrtfuseError, match="field epsilon is given twice"):
        RmsNormPluginCreator().create_plugin("n", duplicate, trt.TensorRTPhase.BUILD)


def test_qk_creator_requires_both_hidden_sizes() -> None:
    values = {
        "epsilon": f32(1e-6),
        "weight_offset": f32(0.0),
        "weight_mode": i32(1),
        "q_hidden_size": i32(128),
        "output_dtype": i32(10),
    }
    with pytest.raises(TrtfuseError, match=r"TrtfuseQkNorm 'n': field k_hidden_size is missing"):
        create(QkNormPluginCreator(), values, node="n")


def test_tolerated_field_forms() -> None:
    """What another producer may send: the parser's lookup attributes naming this plugin, INT64 ints, and a FLOAT64
    that is exactly a float32."""
    tolerated = rms_fields(
        plugin_namespace=(np.frombuffer(b"trtfuse\0", np.int8).copy(), trt.PluginFieldType.CHAR),
        plugin_version=(np.frombuffer(b"1", np.int8).copy(), trt.PluginFieldType.CHAR),
        hidden_size=(np.array([64], np.int64), trt.PluginFieldType.INT64),
        epsilon=(np.array([np.float32(1e-6)], np.float64), trt.PluginFieldType.FLOAT64),
    )
    plugin = create(RmsNormPluginCreator(), tolerated)
    assert plugin.config == NodeFields(
        RMS_NORM, NormParams(float(np.float32(1e-6)), 0.0, WeightMode.AFTER_CAST), (64,), "float16"
    )


# --- build phase -------------------------------------------------------------------------------------------------


def test_build_phase_answers_types_shapes_and_formats(case: NormCase, kernels: list[RecordingKernel]) -> None:
    build = build_phase(CREATORS[case.config.op.name](), case)
    activations = len(case.config.hidden_sizes)
    assert build.plugin.num_outputs == activations
    assert build.output_dtypes == (case.dtype,) * activations
    assert build.output_ranks == tuple(len(shape) for shape in case.max_shapes)
    # The first activation: every dtype that pairs with the node's output dtype (contract.dtype_pair_problem).
    pairs = tuple(d for d in FLOATS if contract.dtype_pair_problem(d, case.config.output_dtype) is None)
    expected: dict[int, tuple[str, ...]] = {0: pairs}
    expected.update({i: (case.dtype,) for i in range(1, activations)})  # k shares q's dtype
    position = activations
    if case.config.has_weight:
        expected[position] = FLOATS  # the weight's dtype is its own, whatever the activations'
        expected.update({position + i: (case.weight_dtype,) for i in range(1, activations)})
        position += activations
    expected.update({position + i: (case.config.output_dtype,) for i in range(activations)})  # output_dtype
    assert build.accepted == expected
    assert build.non_linear_accepted == []


def test_build_phase_rejects_a_wrong_number_of_inputs() -> None:
    plugin = create(RmsNormPluginCreator(), rms_fields())
    with pytest.raises(TrtfuseError, match=r"expected 2 inputs \(x, weight\) with weight_mode AFTER_CAST, got 1"):
        plugin.get_output_data_types([trt.DataType.HALF])
    with pytest.raises(TrtfuseError, match="expected 2 inputs"):
        plugin.get_output_shapes([trt.DimsExprs(2)], [], None)
    in_out = [dynamic_desc((4, 64), (4, 64), (4, 64), "float16")] * 2
    assert not plugin.supports_format_combination(0, in_out, 1)


def test_build_phase_rejects_non_float_activations() -> None:
    plugin = create(RmsNormPluginCreator(), rms_fields())
    with pytest.raises(TrtfuseError, match="input 'x' has dtype INT32; supported: float32, float16, bfloat16"):
        plugin.get_output_data_types([trt.DataType.INT32, trt.DataType.FLOAT])


def test_configure_warms_the_kernel_up_for_the_profile(case: NormCase, kernels: list[RecordingKernel]) -> None:
    creator = CREATORS[case.config.op.name]()
    build_phase(creator, case)
    (kernel,) = kernels
    spec = kernel.spec
    assert isinstance(
        spec, kernels_module.RmsNormSpec if case.config.op.name == RMS_NORM_OP else kernels_module.QkNormSpec
    )
    assert (spec.dtype, spec.weight_dtype) == (case.dtype, case.weight_dtype)
    assert spec.params == case.config.params
    hidden = (spec.hidden,) if case.config.op.name == RMS_NORM_OP else (spec.q_hidden, spec.k_hidden)
    assert hidden == case.config.hidden_sizes
    max_rows = max(int(np.prod(shape[:-1])) for shape in case.max_shapes)
    assert kernel.warm_ups == [max_rows]
    assert kernel.launches == []


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([(2, 8, 32), (64,)], r"input 'x' has shape \[2, 8, 32\]; its last dim must be 64"),
        ([(2, 8, 64), (32,)], r"input 'weight' has shape \[32\], expected \[64\]"),
        ([(2, 8, 64), (2, 64)], r"input 'weight' has shape \[2, 64\], expected \[64\] or \[1, ..., 1, 64\]"),
    ],
)
def test_configure_rejects_shapes_that_contradict_the_fields(shapes: list[tuple[int, ...]], message: str) -> None:
    plugin = create(RmsNormPluginCreator(), rms_fields())
    inputs = [dynamic_desc(shape, shape, shape, "float16") for shape in shapes]
    output = [dynamic_desc(shapes[0], shapes[0], shapes[0], "float16")]
    with pytest.raises(TrtfuseError, match=message):
        plugin.configure_plugin(inputs, output)


# --- serialisation and runtime re-creation -----------------------------------------------------------------------

EPSILONS = [1e-6, 1e-5, 1.0 / 3.0, float(np.nextafter(np.float32(1e-6), np.float32(1))), 1e-45, 0.0]


@pytest.mark.parametrize("epsilon", EPSILONS)
@pytest.mark.parametrize("weight_offset", [0.0, 1.0, -0.1])
def test_serialised_fields_recreate_the_plugin_bit_exactly(
    epsilon: float, weight_offset: float, kernels: list[RecordingKernel]
) -> None:
    case = qk_case(4, 2, 64, "bfloat16", "float32", WeightMode.BEFORE_CAST, weight_offset, epsilon)
    creator = QkNormPluginCreator()
    build = build_phase(creator, case)
    stored = {f.name: f for f in build.serialized}
    assert list(stored) == list(QK_NORM.fields)
    assert stored["epsilon"].type == trt.PluginFieldType.FLOAT32
    assert stored["epsilon"].data.view(np.uint32)[0] == np.float32(epsilon).view(np.uint32)
    assert stored["weight_offset"].data.view(np.uint32)[0] == np.float32(weight_offset).view(np.uint32)
    recreated = recreate(creator, build.serialized)
    assert recreated.config == build.plugin.config == case.config
    assert recreated.phase == trt.TensorRTPhase.RUNTIME
    again = [(f.name, f.type, np.array(f.data).tobytes()) for f in recreated.get_fields_to_serialize()]
    assert again == [(f.name, f.type, f.data.tobytes()) for f in build.serialized]


# --- runtime: attach, clone, shape changes, enqueue --------------------------------------------------------------


def enqueue_args(plugin: Any, case: NormCase, shapes: tuple[tuple[int, ...], ...], stream: int) -> None:
    inputs, outputs = run_descs(case, shapes)
    plugin.enqueue(
        inputs, outputs, [0x1000 * (i + 1) for i in range(len(inputs))], [0xA000, 0xB000][: len(outputs)], 0, stream
    )


def expected_launch(case: NormCase, shapes: tuple[tuple[int, ...], ...], stream: int) -> tuple[int, ...]:
    activations = len(shapes)
    pointers = [0x1000 * (i + 1) for i in range(activations)]
    weights = (
        [0x1000 * (activations + i + 1) for i in range(activations)] if case.config.has_weight else [0] * activations
    )
    rows = [int(np.prod(shape[:-1])) for shape in shapes]
    return (*pointers, *weights, *[0xA000, 0xB000][:activations], *rows, stream)


def test_enqueue_launches_with_pointers_rows_and_stream(case: NormCase, kernels: list[RecordingKernel]) -> None:
    creator = CREATORS[case.config.op.name]()
    attached, _clone = runtime_phase(creator, build_phase(creator, case))
    for index, shapes in enumerate(case.runs):
        shape_change(attached, case, shapes)
        enqueue_args(attached, case, shapes, stream=0x5000 + index)
    build_kernel, runtime_kernel = kernels
    assert build_kernel.launches == []
    assert runtime_kernel.launches == [
        expected_launch(case, shapes, 0x5000 + index) for index, shapes in enumerate(case.runs)
    ]


def test_runtime_plugin_warms_up_as_rows_grow(kernels: list[RecordingKernel]) -> None:
    case = rms_case(64, "float16", "float16", runs=((1, 1), (1, 3), (1, 2), (4, 16)))
    creator = RmsNormPluginCreator()
    plugin = recreate(creator, build_phase(creator, case).serialized)
    for shapes in case.runs:
        shape_change(plugin, case, shapes)
    assert kernels[-1].warm_ups == [1, 3, 64]


def test_clone_and_attached_copies_keep_their_own_shapes(kernels: list[RecordingKernel]) -> None:
    case = rms_case(64, "bfloat16", "bfloat16")
    creator = RmsNormPluginCreator()
    build = build_phase(creator, case)
    first = build.plugin.attach_to_context(None)
    second = build.plugin.attach_to_context(None)
    assert first is not second and first is not build.plugin
    shape_change(first, case, ((2, 64, 64),))
    shape_change(second, case, ((1, 1, 64),))
    twin = first.clone()
    enqueue_args(twin, case, ((2, 64, 64),), stream=1)
    enqueue_args(second, case, ((1, 1, 64),), stream=2)
    enqueue_args(first, case, ((2, 64, 64),), stream=3)
    launches = kernels[0].launches
    assert [(args[3], args[4]) for args in launches] == [(128, 1), (1, 2), (128, 3)]
    twin.destroy()
    enqueue_args(first, case, ((2, 64, 64),), stream=4)
    assert launches[-1][3:] == (128, 4)
    assert twin.config == first.config and twin.plugin_name == RMS_NORM_OP and twin.plugin_namespace == "trtfuse"


def test_enqueue_before_preparation_or_after_destroy_raises(kernels: list[RecordingKernel]) -> None:
    case = rms_case(64, "float32", "float32")
    creator = RmsNormPluginCreator()
    plugin = create(creator, rms_fields(), node="n", phase=trt.TensorRTPhase.RUNTIME)
    with pytest.raises(TrtfuseError, match="TrtfuseRmsNorm 'n': enqueue before on_shape_change gave the shapes"):
        enqueue_args(plugin, case, ((1, 1, 64),), stream=0)
    shape_change(plugin, case, ((1, 1, 64),))
    enqueue_args(plugin, case, ((1, 1, 64),), stream=0)
    plugin.destroy()
    with pytest.raises(TrtfuseError, match="enqueue before on_shape_change"):
        enqueue_args(plugin, case, ((1, 1, 64),), stream=0)


def test_configured_plugin_still_waits_for_shapes_and_skips_empty_tensors(kernels: list[RecordingKernel]) -> None:
    case = rms_case(64, "float16", "float32")
    build = build_phase(RmsNormPluginCreator(), case)
    with pytest.raises(TrtfuseError, match="enqueue before on_shape_change"):
        enqueue_args(build.plugin.clone(), case, ((1, 1, 64),), stream=0)
    shape_change(build.plugin, case, ((1, 0, 64),))
    enqueue_args(build.plugin.clone(), case, ((1, 0, 64),), stream=0)
    shape_change(build.plugin, case, ((1, 2, 64),))
    enqueue_args(build.plugin, case, ((1, 2, 64),), stream=0)
    assert [launch[3] for launch in kernels[0].launches] == [2]


def test_parse_fields_matches_the_creator() -> None:
    collection, _arrays = fields_of(**rms_fields(weight_mode=i32(2), weight_offset=f32(1.0)))
    config = parse_fields(RMS_NORM_OP, collection)
    expected = NodeFields(RMS_NORM, NormParams(float(np.float32(1e-6)), 1.0, WeightMode.BEFORE_CAST), (64,), "float16")
    assert config == expected
    assert replace(config, params=replace(config.params, weight_mode=WeightMode.NONE)).has_weight is False


# --- imports -----------------------------------------------------------------------------------------------------


def run_python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items() if key != TRT_MODULE_ENV}
    environment.update(env)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=environment, check=False)


def test_plugin_modules_import_without_kernels_and_take_rtx_only_when_asked() -> None:
    probe = run_python(
        "import sys, trtfuse.plugins.python.rms_norm, trtfuse.plugins.python.qk_norm\n"
        "from trtfuse.plugins.python.base import trt\n"
        "assert 'trtfuse.kernels' not in sys.modules, 'kernels imported eagerly'\n"
        "print(trt.__name__)",
        **{TRT_MODULE_ENV: RTX_MODULE},
    )
    assert probe.returncode == 0, probe.stderr
    assert probe.stdout.strip() in ("tensorrt", RTX_MODULE)


def test_without_tensorrt_the_package_imports_and_register_says_what_is_missing() -> None:
    if run_python("import tensorrt").returncode == 0:
        pytest.skip("the real `tensorrt` is installed: nothing is missing")
    probe = run_python("import trtfuse.plugins.registry as r\nr.register_python()")
    assert probe.returncode == 1
    last_line = probe.stderr.strip().splitlines()[-1]
    assert "MissingDependencyError: the trtfuse plugins need TensorRT's Python module `tensorrt`" in last_line


# --- the harness's own checks, so a GPU failure means the plugin and not the harness -----------------------------


@pytest.mark.parametrize("dtype", FLOATS)
def test_harness_checks_catch_wrong_unwritten_and_overrunning_outputs(dtype: str) -> None:
    import torch

    case = qk_case(4, 2, 64, dtype, "float32", WeightMode.BEFORE_CAST, weight_offset=1.0, runs=(3,))
    tensors = device_tensors(case, case.runs[0], seed=0, device="cpu")
    q, k, q_weight, k_weight = tensors.inputs
    tensors.outputs[0].copy_(reference_norm(q, q_weight, case.config))
    tensors.outputs[1].copy_(reference_norm(k, k_weight, case.config))
    assert all(check.passed for check in check_outputs(case, tensors))
    assert tensors.guards_intact()

    without_offset = replace(case.config, params=replace(case.config.params, weight_offset=0.0))
    tensors.outputs[1].copy_(reference_norm(k, k_weight, without_offset))
    assert [check.passed for check in check_outputs(case, tensors)] == [True, False]

    tensors.outputs[0].view(-1)[-1] = float("nan")
    assert check_outputs(case, tensors)[0].unwritten == 1
    tensors.output_buffers[1][tensors.outputs[1].numel()] = 0
    assert not tensors.guards_intact()
    tensors.refill(torch.Generator().manual_seed(1))
    assert tensors.guards_intact() and bool(tensors.outputs[0].isnan().all())
    assert tensors.inputs[0].data_ptr() == q.data_ptr()


def test_reference_places_the_cast_where_the_weight_mode_says() -> None:
    import torch

    x = torch.tensor([[0.3, -1.7, 2.9, 0.11]], dtype=torch.bfloat16)
    weight = torch.tensor([1.01, 0.99, 1.03, 0.97], dtype=torch.float32)
    modes = {}
    for mode in WeightMode:
        config = NodeFields(RMS_NORM, NormParams(1e-6, 0.0, mode), (4,), "bfloat16")
        modes[mode] = reference_norm(x, weight, config).double()
    normed = x.double() / x.double().pow(2).mean().add(1e-6).sqrt()
    assert torch.equal(modes[WeightMode.NONE], normed.to(torch.bfloat16).double())
    assert torch.equal(modes[WeightMode.BEFORE_CAST], (normed * weight.double()).to(torch.bfloat16).double())
    after = (normed.to(torch.bfloat16).double() * weight.double()).to(torch.bfloat16).double()
    assert torch.equal(modes[WeightMode.AFTER_CAST], after)
    assert not torch.equal(modes[WeightMode.AFTER_CAST], modes[WeightMode.BEFORE_CAST])


def test_configure_accepts_a_weight_with_leading_ones(kernels: list[RecordingKernel]) -> None:
    plugin = create(RmsNormPluginCreator(), rms_fields(output_dtype=i32(16)))
    shapes = [(3, 64), (1, 1, 64)]
    inputs = [dynamic_desc(shape, shape, shape, "bfloat16") for shape in shapes]
    plugin.configure_plugin(inputs, [dynamic_desc((3, 64), (3, 64), (3, 64), "bfloat16")])
    assert kernels[0].warm_ups == [3]


@pytest.mark.parametrize(
    "case",
    [rms_case(4096, "bfloat16", "float32"), qk_case(32, 8, 128, "bfloat16", "bfloat16")],
    ids=["rms", "qk"],
)
def test_the_real_kernels_compile_through_configure_plugin(case: NormCase) -> None:
    """Without a GPU trtfuse.kernels compiles for sm_90a: configure_plugin's warm-up builds every variant for real,
    and a plugin re-created at runtime gets the process's same kernel object."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    creator = CREATORS[case.config.op.name]()
    build = build_phase(creator, case)
    is_rms = case.config.op.name == RMS_NORM_OP
    assert isinstance(build.plugin.kernel, kernels_module.RmsNormKernel if is_rms else kernels_module.QkNormKernel)
    assert (build.plugin.kernel.spec.dtype, build.plugin.kernel.spec.params.epsilon) == (
        case.dtype,
        case.config.params.epsilon,
    )
    attached, _clone = runtime_phase(creator, build)
    shape_change(attached, case, case.runs[-1])
    assert attached.kernel is build.plugin.kernel
