"""The lifecycle harness over the rotary ops (TrtfuseQkNormRope, TrtfuseQkNormRopeQuant), on the CPU: their cases
(token-major, head-major and full-width heads, tables for the batch or per batch row, partial and interleaved
rotations, output and product stages), the tables as real rotary tables, descriptors with the tables' shapes, the
build phase, the output checks (the AOT check's rule for rotary parts) and whole drives whose stand-in kernel
computes `qk_norm_rope_reference` through the raw pointers at the extents it is launched with.

Nothing here runs the real rotary kernels: a failure on the GPU should then mean the plugin or the kernel, not the
harness. TensorRT-RTX's module stands in for TensorRT's plugin types (as in test_python_plugins.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import pytest
import torch

from trtfuse import contract
from trtfuse.bench.aot.compare import quantization_step
from trtfuse.bench.lifecycle.cases import (
    NormCase,
    RotaryTables,
    default_cases,
    fp8,
    int8,
    rope_case,
    rope_cases,
    rope_quant_cases,
)
from trtfuse.bench.lifecycle.descriptors import profile_descs, run_descs
from trtfuse.bench.lifecycle.drive import drive
from trtfuse.bench.lifecycle.outputs import check_outputs
from trtfuse.bench.lifecycle.phases import build_phase, recreate
from trtfuse.bench.lifecycle.tensors import DeviceTensors, device_tensors
from trtfuse.bench.reference import qk_norm_rope_reference, rotary_tables
from trtfuse.contract import HeadLayout, QuantParams, Rotation, WeightMode
from trtfuse.kernels.specs import QkNormRopeSpec, RopeParams
from trtfuse.plugins.python.base import DTYPE_NAMES
from trtfuse.plugins.python.creators import CREATORS

from support.host_kernels import HostKernel
from support.plugin_fields import RecordingKernel

SIZES = {"max_size": (2, 8), "runs": ((2, 8), (2, 1), (1, 1))}
PER_BATCH = RotaryTables("float32", per_batch=True, theta=1e4)
# Small cases of every layout, rotation, table batch and dtype, with weights and without.
ROPE_SMALL = [
    rope_case(4, 2, 64, "bfloat16", "bfloat16", **SIZES),
    rope_case(
        2,
        1,
        64,
        "float16",
        None,
        WeightMode.NONE,
        rotary_dim=32,
        rotation=Rotation.INTERLEAVED,
        tables=PER_BATCH,
        **SIZES,
    ),
    rope_case(
        2,
        2,
        64,
        "float32",
        "float32",
        WeightMode.BEFORE_CAST,
        1.0,
        layout=HeadLayout.HEAD_MAJOR,
        tables=PER_BATCH,
        **SIZES,
    ),
    rope_case(4, 2, 32, "bfloat16", "float32", full_width=True, **SIZES),
]
PRODUCTS = QuantParams(
    q_cos_product=fp8(1 / 64, dequant_dtype="bfloat16"),
    q_sin_product=fp8(1 / 64, dequant_dtype="bfloat16"),
    k_cos_product=int8(4 / 127, "bfloat16"),
    k_sin_product=int8(4 / 127, "bfloat16"),
    k_output=int8(6 / 127),
)
ROPE_QUANT_SMALL = [
    rope_case(4, 2, 64, "bfloat16", "bfloat16", quant=QuantParams(q_output=fp8(1 / 64)), **SIZES),
    rope_case(4, 2, 64, "bfloat16", "float32", tables=PER_BATCH, quant=PRODUCTS, **SIZES),
]
FLOATS = ("float32", "float16", "bfloat16")


def ids(cases: list[NormCase]) -> list[str]:
    return [case.name for case in cases]


def dims(desc_or_dims: Any) -> tuple[int, ...]:
    shape = getattr(desc_or_dims, "dims", desc_or_dims)
    return tuple(int(shape[i]) for i in range(len(shape)))


# --- cases ----------------------------------------------------------------------------------------------------------


def test_the_default_rope_cases_cover_layouts_rotations_tables_and_stages() -> None:
    cases = [case for case in default_cases() if case.op.rotary]
    assert cases == [*rope_cases(), *rope_quant_cases()]
    assert {case.op.name for case in cases} == {contract.QK_NORM_ROPE_OP, contract.QK_NORM_ROPE_QUANT_OP}
    rotaries = [case.config.rotary for case in cases]
    assert {rotary.layout for rotary in rotaries} == set(HeadLayout)
    assert {rotary.rotation for rotary in rotaries} == set(Rotation)
    assert any(rotary.rotary_dim < rotary.head_dim for rotary in rotaries)  # partial rotation
    # OLMo2's norm over a token's whole width, cut into head rows after it.
    assert any(case.config.hidden_sizes[0] > case.config.rotary.head_dim for case in cases)
    assert {case.tables.per_batch for case in cases} == {True, False}
    assert {case.tables.dtype == "float32" for case in cases} == {True, False}
    assert {case.dtype for case in cases} == set(FLOATS)
    assert {case.config.params.weight_mode for case in cases} == set(WeightMode)
    stages = {stage for case in cases if case.config.quant for stage in case.config.quant.stages}
    assert stages == set(contract.QK_NORM_ROPE_QUANT.quant_stages)
    for case in cases:
        batches = [shapes[0][0] for shapes in case.runs]
        tokens = [case.table_shape(shapes)[1] for shapes in case.runs]
        assert (batches, tokens) == ([2, 2, 1], [32, 1, 1])  # prefill, then decode of the batch and of one


def test_a_rope_case_describes_its_tables_by_the_first_activation_and_the_layout() -> None:
    qwen, interleaved, gemma, olmo = ROPE_SMALL
    assert qwen.input_dtypes == ("bfloat16",) * 6
    assert qwen.input_shapes(qwen.runs[0]) == [(2, 8, 4, 64), (2, 8, 2, 64), (64,), (64,), (1, 8, 64), (1, 8, 64)]
    assert qwen.output_shapes(qwen.runs[0]) == [(2, 8, 4, 64), (2, 8, 2, 64)]
    assert interleaved.input_dtypes == ("float16", "float16", "float32", "float32")
    assert interleaved.input_shapes(interleaved.runs[1]) == [(2, 1, 2, 64), (2, 1, 1, 64), (2, 1, 32), (2, 1, 32)]
    assert gemma.input_shapes(gemma.runs[0])[-2:] == [(2, 8, 64)] * 2  # [B, H, S, D]: S on axis 2
    assert gemma.runs[0] == ((2, 2, 8, 64), (2, 2, 8, 64))
    assert olmo.config.hidden_sizes == (128, 64) and olmo.runs[0] == ((2, 8, 128), (2, 8, 64))
    assert olmo.input_shapes(olmo.runs[0])[-1] == (1, 8, 32)
    assert interleaved.name.endswith("-rope-d64r32-INTERLEAVED-TOKEN_MAJOR-cosfloat32-bcB")
    assert rope_cases()[0].name == (
        "TrtfuseQkNormRope-bfloat16-wbfloat16-AFTER_CAST-h128x128-off0-rope-d128r128-HALF_SPLIT-TOKEN_MAJOR-"
        "cosbfloat16-bc1"
    )
    with pytest.raises(ValueError, match="not a rotary case"):
        replace(qwen, tables=None).table_shape(qwen.runs[0])


def test_the_descriptors_of_a_rope_case_give_the_tables_their_profile() -> None:
    per_batch, one = ROPE_SMALL[1], ROPE_SMALL[0]
    inputs, _outputs = profile_descs(per_batch)
    for desc in inputs[-2:]:
        assert DTYPE_NAMES[desc.desc.type] == "float32"
        assert dims(desc.desc) == (-1, -1, 32)
        assert (dims(desc.min), dims(desc.opt), dims(desc.max)) == ((1, 1, 32), (2, 8, 32), (2, 8, 32))
    inputs, _outputs = profile_descs(one)
    assert dims(inputs[-1].desc) == (1, -1, 64)  # one table row for every batch: Bc stays 1
    run_inputs, _run_outputs = run_descs(per_batch, per_batch.runs[1])
    assert [dims(d) for d in run_inputs] == [(2, 1, 2, 64), (2, 1, 1, 64), (2, 1, 32), (2, 1, 32)]


@pytest.mark.parametrize("case", ROPE_SMALL + ROPE_QUANT_SMALL, ids=ids(ROPE_SMALL + ROPE_QUANT_SMALL))
def test_the_build_phase_of_a_rope_case(case: NormCase, kernels: list[RecordingKernel]) -> None:
    """cos accepts float32 and the activations' dtype, sin cos's; the kernel spec carries the rotation and the
    tables' dtype; the fields (the rotary ones included) survive serialisation exactly."""
    build = build_phase(CREATORS[case.op.name](), case)
    assert build.output_dtypes == case.output_dtypes and build.output_ranks == tuple(map(len, case.runs[0]))
    cos = len(case.input_dtypes) - 2
    assert set(build.accepted[cos]) == {"float32", case.dtype}
    assert build.accepted[cos + 1] == (case.tables.dtype,)
    assert build.non_linear_accepted == []
    (kernel,) = kernels
    assert kernel.spec == case.kernel_spec
    assert isinstance(kernel.spec, QkNormRopeSpec) and kernel.spec.cos_dtype == case.tables.dtype
    rotary = case.config.rotary
    rotation = "interleaved" if rotary.rotation is Rotation.INTERLEAVED else "half"
    layout = "head_major" if rotary.layout is HeadLayout.HEAD_MAJOR else "token_major"
    assert kernel.spec.rope == RopeParams(rotary.head_dim, rotary.rotary_dim, rotation, layout)
    rows = [math.prod(shape[:-1]) for shape in case.max_shapes]
    assert kernel.warm_ups == [max(rows)]
    assert [field.name for field in build.serialized] == list(case.op.fields)
    recreated = recreate(CREATORS[case.op.name](), build.serialized)
    assert recreated.config == case.config


