"""The TrtfuseAddRmsNorm Python plugin on the CPU: creation from fields, the build phase at every position, shape
checks (x and residual of one shape), serialisation, runtime re-creation, and what enqueue hands the kernel.

As in test_python_plugins.py, TensorRT-RTX's module stands in for TensorRT's plugin types and a recorder for the
kernels. Cases, descriptors and phases are the lifecycle harness's (trtfuse/bench/lifecycle/); only the shapes no
case describes (a residual of another shape than x's) are built here from its descriptor functions.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

from trtfuse import contract
from trtfuse import kernels as kernels_module
from trtfuse.bench.lifecycle.cases import NormCase, Shape
from trtfuse.bench.lifecycle.cases import add_case as harness_add_case
from trtfuse.bench.lifecycle.descriptors import (
    DTYPE_BY_NAME,
    dynamic_desc,
    parser_fields,
    profile_descs,
    run_descs,
    tensor_desc,
)
from trtfuse.bench.lifecycle.phases import build_phase, probe_formats, recreate, runtime_phase
from trtfuse.contract import ADD_RMS_NORM, ADD_RMS_NORM_OP, WeightMode
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.python.add_rms_norm import AddRmsNormPlugin, AddRmsNormPluginCreator
from trtfuse.plugins.python.base import DTYPE_NAMES

from support.plugin_fields import RecordingKernel, create, f32, i32, trt

FLOATS = ("float32", "float16", "bfloat16")
HIDDEN = 64
NODE = "layers.1.post_attention_layernorm"
MIN_SHAPE: Shape = (1, 1, HIDDEN)
MAX_SHAPE: Shape = (4, 256, HIDDEN)


def add_case(
    dtype: str,
    weight_dtype: str | None,
    mode: WeightMode = WeightMode.AFTER_CAST,
    output_dtype: str | None = None,
    offset: float = 0.0,
    epsilon: float = 1e-6,
) -> NormCase:
    """The harness's add-norm case over [*, *, HIDDEN]: profile (1, 1) to (4, 256) leading dims, runs of 1024, 3
    and 1 rows."""
    return harness_add_case(HIDDEN, dtype, weight_dtype, mode, offset, epsilon, output_dtype=output_dtype)


CASES = [
    add_case("bfloat16", "bfloat16"),
    add_case("float16", "float32", WeightMode.BEFORE_CAST, offset=1.0),
    add_case("float32", "float16", WeightMode.AFTER_CAST, output_dtype="float16"),  # an fp32 residual stream
    add_case("bfloat16", "float32", WeightMode.AFTER_CAST, output_dtype="float32"),
    add_case("float32", None, WeightMode.NONE, output_dtype="bfloat16"),
    add_case("float16", None, WeightMode.NONE),
]


@pytest.fixture(params=CASES, ids=[case.name for case in CASES])
def case(request: pytest.FixtureRequest) -> NormCase:
    return request.param


def build_plugin(case: NormCase, phase: Any = None) -> AddRmsNormPlugin:
    collection, _arrays = parser_fields(case.config)
    return AddRmsNormPluginCreator().create_plugin(NODE, collection, phase or trt.TensorRTPhase.BUILD)


def x_runs(case: NormCase) -> list[Shape]:
    """x's shape in each of the case's runs (the residual's is the same)."""
    return [shapes[0] for shapes in case.runs]


def x_descs(case: NormCase, x: Shape) -> tuple[list[Any], list[Any]]:
    """The harness's run descriptors for x of shape `x` (and the residual of the same)."""
    return run_descs(case, (x,))


def mismatched_descs(case: NormCase, x: Shape, residual: Shape) -> tuple[list[Any], list[Any]]:
    """Run descriptors with a residual of another shape than x's: a shape no case describes."""
    shapes = [x, residual] + ([(HIDDEN,)] if case.config.has_weight else [])
    inputs = [tensor_desc(shape, dtype) for shape, dtype in zip(shapes, case.input_dtypes, strict=True)]
    return inputs, [tensor_desc(x, dtype) for dtype in case.output_dtypes]


def profile_with_residual(case: NormCase, low: Shape, high: Shape) -> tuple[list[Any], list[Any]]:
    """configure_plugin's descriptors with the residual's min / max as given, the others the case's profile."""
    inputs, outputs = profile_descs(case)
    inputs[1] = dynamic_desc(low, high, high, case.dtype)
    return inputs, outputs


def configured(case: NormCase) -> AddRmsNormPlugin:
    """The harness's build phase: the plugin configured with the case's profile."""
    return build_phase(AddRmsNormPluginCreator(), case, NODE).plugin


def runtime_plugin(case: NormCase) -> AddRmsNormPlugin:
    """Build, serialise, re-create at runtime and attach to a context, as deserialising an engine does."""
    creator = AddRmsNormPluginCreator()
    attached, _clone = runtime_phase(creator, build_phase(creator, case, NODE), NODE)
    return attached


INPUT_POINTERS = (0x1000, 0x2000, 0x3000)
OUTPUT_POINTERS = (0xA000, 0xB000)


def enqueue(plugin: AddRmsNormPlugin, case: NormCase, x: Shape, stream: int) -> None:
    inputs, outputs = x_descs(case, x)
    plugin.enqueue(inputs, outputs, list(INPUT_POINTERS[: len(inputs)]), list(OUTPUT_POINTERS), 0, stream)


# --- creator and fields ------------------------------------------------------------------------------------------


def test_the_creator_advertises_the_contract_s_fields() -> None:
    creator = AddRmsNormPluginCreator()
    assert (creator.name, creator.plugin_namespace, creator.plugin_version) == (ADD_RMS_NORM_OP, "trtfuse", "1")
    floats = {"epsilon", "weight_offset"}
    assert [(f.name, f.type) for f in creator.field_names] == [
        (name, trt.PluginFieldType.FLOAT32 if name in floats else trt.PluginFieldType.INT32)
        for name in ADD_RMS_NORM.fields
    ]


def test_a_plugin_is_created_from_the_parser_s_fields(case: NormCase) -> None:
    plugin = build_plugin(case)
    assert plugin.config == case.config
    assert (plugin.plugin_name, plugin.plugin_namespace, plugin.plugin_version) == (ADD_RMS_NORM_OP, "trtfuse", "1")
    assert plugin.num_outputs == 2
    for capability in ("CORE", "BUILD", "RUNTIME"):
        assert plugin.get_capability_interface(getattr(trt.PluginCapabilityType, capability)) is plugin


def _fields(**overrides: Any) -> dict[str, Any]:
    values = {
        "epsilon": f32(1e-6),
        "weight_offset": f32(0.0),
        "weight_mode": i32(1),
        "hidden_size": i32(HIDDEN),
        "output_dtype": i32(16),
    }
    values.update(overrides)
    return {name: value for name, value in values.items() if value is not None}


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"hidden_size": None}, "field hidden_size is missing (TrtfuseAddRmsNorm takes epsilon, weight_offset"),
        ({"q_hidden_size": i32(HIDDEN)}, "field q_hidden_size is not a field of TrtfuseAddRmsNorm"),
        ({"weight_mode": i32(5)}, "field weight_mode is 5, none of 0 (NONE)"),
    ],
)
def test_bad_fields_are_one_line_naming_the_plugin_and_the_node(overrides: dict[str, Any], message: str) -> None:
    with pytest.raises(TrtfuseError) as raised:
        create(AddRmsNormPluginCreator(), _fields(**overrides), node=NODE)
    text = str(raised.value)
    assert text.startswith(f"TrtfuseAddRmsNorm '{NODE}': ") and message in text and "\n" not in text


