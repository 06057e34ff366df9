"""make_feed, tolerances and check_fused on a hand-built original / fused model pair."""

from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.check import check_fused, run_model
from trtfuse.contract import WeightMode
from trtfuse.errors import TrtfuseError
from trtfuse.inputs import DEFAULT_BATCH, DEFAULT_DIM, make_feed
from trtfuse.io import LoadedModel, load_model
from trtfuse.tolerances import Tolerance, output_error, tolerance_for

VOCAB = 50
HIDDEN = 32
EPSILON = 1e-6


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
    result = check_fused(original, fused, seed=3)
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
    with pytest.raises(TrtfuseError, match=r"onnxruntime cannot run it: .*--dim SYMBOL=N or --shape NAME=D0xD1"):
        run_model(loaded, {"input_ids": np.zeros((2, 3, 4), np.int64)})


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
    with pytest.raises(TrtfuseError, match="--shape names no graph input: tokens"):
        make_feed(model, 0, shapes={"tokens": (1, 9)})
    with pytest.raises(TrtfuseError, match="--dim names no symbolic dim of a graph input: batch"):
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
    from graphs import NormSpec, single_norm

    from trtfuse.fuse import fuse_model

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
