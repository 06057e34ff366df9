"""The AOT plugins: prepare_for_aot's nodes, the QDP definitions' signatures by tensorrt.plugin's rules, the one kind of
plugin per process, and (where TensorRT exists) engines that build with them and run in a process without trtfuse.

The signature tests read the functions `qdp_definitions` builds from the op table with stand-in types (plain classes
in tensorrt.plugin's roles, nothing executed) and run them through tensorrt.plugin's reader restated rule by rule
(`support.qdp_rules`, from _validate.py at v10.9.0 and v11.1, unchanged between the two), which must accept every
generated signature and refuse each way of breaking one; and they check the calls of _plugin_class.py: register
with the fields as keywords, autotune and aot_impl positionally, a field handed to the wrong parameter. Everything
that needs TensorRT runs in subprocesses, so no registration leaks into the other tests of this process.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest

from trtfuse import contract
from trtfuse.contract import WeightMode
from trtfuse.contract.codec import NodeFields, from_qdp
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.aot_form import prepare_for_aot
from trtfuse.fusion.fuse import fuse_model
from trtfuse.plugins import qdp as aot

from support.fused_models import FUSED_MODELS, attributes_of, fused_model, fused_node, rms_model, trtfuse_nodes
from support.graphs import AttentionSpec, Builder, NormSpec, attention_block, rms_norm, single_norm
from support.markers import needs_aot_tensorrt
from support.paths import REPO_ROOT
from support.qdp_rules import StandIns, parse_register, type_name_is_read, validate_aot_impl, validate_autotune

needs_tensorrt = needs_aot_tensorrt
HIDDEN = 64
ROOT = REPO_ROOT


# --- the QDP definitions, by tensorrt.plugin's rules ----------------------------------------------------------------


class TensorDesc:
    """Stand-ins for tensorrt.plugin's types: only their identity matters to the signature rules."""


class AutoTuneCombination:
    def __init__(self, io_types: str, layouts: str, tactics: list[int]) -> None:
        self.io_types, self.layouts, self.tactics = io_types, layouts, tactics


class KernelLaunchParams:
    pass


class SymExprs:
    pass


class SymIntExprs(SymExprs):
    pass


STAND_INS = SimpleNamespace(
    TensorDesc=TensorDesc,
    AutoTuneCombination=AutoTuneCombination,
    KernelLaunchParams=KernelLaunchParams,
    SymIntExprs=SymIntExprs,
)
DEFINITIONS = {definition.op: definition for definition in aot.qdp_definitions(STAND_INS)}
ROLES = StandIns(TensorDesc, AutoTuneCombination, KernelLaunchParams, SymExprs)
# tensorrt.plugin's _validate.py: names an attribute may not take.
DISALLOWED_ATTR_NAMES = {"outputs", "stream", "tactic"}
OUTPUT_COUNTS = {op: len(contract.OPS[op].outputs) for op in contract.FUSED_OPS}


def test_there_is_one_qdp_per_op() -> None:
    assert [definition.op for definition in aot.qdp_definitions(STAND_INS)] == list(contract.FUSED_OPS)


def _rope_kernels() -> None:
    """Skip a check of the rotary op's kernels where trtfuse.kernels has none yet (they come with the ropekernel
    branch's QkNormRopeSpec, qk_norm_rope_params and qk_norm_rope_tactics)."""
    from trtfuse.kernels import declaration

    if not hasattr(declaration, "qk_norm_rope_params"):
        pytest.skip("trtfuse.kernels has no QK-norm + rotary kernel here")


# Each plain op's kernel parameters in trtfuse.kernels.declaration (a quantized op's are its plain op's).
KERNEL_PARAMS = {
    contract.RMS_NORM_OP: "rms_norm_params",
    contract.QK_NORM_OP: "qk_norm_params",
    contract.ADD_RMS_NORM_OP: "add_rms_norm_params",
    contract.QK_NORM_ROPE_OP: "qk_norm_rope_params",
}


def _kernel_params(op: str) -> tuple:
    from trtfuse.kernels import declaration

    if contract.OPS[op].rotary:
        _rope_kernels()
    return getattr(declaration, KERNEL_PARAMS[contract.OPS[op].base or op])()


def _kernel_inputs(op: str) -> list[str]:
    from trtfuse.kernels.declaration import ParamRole

    return [param.name for param in _kernel_params(op) if param.role is ParamRole.INPUT]


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_the_kernel_s_outputs_are_the_op_s_in_order(op: str) -> None:
    """TensorRT hands aot_impl's kernel the output pointers in the register function's order: the op's."""
    from trtfuse.kernels.declaration import ParamRole

    outputs = [param.name for param in _kernel_params(op) if param.role is ParamRole.OUTPUT]
    expected = list(contract.OPS[op].outputs)
    assert outputs == expected


def _split(function: typing.Callable) -> tuple[list[str], list[str], dict[str, object]]:
    """(tensor names, attribute names, annotations) of a register-style signature, by _parse_register_inputs."""
    tensors, attributes, annotations = [], [], {}
    for name, param in inspect.signature(function).parameters.items():
        annotations[name] = param.annotation
        if name in ("outputs", "tactic"):
            continue
        (tensors if param.annotation is TensorDesc else attributes).append(name)
    return tensors, attributes, annotations


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_the_register_function_passes_tensorrt_plugin_rules(op: str) -> None:
    definition = DEFINITIONS[op]
    assert definition.plugin_id == f"trtfuse::{op}"
    signature = inspect.signature(definition.register)
    seen_attribute = False
    for index, (name, param) in enumerate(signature.parameters.items()):
        assert param.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
        assert param.default is inspect.Parameter.empty, f"{name}: defaults are refused"
        assert not isinstance(param.annotation, str), f"{name}: a string annotation fails issubclass"
        if param.annotation is TensorDesc:
            assert not seen_attribute, "TensorDescs come before every attribute"
        else:
            assert index > 0 and name not in DISALLOWED_ATTR_NAMES
            # bytes: tensorrt.plugin makes a float or int field's value with float(data) / int(data) on a
            # one-element array, which NumPy >= 2.4 refuses, and an NDArray annotation fails its issubclass checks
            # on NumPy >= 2.5 and Python >= 3.13 (docs/plugins.md, "Attribute types").
            assert param.annotation is bytes, f"{name}: {param.annotation}"
            seen_attribute = True
        # What _validate.py asks of every parameter: a class issubclass accepts.
        issubclass(param.annotation, TensorDesc)
    returned = signature.return_annotation
    if OUTPUT_COUNTS[op] == 1:
        assert returned is TensorDesc
    else:
        assert typing.get_origin(returned) is tuple and typing.get_args(returned) == (TensorDesc,) * OUTPUT_COUNTS[op]


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_tensorrt_plugin_s_reader_accepts_every_generated_qdp(op: str) -> None:
    """register, autotune and aot_impl through the reader's rules (support.qdp_rules): the tensors are the op's
    inputs, the attributes its fields in order, and autotune and aot_impl name every field (get_launch_params hands
    aot_impl all of them positionally, whatever it names)."""
    definition = DEFINITIONS[op]
    fused_op = contract.OPS[op]
    registered = parse_register(definition.register, ROLES)
    assert registered.tensor_names == list(fused_op.inputs(True))
    assert registered.input_attrs == dict.fromkeys(fused_op.fields, bytes)
    assert registered.num_outputs == OUTPUT_COUNTS[op]
    assert validate_aot_impl(definition.aot_impl, registered, ROLES) == list(fused_op.fields)
    assert validate_autotune(definition.autotune, registered, ROLES) == list(fused_op.fields)


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_what_inspect_signature_reads_is_the_signature_made_from_the_op_table(op: str) -> None:
    """The functions take *args and **kwargs; `inspect.signature`, tensorrt.plugin's one way of reading them, returns
    their `__signature__`, and the call binds to it however its arguments come."""
    definition = DEFINITIONS[op]
    signatures = aot.qdp_signatures(STAND_INS, contract.OPS[op])
    functions = (definition.register, definition.autotune, definition.aot_impl)
    assert [inspect.signature(function) for function in functions] == list(signatures)
    assert [function.__name__ for function in functions] == [f"{op}_register", f"{op}_autotune", f"{op}_aot_impl"]
    with pytest.raises(TypeError):
        definition.register(*range(len(inspect.signature(definition.register).parameters) + 1))


