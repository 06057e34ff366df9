"""The AOT plugins: prepare_for_aot's nodes, the QDP definitions' signatures by tensorrt.plugin's rules, the one kind of
plugin per process, and (where TensorRT exists) engines that build with them and run in a process without trtfuse.

The signature tests read the functions `qdp_definitions` builds with stand-in types (plain classes in tensorrt.plugin's
roles, nothing executed) and check them against the rules of tensorrt.plugin's _validate.py and _plugin_class.py
(v10.9.0 and v11.1, unchanged between the two): what TensorRT would refuse at `@trtp.register` / `@trtp.autotune` /
`@trtp.aot_impl`, and the positional call that would hand a field to the wrong parameter. Everything that needs
TensorRT runs in subprocesses, so no registration leaks into the other tests of this process.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import subprocess
import sys
import typing
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
from graphs import AttentionSpec, Builder, NormSpec, attention_block, rms_norm, single_norm
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import PluginKind, WeightMode
from trtfuse.errors import TrtfuseError
from trtfuse.fuse import fuse_model
from trtfuse.plugins import aot
from trtfuse.plugins.aot_nodes import PLACEHOLDER_PREFIX, prepare_for_aot


def _why_no_aot_tensorrt() -> str | None:
    if importlib.util.find_spec("tensorrt") is None:
        return "needs the real `tensorrt` module (>= 10.14) and an NVIDIA GPU (not installable here)"
    import tensorrt

    refusal = aot.aot_refusal(tensorrt)
    return None if refusal is None else f"needs a TensorRT trtfuse builds AOT plugins with: {refusal}"


WHY_NO_AOT_TENSORRT = _why_no_aot_tensorrt()
needs_tensorrt = pytest.mark.skipif(WHY_NO_AOT_TENSORRT is not None, reason=str(WHY_NO_AOT_TENSORRT))
HIDDEN = 64
ROOT = Path(__file__).resolve().parent.parent


# --- prepare_for_aot -----------------------------------------------------------------------------------------------


def _fused_node(
    op: str,
    inputs: list[str],
    outputs: list[str],
    mode: WeightMode,
    hidden: tuple[int, ...],
    output_dtype: int | None = 10,
    name: str = "norm",
    **extra: object,
) -> onnx.NodeProto:
    hidden_names = (
        (contract.ATTR_HIDDEN,) if op == contract.RMS_NORM_OP else (contract.ATTR_Q_HIDDEN, contract.ATTR_K_HIDDEN)
    )
    attributes: dict[str, object] = {
        contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
        contract.ATTR_VERSION: contract.PLUGIN_VERSION,
        contract.ATTR_EPSILON: 1e-6,
        contract.ATTR_WEIGHT_OFFSET: 0.0,
        contract.ATTR_WEIGHT_MODE: int(mode),
        **dict(zip(hidden_names, hidden, strict=True)),
    }
    if output_dtype is not None:
        attributes[contract.ATTR_OUTPUT_DTYPE] = output_dtype
    attributes.update(extra)
    return helper.make_node(op, inputs, outputs, name=name, domain=contract.ONNX_DOMAIN, **attributes)


def _model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, list]],
    outputs: dict[str, tuple[int, list]],
    initializers: list[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "fused",
        [helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in inputs.items()],
        [helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in outputs.items()],
        list(initializers),
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _rms_model(
    mode: WeightMode = WeightMode.AFTER_CAST, output_dtype: int | None = 10, **extra: object
) -> onnx.ModelProto:
    weighted = mode is not WeightMode.NONE
    weights = [numpy_helper.from_array(np.ones(HIDDEN, np.float16), "w")] if weighted else []
    node = _fused_node(
        contract.RMS_NORM_OP, ["x", "w"] if weighted else ["x"], ["y"], mode, (HIDDEN,), output_dtype, **extra
    )
    shape = ["tokens", HIDDEN]
    return _model([node], {"x": (TensorProto.FLOAT16, shape)}, {"y": (TensorProto.FLOAT16, shape)}, weights)


def _attributes(node: onnx.NodeProto) -> dict[str, object]:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def _trtfuse_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN]


def _expected_names(op: str) -> list[str]:
    return [contract.ATTR_NAMESPACE, contract.ATTR_VERSION, *contract.AOT_FIELDS[op], contract.ATTR_AOT]


FUSED_MODELS = {
    "rms-fp16-llama": lambda: single_norm(NormSpec(dtype="float16")),
    "rms-bf16-gemma": lambda: single_norm(NormSpec(dtype="bfloat16", weight="before-cast", offset="add-one-last")),
    "rms-fp32-no-weight": lambda: single_norm(NormSpec(weight="none")),
    "qk-fp16-qwen3": lambda: attention_block(AttentionSpec("qk-head-dim", dtype="float16")),
    "qk-bf16-mla": lambda: attention_block(AttentionSpec("mla-latent", dtype="bfloat16")),
}


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_what_fuse_writes_gets_every_field_in_registration_order_and_aot(case: str) -> None:
    fused = fuse_model(FUSED_MODELS[case]()).model
    prepared = prepare_for_aot(fused)
    onnx.checker.check_model(prepared)
    before, after = _trtfuse_nodes(fused), _trtfuse_nodes(prepared)
    assert before and len(before) == len(after)
    for original, node in zip(before, after, strict=True):
        assert [attribute.name for attribute in node.attribute] == _expected_names(node.op_type)
        aot_attribute = node.attribute[-1]
        assert (aot_attribute.type, aot_attribute.i) == (onnx.AttributeProto.INT, 1)
        assert {name: value for name, value in _attributes(node).items() if name != contract.ATTR_AOT} == _attributes(
            original
        )
        weighted = _attributes(node)[contract.ATTR_WEIGHT_MODE] != WeightMode.NONE
        assert (list(node.input) == list(original.input)) == weighted


def test_the_input_model_is_not_touched() -> None:
    fused = fuse_model(single_norm(NormSpec(weight="none"))).model
    saved = fused.SerializeToString()
    prepare_for_aot(fused)
    assert fused.SerializeToString() == saved


def test_no_weight_nodes_get_one_float32_placeholder_of_h_zeros_per_width() -> None:
    nodes = [
        _fused_node(contract.RMS_NORM_OP, ["x"], ["y"], WeightMode.NONE, (HIDDEN,), name="a"),
        _fused_node(contract.RMS_NORM_OP, ["y"], ["z"], WeightMode.NONE, (HIDDEN,), name="b"),
        _fused_node(contract.QK_NORM_OP, ["q", "k"], ["q_out", "k_out"], WeightMode.NONE, (16, 32), name="qk"),
    ]
    fp16 = TensorProto.FLOAT16
    model = _model(
        nodes,
        {"x": (fp16, [3, HIDDEN]), "q": (fp16, [3, 4, 16]), "k": (fp16, [3, 2, 32])},
        {"z": (fp16, [3, HIDDEN]), "q_out": (fp16, [3, 4, 16]), "k_out": (fp16, [3, 2, 32])},
    )
    prepared = prepare_for_aot(model)
    onnx.checker.check_model(prepared)
    a, b, qk = _trtfuse_nodes(prepared)
    width = f"{PLACEHOLDER_PREFIX}_{HIDDEN}"
    assert list(a.input) == ["x", width] and list(b.input) == ["y", width]
    assert list(qk.input) == ["q", "k", f"{PLACEHOLDER_PREFIX}_16", f"{PLACEHOLDER_PREFIX}_32"]
    placeholders = {tensor.name: numpy_helper.to_array(tensor) for tensor in prepared.graph.initializer}
    assert sorted(placeholders) == sorted({width, f"{PLACEHOLDER_PREFIX}_16", f"{PLACEHOLDER_PREFIX}_32"})
    for name, array in placeholders.items():
        assert array.dtype == np.dtype(contract.AOT_PLACEHOLDER_WEIGHT_DTYPE)
        assert array.shape == (int(name.rsplit("_", 1)[1]),) and not array.any()


def test_a_placeholder_takes_a_free_name() -> None:
    taken = f"{PLACEHOLDER_PREFIX}_{HIDDEN}"
    model = _rms_model(WeightMode.NONE)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), taken))
    (node,) = _trtfuse_nodes(prepare_for_aot(model))
    assert node.input[1] == f"{taken}_1"


@pytest.mark.parametrize(
    ("elem_type", "code"), [(TensorProto.FLOAT16, 10), (TensorProto.BFLOAT16, 16), (TensorProto.FLOAT, 1)]
)
def test_a_node_written_before_output_dtype_gets_its_activation_dtype(elem_type: int, code: int) -> None:
    model = _rms_model(output_dtype=None)
    model.graph.input[0].type.tensor_type.elem_type = elem_type
    (node,) = _trtfuse_nodes(prepare_for_aot(model))
    assert [attribute.name for attribute in node.attribute] == _expected_names(contract.RMS_NORM_OP)
    assert _attributes(node)[contract.ATTR_OUTPUT_DTYPE] == code


def test_an_undeclared_activation_dtype_comes_from_shape_inference() -> None:
    model = _rms_model(output_dtype=None)
    model.graph.node.insert(0, helper.make_node("Cast", ["raw"], ["x"], name="to_bf16", to=TensorProto.BFLOAT16))
    model.graph.input[0].name = "raw"
    model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
    (node,) = _trtfuse_nodes(prepare_for_aot(model))
    assert _attributes(node)[contract.ATTR_OUTPUT_DTYPE] == 16


def _qk_model(q_type: int, k_type: int) -> onnx.ModelProto:
    node = _fused_node(contract.QK_NORM_OP, ["q", "k"], ["q_out", "k_out"], WeightMode.NONE, (16, 16), None)
    return _model(
        [node],
        {"q": (q_type, [2, 4, 16]), "k": (k_type, [2, 2, 16])},
        {"q_out": (q_type, [2, 4, 16]), "k_out": (k_type, [2, 2, 16])},
    )


def _with_input_dtype(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto:
    model.graph.input[0].type.tensor_type.elem_type = elem_type
    return model


def _without_input_dtype(model: onnx.ModelProto) -> onnx.ModelProto:
    model.graph.input[0].name = "elsewhere"
    return model


BAD_NODES = {
    "epsilon missing": (_rms_model, {"drop": contract.ATTR_EPSILON}, "lacks attribute epsilon"),
    "weight_mode 7": (_rms_model, {contract.ATTR_WEIGHT_MODE: 7}, "weight_mode 7 is none of"),
    "output_dtype 7": (_rms_model, {contract.ATTR_OUTPUT_DTYPE: 7}, "output_dtype 7 is none of"),
    "no weight but a weight input": (
        _rms_model,
        {contract.ATTR_WEIGHT_MODE: 0},
        "with weight_mode NONE takes 1 input(s), not 2",
    ),
    "a weight mode but no weight": (
        lambda: _rms_model(WeightMode.NONE),
        {contract.ATTR_WEIGHT_MODE: 1},
        "with weight_mode AFTER_CAST takes 2 input(s), not 1",
    ),
    "another namespace": (_rms_model, {contract.ATTR_NAMESPACE: "other"}, "plugin_namespace is 'other'"),
    "fp16 to bf16": (
        _rms_model,
        {contract.ATTR_OUTPUT_DTYPE: 16},
        "input dtype float16 and output dtype bfloat16 are two different 16-bit dtypes",
    ),
    "int8 activation": (
        lambda: _with_input_dtype(_rms_model(output_dtype=None), TensorProto.INT8),
        {},
        "input 'x' is int8, not one of",
    ),
    "unknown activation dtype": (
        lambda: _without_input_dtype(_rms_model(output_dtype=None)),
        {},
        "has no output_dtype attribute and the dtype of its input 'x' is unknown",
    ),
    "q and k of two dtypes": (
        lambda: _qk_model(TensorProto.FLOAT16, TensorProto.FLOAT),
        {},
        "its activations must share one dtype, got 'q' float16, 'k' float32",
    ),
}


@pytest.mark.parametrize("case", BAD_NODES, ids=list(BAD_NODES))
def test_a_bad_node_is_one_line_naming_it(case: str) -> None:
    make, changes, message = BAD_NODES[case]
    changes = dict(changes)
    model = make()
    (node,) = _trtfuse_nodes(model)
    values = _attributes(node)
    values.pop(changes.pop("drop", None), None)
    values.update(changes)
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(name, value) for name, value in values.items())
    with pytest.raises(TrtfuseError) as raised:
        prepare_for_aot(model, source="model.onnx")
    text = str(raised.value)
    assert "\n" not in text and text.startswith("model.onnx: node 'norm'") and message in text, text


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
# tensorrt.plugin's _validate.py: names an attribute may not take.
DISALLOWED_ATTR_NAMES = {"outputs", "stream", "tactic"}
OUTPUT_COUNTS = {contract.RMS_NORM_OP: 1, contract.QK_NORM_OP: 2}


def _kernel_inputs(op: str) -> list[str]:
    from trtfuse.kernels.declaration import ParamRole, qk_norm_params, rms_norm_params

    params = rms_norm_params() if op == contract.RMS_NORM_OP else qk_norm_params()
    return [param.name for param in params if param.role is ParamRole.INPUT]


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
def test_the_fields_are_the_contract_s_in_its_order_and_the_inputs_the_kernel_s(op: str) -> None:
    tensors, attributes, _ = _split(DEFINITIONS[op].register)
    assert tuple(attributes) == contract.AOT_FIELDS[op]
    assert tensors == _kernel_inputs(op)


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_each_attribute_annotation_is_what_the_parser_s_field_becomes(case: str) -> None:
    """The parser sends a FLOAT attribute as a FLOAT32 field and an INT as an INT32 one, whatever the creator
    advertises; the plugin reads each field's bytes as the dtype its name says, so each prepared node's attribute
    must be of that type."""
    read_as = {name: onnx.AttributeProto.FLOAT for name in (contract.ATTR_EPSILON, contract.ATTR_WEIGHT_OFFSET)}
    for node in _trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
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
    for node in _trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
        definition = DEFINITIONS[node.op_type]
        tensors, fields, annotations = _split(definition.register)
        given = _attributes(node)
        dtypes = {onnx.AttributeProto.FLOAT: np.float32, onnx.AttributeProto.INT: np.int32}
        types_of = {attribute.name: attribute.type for attribute in node.attribute}
        values = [creator_value(annotations[n], np.array([given[n]], dtype=dtypes[types_of[n]])) for n in fields]
        descs = [TensorDesc() for _ in tensors]
        combinations = definition.autotune(*descs, *values, (None,) * OUTPUT_COUNTS[node.op_type])
        assert combinations, node.name
        params = aot._params(*values[:3])
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
    for node in _trtfuse_nodes(prepare_for_aot(fuse_model(FUSED_MODELS[case]()).model)):
        definition = DEFINITIONS[node.op_type]
        tensors, creator_fields, _ = _split(definition.register)
        given = _attributes(node)
        copied = [given[name] for name in creator_fields if name in given]
        bound = inspect.signature(definition.aot_impl).bind(*node.input, *copied, "outputs", 1)
        assert {name: bound.arguments[name] for name in creator_fields} == {
            name: given[name] for name in creator_fields
        }
        assert [bound.arguments[name] for name in tensors] == list(node.input)


def test_without_prepare_an_old_node_shifts_outputs_into_a_field() -> None:
    """Why prepare_for_aot fills output_dtype: with one field fewer, `outputs` lands in output_dtype's slot."""
    (node,) = _trtfuse_nodes(_rms_model(output_dtype=None))
    definition = DEFINITIONS[node.op_type]
    _, creator_fields, _ = _split(definition.register)
    given = _attributes(node)
    copied = [given[name] for name in creator_fields if name in given]
    bound = inspect.signature(definition.aot_impl).bind_partial(*node.input, *copied, "outputs", 1)
    assert bound.arguments[contract.ATTR_OUTPUT_DTYPE] == "outputs"


