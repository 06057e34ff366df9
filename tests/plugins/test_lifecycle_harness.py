"""The lifecycle harness (trtfuse/bench/lifecycle/) over every op of the contract, on the CPU: its cases, descriptors,
build and runtime phases, the launch arguments its host-cost measurement replays, its output checks (the add-norm's
h bit for bit), and whole drives with CPU stand-in kernels that read and write through the raw pointers.

A failure on the GPU should then mean the plugin or the kernel, not the harness. TensorRT-RTX's module stands in for
TensorRT's plugin types (as in test_python_plugins.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from trtfuse import contract
from trtfuse import kernels as kernels_module
from trtfuse.bench.lifecycle.cases import NormCase, RotaryTables, add_case, default_cases, qk_case, rms_case, rope_case
from trtfuse.bench.lifecycle.descriptors import profile_descs, run_descs
from trtfuse.bench.lifecycle.drive import drive
from trtfuse.bench.lifecycle.outputs import check_outputs, normalised_rtol, reference_part
from trtfuse.bench.lifecycle.phases import build_phase, recreate, runtime_phase, shape_change
from trtfuse.bench.lifecycle.tensors import device_tensors
from trtfuse.bench.reference import add_norm_reference
from trtfuse.contract import ADD_RMS_NORM, ADD_RMS_NORM_OP, HeadLayout, WeightMode
from trtfuse.plugins.python.add_rms_norm import AddRmsNormPluginCreator
from trtfuse.plugins.python.base import DTYPE_NAMES
from trtfuse.plugins.python.creators import CREATORS

from support.host_kernels import HostKernel
from support.plugin_fields import RecordingKernel, trt

FLOATS = ("float32", "float16", "bfloat16")
# The 16 cases of the harness before the add-norm's, in their order: they must stay as they were.
EARLIER_CASES = [
    "TrtfuseRmsNorm-float32-wfloat32-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-float32-wfloat32-BEFORE_CAST-h2048-off1",
    "TrtfuseRmsNorm-float32-wnone-NONE-h1000-off0",
    "TrtfuseRmsNorm-float16-wfloat16-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-float16-wfloat32-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-float16-wfloat32-BEFORE_CAST-h2048-off1",
    "TrtfuseRmsNorm-float16-wnone-NONE-h1000-off0",
    "TrtfuseRmsNorm-bfloat16-wbfloat16-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-bfloat16-wfloat32-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-bfloat16-wfloat32-BEFORE_CAST-h2048-off1",
    "TrtfuseRmsNorm-bfloat16-wnone-NONE-h1000-off0",
    "TrtfuseQkNorm-bfloat16-wbfloat16-AFTER_CAST-h128x128-off0",
    "TrtfuseQkNorm-float16-wfloat32-BEFORE_CAST-h256x256-off1",
    "TrtfuseQkNorm-float32-wnone-NONE-h64x64-off0",
    "TrtfuseRmsNorm-float32-to-bfloat16-wbfloat16-AFTER_CAST-h4096-off0",
    "TrtfuseRmsNorm-bfloat16-to-float32-wfloat32-AFTER_CAST-h4096-off0",
]
# Small cases of every op, with weights and without, same-dtype and mixed.
SMALL_CASES = [
    rms_case(64, "bfloat16", "float32"),
    rms_case(40, "float32", None, WeightMode.NONE, output_dtype="float16"),
    qk_case(4, 2, 128, "bfloat16", "bfloat16"),
    qk_case(2, 1, 64, "float16", None, WeightMode.NONE),
    add_case(64, "bfloat16", "bfloat16"),
    add_case(64, "float16", "float32", WeightMode.BEFORE_CAST, weight_offset=1.0),
    add_case(64, "float32", "bfloat16", output_dtype="bfloat16"),
    add_case(40, "bfloat16", "float32", output_dtype="float32"),
    add_case(1000, "float16", None, WeightMode.NONE),
    add_case(64, "float32", None, WeightMode.NONE, output_dtype="bfloat16"),
    rope_case(4, 2, 64, "bfloat16", "bfloat16", max_size=(2, 8), runs=((2, 8), (2, 1), (1, 1))),
    rope_case(
        2,
        2,
        64,
        "float16",
        None,
        WeightMode.NONE,
        layout=HeadLayout.HEAD_MAJOR,
        tables=RotaryTables("float32", per_batch=True, theta=1e4),
        max_size=(3, 8),
        runs=((3, 8), (3, 1), (1, 1)),
    ),
]
ADD_CASES = [case for case in SMALL_CASES if case.op is ADD_RMS_NORM]


def ids(cases: list[NormCase]) -> list[str]:
    return [case.name for case in cases]


# --- cases --------------------------------------------------------------------------------------------------------


def test_creators_cover_every_op_of_the_contract() -> None:
    assert set(CREATORS) == set(contract.OPS)
    for name, creator in CREATORS.items():
        assert creator.PLUGIN.OP is contract.OPS[name]
    assert CREATORS[ADD_RMS_NORM_OP] is AddRmsNormPluginCreator


def test_the_earlier_cases_are_unchanged_and_come_first() -> None:
    names = ids(default_cases())
    assert names[: len(EARLIER_CASES)] == EARLIER_CASES
    assert len(names) == len(set(names))


def test_the_default_add_norm_cases_cover_dtypes_weights_modes_offsets_sizes_and_rows() -> None:
    cases = [case for case in default_cases() if case.op is ADD_RMS_NORM]
    same = [case for case in cases if case.output_dtype == case.dtype]
    assert {case.dtype for case in same} == set(FLOATS)
    for dtype in FLOATS:
        weights = {case.weight_dtype for case in same if case.dtype == dtype}
        assert weights == {dtype, "float32", None}
    assert {case.config.params.weight_mode for case in cases} == set(WeightMode)
    gemma = [case for case in cases if case.config.params.weight_offset == 1.0]
    assert gemma and all(case.config.params.weight_mode is WeightMode.BEFORE_CAST for case in gemma)
    assert {case.config.hidden_sizes[0] for case in cases} >= {4096, 1000}
    mixed = {(case.dtype, case.output_dtype) for case in cases if case.output_dtype != case.dtype}
    assert ("float32", "bfloat16") in mixed
    for case in cases:
        rows = [math.prod(shapes[0][:-1]) for shapes in case.runs]
        assert rows[0] == 1024 and rows[0] > 132  # prefill: more rows than an H200 has SMs
        assert rows[1:] == [3, 1]  # decode
        assert case.max_shapes[0] == case.runs[0][0] and case.min_shapes[0][:-1] == (1, 1)


def test_an_add_case_describes_its_tensors_by_the_op_s_tables() -> None:
    """x and residual take the part's one shape and the activations' dtype; the weight [hidden]; y the output dtype,
    h the activations'."""
    case = add_case(64, "float32", "bfloat16", output_dtype="bfloat16")
    assert case.op is ADD_RMS_NORM
    assert case.input_dtypes == ("float32", "float32", "bfloat16")
    assert case.output_dtypes == ("bfloat16", "float32")
    assert case.input_shapes([(2, 3, 64)]) == [(2, 3, 64), (2, 3, 64), (64,)]
    assert case.output_shapes([(2, 3, 64)]) == [(2, 3, 64), (2, 3, 64)]
    none = add_case(1000, "float16", "float16", WeightMode.NONE)
    assert none.weight_dtype is None and none.input_dtypes == ("float16", "float16")
    assert none.input_shapes([(5, 1000)]) == [(5, 1000), (5, 1000)]
    assert none.name == "TrtfuseAddRmsNorm-float16-wnone-NONE-h1000-off0"
    assert case.name == "TrtfuseAddRmsNorm-float32-to-bfloat16-wbfloat16-AFTER_CAST-h64-off0"