def _mutant(signature: inspect.Signature, parameters: list | None = None, **changes: object) -> typing.Callable:
    """A function whose signature is `signature` with its parameters (or its return annotation) changed."""

    def function(*args: object, **kwargs: object) -> None:
        return None

    function.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=parameters if parameters is not None else list(signature.parameters.values()), **changes
    )
    return function


def _register_mutants(signature: inspect.Signature) -> dict[str, typing.Callable]:
    params = list(signature.parameters.values())
    tensors = [p for p in params if p.annotation is TensorDesc]
    fields = params[len(tensors) :]
    return {
        "a default": _mutant(signature, [*tensors, *fields[:-1], fields[-1].replace(default=b"")]),
        "*args": _mutant(signature, [inspect.Parameter("args", inspect.Parameter.VAR_POSITIONAL)]),
        "a string annotation": _mutant(signature, [*tensors, fields[0].replace(annotation="bytes"), *fields[1:]]),
        "no annotation": _mutant(signature, [*tensors, fields[0].replace(annotation=inspect.Parameter.empty)]),
        "an attribute first": _mutant(signature, [fields[0], *tensors, *fields[1:]]),
        "a tensor after an attribute": _mutant(signature, [*tensors[:-1], fields[0], tensors[-1], *fields[1:]]),
        "an attribute named tactic": _mutant(signature, [*tensors, *fields[:-1], fields[-1].replace(name="tactic")]),
        "an ndarray annotation": _mutant(signature, [*tensors, fields[0].replace(annotation=np.ndarray), *fields[1:]]),
        "no return annotation": _mutant(signature, return_annotation=inspect.Signature.empty),
        "a list returned": _mutant(signature, return_annotation=list[TensorDesc]),
    }


def _impl_mutants(signature: inspect.Signature, tail: int) -> dict[str, typing.Callable]:
    """aot_impl's (tail 2: outputs, tactic) or autotune's (tail 1) signature broken one way each."""
    params = list(signature.parameters.values())
    head, ends = params[:-tail], params[-tail:]
    first_field = next(i for i, p in enumerate(head) if p.annotation is bytes)
    swapped = [*head[:first_field], head[first_field + 1], head[first_field], *head[first_field + 2 :]]
    retyped = [*head[:first_field], head[first_field].replace(annotation=int), *head[first_field + 1 :]]
    mutants = {
        "two fields swapped": _mutant(signature, [*swapped, *ends]),
        "a field typed unlike its registration": _mutant(signature, [*retyped, *ends]),
        "outputs not a tuple": _mutant(signature, [*head, ends[0].replace(annotation=TensorDesc), *ends[1:]]),
        "an unknown tensor": _mutant(signature, [inspect.Parameter("z", _POSITIONAL, annotation=TensorDesc), *params]),
    }
    if tail == 2:
        mutants["no tactic"] = _mutant(signature, [*head, ends[0]])
        mutants["a 3-tuple returned"] = _mutant(signature, return_annotation=tuple[str, str, KernelLaunchParams])
        mutants["a non-string kernel name"] = _mutant(
            signature, return_annotation=tuple[int, str, KernelLaunchParams, SymIntExprs]
        )
    else:
        mutants["a tactic"] = _mutant(signature, [*params, inspect.Parameter("tactic", _POSITIONAL, annotation=int)])
        mutants["a list of ints returned"] = _mutant(signature, return_annotation=list[int])
    return mutants


_POSITIONAL = inspect.Parameter.POSITIONAL_OR_KEYWORD


@pytest.mark.parametrize("op", [contract.RMS_NORM_QUANT_OP, contract.QK_NORM_OP])
def test_the_restated_reader_refuses_each_way_of_breaking_a_signature(op: str) -> None:
    """So that a generated signature tensorrt.plugin would refuse fails the test above: each mutant of a generated
    signature, breaking one rule of _validate.py, is refused by the restated reader."""
    register, autotune, aot_impl = aot.qdp_signatures(STAND_INS, contract.OPS[op])
    for what, mutant in _register_mutants(register).items():
        with pytest.raises((ValueError, TypeError)):
            parse_register(mutant, ROLES)
            pytest.fail(f"register with {what} accepted")
    registered = parse_register(DEFINITIONS[op].register, ROLES)
    for check, signature, tail in ((validate_aot_impl, aot_impl, 2), (validate_autotune, autotune, 1)):
        for what, mutant in _impl_mutants(signature, tail).items():
            with pytest.raises((ValueError, TypeError)):
                check(mutant, registered, ROLES)
                pytest.fail(f"{check.__name__} with {what} accepted")


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_the_fields_are_the_contract_s_in_its_order_and_the_inputs_the_kernel_s(op: str) -> None:
    tensors, attributes, _ = _split(DEFINITIONS[op].register)
    assert tuple(attributes) == contract.OPS[op].fields
    assert tensors == _kernel_inputs(op)


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_each_attribute_annotation_is_what_the_parser_s_field_becomes(case: str) -> None:
    """The parser sends a FLOAT attribute as a FLOAT32 field and an INT as an INT32 one, whatever the creator
    advertises; the plugin reads each field's bytes as the dtype its name says, so each prepared node's attribute
    must be of that type."""
    read_as = {name: onnx.AttributeProto.FLOAT for name in (contract.ATTR_EPSILON, contract.ATTR_WEIGHT_OFFSET)}
    for node in trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
        _, attributes, _ = _split(DEFINITIONS[node.op_type].register)
        types_of = {attribute.name: attribute.type for attribute in node.attribute}
        assert {name: types_of[name] for name in attributes} == {
            name: read_as.get(name, onnx.AttributeProto.INT) for name in attributes
        }


