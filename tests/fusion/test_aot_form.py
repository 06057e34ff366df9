"""prepare_for_aot: what fuse writes, as TensorRT's parser must see it to build AOT plugins (every field in the op's
order, `aot` = 1, placeholder weights), with the input model untouched and every bad node one line naming it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import WeightMode
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.aot_form import PLACEHOLDER_PREFIX, prepare_for_aot
from trtfuse.fusion.fuse import fuse_model

from support.fused_models import (
    FUSED_MODELS,
    HIDDEN,
    aot_attribute_names,
    attributes_of,
    fused_model,
    fused_node,
    rms_model,
    trtfuse_nodes,
)
from support.graphs import NormSpec, single_norm


@pytest.mark.parametrize("case", FUSED_MODELS, ids=list(FUSED_MODELS))
def test_what_fuse_writes_gets_every_field_in_registration_order_and_aot(case: str) -> None:
    fused = fuse_model(FUSED_MODELS[case]()).model
    prepared = prepare_for_aot(fused)
    onnx.checker.check_model(prepared)
    before, after = trtfuse_nodes(fused), trtfuse_nodes(prepared)
    assert before and len(before) == len(after)
    for original, node in zip(before, after, strict=True):
        assert [attribute.name for attribute in node.attribute] == aot_attribute_names(node.op_type)
        aot_attribute = node.attribute[-1]
        assert (aot_attribute.type, aot_attribute.i) == (onnx.AttributeProto.INT, 1)
        assert {
            name: value for name, value in attributes_of(node).items() if name != contract.ATTR_AOT
        } == attributes_of(original)
        weighted = attributes_of(node)[contract.ATTR_WEIGHT_MODE] != WeightMode.NONE
        assert (list(node.input) == list(original.input)) == weighted


def test_the_input_model_is_not_touched() -> None:
    fused = fuse_model(single_norm(NormSpec(weight="none"))).model
    saved = fused.SerializeToString()
    prepare_for_aot(fused)
    assert fused.SerializeToString() == saved


def test_no_weight_nodes_get_one_float32_placeholder_of_h_zeros_per_width() -> None:
    nodes = [
        fused_node(contract.RMS_NORM_OP, ["x"], ["y"], WeightMode.NONE, (HIDDEN,), name="a"),
        fused_node(contract.RMS_NORM_OP, ["y"], ["z"], WeightMode.NONE, (HIDDEN,), name="b"),
        fused_node(contract.QK_NORM_OP, ["q", "k"], ["q_out", "k_out"], WeightMode.NONE, (16, 32), name="qk"),
    ]
    fp16 = TensorProto.FLOAT16
    model = fused_model(
        nodes,
        {"x": (fp16, [3, HIDDEN]), "q": (fp16, [3, 4, 16]), "k": (fp16, [3, 2, 32])},
        {"z": (fp16, [3, HIDDEN]), "q_out": (fp16, [3, 4, 16]), "k_out": (fp16, [3, 2, 32])},
    )
    prepared = prepare_for_aot(model)
    onnx.checker.check_model(prepared)
    a, b, qk = trtfuse_nodes(prepared)
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
    model = rms_model(WeightMode.NONE)
    model.graph.initializer.append(numpy_helper.from_array(np.ones(2, np.float32), taken))
    (node,) = trtfuse_nodes(prepare_for_aot(model))
    assert node.input[1] == f"{taken}_1"


def test_a_node_without_output_dtype_is_one_line_naming_it() -> None:
    with pytest.raises(TrtfuseError) as raised:
        prepare_for_aot(rms_model(output_dtype=None), source="model.onnx")
    assert str(raised.value) == (
        "model.onnx: node 'norm': attribute output_dtype is missing (TrtfuseRmsNorm takes epsilon, weight_offset, "
        "weight_mode, hidden_size, output_dtype)"
    )


def test_an_undeclared_activation_dtype_comes_from_shape_inference() -> None:
    """The activation's dtype (bf16, behind a Cast) is inferred, so an output_dtype it does not pair with is refused
    and one it pairs with is kept."""
    for code, refused in ((16, False), (10, True)):
        model = rms_model(output_dtype=code)
        model.graph.node.insert(0, helper.make_node("Cast", ["raw"], ["x"], name="to_bf16", to=TensorProto.BFLOAT16))
        model.graph.input[0].name = "raw"
        model.graph.input[0].type.tensor_type.elem_type = TensorProto.FLOAT
        model.graph.output[0].type.tensor_type.elem_type = TensorProto.BFLOAT16 if code == 16 else TensorProto.FLOAT16
        if refused:
            with pytest.raises(TrtfuseError, match="input dtype bfloat16 and output dtype float16"):
                prepare_for_aot(model)
        else:
            (node,) = trtfuse_nodes(prepare_for_aot(model))
            assert attributes_of(node)[contract.ATTR_OUTPUT_DTYPE] == 16


def _qk_model(q_type: int, k_type: int) -> onnx.ModelProto:
    node = fused_node(contract.QK_NORM_OP, ["q", "k"], ["q_out", "k_out"], WeightMode.NONE, (16, 16), 10)
    return fused_model(
        [node],
        {"q": (q_type, [2, 4, 16]), "k": (k_type, [2, 2, 16])},
        {"q_out": (q_type, [2, 4, 16]), "k_out": (k_type, [2, 2, 16])},
    )


def _with_input_dtype(model: onnx.ModelProto, elem_type: int) -> onnx.ModelProto:
    model.graph.input[0].type.tensor_type.elem_type = elem_type
    return model


BAD_NODES = {
    "epsilon missing": (rms_model, {"drop": contract.ATTR_EPSILON}, "attribute epsilon is missing"),
    "weight_mode 7": (rms_model, {contract.ATTR_WEIGHT_MODE: 7}, "attribute weight_mode is 7, none of"),
    "output_dtype 7": (rms_model, {contract.ATTR_OUTPUT_DTYPE: 7}, "attribute output_dtype is 7, none of"),
    "no weight but a weight input": (
        rms_model,
        {contract.ATTR_WEIGHT_MODE: 0},
        "with weight_mode NONE takes 1 input(s) (x) and gives 1 output(s), not 2 and 1",
    ),
    "a weight mode but no weight": (
        lambda: rms_model(WeightMode.NONE),
        {contract.ATTR_WEIGHT_MODE: 1},
        "with weight_mode AFTER_CAST takes 2 input(s) (x, weight) and gives 1 output(s), not 1 and 1",
    ),
    "another namespace": (
        rms_model,
        {contract.ATTR_NAMESPACE: "other"},
        "attribute plugin_namespace is 'other', not the string 'trtfuse'",
    ),
    "hidden size not the activation's": (
        rms_model,
        {contract.ATTR_HIDDEN: 32},
        "hidden_size is 32, but input 'x' has last dim 64",
    ),
    "fp16 to bf16": (
        rms_model,
        {contract.ATTR_OUTPUT_DTYPE: 16},
        "input dtype float16 and output dtype bfloat16 are two different 16-bit dtypes",
    ),
    "int8 activation": (
        lambda: _with_input_dtype(rms_model(), TensorProto.INT8),
        {},
        "input 'x' is int8, not one of",
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
    (node,) = trtfuse_nodes(model)
    values = attributes_of(node)
    values.pop(changes.pop("drop", None), None)
    values.update(changes)
    del node.attribute[:]
    node.attribute.extend(helper.make_attribute(name, value) for name, value in values.items())
    with pytest.raises(TrtfuseError) as raised:
        prepare_for_aot(model, source="model.onnx")
    text = str(raised.value)
    assert "\n" not in text and text.startswith("model.onnx: node 'norm'") and message in text, text


def _add_norm_model(mode: WeightMode, residual_shape: list | None = None) -> onnx.ModelProto:
    """One TrtfuseAddRmsNorm as the pass writes it: fp16 x and residual, y in fp16 and h in fp16."""
    weighted = mode is not WeightMode.NONE
    inputs = ["x", "residual", "w"] if weighted else ["x", "residual"]
    node = fused_node(contract.ADD_RMS_NORM_OP, inputs, ["y", "h"], mode, (HIDDEN,), name="add_norm")
    fp16, shape = TensorProto.FLOAT16, ["tokens", HIDDEN]
    weights = [numpy_helper.from_array(np.ones(HIDDEN, np.float16), "w")] if weighted else []
    return fused_model(
        [node],
        {"x": (fp16, shape), "residual": (fp16, residual_shape or shape)},
        {"y": (fp16, shape), "h": (fp16, shape)},
        weights,
    )


def test_a_no_weight_add_norm_gets_one_placeholder_after_both_activations() -> None:
    """x and residual are one part, so a NONE node gets one placeholder of [hidden_size], the QDP's `weight`."""
    prepared = prepare_for_aot(_add_norm_model(WeightMode.NONE))
    onnx.checker.check_model(prepared)
    (node,) = trtfuse_nodes(prepared)
    placeholder = f"{PLACEHOLDER_PREFIX}_{HIDDEN}"
    assert list(node.input) == ["x", "residual", placeholder] and list(node.output) == ["y", "h"]
    assert [attribute.name for attribute in node.attribute] == aot_attribute_names(contract.ADD_RMS_NORM_OP)
    (tensor,) = prepared.graph.initializer
    array = numpy_helper.to_array(tensor)
    assert tensor.name == placeholder and array.dtype == np.float32 and array.shape == (HIDDEN,) and not array.any()


def test_a_weighted_add_norm_keeps_its_inputs() -> None:
    (node,) = trtfuse_nodes(prepare_for_aot(_add_norm_model(WeightMode.AFTER_CAST)))
    assert list(node.input) == ["x", "residual", "w"]
    assert attributes_of(node)[contract.ATTR_AOT] == 1


def test_an_add_norm_whose_residual_broadcasts_is_one_line_naming_it() -> None:
    """A rank that differs is refused; a symbolic dim against a static one is not (its value may match)."""
    with pytest.raises(TrtfuseError) as raised:
        prepare_for_aot(_add_norm_model(WeightMode.AFTER_CAST, ["batch", "tokens", HIDDEN]), source="model.onnx")
    assert str(raised.value) == (
        "model.onnx: node 'add_norm': inputs 'x' [tokens, 64] and 'residual' [batch, tokens, 64] must have one shape "
        "(no broadcasting)"
    )
    prepare_for_aot(_add_norm_model(WeightMode.AFTER_CAST, [1, HIDDEN]))