# --- build phase -------------------------------------------------------------------------------------------------


def test_output_types_are_the_output_dtype_for_y_and_the_activations_for_h(case: NormCase) -> None:
    types = [DTYPE_BY_NAME[dtype] for dtype in case.input_dtypes]
    answered = build_plugin(case).get_output_data_types(types)
    assert [DTYPE_NAMES[data_type] for data_type in answered] == list(case.output_dtypes)


@pytest.mark.parametrize(("dtype", "output_dtype"), [(d, t) for d in FLOATS for t in FLOATS])
def test_every_pair_the_contract_allows_and_no_other(dtype: str, output_dtype: str) -> None:
    case = add_case(dtype, "float32", output_dtype=output_dtype)
    plugin = build_plugin(case)
    types = [DTYPE_BY_NAME[name] for name in case.input_dtypes]
    problem = contract.dtype_pair_problem(dtype, output_dtype)
    if problem is None:
        assert [DTYPE_NAMES[t] for t in plugin.get_output_data_types(types)] == [output_dtype, dtype]
    else:
        with pytest.raises(TrtfuseError, match=f"^TrtfuseAddRmsNorm '{NODE}': {problem}$"):
            plugin.get_output_data_types(types)


def test_both_outputs_have_x_s_shape() -> None:
    """Each output's DimsExprs is a copy of x's (the part's first activation); the residual's rank is given as
    different here only to tell the two sources apart."""
    plugin = build_plugin(CASES[0])
    shapes = plugin.get_output_shapes([trt.DimsExprs(3), trt.DimsExprs(2), trt.DimsExprs(1)], [], None)
    assert [len(shape) for shape in shapes] == [3, 3]