def creator_value(annotation: object, field_data: np.ndarray) -> object:
    """What tensorrt.plugin's create_plugin makes of a field for an attribute of `annotation` (_lib.py, v10.9.0 to
    v11.1): `data.astype(dtype)` for a NumPy array type, else `annotation(data)`."""
    if typing.get_origin(annotation) is np.ndarray:
        (dtype,) = typing.get_args(typing.get_args(annotation)[1])
        return field_data.astype(dtype)
    return annotation(field_data)


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_the_creator_makes_each_field_s_value_from_a_one_element_array(case: str) -> None:
    """TensorRT hands every field as a one-element array (pyPlugin.cpp's PluginField.data); the values the creator
    makes from them must reach autotune and give the node's own epsilon, mode and sizes."""
    for node in trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
        definition = DEFINITIONS[node.op_type]
        tensors, fields, annotations = _split(definition.register)
        given = attributes_of(node)
        dtypes = {onnx.AttributeProto.FLOAT: np.float32, onnx.AttributeProto.INT: np.int32}
        types_of = {attribute.name: attribute.type for attribute in node.attribute}
        values = [creator_value(annotations[n], np.array([given[n]], dtype=dtypes[types_of[n]])) for n in fields]
        descs = [TensorDesc() for _ in tensors]
        combinations = definition.autotune(*descs, *values, (None,) * OUTPUT_COUNTS[node.op_type])
        assert combinations, node.name
        params = from_qdp(contract.OPS[node.op_type], values).params
        assert params.epsilon == float(np.float32(given[contract.ATTR_EPSILON]))
        assert params.weight_mode is WeightMode(given[contract.ATTR_WEIGHT_MODE])


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_aot_impl_and_autotune_take_every_field_in_registration_order(op: str) -> None:
    """_validate_aot_impl wants (inputs..., attrs..., outputs, tactic) with the register function's names and types;
    get_launch_params passes *all* fields by position, so aot_impl must declare all of them."""
    definition = DEFINITIONS[op]
    tensors, attributes, annotations = _split(definition.register)
    for function, tail in ((definition.aot_impl, ["outputs", "tactic"]), (definition.autotune, ["outputs"])):
        function_tensors, function_attributes, function_annotations = _split(function)
        assert list(inspect.signature(function).parameters) == [*tensors, *attributes, *tail]
        assert (function_tensors, function_attributes) == (tensors, attributes)
        assert {name: function_annotations[name] for name in (*tensors, *attributes)} == {
            name: annotations[name] for name in (*tensors, *attributes)
        }
        outputs = function_annotations["outputs"]
        assert typing.get_origin(outputs) is tuple and typing.get_args(outputs) == (TensorDesc,) * OUTPUT_COUNTS[op]
    assert _split(definition.aot_impl)[2]["tactic"] is int


@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_the_return_annotations_are_the_ones_tensorrt_plugin_accepts(op: str) -> None:
    definition = DEFINITIONS[op]
    kernel = inspect.signature(definition.aot_impl).return_annotation
    assert typing.get_origin(kernel) is tuple
    name, compiled, launch, extra = typing.get_args(kernel)
    for text in (name, compiled):
        assert all(arg in (str, bytes) for arg in (typing.get_args(text) or (text,)))
    assert issubclass(launch, KernelLaunchParams) and issubclass(extra, SymExprs)
    combinations = inspect.signature(definition.autotune).return_annotation
    assert typing.get_origin(combinations) is list and typing.get_args(combinations) == (AutoTuneCombination,)


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_the_positional_call_gives_each_parameter_its_field(case: str) -> None:
    """What TensorRT does with a prepared node: the parser copies the attributes the creator advertises, in the
    creator's field order (the register signature's), and get_launch_params calls aot_impl(*inputs, *values,
    outputs, tactic). Each parameter must receive the attribute of its own name."""
    for node in trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
        definition = DEFINITIONS[node.op_type]
        tensors, creator_fields, _ = _split(definition.register)
        given = attributes_of(node)
        copied = [given[name] for name in creator_fields if name in given]
        bound = inspect.signature(definition.aot_impl).bind(*node.input, *copied, "outputs", 1)
        assert {name: bound.arguments[name] for name in creator_fields} == {
            name: given[name] for name in creator_fields
        }
        assert [bound.arguments[name] for name in tensors] == list(node.input)


@pytest.mark.parametrize("mode", [WeightMode.NONE, WeightMode.AFTER_CAST], ids=["NONE", "AFTER_CAST"])
def test_a_prepared_add_norm_binds_x_residual_weight_and_every_field(mode: WeightMode) -> None:
    """The positional call on a prepared TrtfuseAddRmsNorm (the pass writes none yet, so it is built by hand): its
    inputs land in x, residual, weight (a NONE node's placeholder included) and each field in its own slot."""
    weighted = mode is not WeightMode.NONE
    inputs = ["x", "residual", "w"] if weighted else ["x", "residual"]
    fp16, shape = onnx.TensorProto.FLOAT16, ["tokens", HIDDEN]
    model = fused_model(
        [fused_node(contract.ADD_RMS_NORM_OP, inputs, ["y", "h"], mode, (HIDDEN,))],
        {"x": (fp16, shape), "residual": (fp16, shape)},
        {"y": (fp16, shape), "h": (fp16, shape)},
        [onnx.numpy_helper.from_array(np.ones(HIDDEN, np.float16), "w")] if weighted else [],
    )
    (node,) = trtfuse_nodes(prepare_for_aot(model))
    definition = DEFINITIONS[contract.ADD_RMS_NORM_OP]
    tensors, creator_fields, _ = _split(definition.register)
    given = attributes_of(node)
    copied = [given[name] for name in creator_fields if name in given]
    bound = inspect.signature(definition.aot_impl).bind(*node.input, *copied, "outputs", 1)
    assert [bound.arguments[name] for name in tensors] == list(node.input)
    assert tensors == ["x", "residual", "weight"] and len(node.input) == 3
    assert {name: bound.arguments[name] for name in creator_fields} == {name: given[name] for name in creator_fields}