TYPE_NAMES = {"FP32": "float32", "FP16": "float16", "BF16": "bfloat16"}


@pytest.mark.parametrize("mode", list(WeightMode), ids=[mode.name for mode in WeightMode])
@pytest.mark.parametrize("output_dtype", sorted(contract.OUTPUT_DTYPE_CODES))
@pytest.mark.parametrize("op", contract.FUSED_OPS)
def test_autotune_offers_exactly_the_contract_s_dtype_pairs(op: str, output_dtype: str, mode: WeightMode) -> None:
    """One combination per (activation, weight) dtype pair the contract allows, LINEAR, with the kernels' tactics;
    in type strings _autotune.py's _str_to_data_type reads (FP32, FP16, or a trt.DataType name: BF16)."""
    from trtfuse.kernels.artifacts import qk_norm_tactics, rms_norm_tactics
    from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec

    hidden = (HIDDEN,) if op == contract.RMS_NORM_OP else (16, 32)
    code = contract.OUTPUT_DTYPE_CODES[output_dtype]
    inputs = [None] * (2 * len(hidden))
    fields = (np.float32(1e-6), np.float32(0.0), np.int32(mode), *(np.int32(h) for h in hidden), np.int32(code))
    combinations = DEFINITIONS[op].autotune(*inputs, *(f.tobytes() for f in fields), (None,) * len(hidden))
    seen = set()
    params = contract.NormParams(1e-6, 0.0, mode)
    for combination in combinations:
        assert combination.layouts == "LINEAR"
        names = [TYPE_NAMES[part.strip()] for part in combination.io_types.split(",")]
        activations, weights, outputs = (
            names[: len(hidden)],
            names[len(hidden) : 2 * len(hidden)],
            names[2 * len(hidden) :],
        )
        assert len(set(activations)) == len(set(weights)) == 1 and outputs == [output_dtype] * len(hidden)
        dtype, weight = activations[0], weights[0]
        assert contract.dtype_pair_problem(dtype, output_dtype) is None
        spec_weight = None if mode is WeightMode.NONE else weight
        if op == contract.RMS_NORM_OP:
            tactics = rms_norm_tactics(RmsNormSpec(HIDDEN, dtype, spec_weight, params, output_dtype))
        else:
            tactics = qk_norm_tactics(QkNormSpec(16, 32, dtype, spec_weight, params, output_dtype))
        assert combination.tactics == [int(tactic) for tactic in tactics] and all(t > 0 for t in combination.tactics)
        seen.add((dtype, weight))
    weights = (contract.AOT_PLACEHOLDER_WEIGHT_DTYPE,) if mode is WeightMode.NONE else contract.WEIGHT_DTYPES
    allowed = {d for d in contract.ACTIVATION_DTYPES if contract.dtype_pair_problem(d, output_dtype) is None}
    assert seen == {(dtype, weight) for dtype in allowed for weight in weights}
    assert len(seen) == len(combinations)


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
    ],
)
def test_aot_impl_s_launch_is_the_declaration_s_for_the_activations_rows(op: str, shapes: list) -> None:
    """The artifact's entry and PTX, block and shared memory, and the grid and scalars of the declaration's formula
    for rows = element count // hidden of each activation, in order (q, then k)."""
    from trtfuse.kernels.artifacts import qk_norm_artifact, rms_norm_artifact
    from trtfuse.kernels.declaration import Tactic
    from trtfuse.kernels.specs import QkNormSpec, RmsNormSpec

    params = contract.NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
    if op == contract.RMS_NORM_OP:
        artifact = rms_norm_artifact(RmsNormSpec(HIDDEN, "float16", "float16", params), Tactic.PREFILL, "sm_90a")
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