# --- tensors --------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", ROPE_SMALL, ids=ids(ROPE_SMALL))
def test_the_tables_are_rotary_tables_of_consecutive_positions(case: NormCase) -> None:
    """Each table row is `rotary_tables` of S consecutive positions from its own start (found among every start
    the harness draws), in the case's dtype, theta and rotation; per-batch tables start each row elsewhere."""
    tensors = device_tensors(case, case.runs[0], seed=0, device="cpu")
    cos, sin = tensors.inputs[-2:]
    rows, tokens, rotary_dim = case.table_shape(case.runs[0])
    assert tuple(cos.shape) == tuple(sin.shape) == (rows, tokens, rotary_dim)
    rotation = "interleaved" if case.config.rotary.rotation is Rotation.INTERLEAVED else "half"
    theta = case.tables.theta
    every_cos, _every_sin = rotary_tables(torch.arange(32768)[None, :], rotary_dim, theta, rotation, cos.dtype)
    starts = []
    for row in range(rows):
        (start,) = (every_cos[0] == cos[row, 0]).all(-1).nonzero()[:, 0].tolist()
        positions = start + torch.arange(tokens)[None, :]
        expected = rotary_tables(positions, rotary_dim, theta, rotation, cos.dtype)
        assert torch.equal(expected[0][0], cos[row]) and torch.equal(expected[1][0], sin[row])
        starts.append(start)
    assert len(set(starts)) == rows  # per batch row: each its own start