def test_without_prepare_an_old_node_shifts_outputs_into_a_field() -> None:
    """Why prepare_for_aot fills output_dtype: with one field fewer, `outputs` lands in output_dtype's slot."""
    (node,) = trtfuse_nodes(rms_model(output_dtype=None))
    definition = DEFINITIONS[node.op_type]
    _, creator_fields, _ = _split(definition.register)
    given = attributes_of(node)
    copied = [given[name] for name in creator_fields if name in given]
    bound = inspect.signature(definition.aot_impl).bind_partial(*node.input, *copied, "outputs", 1)
    assert bound.arguments[contract.ATTR_OUTPUT_DTYPE] == "outputs"


TYPE_NAMES = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16", "FP8": "float8_e4m3fn", "INT8": "int8"}
FP8_OUT = contract.QuantParams(output=contract.Quantizer("float8_e4m3fn", 0.015625))
INT8_OUT = contract.QuantParams(output=contract.Quantizer("int8", 0.03125))
INPUT_ONLY = contract.QuantParams(input=contract.Quantizer("float8_e4m3fn", 0.0625, True, "bfloat16"))
# The QK-norm's outputs' own quantizers: q's alone in FP8 (k_out stays in T), and q in INT8 beside k in FP8.
QK_FP8_Q = contract.QuantParams(q_output=contract.Quantizer("float8_e4m3fn", 0.015625))
QK_INT8_Q_FP8_K = contract.QuantParams(
    q_output=contract.Quantizer("int8", 0.03125), k_output=contract.Quantizer("float8_e4m3fn", 0.0625)
)


def _quant_choices(op: contract.FusedOp) -> tuple[contract.QuantParams | None, ...]:
    """The quantizers `op` is tried with: none for a plain op; an FP8 and an INT8 output and an input stage alone (y
    stays in T) for a quantized norm; each output's own, or one output's alone, for the quantized QK-norms."""
    if not op.quantized:
        return (None,)
    if op.base in (contract.QK_NORM_OP, contract.QK_NORM_ROPE_OP):
        return (QK_FP8_Q, QK_INT8_Q_FP8_K)
    return (FP8_OUT, INT8_OUT, INPUT_ONLY)


QUANT_CHOICES = [(op, quant) for op in contract.FUSED_OPS for quant in _quant_choices(contract.OPS[op])]


def quant_label(quant: contract.QuantParams | None) -> str:
    if quant is None:
        return "plain"
    return "+".join(f"{stage.value}-{quant.at(stage).dtype}" for stage in quant.stages)


ROTARY = contract.RotaryParams(16, 16, contract.Rotation.HALF_SPLIT, contract.HeadLayout.TOKEN_MAJOR)


def qdp_fields(op: str, mode: WeightMode, output_dtype: str, quant: contract.QuantParams | None) -> NodeFields:
    fused = contract.OPS[op]
    hidden = (16, 32) if len(fused.hidden_fields) == 2 else (HIDDEN,)
    params = contract.NormParams(float(np.float32(1e-6)), 0.0, mode)  # as a float32 attribute holds it
    return NodeFields(fused, params, hidden, output_dtype, quant, ROTARY if fused.rotary else None)


def field_bytes(fields: NodeFields) -> list[bytes]:
    """Each field as the ONNX parser hands it to a QDP: the bytes of one float32 or int32."""
    return [
        (np.float32(value) if name in contract.FLOAT_FIELDS else np.int32(value)).tobytes()
        for name, value in fields.numbers().items()
    ]


def _offered_tactics(op: str, dtype: str, weight: str | None, fields: NodeFields, table: str | None) -> tuple:
    """The kernels' own tactics for the spec of an autotune combination."""
    from trtfuse.kernels import artifacts
    from trtfuse.kernels.artifacts import add_rms_norm_tactics, qk_norm_tactics, rms_norm_tactics
    from trtfuse.kernels.specs import AddRmsNormSpec, QkNormSpec, RmsNormSpec
    from trtfuse.plugins.kernel_specs import kernel_spec

    params, output_dtype = fields.params, fields.output_dtype
    kind = contract.OPS[op].base or op
    if kind == contract.QK_NORM_ROPE_OP:
        return artifacts.qk_norm_rope_tactics(kernel_spec(fields, dtype, weight, table))
    if kind == contract.RMS_NORM_OP:
        return rms_norm_tactics(RmsNormSpec(HIDDEN, dtype, weight, params, output_dtype, fields.quant))
    if kind == contract.ADD_RMS_NORM_OP:
        return add_rms_norm_tactics(AddRmsNormSpec(HIDDEN, dtype, weight, params, output_dtype, fields.quant))
    return qk_norm_tactics(QkNormSpec(16, 32, dtype, weight, params, output_dtype))


@pytest.mark.parametrize("mode", list(WeightMode), ids=[mode.name for mode in WeightMode])
@pytest.mark.parametrize("output_dtype", sorted(contract.OUTPUT_DTYPE_CODES))
@pytest.mark.parametrize(("op", "quant"), QUANT_CHOICES, ids=[f"{op}-{quant_label(q)}" for op, q in QUANT_CHOICES])
def test_autotune_offers_exactly_the_contract_s_dtype_pairs(
    op: str, quant: contract.QuantParams | None, output_dtype: str, mode: WeightMode
) -> None:
    """One combination per (activation, weight) dtype pair the contract allows, LINEAR, with the kernels' tactics;
    in type strings _autotune.py's _str_to_data_type reads (FP32, FP16, or a trt.DataType name: BF16, FP8, INT8).
    Normalised outputs are in the normalised dtype (a quantized op's FP8 / INT8 with the output stage on), the others
    (the add-norm's h) in the activations' dtype."""
    fused_op = contract.OPS[op]
    if fused_op.rotary:
        _rope_kernels()
    fields = qdp_fields(op, mode, output_dtype, quant)
    inputs = [None] * len(fused_op.inputs(True))
    combinations = DEFINITIONS[op].autotune(*inputs, *field_bytes(fields), (None,) * OUTPUT_COUNTS[op])
    seen = set()
    data_type_names = {"BF16", "FP8", "INT8", "FLOAT", "HALF", "INT32"}
    for combination in combinations:
        assert combination.layouts == "LINEAR"
        parts = [part.strip() for part in combination.io_types.split(",")]
        assert all(type_name_is_read(part, data_type_names) for part in parts)
        names = [TYPE_NAMES[part] for part in parts]
        activation_count, input_count = len(fused_op.activations), len(inputs)
        table_start = input_count - len(fused_op.rotary_tables)
        activations, weights, tables, outputs = (
            names[:activation_count],
            names[activation_count:table_start],
            names[table_start:input_count],
            names[input_count:],
        )
        assert len(set(activations)) == len(set(weights)) == 1 and len(set(tables)) <= 1
        dtype, weight, table = activations[0], weights[0], next(iter(tables), None)
        assert table in (None, "float32", dtype)
        assert outputs == [
            fields.normalised_dtype(index) if norm else dtype for index, norm in enumerate(fused_op.normalised_outputs)
        ]
        assert dtype in contract.ACTIVATION_DTYPES and weight in contract.WEIGHT_DTYPES
        assert contract.dtype_pair_problem(dtype, output_dtype) is None
        spec_weight = None if mode is WeightMode.NONE else weight
        tactics = _offered_tactics(op, dtype, spec_weight, fields, table)
        assert combination.tactics == [int(tactic) for tactic in tactics] and all(t > 0 for t in combination.tactics)
        seen.add((dtype, weight, table))
    weights = (contract.AOT_PLACEHOLDER_WEIGHT_DTYPE,) if mode is WeightMode.NONE else contract.WEIGHT_DTYPES
    allowed = {d for d in contract.ACTIVATION_DTYPES if contract.dtype_pair_problem(d, output_dtype) is None}
    # A rotary op's tables: float32, or the activations' dtype.
    tables = (lambda dtype: {"float32", dtype}) if fused_op.rotary else (lambda dtype: {None})
    assert seen == {(dtype, weight, table) for dtype in allowed for weight in weights for table in tables(dtype)}
    assert len(seen) == len(combinations)