def test_a_wrong_input_count_or_a_non_float_residual_is_refused() -> None:
    plugin = build_plugin(CASES[0])
    with pytest.raises(TrtfuseError, match=r"expected 3 inputs \(x, residual, weight\) with weight_mode AFTER_CAST"):
        plugin.get_output_data_types([trt.DataType.BF16, trt.DataType.BF16])
    with pytest.raises(TrtfuseError, match="expected 3 inputs"):
        plugin.get_output_shapes([trt.DimsExprs(2)] * 2, [], None)
    with pytest.raises(TrtfuseError, match="input 'residual' has dtype INT32; supported: float32, float16, bfloat16"):
        plugin.get_output_data_types([trt.DataType.BF16, trt.DataType.INT32, trt.DataType.BF16])
    no_weight = build_plugin(CASES[-1])
    with pytest.raises(TrtfuseError, match=r"expected 2 inputs \(x, residual\) with weight_mode NONE, got 3"):
        no_weight.get_output_data_types([trt.DataType.HALF] * 3)


def test_formats_at_every_position(case: NormCase) -> None:
    """x: every dtype pairing with output_dtype; residual: x's; weight: any float; y: output_dtype; h: x's."""
    accepted, non_linear = probe_formats(build_plugin(case), case)  # the harness's probe
    pairs = tuple(d for d in FLOATS if contract.dtype_pair_problem(d, case.config.output_dtype) is None)
    expected: dict[int, tuple[str, ...]] = {0: pairs, 1: (case.dtype,)}
    position = 2
    if case.config.has_weight:
        expected[position] = FLOATS
        position += 1
    expected[position] = (case.config.output_dtype,)
    expected[position + 1] = (case.dtype,)
    assert accepted == expected
    assert non_linear == []
    num_inputs = len(case.input_dtypes)
    assert not build_plugin(case).supports_format_combination(num_inputs + 2, [], num_inputs)


def test_configure_makes_the_add_norm_kernel_and_warms_it_up(case: NormCase, kernels: list[RecordingKernel]) -> None:
    configured(case)
    (kernel,) = kernels
    assert kernel.spec == kernels_module.AddRmsNormSpec(
        HIDDEN, case.dtype, case.weight_dtype, case.config.params, case.config.output_dtype
    )
    assert kernel.warm_ups == [math.prod(MAX_SHAPE[:-1])]
    assert kernel.launches == []