def test_a_refill_leaves_the_tables_and_changes_the_activations() -> None:
    case = ROPE_SMALL[1]
    tensors = device_tensors(case, case.runs[0], seed=0, device="cpu")
    before = [tensor.clone() for tensor in tensors.inputs]
    tensors.refill(torch.Generator().manual_seed(5))
    assert tensors.tables == 2 and len(tensors.random_inputs) == 2
    assert all(not torch.equal(a, b) for a, b in zip(before[:2], tensors.inputs[:2], strict=True))
    assert all(torch.equal(a, b) for a, b in zip(before[2:], tensors.inputs[2:], strict=True))


# --- output checks --------------------------------------------------------------------------------------------------


def extents(case: NormCase, shapes: tuple[tuple[int, ...], ...]) -> tuple[int, int]:
    """(B, S) of a run, read off q's shape by the layout, independently of the plugin."""
    q = shapes[0]
    return q[0], q[2] if case.config.rotary.layout is HeadLayout.HEAD_MAJOR else q[1]


def written(case: NormCase, spec: Any = None, tables: Any = None) -> DeviceTensors:
    """A run's host tensors with every output written as `qk_norm_rope_reference` says for `spec` (default: the
    case's kernel spec) and `tables` (default: the run's own cos and sin)."""
    tensors = device_tensors(case, case.runs[0], seed=3, device="cpu")
    cos, sin = tables or tensors.inputs[-2:]
    batch, seq_len = extents(case, case.runs[0])
    weighted = case.config.has_weight
    for part, (x, out) in enumerate(zip(tensors.inputs[:2], tensors.outputs, strict=True)):
        weight = tensors.inputs[2 + part] if weighted else None
        reference, _magnitude = qk_norm_rope_reference(
            x, weight, cos, sin, spec or case.kernel_spec, part, batch, seq_len
        )
        out.copy_(reference)
    return tensors