def test_the_combination_type_names_are_trt_data_type_names() -> None:
    """FP8 and INT8 as `_str_to_data_type` reads them: names of trt.DataType members (TensorRT-RTX's enum, which
    shares TensorRT's, stands in)."""
    from support.plugin_fields import trt

    members = set(trt.DataType.__members__)
    for dtype, name in aot.COMBINATION_TYPE_NAMES.items():
        assert type_name_is_read(name, members), dtype
    assert {aot.COMBINATION_TYPE_NAMES[name] for name in contract.QUANT_DTYPE_CODES} == {"FP8", "INT8"}
    assert trt.DataType.FP8 == trt.DataType.FP8 and trt.DataType.INT8 == trt.DataType.INT8


class IntShape:
    """A shape whose "expressions" are ints: evaluates aot_impl's launch arithmetic for one concrete shape."""

    def __init__(self, dims: tuple[int, ...]) -> None:
        self.dims = dims

    def numel(self) -> int:
        return int(np.prod(self.dims))


class IntLaunchParams:
    def __init__(self) -> None:
        self.grid_x = self.block_x = 1
        self.shared_mem = 0


# trtp's expression functions on ints. Only the arithmetic is checked here; trtp's own expression types are
# exercised by the TensorRT tests.
INT_EXPRESSIONS = SimpleNamespace(
    cdiv=lambda a, b: -(-a // b),
    max=max,
    KernelLaunchParams=IntLaunchParams,
    SymInt32=int,
    SymIntExprs=SimpleNamespace(from_tuple=tuple),
)


@pytest.mark.parametrize(
    ("op", "shapes"),
    [
        (contract.RMS_NORM_OP, [(4, 29, HIDDEN)]),
        (contract.RMS_NORM_OP, [(1, 1, HIDDEN)]),
        (contract.QK_NORM_OP, [(3, 5, 4, 16), (3, 5, 2, 32)]),
        (contract.QK_NORM_OP, [(0, 4, 16), (0, 2, 32)]),
        (contract.ADD_RMS_NORM_OP, [(4, 29, HIDDEN)]),
        (contract.ADD_RMS_NORM_OP, [(0, HIDDEN)]),
    ],
)
def test_aot_impl_s_launch_is_the_declaration_s_for_the_activations_rows(op: str, shapes: list) -> None:
    """The artifact's entry and PTX, block and shared memory, and the grid and scalars of the declaration's formula
    for rows = element count // hidden of each part's activation, in order (q, then k; the add-norm's x)."""
    from trtfuse.kernels.artifacts import add_rms_norm_artifact, qk_norm_artifact, rms_norm_artifact
    from trtfuse.kernels.declaration import Tactic
    from trtfuse.kernels.specs import AddRmsNormSpec, QkNormSpec, RmsNormSpec

    params = contract.NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
    if op == contract.RMS_NORM_OP:
        artifact = rms_norm_artifact(RmsNormSpec(HIDDEN, "float16", "float16", params), Tactic.PREFILL, "sm_90a")
    elif op == contract.ADD_RMS_NORM_OP:
        spec = AddRmsNormSpec(HIDDEN, "float16", "float16", params)
        artifact = add_rms_norm_artifact(spec, Tactic.PREFILL, "sm_90a")
    else:
        artifact = qk_norm_artifact(QkNormSpec(16, 32, "float16", "float16", params), Tactic.PREFILL, "sm_90a")
    activations = [SimpleNamespace(shape_expr=IntShape(shape)) for shape in shapes]
    name, ptx, launch, extra = aot._kernel(INT_EXPRESSIONS, artifact, activations)
    declaration = artifact.declaration
    rows = [int(np.prod(shape[:-1])) for shape in shapes]
    assert (name, ptx) == (declaration.kernel_name, artifact.ptx) and f".entry {name}(" in ptx
    assert (launch.grid_x, launch.block_x, launch.shared_mem) == (
        declaration.grid_x(rows),
        declaration.block_threads,
        declaration.shared_mem,
    )
    assert extra == declaration.scalars(rows)


class Desc:
    """A TensorDesc stand-in with what register and aot_impl read: a dtype (the stand-in names below), a shape
    expression, and `like()`, which copies both, as TensorDesc.like does."""

    def __init__(self, dtype: str, dims: tuple[int, ...] = (4, 29, HIDDEN)) -> None:
        self.dtype, self.shape_expr = dtype, IntShape(dims)

    def like(self) -> Desc:
        return Desc(self.dtype, self.shape_expr.dims)


@pytest.fixture
def dtype_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT's DataTypes as their contract names, so register and aot_impl run without TensorRT."""
    names = (*contract.ACTIVATION_DTYPES, *contract.QUANT_DTYPE_CODES)
    monkeypatch.setattr(aot, "_data_types", lambda: {name: name for name in names})


def _add_norm_fields(mode: WeightMode, output_dtype: str) -> list[bytes]:
    code = contract.OUTPUT_DTYPE_CODES[output_dtype]
    numbers = (np.float32(1e-6), np.float32(1.0), np.int32(mode), np.int32(HIDDEN), np.int32(code))
    return [number.tobytes() for number in numbers]


@pytest.mark.parametrize(
    ("dtype", "output_dtype"), [("float32", "bfloat16"), ("float16", "float16"), ("bfloat16", "float32")]
)
def test_the_add_norm_registers_y_in_output_dtype_and_h_in_x_s_dtype(
    dtype: str, output_dtype: str, dtype_names: None
) -> None:
    x = Desc(dtype)
    y, h = DEFINITIONS[contract.ADD_RMS_NORM_OP].register(
        x, Desc(dtype), Desc("float32"), *_add_norm_fields(WeightMode.AFTER_CAST, output_dtype)
    )
    assert (y.dtype, h.dtype) == (output_dtype, dtype)
    assert y.shape_expr.dims == h.shape_expr.dims == x.shape_expr.dims


@pytest.mark.parametrize("mode", [WeightMode.NONE, WeightMode.BEFORE_CAST], ids=["NONE", "BEFORE_CAST"])
def test_the_add_norm_aot_impl_compiles_its_spec_and_launches_over_x_s_rows(
    mode: WeightMode, dtype_names: None
) -> None:
    """aot_impl end to end on the CPU (sm_90a without a GPU): the spec from the chosen types and the node's fields
    (no weight dtype for NONE, whose placeholder the kernel never reads), the declaration's grid for x's rows."""
    from trtfuse.kernels.artifacts import add_rms_norm_artifact, add_rms_norm_tactics
    from trtfuse.kernels.device import ptx_isa
    from trtfuse.kernels.specs import AddRmsNormSpec

    x, residual, weight = Desc("bfloat16", (3, 7, HIDDEN)), Desc("bfloat16", (3, 7, HIDDEN)), Desc("float32", (HIDDEN,))
    outputs = (Desc("float32", (3, 7, HIDDEN)), Desc("bfloat16", (3, 7, HIDDEN)))
    raw = _add_norm_fields(mode, "float32")
    params = from_qdp(contract.ADD_RMS_NORM, raw).params
    spec = AddRmsNormSpec(HIDDEN, "bfloat16", None if mode is WeightMode.NONE else "float32", params, "float32")
    tactic = add_rms_norm_tactics(spec)[-1]
    # aot_impl's launch arithmetic on ints: the definitions built with INT_EXPRESSIONS in trtp's expression roles.
    trtp = SimpleNamespace(**{**vars(STAND_INS), **vars(INT_EXPRESSIONS)})
    (definition,) = [d for d in aot.qdp_definitions(trtp) if d.op == contract.ADD_RMS_NORM_OP]
    aot.take_embedded_ptx_isas()
    name, ptx, launch, extra = definition.aot_impl(x, residual, weight, *raw, outputs, int(tactic))
    assert aot.take_embedded_ptx_isas() == [ptx_isa(ptx)]
    artifact = add_rms_norm_artifact(spec, tactic, "sm_90a")
    declaration = artifact.declaration
    assert (name, ptx) == (declaration.kernel_name, artifact.ptx)
    assert [param.name for param in declaration.params] == ["x", "residual", "weight", "rows", "y", "h"]
    assert (launch.grid_x, launch.block_x, launch.shared_mem) == (
        declaration.grid_x([21]),
        declaration.block_threads,
        declaration.shared_mem,
    )
    assert extra == declaration.scalars([21]) == (21,)


QUANTIZED_CHOICES = [(op, quant) for op, quant in QUANT_CHOICES if quant is not None]


@pytest.mark.parametrize(
    ("op", "quant"), QUANTIZED_CHOICES, ids=[f"{op}-{quant_label(q)}" for op, q in QUANTIZED_CHOICES]
)
def test_register_called_as_tensorrt_calls_it_gives_y_in_the_normalised_dtype(
    op: str, quant: contract.QuantParams, dtype_names: None
) -> None:
    """tensorrt.plugin calls register as `register_function(*input_descs, **self.attrs)` (P/_plugin_class.py:69,131):
    the fields by keyword. y takes the output quantizer's dtype (T with the input stage alone), h x's; each QK-norm
    output its own quantizer's, or T without one."""
    fields = qdp_fields(op, WeightMode.AFTER_CAST, "bfloat16", quant)
    attrs = dict(zip(contract.OPS[op].fields, field_bytes(fields), strict=True))
    x = Desc("bfloat16")
    inputs = [x, *(Desc("bfloat16") for _ in contract.OPS[op].inputs(True)[1:])]
    returned = DEFINITIONS[op].register(*inputs, **attrs)
    outputs = returned if isinstance(returned, tuple) else (returned,)
    assert [desc.dtype for desc in outputs] == list(fields.output_dtypes("bfloat16"))
    assert all(desc.shape_expr.dims == x.shape_expr.dims for desc in outputs)


class ShapeTuple(tuple):
    """A shape expression of ints that iterates as ShapeExprs does, with the stand-in's `dims`."""

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self)