def test_rms_and_qk_cases_still_have_one_activation_per_part() -> None:
    rms = rms_case(64, "float32", "bfloat16", output_dtype="bfloat16")
    assert (rms.input_dtypes, rms.output_dtypes) == (("float32", "bfloat16"), ("bfloat16",))
    assert rms.input_shapes([(3, 64)]) == [(3, 64), (64,)] and rms.output_shapes([(3, 64)]) == [(3, 64)]
    qk = qk_case(4, 2, 128, "float16", "float32")
    shapes = qk.runs[1]
    assert qk.input_dtypes == ("float16", "float16", "float32", "float32")
    assert qk.output_dtypes == ("float16", "float16")
    assert qk.input_shapes(shapes) == [*shapes, (128,), (128,)] and qk.output_shapes(shapes) == list(shapes)


# --- descriptors and the build phase ----------------------------------------------------------------------------


def dims(desc_or_dims: Any) -> tuple[int, ...]:
    """The sizes of a Dims, or of a PluginTensorDesc's dims."""
    shape = getattr(desc_or_dims, "dims", desc_or_dims)
    return tuple(int(shape[i]) for i in range(len(shape)))


def test_descriptors_of_an_add_case() -> None:
    case = add_case(64, "float32", "bfloat16", output_dtype="bfloat16")
    inputs, outputs = profile_descs(case)
    assert [DTYPE_NAMES[d.desc.type] for d in inputs] == ["float32", "float32", "bfloat16"]
    assert [DTYPE_NAMES[d.desc.type] for d in outputs] == ["bfloat16", "float32"]
    for desc in (inputs[0], inputs[1], *outputs):
        assert dims(desc.desc) == (-1, -1, 64)
        assert (dims(desc.min), dims(desc.opt), dims(desc.max)) == ((1, 1, 64), (4, 256, 64), (4, 256, 64))
    assert dims(inputs[2].desc) == dims(inputs[2].max) == (64,)
    run_inputs, run_outputs = run_descs(case, case.runs[1])
    assert [dims(d) for d in run_inputs] == [(1, 3, 64), (1, 3, 64), (64,)]
    assert [(dims(d), DTYPE_NAMES[d.type]) for d in run_outputs] == [((1, 3, 64), "bfloat16"), ((1, 3, 64), "float32")]