ROPE_CHECKED = ROPE_SMALL + ROPE_QUANT_SMALL


@pytest.mark.parametrize("case", ROPE_CHECKED, ids=ids(ROPE_CHECKED))
def test_rope_outputs_start_poisoned_and_pass_when_written_as_the_reference(case: NormCase) -> None:
    tensors = device_tensors(case, case.runs[0], seed=3, device="cpu")
    checks = check_outputs(case, tensors)
    assert [check.unwritten for check in checks] == [out.numel() for out in tensors.outputs]
    assert not any(check.passed for check in checks)
    tensors = written(case)
    checks = check_outputs(case, tensors)
    assert [check.name for check in checks] == ["q_out", "k_out"]
    assert all(check.passed for check in checks), checks
    assert all(check.rtol == 1.0 and check.max_rel == 0.0 and check.unwritten == 0 for check in checks)
    assert tensors.guards_intact()


@pytest.mark.parametrize("case", ROPE_SMALL[:3], ids=ids(ROPE_SMALL[:3]))
def test_the_rope_checks_catch_an_unrotated_output_swapped_tables_and_the_wrong_table_row(case: NormCase) -> None:
    spec = case.kernel_spec
    # The QK-norm's own output, not rotated: a rotation by the identity table (cos 1, sin 0).
    run_tables = device_tensors(case, case.runs[0], seed=3, device="cpu").inputs[-2:]
    identity = (torch.ones_like(run_tables[0]), torch.zeros_like(run_tables[1]))
    assert not any(check.passed for check in check_outputs(case, written(case, tables=identity)))
    swapped = (run_tables[1], run_tables[0])
    assert not any(check.passed for check in check_outputs(case, written(case, tables=swapped)))
    # The other rotation's pairs.
    other = "half" if spec.rope.rotation == "interleaved" else "interleaved"
    paired = replace(spec, rope=replace(spec.rope, rotation=other))
    assert not any(check.passed for check in check_outputs(case, written(case, spec=paired)))
    if case.tables.per_batch:
        # Every batch row rotated by the first row's table, as a kernel that took Bc for 1 would.
        first = tuple(table[:1] for table in run_tables)
        assert not any(check.passed for check in check_outputs(case, written(case, tables=first)))