@pytest.mark.parametrize(
    ("q", "k", "hidden", "q_out", "k_out"),
    [
        ((2, 5, 4, 16), (2, 5, 2, 16), (16, 16), (2, 4, 5, 16), (2, 2, 5, 16)),
        ((2, 5, 64), (2, 5, 32), (64, 32), (2, 4, 5, 16), (2, 2, 5, 16)),
    ],
    ids=["head-rows", "full-width"],
)
def test_a_rotary_node_that_moves_heads_registers_b_h_s_d_outputs(
    q: tuple, k: tuple, hidden: tuple, q_out: tuple, k_out: tuple, dtype_names: None
) -> None:
    """register of a token-major rotary node with output_layout HEAD_MAJOR: each output [B, H, S, D] of its
    activation (H a constant for a full-width norm's [B, S, H·D]), in the normalised dtype (FP8 for q's Q)."""
    quant = contract.QuantParams(q_output=contract.Quantizer("float8_e4m3fn", 0.5))
    rotary = dataclasses.replace(ROTARY, output_layout=contract.HeadLayout.HEAD_MAJOR)
    params = contract.NormParams(float(np.float32(1e-6)), 0.0, WeightMode.AFTER_CAST)
    fields = NodeFields(contract.QK_NORM_ROPE_QUANT, params, hidden, "bfloat16", quant, rotary)
    trtp = SimpleNamespace(**vars(STAND_INS), ShapeExprs=SimpleNamespace(from_tuple=ShapeTuple))
    (definition,) = [d for d in aot.qdp_definitions(trtp) if d.op == contract.QK_NORM_ROPE_QUANT_OP]

    def desc(dtype: str, dims: tuple) -> Desc:
        described = Desc(dtype, dims)
        described.shape_expr = ShapeTuple(dims)
        return described

    weights = [desc("bfloat16", (size,)) for size in hidden]
    tables = [desc("float32", (1, 5, 16)) for _ in range(2)]
    inputs = [desc("bfloat16", q), desc("bfloat16", k), *weights, *tables]
    written_q, written_k = definition.register(*inputs, *field_bytes(fields))
    assert (written_q.shape_expr.dims, written_k.shape_expr.dims) == (q_out, k_out)
    assert (written_q.dtype, written_k.dtype) == ("float8_e4m3fn", "bfloat16")