SHAPE_PROBLEMS = [
    (
        "residual rows",
        [(4, 256, HIDDEN), (4, 1, HIDDEN)],
        rf"inputs 'x' \[4, 256, {HIDDEN}\] and 'residual' \[4, 1, {HIDDEN}\] must have one shape",
    ),
    (
        "residual rank",
        [(4, 256, HIDDEN), (1024, HIDDEN)],
        rf"inputs 'x' \[4, 256, {HIDDEN}\] and 'residual' \[1024, {HIDDEN}\] must have one shape",
    ),
    ("residual width", [(4, 256, HIDDEN), (4, 256, 32)], r"input 'residual' has shape \[4, 256, 32\]; its last dim"),
    ("x width", [(4, 256, 32), (4, 256, HIDDEN)], r"input 'x' has shape \[4, 256, 32\]; its last dim must be 64"),
]


@pytest.mark.parametrize(("shapes", "message"), [p[1:] for p in SHAPE_PROBLEMS], ids=[p[0] for p in SHAPE_PROBLEMS])
def test_configure_refuses_shapes_that_do_not_fit(shapes: list[Shape], message: str) -> None:
    case = CASES[0]
    plugin = build_plugin(case)
    inputs = [dynamic_desc(s, s, s, d) for s, d in zip([*shapes, (HIDDEN,)], case.input_dtypes, strict=True)]
    outputs = [dynamic_desc(shapes[0], shapes[0], shapes[0], d) for d in case.output_dtypes]
    with pytest.raises(TrtfuseError, match=f"^TrtfuseAddRmsNorm '{NODE}': {message}") as raised:
        plugin.configure_plugin(inputs, outputs)
    assert "\n" not in str(raised.value)


def test_configure_checks_the_profile_s_min_and_max_alike() -> None:
    """A residual whose min differs from x's is refused even when the max agrees."""
    case = CASES[0]
    plugin = build_plugin(case)
    with pytest.raises(TrtfuseError, match=r"inputs 'x' \[1, 1, 64\] and 'residual' \[2, 1, 64\] must have one"):
        plugin.configure_plugin(*profile_with_residual(case, (2, 1, HIDDEN), MAX_SHAPE))


def test_configure_refuses_a_weight_of_two_rows() -> None:
    case = CASES[0]
    shapes = [MAX_SHAPE, MAX_SHAPE, (2, HIDDEN)]
    inputs = [dynamic_desc(s, s, s, d) for s, d in zip(shapes, case.input_dtypes, strict=True)]
    with pytest.raises(TrtfuseError, match=r"input 'weight' has shape \[2, 64\], expected \[64\] or \[1, ..., 1, 64\]"):
        build_plugin(case).configure_plugin(inputs, [])


# --- serialisation and runtime -----------------------------------------------------------------------------------


@pytest.mark.parametrize("epsilon", [1e-6, 1e-5, 1.0 / 3.0, 1e-45, 0.0])
def test_serialised_fields_recreate_the_plugin_bit_exactly(epsilon: float, kernels: list[RecordingKernel]) -> None:
    case = add_case("bfloat16", "float32", WeightMode.BEFORE_CAST, "float32", offset=1.0, epsilon=epsilon)
    build = build_phase(AddRmsNormPluginCreator(), case, NODE)
    plugin, stored = build.plugin, build.serialized
    assert [field.name for field in stored] == list(ADD_RMS_NORM.fields)
    by_name = {field.name: field for field in stored}
    assert by_name["epsilon"].data.view(np.uint32)[0] == np.float32(epsilon).view(np.uint32)
    recreated = recreate(AddRmsNormPluginCreator(), stored, NODE)
    assert recreated.config == plugin.config == case.config
    assert recreated.phase == trt.TensorRTPhase.RUNTIME
    again = [(f.name, f.type, np.array(f.data).tobytes()) for f in recreated.get_fields_to_serialize()]
    assert again == [(f.name, f.type, f.data.tobytes()) for f in stored]


