"""make_feed, tolerances and check_fused on a hand-built original / fused model pair."""

from __future__ import annotations

import contextlib
import json
import re
from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import WeightMode
from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.model.feeds import DEFAULT_BATCH, DEFAULT_DIM, default_feeds, make_feed
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import CheckInputs, check_fused
from trtfuse.verify.onnxrt import CpuSession, lowered_session
from trtfuse.verify.tolerances import Tolerance, output_error, tolerance_for
from trtfuse.verify.verdict import CheckResult, computed_dtypes, judge_for, judge_steps

from support.kv_models import windowed_genai_model

VOCAB = 50
HIDDEN = 32
EPSILON = 1e-6
LOGITS_SHAPE = ["batch_size", "sequence_length", VOCAB]


def embedding_norm_model(fused: bool, epsilon: float = EPSILON, weight_offset: float = 0.0) -> onnx.ModelProto:
    """input_ids -> embedding Gather -> RMSNorm (decomposed, or one TrtfuseRmsNorm node) -> MatMul -> logits."""
    rng = np.random.default_rng(0)
    initializers = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32), "embed"),
        numpy_helper.from_array(rng.normal(1.0, 0.5, HIDDEN).astype(np.float32), "norm_weight"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, VOCAB)).astype(np.float32), "lm_head"),
    ]
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["hidden"], name="embed_tokens")]
    if fused:
        attributes = {
            contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
            contract.ATTR_VERSION: contract.PLUGIN_VERSION,
            contract.ATTR_EPSILON: epsilon,
            contract.ATTR_WEIGHT_OFFSET: weight_offset,
            contract.ATTR_WEIGHT_MODE: int(WeightMode.AFTER_CAST),
            contract.ATTR_HIDDEN: HIDDEN,
            contract.ATTR_OUTPUT_DTYPE: TensorProto.FLOAT,
        }
        nodes.append(
            helper.make_node(
                contract.RMS_NORM_OP,
                ["hidden", "norm_weight"],
                ["normed"],
                name="norm",
                domain=contract.ONNX_DOMAIN,
                **attributes,
            )
        )
    else:
        initializers += [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array([-1], np.int64), "last_axis"),
            numpy_helper.from_array(np.array(epsilon, np.float32), "epsilon"),
        ]
        nodes += [
            helper.make_node("Pow", ["hidden", "two"], ["square"], name="norm/pow"),
            helper.make_node("ReduceMean", ["square", "last_axis"], ["mean"], name="norm/mean"),
            helper.make_node("Add", ["mean", "epsilon"], ["variance"], name="norm/add"),
            helper.make_node("Sqrt", ["variance"], ["root"], name="norm/sqrt"),
            helper.make_node("Reciprocal", ["root"], ["inverse_root"], name="norm/reciprocal"),
            helper.make_node("Mul", ["hidden", "inverse_root"], ["normalised"], name="norm/normalise"),
            helper.make_node("Mul", ["normalised", "norm_weight"], ["normed"], name="norm/scale"),
        ]
    nodes.append(helper.make_node("MatMul", ["normed", "lm_head"], ["logits"], name="lm_head"))
    graph = helper.make_graph(
        nodes,
        "embedding_norm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", VOCAB])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 18)]
    if fused:
        opsets.append(helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION))
    return helper.make_model(graph, opset_imports=opsets)


def _loaded(model: onnx.ModelProto, path: Path) -> LoadedModel:
    onnx.save_model(model, str(path))
    return load_model(path)


def test_fused_model_matches_its_original(tmp_path: Path) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    fused = _loaded(embedding_norm_model(fused=True), tmp_path / "fused.onnx")
    result = check_fused(original, fused, CheckInputs(seed=3))
    assert result.passed
    assert result.judged_by == "tolerance"
    (step,) = result.steps
    assert step.input_shapes == {"input_ids": (DEFAULT_BATCH, DEFAULT_DIM)}
    (verdict,) = step.outputs
    assert verdict.name == "logits"
    assert verdict.reference is None
    assert verdict.error.max_rel <= 1e-5


@pytest.mark.parametrize(("epsilon", "weight_offset"), [(0.5, 0.0), (EPSILON, 1.0)])
def test_wrong_fusion_is_caught(tmp_path: Path, epsilon: float, weight_offset: float) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    fused = _loaded(embedding_norm_model(fused=True, epsilon=epsilon, weight_offset=weight_offset), tmp_path / "f.onnx")
    result = check_fused(original, fused)
    assert not result.passed
    assert result.errors[0].error.max_rel > 1e-3


def test_different_interfaces_are_reported(tmp_path: Path) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    other = embedding_norm_model(fused=True)
    other.graph.output[0].name = "renamed"
    other.graph.node[-1].output[0] = "renamed"
    with pytest.raises(TrtfuseError, match=r"graph outputs differ from .*original\.onnx's: logits, renamed"):
        check_fused(original, _loaded(other, tmp_path / "fused.onnx"))


def test_onnxruntime_shape_failure_points_at_dim_and_shape(tmp_path: Path) -> None:
    loaded = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    with pytest.raises(OptionError, match=r"onnxruntime cannot run it: .*dim SYMBOL=N or shape NAME=D0xD1"):
        CpuSession(loaded).run({"input_ids": np.zeros((2, 3, 4), np.int64)})


