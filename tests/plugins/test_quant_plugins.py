"""The quantized ops' Python plugins (TrtfuseRmsNormQuant, TrtfuseAddRmsNormQuant) and the harness's quantized cases,
on the CPU, from docs/plugin-nodes.md "Quantization" and docs/plugins.md "Quantized outputs": the plain op's classes
with the op swapped, FP8 / INT8 normalised outputs (nothing else quantized, only LINEAR), the kernel spec built with
the node's quantizers, the quantizer fields serialised and read back exactly, and whole drives whose stand-in kernels
compute the contract's reference (trtfuse/bench/reference.py) through the raw pointers; the output checks catch
what a kernel could get wrong. TensorRT-RTX's module stands in for TensorRT's plugin types.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
import torch

from trtfuse import contract
from trtfuse import kernels as kernels_module
from trtfuse.bench.lifecycle.cases import NormCase, add_case, default_cases, fp8, int8, quant_cases, rms_case
from trtfuse.bench.lifecycle.drive import drive
from trtfuse.bench.lifecycle.outputs import allowed_steps, check_outputs, quantized_steps, reference_part
from trtfuse.bench.lifecycle.phases import build_phase, recreate
from trtfuse.bench.lifecycle.tensors import device_tensors, is_poison, poison
from trtfuse.contract import QuantParams, WeightMode
from trtfuse.plugins.python.add_rms_norm import AddRmsNormPlugin, AddRmsNormPluginCreator
from trtfuse.plugins.python.base import DTYPE_NAMES, OUTPUT_DTYPE_NAMES
from trtfuse.plugins.python.creators import CREATORS
from trtfuse.plugins.python.rms_norm import RmsNormPlugin, RmsNormPluginCreator

from support.host_kernels import HostKernel
from support.plugin_fields import RecordingKernel, trt

FLOATS = ("float32", "float16", "bfloat16")
SMALL = ((4, 16), (1, 3), (1, 1))
QUANT_SMALL = [
    rms_case(64, "bfloat16", "float32", max_leading=(4, 16), runs=SMALL, quant=QuantParams(output=fp8(1 / 64))),
    rms_case(
        40, "float16", None, WeightMode.NONE, max_leading=(4, 16), runs=SMALL, quant=QuantParams(output=int8(0.02))
    ),
    rms_case(
        64,
        "float16",
        "float16",
        max_leading=(4, 16),
        runs=SMALL,
        quant=QuantParams(rsqrt=int8(2 / 127, "float16"), output=fp8(1 / 128, saturate=False)),
    ),
    add_case(
        64,
        "bfloat16",
        "bfloat16",
        max_leading=(4, 16),
        runs=SMALL,
        quant=QuantParams(input=fp8(1 / 64, dequant_dtype="bfloat16"), output=fp8(1 / 64)),
    ),
    add_case(64, "float16", "float32", max_leading=(4, 16), runs=SMALL, quant=QuantParams(input=int8(0.05, "float16"))),
    add_case(
        64,
        "float32",
        "bfloat16",
        WeightMode.BEFORE_CAST,
        1.0,
        max_leading=(4, 16),
        runs=SMALL,
        output_dtype="bfloat16",
        quant=QuantParams(output=int8(8 / 127)),
    ),
]


def ids(cases: list[NormCase]) -> list[str]:
    return [case.name for case in cases]


def trt_type(dtype: str) -> Any:
    return {name: data_type for data_type, name in OUTPUT_DTYPE_NAMES.items()}[dtype]


# --- the classes ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("quantized", "plugin", "creator"),
    [
        (contract.RMS_NORM_QUANT_OP, RmsNormPlugin, RmsNormPluginCreator),
        (contract.ADD_RMS_NORM_QUANT_OP, AddRmsNormPlugin, AddRmsNormPluginCreator),
    ],
)
def test_a_quantized_op_is_its_plain_op_s_classes_with_the_op_swapped(
    quantized: str, plugin: type, creator: type
) -> None:
    quant_creator = CREATORS[quantized]
    assert quant_creator.__bases__ == (creator,) and quant_creator.PLUGIN.__bases__ == (plugin,)
    assert quant_creator.PLUGIN.OP is contract.OPS[quantized]
    assert set(vars(quant_creator.PLUGIN)) - {"__module__", "__doc__"} == {"OP"}
    assert set(vars(quant_creator)) - {"__module__", "__doc__"} == {"PLUGIN"}
    made = quant_creator()
    assert (made.name, made.plugin_namespace, made.plugin_version) == (quantized, "trtfuse", "1")
    assert [field.name for field in made.field_names] == list(contract.OPS[quantized].fields)


def test_the_output_data_types_are_the_contract_s_quantized_dtypes() -> None:
    assert {OUTPUT_DTYPE_NAMES[trt.DataType.FP8], OUTPUT_DTYPE_NAMES[trt.DataType.INT8]} == set(
        contract.QUANT_DTYPE_CODES
    )
    # An activation or a weight is never quantized.
    assert trt.DataType.FP8 not in DTYPE_NAMES and trt.DataType.INT8 not in DTYPE_NAMES


# --- the build phase ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", QUANT_SMALL, ids=ids(QUANT_SMALL))
def test_the_build_phase_of_a_quantized_case(case: NormCase, kernels: list[RecordingKernel]) -> None:
    """y in the normalised dtype (FP8 / INT8 with the output stage, else T) and nothing else quantized; the spec is the
    plain op's with `quant` the node's quantizers; the fields (every stage's) survive serialisation exactly."""
    build = build_phase(CREATORS[case.op.name](), case)
    normalised = case.config.normalised_dtype(0)
    assert build.output_dtypes == case.output_dtypes
    assert build.output_dtypes[0] == normalised
    activations = len(case.op.activations)
    pairs = tuple(d for d in FLOATS if contract.dtype_pair_problem(d, case.output_dtype) is None)
    expected: dict[int, tuple[str, ...]] = {0: pairs, **{i: (case.dtype,) for i in range(1, activations)}}
    position = activations
    if case.config.has_weight:
        expected[position] = FLOATS
        position += 1
    expected[position] = (normalised,)
    if len(case.op.outputs) == 2:
        expected[position + 1] = (case.dtype,)
    assert build.accepted == expected
    assert build.non_linear_accepted == []
    (kernel,) = kernels
    spec_class = kernels_module.RmsNormSpec if case.op.base == contract.RMS_NORM_OP else kernels_module.AddRmsNormSpec
    hidden = case.config.hidden_sizes[0]
    params = case.config.params
    assert kernel.spec == spec_class(
        hidden, case.dtype, case.weight_dtype, params, case.output_dtype, case.config.quant
    )
    assert [field.name for field in build.serialized] == list(case.op.fields)
    recreated = recreate(CREATORS[case.op.name](), build.serialized)
    assert recreated.config == case.config and recreated.config.quant == case.config.quant
    assert recreated.timing_cache_id == build.plugin.timing_cache_id


def test_get_output_data_types_refuses_a_quantized_input_and_two_scales_give_two_timing_ids(
    kernels: list[RecordingKernel],
) -> None:
    case = QUANT_SMALL[0]
    build = build_phase(CREATORS[case.op.name](), case)
    with pytest.raises(Exception, match="input 'x' has dtype FP8"):
        build.plugin.get_output_data_types([trt.DataType.FP8, trt.DataType.FLOAT])
    other = replace(case, config=replace(case.config, quant=QuantParams(output=fp8(1 / 32))))
    assert build_phase(CREATORS[case.op.name](), other).plugin.timing_cache_id != build.plugin.timing_cache_id


def test_an_input_stage_alone_leaves_y_in_t() -> None:
    case = add_case(64, "float16", "float16", quant=QuantParams(input=fp8(1 / 32, dequant_dtype="float16")))
    assert case.config.normalised_dtype(0) == "float16" and case.output_dtypes == ("float16", "float16")


# --- the default cases ----------------------------------------------------------------------------------------------


def test_the_default_cases_cover_every_quantized_op_dtype_stage_and_saturation() -> None:
    cases = [case for case in default_cases() if case.op.quantized]
    assert cases == quant_cases() and cases == default_cases()[-len(cases) :]
    assert {case.op.name for case in cases} == {op.name for op in contract.QUANTIZED_OPS.values()}
    quantizers = [(stage, case.config.quant.at(stage)) for case in cases for stage in case.config.quant.stages]
    # Every stage of an op in both dtypes (the rotary QK-norm's products and outputs included) but FP8 inverse roots
    # (ModelOpt's are INT8).
    fp8_roots = {(stage, "float8_e4m3fn") for stage in contract.QUANT_STAGES if stage.rounds_input}
    stages = {stage for op in contract.QUANTIZED_OPS.values() for stage in op.quant_stages}
    assert {(stage, quantizer.dtype) for stage, quantizer in quantizers} == {
        (stage, dtype) for stage in stages for dtype in contract.QUANT_DTYPE_CODES
    } - fp8_roots
    assert any(not quantizer.saturate for _stage, quantizer in quantizers)
    assert {case.dtype for case in cases} == set(FLOATS)
    assert {case.config.params.weight_mode for case in cases} == set(WeightMode)
    assert len({case.name for case in cases}) == len(cases)


# --- output checks --------------------------------------------------------------------------------------------------


def written(case: NormCase) -> Any:
    """A run's host tensors with every output written as the reference says."""
    tensors = device_tensors(case, case.runs[0], seed=3, device="cpu")
    activations = len(case.op.activations)
    weight = tensors.inputs[activations] if case.config.has_weight else None
    normed, summed = reference_part(tensors.inputs[:activations], weight, case.config)
    tensors.outputs[0].copy_(normed)
    if summed is not None:
        tensors.outputs[1].copy_(summed)
    return tensors


@pytest.mark.parametrize("case", [QUANT_SMALL[0], QUANT_SMALL[5]], ids=["fp8", "int8"])
def test_the_checks_judge_a_quantized_y_in_steps_of_its_grid(case: NormCase) -> None:
    tensors = device_tensors(case, case.runs[0], seed=3, device="cpu")
    y = tensors.outputs[0]
    assert y.dtype == getattr(torch, case.config.normalised_dtype(0))
    assert check_outputs(case, tensors)[0].unwritten > 0
    tensors = written(case)
    y = tensors.outputs[0]
    check = check_outputs(case, tensors)[0]
    assert check.passed and (check.max_steps, check.allowed_steps) == (0, allowed_steps(case)) and check.unwritten == 0
    # One value up, then past the allowance: an element some steps from the reference's.
    grid = y.view(torch.uint8) if y.dtype == torch.float8_e4m3fn else y
    index = int((grid.view(-1).long().abs() < 60).nonzero()[0])
    original = grid.view(-1)[index].clone()
    grid.view(-1)[index] = original + 1
    assert check_outputs(case, tensors)[0].max_steps == 1
    grid.view(-1)[index] = original + allowed_steps(case) + 1
    assert not check_outputs(case, tensors)[0].passed
    # An element left at the poison, and a write past the end.
    tensors = written(case)
    first = tensors.outputs[0].view(-1)[:1]
    assert not bool(is_poison(first).item())
    first.copy_(torch.full((1,), poison(first.dtype)).to(first.dtype))
    assert check_outputs(case, tensors)[0].unwritten == 1
    tensors = written(case)
    tensors.output_buffers[0][tensors.outputs[0].numel()] = 0
    assert not tensors.guards_intact()


def test_quantized_steps_count_e4m3fn_values_across_zero_and_nans() -> None:
    values = torch.tensor([0.0, 0.015625, -0.001953125, 448.0, float("nan")], dtype=torch.float8_e4m3fn)
    assert quantized_steps(values, values) == 0
    across = torch.tensor([0.001953125, 0.015625, 0.001953125, 416.0, float("nan")], dtype=torch.float8_e4m3fn)
    # -2^-9 to +2^-9 is two steps (through ±0); 416 to 448 one.
    assert quantized_steps(across, values) == 2
    lost = torch.tensor([0.0, 0.015625, -0.001953125, 448.0, 448.0], dtype=torch.float8_e4m3fn)
    assert quantized_steps(lost, values) == 256


# --- whole drives ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("case", QUANT_SMALL, ids=ids(QUANT_SMALL))
def test_drive_a_quantized_case_with_cpu_stand_in_kernels(case: NormCase, host_kernels: list[HostKernel]) -> None:
    """The whole drive; the stand-ins compute the contract's reference, so y is exactly the reference's codes."""
    report = drive(case, device="cpu")
    assert report.passed, [(run.shapes, run.checks, run.guards_intact) for run in report.runs]
    assert all(check.max_steps == 0 for run in report.runs for check in run.checks)
    assert {kernel.spec.quant for kernel in host_kernels} == {case.config.quant}


def test_a_drive_catches_a_kernel_that_ignores_the_quantizers(
    monkeypatch: pytest.MonkeyPatch, host_kernels: list[HostKernel]
) -> None:
    """A plugin that built its kernel without the node's quantizers (y cast to FP8, not divided by the scale) fails."""
    original = kernels_module.get_rms_norm
    monkeypatch.setattr(kernels_module, "get_rms_norm", lambda spec: original(replace(spec, quant=None)))
    case = QUANT_SMALL[0]
    report = drive(case, device="cpu")
    assert not report.passed
    assert all(check.max_steps > check.allowed_steps for run in report.runs for check in run.checks)