def expected_launch(case: NormCase, x: Shape, stream: int) -> tuple[int, ...]:
    x_ptr, residual_ptr, weight_ptr = INPUT_POINTERS
    weight = weight_ptr if case.config.has_weight else 0
    return (x_ptr, residual_ptr, weight, *OUTPUT_POINTERS, math.prod(x[:-1]), stream)


def test_enqueue_launches_with_five_pointers_the_rows_and_the_stream(
    case: NormCase, kernels: list[RecordingKernel]
) -> None:
    attached = runtime_plugin(case)
    runs = x_runs(case)
    for index, x in enumerate(runs):
        attached.on_shape_change(*x_descs(case, x))
        enqueue(attached, case, x, stream=0x5000 + index)
    # A clone shares the kernel and starts from the shapes it was cloned with; its own shape changes stay its own.
    twin = attached.clone()
    enqueue(twin, case, runs[-1], stream=0x6000)
    twin.on_shape_change(*x_descs(case, runs[0]))
    enqueue(twin, case, runs[0], stream=0x6001)
    enqueue(attached, case, runs[-1], stream=0x6002)
    build_kernel, runtime_kernel = kernels
    assert build_kernel.launches == []
    assert runtime_kernel.launches == [
        *(expected_launch(case, x, 0x5000 + index) for index, x in enumerate(runs)),
        expected_launch(case, runs[-1], 0x6000),
        expected_launch(case, runs[0], 0x6001),
        expected_launch(case, runs[-1], 0x6002),
    ]
    assert runtime_kernel.warm_ups == [math.prod(runs[0][:-1])]


def test_on_shape_change_refuses_a_residual_of_another_shape(kernels: list[RecordingKernel]) -> None:
    case = CASES[0]
    plugin = runtime_plugin(case)
    with pytest.raises(TrtfuseError, match=r"inputs 'x' \[1, 3, 64\] and 'residual' \[1, 1, 64\] must have one shape"):
        plugin.on_shape_change(*mismatched_descs(case, (1, 3, HIDDEN), (1, 1, HIDDEN)))
    with pytest.raises(TrtfuseError, match="enqueue before on_shape_change"):
        enqueue(plugin, case, (1, 3, HIDDEN), stream=0)


def test_empty_tensors_launch_nothing_and_an_unprepared_plugin_raises(kernels: list[RecordingKernel]) -> None:
    case = CASES[1]
    plugin = build_plugin(case, trt.TensorRTPhase.RUNTIME)
    with pytest.raises(TrtfuseError, match=f"TrtfuseAddRmsNorm '{NODE}': enqueue before on_shape_change"):
        enqueue(plugin, case, (1, 1, HIDDEN), stream=0)
    plugin.on_shape_change(*x_descs(case, (1, 0, HIDDEN)))
    enqueue(plugin, case, (1, 0, HIDDEN), stream=1)
    plugin.on_shape_change(*x_descs(case, (2, 3, HIDDEN)))
    enqueue(plugin, case, (2, 3, HIDDEN), stream=2)
    assert kernels[0].launches == [expected_launch(case, (2, 3, HIDDEN), 2)]
    plugin.destroy()
    with pytest.raises(TrtfuseError, match="enqueue before on_shape_change"):
        enqueue(plugin, case, (2, 3, HIDDEN), stream=3)


def test_the_real_kernel_compiles_through_configure_plugin() -> None:
    """Without a GPU trtfuse.kernels compiles for sm_90a: configure_plugin's warm-up builds the add-norm variants for
    real, and a plugin re-created at runtime gets the process's same kernel object."""
    pytest.importorskip("cutlass", reason="nvidia-cutlass-dsl is not installed")
    case = harness_add_case(HIDDEN, "bfloat16", "bfloat16", max_leading=(2, 8), runs=((1, 1),))
    plugin = configured(case)
    assert isinstance(plugin.kernel, kernels_module.AddRmsNormKernel)
    attached = runtime_plugin(case)
    attached.on_shape_change(*run_descs(case, case.runs[0]))
    assert attached.kernel is plugin.kernel