def test_a_position_table_shorter_than_the_tokens_fed_points_at_dim_and_shape(tmp_path: Path) -> None:
    # GPT-2's learned positions: a Gather from a table of 4 rows, fed 6 positions.
    table = numpy_helper.from_array(np.zeros((4, 8), np.float32), "wpe")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["wpe", "position_ids"], ["y"], name="/wpe/Gather")],
        "positions",
        [helper.make_tensor_value_info("position_ids", TensorProto.INT64, [1, "sequence"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, "sequence", 8])],
        [table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    loaded = _loaded(model, tmp_path / "positions.onnx")
    with pytest.raises(OptionError, match=r"/wpe/Gather.*out of data bounds.*dim SYMBOL=N or shape NAME=D0xD1"):
        CpuSession(loaded).run({"position_ids": np.arange(6, dtype=np.int64)[None]})


def test_feed_keeps_token_ids_inside_the_vocabulary() -> None:
    feed = make_feed(embedding_norm_model(fused=False), seed=0, dims={"sequence_length": 4000})
    ids = feed["input_ids"]
    assert ids.shape == (DEFAULT_BATCH, 4000)
    assert ids.dtype == np.int64
    assert ids.min() >= 0
    assert ids.max() == VOCAB - 1


def test_feed_is_reproducible_per_seed() -> None:
    model = embedding_norm_model(fused=False)
    np.testing.assert_array_equal(make_feed(model, 7)["input_ids"], make_feed(model, 7)["input_ids"])
    assert not np.array_equal(make_feed(model, 7)["input_ids"], make_feed(model, 8)["input_ids"])


def _inputs_model(inputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    nodes = [helper.make_node("Identity", [value.name], [f"{value.name}_out"]) for value in inputs]
    outputs = [
        helper.make_tensor_value_info(f"{value.name}_out", value.type.tensor_type.elem_type, None) for value in inputs
    ]
    return helper.make_model(helper.make_graph(nodes, "inputs", inputs, outputs))


def test_feed_symbolic_dims_masks_positions_and_floats() -> None:
    model = _inputs_model(
        [
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "past + seq"]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("hidden", TensorProto.FLOAT16, ["batch", "seq", 8]),
            helper.make_tensor_value_info("scale", TensorProto.BFLOAT16, [None, 3]),
            helper.make_tensor_value_info("flag", TensorProto.BOOL, [2]),
        ]
    )
    feed = make_feed(model, seed=0, dims={"past": 3})
    assert feed["attention_mask"].shape == (DEFAULT_BATCH, 3 + DEFAULT_DIM)
    assert np.all(feed["attention_mask"] == 1)
    np.testing.assert_array_equal(feed["position_ids"][1], np.arange(3, 3 + DEFAULT_DIM))
    assert feed["hidden"].dtype == np.float16
    assert feed["hidden"].shape == (DEFAULT_BATCH, DEFAULT_DIM, 8)
    assert feed["scale"].dtype == ml_dtypes.bfloat16
    assert feed["scale"].shape == (DEFAULT_DIM, 3)
    assert feed["flag"].all()


def test_feed_shape_overrides_and_bad_names() -> None:
    model = embedding_norm_model(fused=False)
    assert make_feed(model, 0, shapes={"input_ids": (1, 9)})["input_ids"].shape == (1, 9)
    with pytest.raises(OptionError, match="shape names no graph input: tokens"):
        make_feed(model, 0, shapes={"tokens": (1, 9)})
    with pytest.raises(OptionError, match="dim names no symbolic dim of a graph input: batch"):
        make_feed(model, 0, dims={"batch": 1, "batch_size": 1})


def test_feed_rejects_an_unreadable_dim() -> None:
    model = _inputs_model([helper.make_tensor_value_info("x", TensorProto.FLOAT, ["seq ** 2"])])
    with pytest.raises(TrtfuseError, match=r"input 'x': cannot evaluate symbolic dim 'seq \*\* 2'"):
        make_feed(model, 0)


def test_tolerances_per_dtype() -> None:
    assert tolerance_for("float32").rtol == 1e-5
    assert tolerance_for(np.float16).rtol == 2e-3
    assert tolerance_for(ml_dtypes.bfloat16).rtol == 1e-2
    assert tolerance_for(np.int64) == Tolerance(0.0, 0.0)


def test_output_error_is_relative_to_the_reference_maximum() -> None:
    reference = np.array([100.0, 0.001], np.float32)
    error = output_error("y", np.array([100.0, 0.0015], np.float32), reference)
    assert error.max_abs == pytest.approx(0.0005)
    assert error.max_rel == pytest.approx(5e-6)
    assert error.passed
    assert not output_error("y", np.array([100.01, 0.001], np.float32), reference).passed


def test_output_error_nan_and_shape_mismatches_fail() -> None:
    reference = np.array([1.0, np.nan], np.float32)
    assert output_error("y", reference.copy(), reference).passed
    assert not output_error("y", np.array([1.0, 1.0], np.float32), reference).passed
    assert not output_error("y", np.array([np.inf, np.nan], np.float32), reference).passed
    assert not output_error("y", np.zeros(3, np.float32), reference).passed
    assert output_error("ids", np.array([1, 2]), np.array([1, 2])).passed
    assert not output_error("ids", np.array([1, 3]), np.array([1, 2])).passed


def _fused_pair(spec_dtype: str, tmp_path: Path) -> tuple[LoadedModel, onnx.ModelProto]:
    from trtfuse.fusion.fuse import fuse_model

    from support.graphs import NormSpec, single_norm

    original = _loaded(single_norm(NormSpec(dtype=spec_dtype, weight_dtype=spec_dtype)), tmp_path / "original.onnx")
    return original, fuse_model(original.model).model


def test_bfloat16_models_run_in_the_reference_evaluator(tmp_path: Path) -> None:
    # onnxruntime's CPU build has no bfloat16 Mul; `check` must still compare such models, and still catch a mismatch.
    original, fused = _fused_pair("bfloat16", tmp_path)
    result = check_fused(original, _loaded(fused, tmp_path / "fused.onnx"))
    assert result.passed
    assert result.judged_by == "float32 evaluation"
    (node,) = [node for node in fused.graph.node if node.op_type == contract.RMS_NORM_OP]
    (offset,) = [attribute for attribute in node.attribute if attribute.name == contract.ATTR_WEIGHT_OFFSET]
    offset.f = 1.0
    assert not check_fused(original, _loaded(fused, tmp_path / "corrupted.onnx")).passed


def _cast_output_to_float(model: onnx.ModelProto) -> onnx.ModelProto:
    """`logits.float()`: the model's last value cast to float32 as the graph output."""
    model.graph.node[-1].output[0] = "logits_narrow"
    model.graph.node.append(helper.make_node("Cast", ["logits_narrow"], ["logits"], to=TensorProto.FLOAT, name="up"))
    model.graph.output[0].type.tensor_type.elem_type = TensorProto.FLOAT
    return model


def _norm_in_16_bit(model: onnx.ModelProto, dtype: type = np.float16) -> onnx.ModelProto:
    """The norm computed in `dtype` throughout (no upcast), as AutoCast exports have it; the fused node (tag
    core-float16) computes it in float32, and rounds differently."""
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    for node in model.graph.node:
        if node.name == "norm/cast":
            node.attribute[0].i = elem_type
    for index, tensor in enumerate(model.graph.initializer):
        if tensor.name in ("two", "eps"):
            narrowed = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(dtype), tensor.name)
            model.graph.initializer[index].CopyFrom(narrowed)
    return model


