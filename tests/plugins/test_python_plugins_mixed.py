"""The plugins' side of mixed precision (contract: `output_dtype`): fields, output types, formats, kernel spec.

CPU only, with TensorRT-RTX's plugin types standing in for TensorRT's (as in test_python_plugins.py) and the kernels
replaced by a recorder.
"""

from __future__ import annotations

from typing import Any

import pytest

from trtfuse.bench.lifecycle.cases import rms_case
from trtfuse.bench.lifecycle.descriptors import dynamic_desc
from trtfuse.bench.lifecycle.phases import build_phase, runtime_phase
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.python.base import DTYPE_NAMES
from trtfuse.plugins.python.fields import serialize_fields
from trtfuse.plugins.python.qk_norm import QkNormPluginCreator
from trtfuse.plugins.python.rms_norm import RmsNormPluginCreator

from support.plugin_fields import RecordingKernel, create, f32, i32, rms_fields, trt

FLOAT, HALF, BF16 = trt.DataType.FLOAT, trt.DataType.HALF, trt.DataType.BF16


def rms_plugin(output_dtype: int, weight_mode: int = 1) -> Any:
    return create(RmsNormPluginCreator(), rms_fields(weight_mode=i32(weight_mode), output_dtype=i32(output_dtype)))


@pytest.mark.parametrize(("code", "name"), [(1, "float32"), (10, "float16"), (16, "bfloat16")])
def test_output_dtype_field_is_parsed_and_serialised_back(code: int, name: str) -> None:
    plugin = rms_plugin(code)
    assert plugin.config.output_dtype == name
    collection, _arrays = serialize_fields(plugin.config)
    stored = {f.name: int(f.data[0]) for f in collection if f.type == trt.PluginFieldType.INT32}
    assert stored["output_dtype"] == code


@pytest.mark.parametrize("code", [0, 11, 2, -1])
def test_bad_output_dtype_field_is_one_line_naming_the_node(code: int) -> None:
    with pytest.raises(TrtfuseError) as error:
        rms_plugin(code)
    assert str(error.value) == (
        f"TrtfuseRmsNorm 'layers.0.norm': field output_dtype is {code}, none of 1 (float32), 10 (float16), "
        "16 (bfloat16)"
    )


@pytest.mark.parametrize(
    ("code", "inputs", "outputs"),
    [
        (10, [FLOAT, HALF], [HALF]),  # optimum fp16 export on an fp32 residual stream
        (16, [FLOAT, FLOAT], [BF16]),
        (1, [BF16, FLOAT], [FLOAT]),  # opset-23 RMSNormalization, bf16 X, fp32 scale and Y
        (10, [HALF, FLOAT], [HALF]),
    ],
)
def test_output_types_come_from_output_dtype(code: int, inputs: list[Any], outputs: list[Any]) -> None:
    assert rms_plugin(code).get_output_data_types(inputs) == outputs


def test_two_different_16_bit_dtypes_are_refused_in_one_line() -> None:
    with pytest.raises(TrtfuseError) as error:
        rms_plugin(16).get_output_data_types([HALF, HALF])
    assert str(error.value) == (
        "TrtfuseRmsNorm 'layers.0.norm': input dtype float16 and output dtype bfloat16 are two different 16-bit dtypes"
    )


def accepted(plugin: Any, pos: int, chosen: list[Any]) -> set[str]:
    """The dtypes supports_format_combination takes at `pos`, the other positions holding `chosen`."""
    names = set()
    for data_type in DTYPE_NAMES:
        in_out = [dynamic_desc((2, 64), (2, 64), (2, 64), DTYPE_NAMES[t]) for t in chosen]
        in_out[pos].desc.type = data_type
        if plugin.supports_format_combination(pos, in_out, 2):
            names.add(DTYPE_NAMES[data_type])
    return names


def test_formats_accept_the_output_dtype_and_the_inputs_it_pairs_with() -> None:
    plugin = rms_plugin(16)
    assert accepted(plugin, 0, [FLOAT, FLOAT, BF16]) == {"float32", "bfloat16"}
    assert accepted(plugin, 1, [FLOAT, FLOAT, BF16]) == {"float32", "float16", "bfloat16"}
    assert accepted(plugin, 2, [FLOAT, FLOAT, BF16]) == {"bfloat16"}


def test_kernel_spec_carries_the_output_dtype(kernels: list[RecordingKernel]) -> None:
    plugin = rms_plugin(10)
    descs = [
        dynamic_desc((1, 64), (8, 64), (8, 64), "float32"),
        dynamic_desc((64,), (64,), (64,), "float16"),
    ]
    out = [dynamic_desc((1, 64), (8, 64), (8, 64), "float16")]
    plugin.configure_plugin(descs, out)
    [kernel] = kernels
    assert (kernel.spec.dtype, kernel.spec.weight_dtype, kernel.spec.out_dtype) == ("float32", "float16", "float16")


def test_qk_norm_outputs_share_the_output_dtype() -> None:
    values = {
        "epsilon": f32(1e-6),
        "weight_offset": f32(0.0),
        "weight_mode": i32(1),
        "q_hidden_size": i32(128),
        "k_hidden_size": i32(128),
        "output_dtype": i32(16),
    }
    plugin = create(QkNormPluginCreator(), values, node="qk")
    assert plugin.get_output_data_types([FLOAT, FLOAT, BF16, BF16]) == [BF16, BF16]
    assert accepted_qk_outputs(plugin) == ({"bfloat16"}, {"bfloat16"})


def accepted_qk_outputs(plugin: Any) -> tuple[set[str], set[str]]:
    chosen = ["float32", "float32", "bfloat16", "bfloat16", "bfloat16", "bfloat16"]
    result = []
    for pos in (4, 5):
        names = set()
        for data_type in DTYPE_NAMES:
            in_out = [dynamic_desc((2, 128), (2, 128), (2, 128), name) for name in chosen]
            in_out[pos].desc.type = data_type
            if plugin.supports_format_combination(pos, in_out, 4):
                names.add(DTYPE_NAMES[data_type])
        result.append(names)
    return result[0], result[1]


@pytest.mark.parametrize(
    "case",
    [
        rms_case(64, "float32", "bfloat16", output_dtype="bfloat16"),
        rms_case(64, "bfloat16", "float32", output_dtype="float32"),
    ],
    ids=lambda case: case.name,
)
def test_mixed_precision_build_serialise_and_recreate(case: Any, kernels: list[RecordingKernel]) -> None:
    """The parser's fields to an engine's and back: the output dtype survives serialisation and drives the
    output types, the accepted formats and the kernel spec at build and at runtime."""
    creator = RmsNormPluginCreator()
    build = build_phase(creator, case)
    assert build.output_dtypes == (case.output_dtype,)
    assert build.accepted[2] == (case.output_dtype,)
    assert [f.name for f in build.serialized][-1] == "output_dtype"
    attached, clone = runtime_phase(creator, build)
    assert attached.config == clone.config == case.config
    assert {k.spec.out_dtype for k in kernels} == {case.output_dtype}
    assert {k.spec.dtype for k in kernels} == {case.dtype}