def test_the_rope_checks_allow_a_product_s_grid_step_and_catch_more_and_a_quantized_poison() -> None:
    """With product stages, an output may be one step of each product's grid off (at the rotated terms' size, the
    AOT check's rule), far more than the rotation's own tolerance: one step passes, four fail."""
    case = ROPE_QUANT_SMALL[1]  # q: FP8 products; k: INT8 products and an INT8 output
    tensors = written(case)
    q_out, k_out = tensors.outputs
    assert q_out.dtype == torch.bfloat16 and k_out.dtype == torch.int8
    cos, sin = tensors.inputs[-2:]
    batch, seq_len = extents(case, case.runs[0])
    _q, magnitude = qk_norm_rope_reference(
        tensors.inputs[0], tensors.inputs[2], cos, sin, case.kernel_spec, 0, batch, seq_len
    )
    index = int((magnitude.view(-1) - 1.5).abs().argmin())
    step = float(quantization_step(magnitude.view(-1)[index : index + 1].double(), PRODUCTS.q_cos_product))
    original = q_out.view(-1)[index].clone()
    q_out.view(-1)[index] = original + step
    q_check, k_check = check_outputs(case, tensors)
    assert q_check.passed and 0.3 < q_check.max_rel < 1 and k_check.passed
    q_out.view(-1)[index] = original + 4 * step
    q_check = check_outputs(case, tensors)[0]
    assert not q_check.passed and q_check.failure.startswith("q_out: 1 elements outside")
    tensors = written(case)
    codes = tensors.outputs[1].view(-1)
    position = int((codes != -128).nonzero()[0])
    codes[position] = -128  # the INT8 poison where the reference holds another code
    k_check = check_outputs(case, tensors)[1]
    assert k_check.unwritten == 1 and not k_check.passed


# --- whole drives ---------------------------------------------------------------------------------------------------

DRIVEN = [*rope_cases(), *rope_quant_cases(), *ROPE_SMALL]


@pytest.mark.parametrize("case", DRIVEN, ids=ids(DRIVEN))
def test_drive_a_rope_case_with_cpu_stand_in_kernels(case: NormCase, host_kernels: list[HostKernel]) -> None:
    """Every rotary case of `python -m trtfuse.bench.lifecycle` (and the small ones) through the whole drive; the
    stand-in reads cos and sin at the extents the plugin launches with."""
    report = drive(case, device="cpu")
    assert report.passed, [(run.shapes, run.checks, run.guards_intact) for run in report.runs]
    assert all(check.max_rel == 0.0 for run in report.runs for check in run.checks)
    _build_kernel, attached_kernel, clone_kernel = host_kernels
    launches = [attached_kernel.launches[0], clone_kernel.launches[0], attached_kernel.launches[1]]
    for args, shapes in zip(launches, case.runs, strict=True):
        batch, seq_len = extents(case, shapes)
        rows = tuple(math.prod(shape[:-1]) for shape in shapes)
        cos_batch = batch if case.tables.per_batch else 1
        assert args[-6:] == (*rows, batch, seq_len, cos_batch, 0x5EED)
    assert {kernel.spec for kernel in host_kernels} == {case.kernel_spec}


def test_a_drive_catches_a_plugin_that_reads_one_table_row_for_the_batch(
    monkeypatch: pytest.MonkeyPatch, host_kernels: list[HostKernel]
) -> None:
    """A plugin that launched with Bc = 1 for per-batch tables rotates the second batch row by the first's table:
    the prefill run (B = 2) and the decode of the batch fail, the decode of one token passes."""
    import trtfuse.plugins.python.base as base

    original = base.rotary_extents

    def one_row(*args: Any) -> tuple[int, ...]:
        batch, seq_len, _cos_batch = original(*args)
        return batch, seq_len, 1

    monkeypatch.setattr(base, "rotary_extents", one_row)
    case = ROPE_SMALL[1]
    report = drive(case, device="cpu")
    assert [all(check.passed for check in run.checks) for run in report.runs] == [False, False, True]