@pytest.mark.parametrize("case", ADD_CASES, ids=ids(ADD_CASES))
def test_the_build_phase_of_an_add_case(case: NormCase, kernels: list[RecordingKernel]) -> None:
    build = build_phase(CREATORS[case.op.name](), case)
    assert build.plugin.num_outputs == 2
    assert build.output_dtypes == (case.output_dtype, case.dtype)
    assert build.output_ranks == (3, 3)
    pairs = tuple(d for d in FLOATS if contract.dtype_pair_problem(d, case.output_dtype) is None)
    weight = {2: FLOATS} if case.config.has_weight else {}
    outputs = 2 + len(weight)
    expected = {0: pairs, 1: (case.dtype,), **weight, outputs: (case.output_dtype,), outputs + 1: (case.dtype,)}
    assert build.accepted == expected
    assert build.non_linear_accepted == []
    (kernel,) = kernels
    assert kernel.spec == kernels_module.AddRmsNormSpec(
        case.config.hidden_sizes[0], case.dtype, case.weight_dtype, case.config.params, case.output_dtype
    )
    assert kernel.warm_ups == [1024]
    assert [field.name for field in build.serialized] == list(ADD_RMS_NORM.fields)
    recreated = recreate(CREATORS[case.op.name](), build.serialized)
    assert recreated.config == case.config and recreated.phase == trt.TensorRTPhase.RUNTIME
    again = [(f.name, f.type, f.data.tobytes()) for f in recreated.get_fields_to_serialize()]
    assert again == [(f.name, f.type, f.data.tobytes()) for f in build.serialized]


# --- launch arguments -------------------------------------------------------------------------------------------


def spelled_out(
    case: NormCase,
    inputs: list[int],
    outputs: list[int],
    rows: tuple[int, ...],
    stream: int,
    rows_shape: tuple[tuple[int, ...], ...],
) -> tuple:
    """Each kernel's launch signature (trtfuse/kernels/api.py), written out per op, independently of the harness
    (the rotary kernel's extents B, S and Bc read off q's shape `rows_shape[0]` by the layout)."""
    weighted = case.config.has_weight
    kind = case.op.base or case.op.name  # a quantized op launches as its plain op
    if kind == contract.QK_NORM_ROPE_OP:
        q, k, *weights, cos, sin = inputs
        q_w, k_w = weights if weighted else (0, 0)
        layout = case.config.rotary.layout
        batch, seq_len = rows_shape[0][0], rows_shape[0][2 if layout is HeadLayout.HEAD_MAJOR else 1]
        cos_batch = batch if case.tables.per_batch else 1
        return (q, k, q_w, k_w, cos, sin, *outputs, rows[0], rows[1], batch, seq_len, cos_batch, stream)
    if kind == contract.RMS_NORM_OP:
        x, *weight = inputs
        return (x, weight[0] if weighted else 0, outputs[0], rows[0], stream)
    if kind == contract.QK_NORM_OP:
        q, k, *weights = inputs
        q_w, k_w = weights if weighted else (0, 0)
        return (q, k, q_w, k_w, *outputs, rows[0], rows[1], stream)
    x, residual, *weight = inputs
    y, h = outputs
    return (x, residual, weight[0] if weighted else 0, y, h, rows[0], stream)