def _fp16_pair(tmp_path: Path, **fused_options: float) -> tuple[LoadedModel, LoadedModel]:
    from support.models import tiny_lm

    original = _cast_output_to_float(_norm_in_16_bit(tiny_lm(np.float16, fused=False)))
    fused = _cast_output_to_float(tiny_lm(np.float16, fused=True, **fused_options))
    return _loaded(original, tmp_path / "original.onnx"), _loaded(fused, tmp_path / "fused.onnx")


def test_fp16_model_with_fp32_output_is_judged_by_its_fp16_computation(tmp_path: Path) -> None:
    original, fused = _fp16_pair(tmp_path)
    assert computed_dtypes(original.model) == {"logits": "float16"}
    result = check_fused(original, fused, CheckInputs(dims={"sequence": 64}))
    (verdict,) = result.errors
    assert (verdict.dtype, verdict.computed_in) == ("float32", "float16")
    # The fused norm computes in float32 where the original rounds to fp16 at every op: beyond float32's tolerance.
    assert verdict.error.max_rel > tolerance_for("float32").rtol
    assert result.judged_by == "float32 evaluation"
    assert verdict.reference.original > 0.0
    assert verdict.reference.candidate <= verdict.reference.bound
    assert result.passed


def test_16_bit_verdict_still_catches_a_wrong_fusion_and_a_given_tolerance_replaces_it(tmp_path: Path) -> None:
    original, corrupted = _fp16_pair(tmp_path, epsilon=0.5)
    (verdict,) = check_fused(original, corrupted).errors
    assert verdict.reference.candidate > 10 * verdict.reference.bound
    assert not verdict.passed
    original, fused = _fp16_pair(tmp_path)
    (verdict,) = check_fused(
        original, fused, CheckInputs(tolerance=Tolerance(atol=0.0, rtol=1e-7), dims={"sequence": 64})
    ).errors
    assert verdict.reference is None
    assert verdict.error.tolerance.rtol == 1e-7
    assert not verdict.passed


def _with_noise_output(model: onnx.ModelProto, only: bool = False) -> onnx.ModelProto:
    """An extra output the original computes differently on every run (unseeded RandomUniformLike)."""
    model.graph.node.append(helper.make_node("RandomUniformLike", ["logits"], ["noise"], name="noise"))
    model.graph.output.append(helper.make_tensor_value_info("noise", TensorProto.FLOAT, LOGITS_SHAPE))
    if only:
        del model.graph.output[0]
    return model


@pytest.mark.parametrize("only", [False, True])
def test_outputs_that_differ_between_runs_of_the_original_are_left_out(tmp_path: Path, only: bool) -> None:
    original = _loaded(_with_noise_output(embedding_norm_model(fused=False), only), tmp_path / "original.onnx")
    fused = _loaded(_with_noise_output(embedding_norm_model(fused=True), only), tmp_path / "fused.onnx")
    result = check_fused(original, fused)
    noise = next(verdict for verdict in result.errors if verdict.name == "noise")
    assert noise.passed is None
    assert noise.note.startswith("left out: two runs of the original differ")
    # Left out, not passed: with nothing else to judge there is no pass.
    assert result.passed is not only