# --- one kind per process, and what needs no TensorRT ----------------------------------------------------------------


def test_one_process_registers_one_kind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(aot, "_claimed_kind", None)
    aot.claim_plugin_kind(PluginKind.AOT)
    aot.claim_plugin_kind(PluginKind.AOT)
    with pytest.raises(TrtfuseError) as raised:
        aot.claim_plugin_kind(PluginKind.PYTHON)
    assert "\n" not in str(raised.value) and "registered trtfuse's aot plugins" in str(raised.value)
    monkeypatch.setattr(aot, "_claimed_kind", None)
    aot.claim_plugin_kind(PluginKind.PYTHON)
    with pytest.raises(TrtfuseError, match="registered trtfuse's python plugins"):
        aot.claim_plugin_kind(PluginKind.AOT)
    with pytest.raises(ValueError):
        aot.claim_plugin_kind("jit")


def test_importing_the_aot_modules_needs_neither_tensorrt_nor_cutedsl() -> None:
    code = (
        "import sys, trtfuse.plugins.aot, trtfuse.plugins.aot_nodes\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('tensorrt', 'tensorrt_rtx', 'cutlass')"
        " or m.startswith('trtfuse.kernels')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt_rtx") is None or importlib.util.find_spec("tensorrt") is not None,
    reason="needs TensorRT-RTX's module (a TensorRT without AOT plugins) where `tensorrt` is absent",
)
def test_register_aot_refuses_a_tensorrt_without_aot_in_one_line() -> None:
    code = (
        "from trtfuse.errors import MissingDependencyError\n"
        "from trtfuse.plugins import aot\n"
        "try:\n    aot.register_aot()\nexcept MissingDependencyError as error:\n    print(error)\n"
        "else:\n    raise SystemExit('registered')\n"
        "assert aot._claimed_kind is None\n"
    )
    env = {**os.environ, "TRTFUSE_TRT_MODULE": "tensorrt_rtx"}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    (line,) = done.stdout.strip().splitlines()
    assert "has no AOT plugins (tensorrt.plugin's aot_impl); trtfuse builds AOT plugins with TensorRT >= 10.14" in line