@pytest.mark.parametrize("case", SMALL_CASES, ids=ids(SMALL_CASES))
def test_launch_args_are_exactly_what_enqueue_passes(case: NormCase, kernels: list[RecordingKernel]) -> None:
    """What host_cost times as the bare launch is what enqueue launches, for every op; both follow the kernel's
    signature. The add-norm's one row count is x's (the residual has its shape); the rotary kernel's extents follow
    the row counts."""
    creator = CREATORS[case.op.name]()
    attached, clone = runtime_phase(creator, build_phase(creator, case))
    recorded, replayed = [], []
    for index, shapes in enumerate(case.runs):
        plugin = (attached, clone)[index % 2]
        descs = shape_change(plugin, case, shapes)
        inputs = [0x10000 * (i + 1) for i in range(len(descs[0]))]
        outputs = [0xA0000 + 0x10000 * i for i in range(len(descs[1]))]
        stream = 0x5000 + index
        plugin.enqueue(descs[0], descs[1], inputs, outputs, 0, stream)
        rows = tuple(math.prod(shape[:-1]) for shape in shapes)
        expected = spelled_out(case, inputs, outputs, rows, stream, shapes)
        assert plugin.launch_args(inputs, outputs, stream) == expected
        replayed.append(plugin.launch_args(inputs, outputs, stream))
        recorded.append(plugin.kernel.launches[-1])
    assert recorded == replayed
    # plugin.rows holds one count per activation (the add-norm's x and residual alike); the launch takes one per part.
    assert len(attached.rows) == len(case.op.activations)


# --- output checks ----------------------------------------------------------------------------------------------


def filled(case: NormCase, seed: int = 0) -> Any:
    """A run's host tensors with both outputs written as the reference says."""
    tensors = device_tensors(case, case.runs[1], seed, device="cpu")
    weight = tensors.inputs[2] if case.config.has_weight else None
    y, h = add_norm_reference(tensors.inputs[0], tensors.inputs[1], weight, case.config.params, case.output_dtype)
    tensors.outputs[0].copy_(y)
    tensors.outputs[1].copy_(h)
    return tensors


@pytest.mark.parametrize("case", ADD_CASES, ids=ids(ADD_CASES))
def test_add_norm_outputs_start_poisoned_and_pass_when_written_as_the_reference(case: NormCase) -> None:
    tensors = device_tensors(case, case.runs[1], seed=0, device="cpu")
    assert [str(t.dtype).removeprefix("torch.") for t in tensors.outputs] == list(case.output_dtypes)
    assert all(bool(buffer.isnan().all()) for buffer in tensors.output_buffers)
    elements = 3 * case.config.hidden_sizes[0]  # the run's 3 rows
    assert [check.unwritten for check in check_outputs(case, tensors)] == [elements, elements]
    tensors = filled(case)
    checks = check_outputs(case, tensors)
    assert [check.name for check in checks] == ["y", "h"]
    assert all(check.passed for check in checks), checks
    y, h = checks
    assert (h.rtol, h.max_abs, h.differing) == (0.0, 0.0, 0)
    # y's tolerance is the rule of the other ops' normalised outputs.
    as_rms = replace(case, config=replace(case.config, op=contract.RMS_NORM))
    assert y.rtol == normalised_rtol(case) == normalised_rtol(as_rms)
    assert tensors.guards_intact()