@pytest.mark.parametrize("op", [contract.RMS_NORM_QUANT_OP, contract.ADD_RMS_NORM_QUANT_OP])
def test_a_quantized_aot_impl_builds_its_spec_with_the_quantizers(
    op: str, dtype_names: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """aot_impl of a quantized op asks for the artifact of its plain op's spec with `quant` the node's quantizers and
    out_dtype T (the dtype the norm is rounded to before the quantizer), for the activation dtype TensorRT chose;
    an output dtype other than the normalised one is refused in one line."""
    from trtfuse.kernels import artifacts
    from trtfuse.kernels.specs import AddRmsNormSpec, RmsNormSpec

    asked = []
    name = "rms_norm_artifact" if op == contract.RMS_NORM_QUANT_OP else "add_rms_norm_artifact"
    monkeypatch.setattr(artifacts, name, lambda spec, tactic, arch: asked.append((spec, tactic, arch)) or "artifact")
    monkeypatch.setattr(aot, "_build_arch", lambda: "sm_90a")
    monkeypatch.setattr(aot, "_kernel", lambda trtp, artifact, activations, extents=(): (artifact, activations))
    fields = qdp_fields(op, WeightMode.AFTER_CAST, "float16", FP8_OUT)
    fused_op = contract.OPS[op]
    inputs = [Desc("float16") for _ in fused_op.activations] + [Desc("float32", (HIDDEN,))]
    outputs = tuple(Desc("float8_e4m3fn" if norm else "float16") for norm in fused_op.normalised_outputs)
    artifact, activations = DEFINITIONS[op].aot_impl(*inputs, *field_bytes(fields), outputs, 1)
    spec_class = RmsNormSpec if op == contract.RMS_NORM_QUANT_OP else AddRmsNormSpec
    expected = spec_class(HIDDEN, "float16", "float32", fields.params, "float16", FP8_OUT)
    assert (artifact, activations) == ("artifact", [inputs[0]])
    assert [(spec, int(tactic), arch) for spec, tactic, arch in asked] == [(expected, 1, "sm_90a")]
    wrong = (Desc("float16"), *outputs[1:])
    with pytest.raises(TrtfuseError, match=f"{op}: TensorRT chose float16 for 'y', which is float8_e4m3fn"):
        DEFINITIONS[op].aot_impl(*inputs, *field_bytes(fields), wrong, 1)


# --- real TensorRT: register, build, and run where trtfuse is not ---------------------------------------------------

REGISTER_SCRIPT = """
import tensorrt as trt
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.registry import register_aot, register_python
register_aot()
register_aot()
names = {c.name for c in trt.get_plugin_registry().all_creators if getattr(c, "plugin_namespace", None) == "trtfuse"}
from trtfuse.contract import FUSED_OPS
assert set(FUSED_OPS) <= names, names
try:
    register_python()
except TrtfuseError as error:
    assert "\\n" not in str(error), error
else:
    raise SystemExit("the Python plugins registered beside the AOT ones")
"""

PYTHON_FIRST_SCRIPT = """
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.registry import register_aot, register_python
register_python()
try:
    register_aot()
except TrtfuseError as error:
    assert "\\n" not in str(error), error
else:
    raise SystemExit("the AOT plugins registered beside the Python ones")
"""

# Strongly typed, the ONNX dtypes kept as written: a flag below TensorRT 11 (from 11 every network is).
TYPED_FLAGS = """
def typed_flags(trt):
    major = int(trt.__version__.split(".", 1)[0])
    return 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED) if major < 11 else 0
"""

BUILD_SCRIPT = (
    TYPED_FLAGS
    + """
import json, sys
from pathlib import Path
import onnx, tensorrt as trt
from trtfuse.plugins.registry import register_aot
from trtfuse.fusion.aot_form import prepare_for_aot

fused, engine, shapes = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
register_aot()
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = builder.create_network(typed_flags(trt))
parser = trt.OnnxParser(network, logger)
if not parser.parse(prepare_for_aot(onnx.load(fused)).SerializeToString()):
    raise SystemExit("; ".join(parser.get_error(i).desc() for i in range(parser.num_errors)))
config = builder.create_builder_config()
config.clear_flag(trt.BuilderFlag.TF32)
if shapes:
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        profile.set_shape(name, low, opt, high)
    config.add_optimization_profile(profile)
serialized = builder.build_serialized_network(network, config)
if serialized is None:
    raise SystemExit("the build failed")
Path(engine).write_bytes(bytes(serialized))
"""
)

NETWORK_SCRIPT = (
    TYPED_FLAGS
    + """
import sys
from pathlib import Path
import numpy as np, tensorrt as trt, tensorrt.plugin as trtp
from trtfuse.plugins.registry import register_aot

register_aot()
hidden = int(sys.argv[2])
logger = trt.Logger(trt.Logger.WARNING)
builder = trt.Builder(logger)
network = builder.create_network(typed_flags(trt))
x = network.add_input("x", trt.float32, (-1, hidden))
weight = np.linspace(0.5, 1.5, hidden, dtype=np.float32)
w = network.add_constant((hidden,), trt.Weights(weight)).get_output(0)
norm = network.add_plugin(
    trtp.op.trtfuse.TrtfuseRmsNorm(
        x,
        w,
        epsilon=np.float32(1e-6).tobytes(),
        weight_offset=np.float32(0.0).tobytes(),
        weight_mode=np.int32(1).tobytes(),
        hidden_size=np.int32(hidden).tobytes(),
        output_dtype=np.int32(1).tobytes(),
    ),
    aot=True,
)
y = norm.get_output(0)
y.name = "y"
network.mark_output(y)
config = builder.create_builder_config()
profile = builder.create_optimization_profile()
profile.set_shape("x", (1, hidden), (8, hidden), (64, hidden))
config.add_optimization_profile(profile)
serialized = builder.build_serialized_network(network, config)
if serialized is None:
    raise SystemExit("the build failed")
Path(sys.argv[1]).write_bytes(bytes(serialized))
"""
)

# Runs an engine with nothing of trtfuse imported or registered: TensorRT and the CUDA runtime only.
RUN_SCRIPT = """
import sys
import numpy as np, tensorrt as trt
from cuda.bindings import runtime as cudart

def check(result):
    error = result[0] if isinstance(result, tuple) else result
    if error != cudart.cudaError_t.cudaSuccess:
        raise SystemExit(f"CUDA error {error}")
    return result[1] if isinstance(result, tuple) and len(result) > 1 else None

TO_DEVICE = cudart.cudaMemcpyKind.cudaMemcpyHostToDevice
TO_HOST = cudart.cudaMemcpyKind.cudaMemcpyDeviceToHost
engine_path, feeds_path, out_path = sys.argv[1:4]
logger = trt.Logger(trt.Logger.WARNING)
engine = trt.Runtime(logger).deserialize_cuda_engine(open(engine_path, "rb").read())
if engine is None:
    raise SystemExit("the engine does not deserialise")
context = engine.create_execution_context()
stream = int(check(cudart.cudaStreamCreate()))
names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
feeds = np.load(feeds_path)
results = {}
for run in sorted({key.split("__", 1)[0] for key in feeds.files}):
    arrays = {
        name: np.ascontiguousarray(feeds[f"{run}__{name}"], dtype=trt.nptype(engine.get_tensor_dtype(name)))
        for name in inputs
    }
    for name, array in arrays.items():
        context.set_input_shape(name, array.shape)
    buffers = []
    for name in names:
        if name in arrays:
            host = arrays[name]
        else:
            host = np.empty(tuple(context.get_tensor_shape(name)), dtype=trt.nptype(engine.get_tensor_dtype(name)))
        device = check(cudart.cudaMalloc(max(host.nbytes, 1)))
        if name in arrays:
            check(cudart.cudaMemcpy(device, host.ctypes.data, host.nbytes, TO_DEVICE))
        context.set_tensor_address(name, device)
        buffers.append((name, host, device))
    if not context.execute_async_v3(stream):
        raise SystemExit("execute_async_v3 failed")
    check(cudart.cudaStreamSynchronize(stream))
    for name, host, device in buffers:
        if name not in arrays:
            check(cudart.cudaMemcpy(host.ctypes.data, device, host.nbytes, TO_HOST))
            results[f"{run}__{name}"] = host
        check(cudart.cudaFree(device))
assert not any(m.split(".")[0] == "trtfuse" for m in sys.modules), "trtfuse was imported"
assert not any(getattr(c, "plugin_namespace", None) == "trtfuse" for c in trt.get_plugin_registry().all_creators)
np.savez(out_path, **results)
"""


@pytest.mark.parametrize(
    "name", ["REGISTER_SCRIPT", "PYTHON_FIRST_SCRIPT", "BUILD_SCRIPT", "NETWORK_SCRIPT", "RUN_SCRIPT"]
)
def test_the_tensorrt_scripts_are_python(name: str) -> None:
    """They run only where TensorRT exists; here at least they must compile."""
    compile(globals()[name], name, "exec")


def _python(script: str, *args: str) -> None:
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def _run_fresh(
    engine: Path, runs: dict[str, dict[str, np.ndarray]], tmp_path: Path
) -> dict[str, dict[str, np.ndarray]]:
    feeds = {f"{run}__{name}": array for run, arrays in runs.items() for name, array in arrays.items()}
    np.savez(tmp_path / "feeds.npz", **feeds)
    _python(RUN_SCRIPT, str(engine), str(tmp_path / "feeds.npz"), str(tmp_path / "outputs.npz"))
    outputs = np.load(tmp_path / "outputs.npz")
    found: dict[str, dict[str, np.ndarray]] = {}
    for key in outputs.files:
        run, name = key.split("__", 1)
        found.setdefault(run, {})[name] = outputs[key]
    return found


def _reference(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _dynamic_norm(spec: NormSpec) -> onnx.ModelProto:
    b = Builder()
    b.output(rms_norm(b, b.input("x", ["batch", "sequence", HIDDEN], spec.dtype), spec))
    return b.model()


ENGINE_CASES = {
    "rms-fp16-llama-dynamic": (
        lambda: _dynamic_norm(NormSpec(dtype="float16")),
        {"x": ((1, 1, HIDDEN), (2, 3, HIDDEN), (4, 32, HIDDEN))},
        [{"x": (1, 1, HIDDEN)}, {"x": (4, 29, HIDDEN)}, {"x": (2, 3, HIDDEN)}],
    ),
    "rms-fp32-no-weight": (lambda: single_norm(NormSpec(weight="none")), {}, [{"x": (2, 3, HIDDEN)}]),
    "qk-fp32-qwen3": (
        lambda: attention_block(AttentionSpec("qk-head-dim")),
        {},
        [{"x": (2, 3, HIDDEN)}],
    ),
}


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_register_aot_registers_both_qdps_once_and_refuses_the_python_plugins() -> None:
    _python(REGISTER_SCRIPT)


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_register_aot_is_refused_after_the_python_plugins() -> None:
    _python(PYTHON_FIRST_SCRIPT)


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
@pytest.mark.parametrize("case", ENGINE_CASES, ids=list(ENGINE_CASES))
def test_a_fused_model_builds_with_aot_plugins_and_runs_without_trtfuse(case: str, tmp_path: Path) -> None:
    from trtfuse.verify.tolerances import tolerance_for

    make, profile, shapes = ENGINE_CASES[case]
    original = make()
    fused = tmp_path / "fused.onnx"
    onnx.save(fuse_model(original).model, str(fused))
    engine = tmp_path / "model.engine"
    _python(BUILD_SCRIPT, str(fused), str(engine), json.dumps(profile))
    rng = np.random.default_rng(0)
    input_dtypes = {
        graph_input.name: onnx.helper.tensor_dtype_to_np_dtype(graph_input.type.tensor_type.elem_type)
        for graph_input in original.graph.input
    }
    runs = {
        f"run{index}": {name: rng.standard_normal(shape).astype(input_dtypes[name]) for name, shape in run.items()}
        for index, run in enumerate(shapes)
    }
    results = _run_fresh(engine, runs, tmp_path)
    dtype = "float16" if "fp16" in case else "float32"
    for run, feed in runs.items():
        expected = _reference(original, feed)
        assert results[run].keys() == expected.keys()
        for name, value in expected.items():
            error = np.abs(results[run][name].astype(np.float64) - value)
            relative = error / np.maximum(np.abs(value), 1e-3)
            assert tolerance_for(dtype).accepts(float(error.max()), float(relative.max())), (run, name, error.max())


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_an_add_plugin_network_builds_and_runs_without_trtfuse(tmp_path: Path) -> None:
    engine = tmp_path / "network.engine"
    _python(NETWORK_SCRIPT, str(engine), str(HIDDEN))
    rng = np.random.default_rng(1)
    runs = {f"rows{rows}": {"x": rng.standard_normal((rows, HIDDEN)).astype(np.float32)} for rows in (1, 64, 5)}
    results = _run_fresh(engine, runs, tmp_path)
    weight = np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32).astype(np.float64)
    for run, feed in runs.items():
        x = feed["x"].astype(np.float64)
        expected = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(1e-6)) * weight
        np.testing.assert_allclose(results[run]["y"], expected, rtol=1e-5, atol=1e-6)