# --- real TensorRT: register, build, and run where trtfuse is not ---------------------------------------------------

REGISTER_SCRIPT = """
import tensorrt as trt
import trtfuse.plugins
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.aot import register_aot
register_aot()
register_aot()
names = {c.name for c in trt.get_plugin_registry().all_creators if getattr(c, "plugin_namespace", None) == "trtfuse"}
assert {"TrtfuseRmsNorm", "TrtfuseQkNorm"} <= names, names
try:
    trtfuse.plugins.register()
except TrtfuseError as error:
    assert "\\n" not in str(error), error
else:
    raise SystemExit("the Python plugins registered beside the AOT ones")
"""

PYTHON_FIRST_SCRIPT = """
import trtfuse.plugins
from trtfuse.errors import TrtfuseError
from trtfuse.plugins.aot import register_aot
trtfuse.plugins.register()
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
from trtfuse.plugins.aot import register_aot
from trtfuse.plugins.aot_nodes import prepare_for_aot

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
from trtfuse.plugins.aot import register_aot

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
    from trtfuse.tolerances import tolerance_for

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


@pytest.mark.parametrize(
    ("version", "has_request", "supported"),
    [
        ("10.8.0.43", False, False),
        ("10.9.0.34", True, False),  # AOT QDPs exist, but its parser may look them up by node name (aot.py)
        ("10.10.0.31", True, False),  # 10.10-10.13: the binding hands TensorRT a freed kernel name (aot.py)
        ("10.13.3.9", True, False),
        ("10.14.1.48", True, True),
        ("11.1.0.4", True, True),
        ("11.1.0.4", False, False),  # a build without tensorrt.plugin's AOT support (TensorRT-RTX 1.7 is one)
        ("unknown", True, False),
    ],
)
def test_aot_needs_the_aot_request_type_and_tensorrt_10_14(version: str, has_request: bool, supported: bool) -> None:
    fields = {"__version__": version} | ({"QuickPluginCreationRequest": object} if has_request else {})
    assert aot.aot_supported(SimpleNamespace(**fields)) is supported


def test_a_field_that_is_not_one_number_is_one_line() -> None:
    assert aot._float(np.float32(2.5).tobytes()) == 2.5
    assert aot._int(np.int32(-3).tobytes()) == -3
    assert aot._int(np.int64(7).tobytes()) == 7 and aot._float(np.float64(0.25).tobytes()) == 0.25
    with pytest.raises(TrtfuseError, match="holds 12 bytes, not one 4- or 8-byte number"):
        aot._float(np.array([1.0, 2.0, 3.0], np.float32).tobytes())