def test_the_checks_catch_a_wrong_sum_a_wrong_norm_a_signed_zero_and_unwritten_or_overrunning_outputs() -> None:
    case = add_case(64, "bfloat16", "bfloat16")
    tensors = filled(case)
    # h must be the sum, not x; y must be the norm of the sum, not of x.
    tensors.outputs[1].copy_(tensors.inputs[0])
    y, h = check_outputs(case, tensors)
    assert y.passed and not h.passed and h.differing > 0
    tensors = filled(case)
    normed_x, _none = reference_part([tensors.inputs[0]], tensors.inputs[2], case.config)
    tensors.outputs[0].copy_(normed_x)
    y, h = check_outputs(case, tensors)
    assert not y.passed and h.passed
    # h bit for bit: -0 where the rounded sum is +0 passes a value comparison but not this one.
    tensors = device_tensors(case, case.runs[1], seed=0, device="cpu")
    tensors.inputs[0].view(-1)[0], tensors.inputs[1].view(-1)[0] = 0.5, -0.5
    y_ref, h_ref = add_norm_reference(*tensors.inputs, case.config.params, case.output_dtype)
    tensors.outputs[0].copy_(y_ref)
    tensors.outputs[1].copy_(h_ref)
    assert check_outputs(case, tensors)[1].passed
    tensors.outputs[1].view(-1)[0] = -0.0
    h = check_outputs(case, tensors)[1]
    assert (h.max_abs, h.max_rel, h.differing, h.passed) == (0.0, 0.0, 1, False)
    # An element left NaN, and a write past the end into the guard tail.
    tensors = filled(case)
    tensors.outputs[1].view(-1)[-1] = float("nan")
    assert check_outputs(case, tensors)[1].unwritten == 1
    tensors.output_buffers[0][tensors.outputs[0].numel()] = 0
    assert not tensors.guards_intact()
    tensors.refill(torch.Generator().manual_seed(1))
    assert tensors.guards_intact() and all(bool(out.isnan().all()) for out in tensors.outputs)


# --- whole drives on the CPU ------------------------------------------------------------------------------------

DRIVEN = [case for case in default_cases() if case.op is ADD_RMS_NORM] + [
    rms_case(4096, "bfloat16", "float32"),
    qk_case(32, 8, 128, "bfloat16", "bfloat16"),
]


@pytest.mark.parametrize("case", DRIVEN, ids=ids(DRIVEN))
def test_drive_with_cpu_stand_in_kernels(case: NormCase, host_kernels: list[HostKernel]) -> None:
    """Every add-norm case of `python -m trtfuse.bench.lifecycle` (and one RMSNorm and one QK-norm case) through the
    whole drive, the stand-in kernels reading and writing through the pointers enqueue hands them."""
    report = drive(case, device="cpu")
    assert report.passed, [(run.shapes, run.checks, run.guards_intact) for run in report.runs]
    assert [run.plugin for run in report.runs] == ["attached", "clone", "attached"]
    names = [[check.name for check in run.checks] for run in report.runs]
    assert names == [list(case.op.outputs)] * len(case.runs)
    # The build's kernel, then the attached plugin's and its clone's (each made at its first on_shape_change).
    build_kernel, attached_kernel, clone_kernel = host_kernels
    assert build_kernel.launches == []
    runs = [attached_kernel.launches[0], clone_kernel.launches[0], attached_kernel.launches[1]]
    parts = len(case.op.weights)
    rows = [tuple(math.prod(shape[:-1]) for shape in shapes) for shapes in case.runs]
    assert [args[-1 - parts : -1] for args in runs] == rows
    assert {args[-1] for kernel in host_kernels for args in kernel.launches} == {0x5EED}  # drive's HostStream
    assert len(attached_kernel.launches) == 2 + 20 + 2 * 400  # host cost: warm-up, enqueues, bare launches
    assert report.host.enqueue_us > 0 and report.host.launch_us > 0


def test_a_drive_catches_y_and_h_swapped(monkeypatch: pytest.MonkeyPatch, host_kernels: list[HostKernel]) -> None:
    """A plugin that passed y's and h's pointers the other way round fails every run (same dtype: no overrun)."""
    from trtfuse.plugins.python.add_rms_norm import AddRmsNormPlugin

    original = AddRmsNormPlugin.enqueue

    def swapped(self: Any, input_desc: Any, output_desc: Any, inputs: Any, outputs: Any, *rest: Any) -> None:
        original(self, input_desc, output_desc, inputs, list(reversed(outputs)), *rest)

    monkeypatch.setattr(AddRmsNormPlugin, "enqueue", swapped)
    case = add_case(256, "bfloat16", "bfloat16", runs=((2, 8), (1, 1)))
    report = drive(case, device="cpu")
    assert not report.passed
    assert all(not check.passed for run in report.runs for check in run.checks)