def test_a_missing_or_changed_declared_output_is_a_mismatch(tmp_path: Path) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    untyped = embedding_norm_model(fused=True)
    untyped.graph.output[0].type.tensor_type.elem_type = TensorProto.UNDEFINED
    (verdict,) = check_fused(original, _loaded(untyped, tmp_path / "untyped.onnx")).errors
    assert not verdict.passed
    assert verdict.note == "the fused model declares no dtype for it"
    reshaped = embedding_norm_model(fused=True)
    reshaped.graph.output[0].type.tensor_type.shape.dim[2].dim_value = VOCAB + 1
    (verdict,) = check_fused(original, _loaded(reshaped, tmp_path / "reshaped.onnx")).errors
    assert not verdict.passed
    assert verdict.note == f"declared float32[batch_size,sequence_length,{VOCAB + 1}] in the fused model, " + (
        f"float32[batch_size,sequence_length,{VOCAB}] originally"
    )
    renamed = embedding_norm_model(fused=True)
    renamed.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "unk__1"
    (verdict,) = check_fused(original, _loaded(renamed, tmp_path / "renamed.onnx")).errors
    assert verdict.passed
    assert verdict.note.startswith(f"declared float32[unk__1,sequence_length,{VOCAB}] in the fused model")


def _with_output(model: onnx.ModelProto, node: onnx.NodeProto, output: onnx.ValueInfoProto) -> onnx.ModelProto:
    model.graph.node.append(node)
    model.graph.output.append(output)
    return model


def _string_output(model: onnx.ModelProto, text: str | None = None) -> onnx.ModelProto:
    """`model` with a string output: the token ids as text, or one constant `text`."""
    if text is None:
        node = helper.make_node("Cast", ["input_ids"], ["text"], to=TensorProto.STRING)
        output = helper.make_tensor_value_info("text", TensorProto.STRING, ["batch_size", "sequence_length"])
    else:
        value = helper.make_tensor("value", TensorProto.STRING, [2], [text.encode(), b"same"])
        node = helper.make_node("Constant", [], ["text"], value=value)
        output = helper.make_tensor_value_info("text", TensorProto.STRING, [2])
    return _with_output(model, node, output)


def test_string_outputs_are_compared_for_equality_and_the_rest_as_numbers(tmp_path: Path) -> None:
    original = _loaded(_string_output(embedding_norm_model(fused=False)), tmp_path / "original.onnx")
    fused = _loaded(_string_output(embedding_norm_model(fused=True)), tmp_path / "fused.onnx")
    result = check_fused(original, fused)
    assert result.passed
    logits, text = result.errors
    assert logits.name == "logits"
    assert logits.error.max_rel <= 1e-5
    assert (text.name, text.dtype, text.computed_in, text.passed) == ("text", "string", "string", True)
    assert text.note == "compared for equality"
    assert text.to_json()["max_abs"] is None


def test_a_string_output_that_differs_fails_naming_the_first_difference(tmp_path: Path) -> None:
    original = _loaded(_string_output(embedding_norm_model(fused=False), "one"), tmp_path / "original.onnx")
    fused = _loaded(_string_output(embedding_norm_model(fused=True), "two"), tmp_path / "fused.onnx")
    result = check_fused(original, fused)
    assert not result.passed
    logits, text = result.errors
    assert logits.passed
    assert not text.passed
    assert text.note == "1 of 2 strings differ, the first at [0]: 'two', the original's 'one'"


def test_string_outputs_pass_in_onnx_reference_evaluator(tmp_path: Path) -> None:
    original = _loaded(_string_output(embedding_norm_model(fused=False)), tmp_path / "original.onnx")
    fused = _loaded(_string_output(embedding_norm_model(fused=True)), tmp_path / "fused.onnx")
    # The evaluator's Cast gives a fixed-width str array where onnxruntime's gives one of objects.
    evaluator = CpuSession(original, evaluator=True)
    lowered = lowered_session(fused, evaluator=True)
    result = judge_steps(evaluator, lowered, default_feeds(original.model, 0), judge_for(original, None), seed=0)
    assert result.passed
    assert result.errors[1].note == "compared for equality"


def test_non_tensor_outputs_are_not_compared_and_the_rest_is(tmp_path: Path) -> None:
    def with_sequence(model: onnx.ModelProto) -> onnx.ModelProto:
        node = helper.make_node("SequenceConstruct", ["logits"], ["sequence"])
        return _with_output(model, node, helper.make_tensor_sequence_value_info("sequence", TensorProto.FLOAT, None))

    original = _loaded(with_sequence(embedding_norm_model(fused=False)), tmp_path / "original.onnx")
    fused = _loaded(with_sequence(embedding_norm_model(fused=True)), tmp_path / "fused.onnx")
    result = check_fused(original, fused)
    assert result.passed
    logits, sequence = result.errors
    assert logits.passed
    assert sequence.passed is None
    assert sequence.note == "not compared: a sequence (only tensors of real numbers, bools and strings are compared)"
    assert sequence.dtype == "sequence"


def _set_attribute(node: onnx.NodeProto, name: str, value: object) -> None:
    kept = [attribute for attribute in node.attribute if attribute.name != name]
    del node.attribute[:]
    node.attribute.extend(kept)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        (contract.ATTR_WEIGHT_MODE, 7, "attribute weight_mode is 7, none of 0 (NONE), 1 (AFTER_CAST), 2 (BEFORE_CAST)"),
        (contract.ATTR_EPSILON, "1e-6", "attribute epsilon must be one float"),
        (contract.ATTR_EPSILON, -1.0, "attribute epsilon is -1.0, not a finite non-negative number"),
        (contract.ATTR_EPSILON, float("nan"), "attribute epsilon is nan, not a finite non-negative number"),
        (contract.ATTR_EPSILON, float("inf"), "attribute epsilon is inf, not a finite non-negative number"),
        (contract.ATTR_WEIGHT_OFFSET, float("nan"), "attribute weight_offset is nan, not a finite number"),
        (contract.ATTR_HIDDEN, None, "attribute hidden_size is missing (TrtfuseRmsNorm takes"),
        (contract.ATTR_HIDDEN, 0, "attribute hidden_size is 0, not a positive int32 length"),
        (contract.ATTR_HIDDEN, 16, "hidden_size is 16, but input 'hidden' has last dim 32"),
        (contract.ATTR_OUTPUT_DTYPE, 7, "attribute output_dtype is 7, none of 1 (float32), 10 (float16), 16 (bf"),
        (contract.ATTR_OUTPUT_DTYPE, None, "attribute output_dtype is missing"),
        (contract.ATTR_OUTPUT_DTYPE, 1.0, "attribute output_dtype must be one int"),
    ],
)
def test_fused_nodes_with_invalid_attributes_are_one_line(
    tmp_path: Path, name: str, value: object, message: str
) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    edited = embedding_norm_model(fused=True)
    _set_attribute(edited.graph.node[1], name, value)
    onnx.save_model(edited, str(tmp_path / "edited.onnx"))
    with pytest.raises(TrtfuseError, match=re.escape(f"edited.onnx: node 'norm': {message}")):
        check_fused(original, LoadedModel(model=edited, path=tmp_path / "edited.onnx"))


def test_unknown_trtfuse_op_is_one_line(tmp_path: Path) -> None:
    original = _loaded(embedding_norm_model(fused=False), tmp_path / "original.onnx")
    edited = embedding_norm_model(fused=True)
    edited.graph.node[1].op_type = "TrtfuseLayerNorm"
    with pytest.raises(TrtfuseError, match="node 'norm': TrtfuseLayerNorm is no trtfuse op"):
        check_fused(original, LoadedModel(model=edited, path=tmp_path / "edited.onnx"))


def test_symlinked_models_read_external_data_beside_the_link_as_fuse_does(tmp_path: Path) -> None:
    from support.models import projection_model, save_external

    target, links = tmp_path / "target", tmp_path / "links"
    target.mkdir()
    links.mkdir()
    save_external(projection_model(), target / "model.onnx")
    # The data lives beside the link only, where trtfuse.model.onnx_file.load_model (and so `fuse`) looks for it.
    (target / "weights.data").rename(links / "weights.data")
    (links / "model.onnx").symlink_to(target / "model.onnx")
    loaded = load_model(links / "model.onnx")
    assert check_fused(loaded, loaded, CheckInputs(dims={"batch": 1})).passed


def test_widening_keeps_ops_and_weights_and_drops_activation_quantization() -> None:
    from trtfuse.verify.widening import is_reduced_precision, widen_to_float32

    weight = numpy_helper.from_array(np.array([0.5, -2.0], np.float16), "w")
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "scale", "zero"], ["q"], name="q"),
        helper.make_node("DequantizeLinear", ["q", "scale", "zero"], ["dq"], name="dq"),
        helper.make_node("Cast", ["dq"], ["h"], to=TensorProto.FLOAT16, name="narrow"),
        helper.make_node("Mul", ["h", "w"], ["y"], name="scale_by_w"),
    ]
    scale = numpy_helper.from_array(np.array(0.1, np.float32), "scale")
    zero = numpy_helper.from_array(np.array(0, np.int8), "zero")
    graph = helper.make_graph(
        nodes,
        "quantized",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [2])],
        [weight, scale, zero],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    assert is_reduced_precision(model)
    widened = widen_to_float32(model)
    assert not is_reduced_precision(widened)
    assert [node.op_type for node in widened.graph.node] == ["Identity", "Cast", "Mul"]
    assert widened.graph.node[0].input[0] == "x"
    np.testing.assert_array_equal(numpy_helper.to_array(widened.graph.initializer[0]), [0.5, -2.0])
    x = np.array([0.123, -0.456], np.float32)
    (y,) = CpuSession(LoadedModel(model=widened, path=Path("widened.onnx"))).run({"x": x}).values()
    np.testing.assert_allclose(y, x * np.array([0.5, -2.0], np.float32), rtol=1e-7)


def _with_kv_cache(model: onnx.ModelProto) -> onnx.ModelProto:
    """A KV cache as optimum writes one: `past_key_values.0.key` in, the normed hidden state appended as `present.0.key`
    out (HIDDEN = 2 heads x 16)."""
    model.graph.input.append(
        helper.make_tensor_value_info(
            "past_key_values.0.key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length", HIDDEN // 2]
        )
    )
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, 2, HIDDEN // 2], np.int64), "heads"))
    model.graph.node.extend(
        [
            helper.make_node("Reshape", ["normed", "heads"], ["split_heads"], name="split_heads"),
            helper.make_node("Transpose", ["split_heads"], ["key"], perm=[0, 2, 1, 3], name="key"),
            helper.make_node("Concat", ["past_key_values.0.key", "key"], ["present.0.key"], axis=2, name="cache"),
        ]
    )
    model.graph.output.append(
        helper.make_tensor_value_info(
            "present.0.key", TensorProto.FLOAT, ["batch_size", 2, "past_sequence_length + sequence_length", HIDDEN // 2]
        )
    )
    return model


def test_kv_cache_models_are_checked_at_a_prefill_and_a_decode_step(tmp_path: Path) -> None:
    original = _loaded(_with_kv_cache(embedding_norm_model(fused=False)), tmp_path / "original.onnx")
    fused = _loaded(_with_kv_cache(embedding_norm_model(fused=True)), tmp_path / "fused.onnx")
    result = check_fused(original, fused)
    assert [step.name for step in result.steps] == ["prefill", "decode"]
    prefill, decode = result.steps
    assert prefill.input_shapes["past_key_values.0.key"] == (DEFAULT_BATCH, 2, 0, HIDDEN // 2)
    assert decode.input_shapes == {
        "input_ids": (DEFAULT_BATCH, 1),
        "past_key_values.0.key": (DEFAULT_BATCH, 2, DEFAULT_DIM, HIDDEN // 2),
    }
    assert [output.name for output in decode.outputs] == ["logits", "present.0.key"]
    assert result.passed
    corrupted = _loaded(_with_kv_cache(embedding_norm_model(fused=True, epsilon=0.5)), tmp_path / "corrupted.onnx")
    assert not any(step.passed for step in check_fused(original, corrupted).steps)


def _cli_pair(tmp_path: Path) -> tuple[str, str]:
    from support.models import tiny_lm

    onnx.save_model(_norm_in_16_bit(tiny_lm(np.float16, fused=False)), str(tmp_path / "original.onnx"))
    onnx.save_model(tiny_lm(np.float16, fused=True), str(tmp_path / "fused.onnx"))
    return str(tmp_path / "original.onnx"), str(tmp_path / "fused.onnx")


def test_check_prints_seed_and_shapes_and_repeats_a_run_from_saved_inputs(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from trtfuse.cli.main import cli

    original, fused = _cli_pair(tmp_path)
    saved = tmp_path / "inputs.npz"
    runner = CliRunner()
    first = runner.invoke(cli, ["check", original, fused, "--seed", "5", "--dim", "sequence=7", "--save-inputs", saved])
    assert first.exit_code == 0, first.output
    assert "step single (seed 5): input_ids=2x7" in first.output
    assert "orig err" in first.output
    again = runner.invoke(cli, ["check", original, fused, "--load-inputs", str(saved), "--json"])
    assert again.exit_code == 0, again.output
    # The JSON is stdout; the progress lines go to stderr.
    report = json.loads(again.stdout)
    assert report["seed"] is None
    assert report["inputs_file"] == str(saved)
    assert report["steps"][0]["input_shapes"] == {"input_ids": [2, 7]}
    first_json = json.loads(
        runner.invoke(cli, ["check", original, fused, "--seed", "5", "--dim", "sequence=7", "--json"]).stdout
    )
    assert report["steps"][0]["outputs"] == first_json["steps"][0]["outputs"]


@pytest.mark.parametrize(
    ("arguments", "status", "message"),
    [
        (["--load-inputs", "{saved}", "--dim", "sequence=3"], 2, "fixes the inputs; drop --dim"),
        (["--load-inputs", "{other}"], 2, "other.npz has no array for input 'input_ids'"),
        (["--save-inputs", "{original}"], 2, "would overwrite the input"),
        (["--rtol", "-1"], 2, "-1.0 is not a finite non-negative number"),
        (["--rtol", "1e-9"], 1, "1 output(s) fail"),
    ],
)
def test_check_input_and_tolerance_options(tmp_path: Path, arguments: list[str], status: int, message: str) -> None:
    from click.testing import CliRunner

    from trtfuse.cli.main import cli

    original, fused = _cli_pair(tmp_path)
    np.savez(tmp_path / "saved.npz", input_ids=np.zeros((1, 3), np.int64))
    np.savez(tmp_path / "other.npz", tokens=np.zeros((1, 3), np.int64))
    paths = {"saved": str(tmp_path / "saved.npz"), "other": str(tmp_path / "other.npz"), "original": original}
    result = CliRunner().invoke(cli, ["check", original, fused, *(argument.format(**paths) for argument in arguments)])
    assert result.exit_code == status, result.output
    assert message in result.output
    assert "Traceback" not in result.output


def _quantized(model: onnx.ModelProto) -> onnx.ModelProto:
    """int8 Q/DQ of the norm's output in float32, between casts from and back to bfloat16."""
    for node in model.graph.node:
        if node.output[0] == "normed":
            node.output[0] = "normed_bf16"
    model.graph.initializer.extend(
        [numpy_helper.from_array(np.array(0.05, np.float32), "q_scale"), numpy_helper.from_array(np.int8(0), "q_zero")]
    )
    quantize = [
        helper.make_node("Cast", ["normed_bf16"], ["normed_fp32"], to=TensorProto.FLOAT, name="to_fp32"),
        helper.make_node("QuantizeLinear", ["normed_fp32", "q_scale", "q_zero"], ["normed_q"], name="q"),
        helper.make_node("DequantizeLinear", ["normed_q", "q_scale", "q_zero"], ["normed_dq"], name="dq"),
        helper.make_node("Cast", ["normed_dq"], ["normed"], to=TensorProto.BFLOAT16, name="to_bf16"),
    ]
    position = next(index for index, node in enumerate(model.graph.node) if node.op_type == "MatMul")
    for offset, node in enumerate(quantize):
        model.graph.node.insert(position + offset, node)
    # onnx's reference evaluator has DequantizeLinear from opset 19, where ReduceMean takes its axes as an input.
    model.opset_import[0].version = 19
    for node in model.graph.node:
        if node.op_type == "ReduceMean":
            kept = [attribute for attribute in node.attribute if attribute.name != "axes"]
            del node.attribute[:]
            node.attribute.extend(kept)
            node.input.append("mean_axes")
    model.graph.initializer.append(numpy_helper.from_array(np.array([-1], np.int64), "mean_axes"))
    return model


def _hidden_state_input(model: onnx.ModelProto) -> onnx.ModelProto:
    """The hidden state fed directly instead of gathered from a 32-row table: every element of the norm differs."""
    from support.models import HIDDEN as TINY_HIDDEN

    kept = [node for node in model.graph.node if node.op_type != "Gather"]
    del model.graph.node[:]
    model.graph.node.extend(kept)
    del model.graph.input[:]
    model.graph.input.append(
        helper.make_tensor_value_info("hidden", TensorProto.BFLOAT16, ["batch", "sequence", TINY_HIDDEN])
    )
    return model


def test_quantized_graphs_are_judged_against_the_float32_evaluation(tmp_path: Path) -> None:
    from support.models import tiny_lm

    def quantized(model: onnx.ModelProto) -> onnx.ModelProto:
        return _quantized(_hidden_state_input(model))

    bf16 = ml_dtypes.bfloat16
    original = _loaded(quantized(_norm_in_16_bit(tiny_lm(bf16, fused=False), bf16)), tmp_path / "original.onnx")
    fused = _loaded(quantized(tiny_lm(bf16, fused=True)), tmp_path / "fused.onnx")
    result = check_fused(original, fused, CheckInputs(dims={"sequence": 64}))
    (verdict,) = result.errors
    # The fused norm computes in float32 where the original rounds to bfloat16 at every op (onnx's reference
    # evaluator runs bfloat16 graphs exactly), which flips quantization steps: beyond bf16's tolerance ...
    assert verdict.error.max_rel > tolerance_for("bfloat16").rtol
    # ... but no further from the graph's float32 arithmetic than the original's own rounding and quantization.
    assert result.judged_by == "float32 evaluation"
    assert verdict.reference.candidate <= verdict.reference.bound
    assert result.passed
    corrupted = _loaded(quantized(tiny_lm(bf16, fused=True, epsilon=0.5)), tmp_path / "corrupted.onnx")
    assert not check_fused(original, corrupted, CheckInputs(dims={"sequence": 64})).passed


def test_models_onnxruntime_cannot_load_run_in_the_reference_evaluator(tmp_path: Path) -> None:
    # dynamo's opset-23 fp16 Gemma3: RMSNormalization of fp16 X with an fp32 scale, which the schema allows and the
    # reference evaluator runs, but onnxruntime's expansion of it mixes fp16 and fp32 in one Mul and does not load.
    graph = helper.make_graph(
        [helper.make_node("RMSNormalization", ["x", "scale"], ["y"], axis=-1, epsilon=1e-6, name="norm")],
        "mixed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])],
        [numpy_helper.from_array(np.array([1.0, 2.0, 3.0, 4.0], np.float32), "scale")],
    )
    model = _loaded(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 23)]), tmp_path / "mixed.onnx")
    result = check_fused(model, model)
    assert result.passed
    (note,) = result.steps[0].notes
    assert "onnxruntime cannot load it" in note
    assert note.endswith("both models run in onnx's reference evaluator instead")


def test_16_bit_weights_in_external_data_are_widened_without_being_read(tmp_path: Path) -> None:
    from support.models import save_external

    # 2 MiB of fp16: above trtfuse.model.onnx_file.SMALL_TENSOR_BYTES, so the loaded model holds only a reference to it.
    weight = numpy_helper.from_array(np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float16), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["y"], name="project")],
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["batch", 1024])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, ["batch", 1024])],
        [weight],
    )
    path = save_external(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    loaded = load_model(path)
    result = check_fused(loaded, loaded)
    assert result.judged_by == "float32 evaluation"
    (verdict,) = result.errors
    assert verdict.reference.original > 0.0
    assert result.passed


def test_check_says_what_it_left_out(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from trtfuse.cli.main import cli

    original = tmp_path / "original.onnx"
    fused = tmp_path / "fused.onnx"
    onnx.save_model(_with_noise_output(embedding_norm_model(fused=False)), str(original))
    onnx.save_model(_with_noise_output(embedding_norm_model(fused=True)), str(fused))
    result = CliRunner().invoke(cli, ["check", str(original), str(fused)])
    assert result.exit_code == 0, result.output
    assert "left out  (left out: two runs of the original differ (max abs" in result.output
    assert "all 1 outputs pass (within tolerance of the original), 1 left out" in result.output


def test_onnxruntime_rounds_every_16_bit_value_as_the_graph_says() -> None:
    # Pow -> ReduceMean -> Sqrt -> Div in fp16: onnxruntime's CPU build has fp16 kernels for none of them.
    graph = helper.make_graph(
        [
            helper.make_node("Pow", ["x", "two"], ["square"]),
            helper.make_node("ReduceMean", ["square"], ["mean"], axes=[-1]),
            helper.make_node("Sqrt", ["mean"], ["root"]),
            helper.make_node("Div", ["x", "root"], ["y"]),
        ],
        "chain",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [512, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT16, [512, 16])],
        [numpy_helper.from_array(np.array(2.0, np.float16), "two")],
    )
    model = LoadedModel(model=helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path=Path("m"))
    x = np.random.default_rng(0).standard_normal((512, 16)).astype(np.float16)
    x32 = x.astype(np.float32)
    square = (x32 * x32).astype(np.float16).astype(np.float32)
    mean = square.mean(axis=-1, keepdims=True).astype(np.float16).astype(np.float32)
    per_op = (x32 / np.sqrt(mean).astype(np.float16).astype(np.float32)).astype(np.float16)
    in_float32 = (x32 / np.sqrt((x32 * x32).mean(axis=-1, keepdims=True))).astype(np.float16)
    assert not np.array_equal(per_op, in_float32)
    (y,) = CpuSession(model).run({"x": x}).values()
    np.testing.assert_array_equal(y, per_op)


class _UninitialisedRows(CpuSession):
    """The original on the CPU, with every row of a window cache past the resident ones overwritten by fresh garbage
    on each run: what onnxruntime leaves there is unspecified (uninitialised memory)."""

    def __init__(self, model: LoadedModel, window: int) -> None:
        super().__init__(model)
        self.window = window
        self.rng = np.random.default_rng(7)

    def run(self, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = dict(super().run(feed))
        total = feed["attention_mask"].shape[1]
        for name in ("present.0.key", "present.0.value"):
            garbled = outputs[name].copy()
            garbled[:, :, min(total, self.window) :] = self.rng.standard_normal(garbled[:, :, total:].shape)
            outputs[name] = garbled
        return outputs


def _window_verdict(tmp_path: Path, perturb_resident: bool = False) -> CheckResult:
    window = 16
    original = _loaded(windowed_genai_model(window), tmp_path / "windowed.onnx")
    runner = _UninitialisedRows(original, window)
    candidate = _UninitialisedRows(original, window)

    def run_candidate(feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = candidate.run(feed)
        if perturb_resident:
            outputs["present.0.key"][:, :, 0] += 0.5
        return outputs

    feeds = default_feeds(original.model, seed=0)
    return judge_steps(runner, contextlib.nullcontext(run_candidate), feeds, judge_for(original, None), seed=0)


def test_window_caches_are_judged_on_their_resident_rows_only(tmp_path: Path) -> None:
    result = _window_verdict(tmp_path)
    assert result.passed and [step.name for step in result.steps] == ["prefill", "decode"]
    for step, total in zip(result.steps, (5, 6), strict=True):
        verdicts = {output.name: output for output in step.outputs}
        # Judged, not "left out: two runs of the original differ".
        assert verdicts["present.0.key"].passed is True and verdicts["present.0.value"].passed is True
        assert any(f"present.0.key [0, {total})" in note for note in step.notes), step.notes


def test_a_window_cache_wrong_in_a_resident_row_fails(tmp_path: Path) -> None:
    result = _window_verdict(tmp_path, perturb_resident=True)
    assert not result.passed
    assert all(
        output.passed is False for step in result.steps for output in step.outputs if output.name == "present.0.key"
    )


def test_check_runs_a_windowed_genai_model_with_no_options(tmp_path: Path) -> None:
    # Before the window rule the prefill fed the window cache 0 rows and onnxruntime refused the original.
    original = _loaded(windowed_genai_model(16), tmp_path / "windowed.onnx")
    result = check_fused(original, original)
    assert result.passed and [step.name for step in result.steps] == ["prefill", "decode"]


@pytest.mark.parametrize(
    ("dequantize", "same_values", "kept"),
    [("exact", True, False), ("scale", True, False), ("scale", False, True), ("zero-point", False, True)],
)
def test_the_float32_evaluation_drops_only_pairs_that_round(dequantize: str, same_values: bool, kept: bool) -> None:
    # ModelOpt's fp16 exports give the DequantizeLinear a scale of its own name with the same value: still a rounding.
    # A scale or zero point that differs rescales or shifts the value: arithmetic the evaluation must keep.
    from trtfuse.verify.widening import widen_to_float32

    from support.graphs import qdq_norm

    model = qdq_norm("output", dequantize=dequantize)
    if dequantize == "scale" and same_values:
        quantize = next(node for node in model.graph.node if node.op_type == "QuantizeLinear")
        dequantize_node = next(node for node in model.graph.node if node.op_type == "DequantizeLinear")
        initializers = {tensor.name: tensor for tensor in model.graph.initializer}
        initializers[dequantize_node.input[1]].CopyFrom(
            numpy_helper.from_array(numpy_helper.to_array(initializers[quantize.input[1]]), dequantize_node.input[1])
        )
    ops = [node.op_type for node in widen_to_float32(model).graph.node]
    assert ("QuantizeLinear" in ops and "DequantizeLinear" in ops) is kept
