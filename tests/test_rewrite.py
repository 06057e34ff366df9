"""rewrite: one contract node per match, a valid ONNX model, and the same numbers as the original graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime
import pytest
from graphs import (
    ACCEPTED,
    REJECTED,
    AttentionSpec,
    NormSpec,
    attention_block,
    before_cast_gate,
    fused_op_norm,
    partial_weight,
    shared_normalized,
    single_norm,
)
from onnx.reference import ReferenceEvaluator

from trtfuse import contract
from trtfuse.patterns import find_norms
from trtfuse.reference import lower_fused_nodes
from trtfuse.rewrite import FusedNode, rewrite
from trtfuse.tolerances import tolerance_for

NORM_OPS = {"ReduceMean", "ReduceSum", "ReduceSumSquare", "Sqrt", "Reciprocal", "Pow"}


def fuse(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[FusedNode]]:
    graph = gs.import_onnx(model)
    fused = rewrite(graph, find_norms(graph))
    exported = gs.export_onnx(graph)
    onnx.checker.check_model(exported, full_check=True)
    return onnx.shape_inference.infer_shapes(exported, strict_mode=True), fused


def feed_for(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feed = {}
    for value in model.graph.input:
        shape = [dim.dim_value for dim in value.type.tensor_type.shape.dim]
        feed[value.name] = rng.normal(0.0, 2.0, shape).astype(np.float32)
    return feed


def run(model: onnx.ModelProto, feed: dict[str, np.ndarray], dtype: str) -> list[np.ndarray]:
    """onnxruntime, except for bfloat16 graphs: its CPU provider has no bfloat16 Mul or MatMul, onnx's evaluator has."""
    if dtype == "bfloat16":
        return ReferenceEvaluator(model).run(None, feed)
    options = onnxruntime.SessionOptions()
    # onnxruntime's optimiser fuses RMSNorm chains into its own op with other rounding: run the graph as written.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def assert_same_numbers(original: onnx.ModelProto, fused: onnx.ModelProto, dtype: str) -> None:
    """The fused model, its trtfuse nodes lowered to the contract's reference ops, computes what the original does."""
    feed = feed_for(original)
    expected = run(original, feed, dtype)
    actual = run(lower_fused_nodes(fused), feed, dtype)
    rtol = tolerance_for(dtype).rtol
    for want, got in zip(expected, actual, strict=True):
        assert got.shape == want.shape
        relative = np.abs(got.astype(np.float64) - want).max() / np.abs(want).max()
        assert relative <= rtol, (relative, rtol)


def fused_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN]


def attributes(node: onnx.NodeProto) -> dict:
    return {attribute.name: onnx.helper.get_attribute_value(attribute) for attribute in node.attribute}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_single_norm_becomes_one_node(name: str) -> None:
    spec, opset = ACCEPTED[name]
    original = single_norm(spec, opset)
    fused, records = fuse(original)
    [node] = fused_nodes(fused)
    assert node.op_type == contract.RMS_NORM_OP
    assert not NORM_OPS & {other.op_type for other in fused.graph.node}
    attrs = attributes(node)
    assert attrs[contract.ATTR_NAMESPACE] == b"trtfuse" and attrs[contract.ATTR_VERSION] == b"1"
    assert attrs[contract.ATTR_HIDDEN] == spec.hidden
    assert set(attrs) == {contract.ATTR_NAMESPACE, contract.ATTR_VERSION, *contract.RMS_NORM_FIELDS}
    assert len(node.input) == (1 if spec.weight == "none" else 2)
    assert [output.name for output in fused.graph.output] == [output.name for output in original.graph.output]
    assert {"domain": "trtfuse", "version": 1} in [
        {"domain": opset.domain, "version": opset.version} for opset in fused.opset_import
    ]
    assert not any("epsilon" in tensor.name for tensor in fused.graph.initializer)
    [record] = records
    assert record.kind == contract.RMS_NORM_OP and record.hidden_sizes == (spec.hidden,)
    assert record.epsilon == attrs[contract.ATTR_EPSILON] and len(record.replaced) >= 5
    assert_same_numbers(original, fused, spec.dtype)


def test_fused_node_output_keeps_its_dtype_in_value_info() -> None:
    fused, _ = fuse(single_norm(NormSpec(dtype="float16")))
    [node] = fused_nodes(fused)
    types = {value.name: value.type.tensor_type.elem_type for value in fused.graph.value_info}
    assert types[node.output[0]] == onnx.TensorProto.FLOAT16


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    "kind", ["RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"]
)
def test_fused_norm_op_becomes_one_node(kind: str, dtype: str) -> None:
    original = fused_op_norm(kind, dtype)
    fused, _ = fuse(original)
    [node] = fused_nodes(fused)
    assert {other.op_type for other in fused.graph.node} <= {"Cast", "Add", contract.RMS_NORM_OP}
    if kind.startswith("Skip"):
        adds = [other for other in fused.graph.node if other.op_type == "Add"]
        assert len(adds) == 2 and node.input[0] == adds[-1].output[0]
    # Nothing on this machine runs onnxruntime's own norm ops in bfloat16: onnx's evaluator does not know them.
    if dtype != "bfloat16" or kind == "RMSNormalization":
        assert_same_numbers(original, fused, dtype)


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_graph_is_left_alone(name: str) -> None:
    original = REJECTED[name][0]()
    fused, records = fuse(original)
    assert not records and not fused_nodes(fused)
    assert_same_numbers(original, fused, "float32")


@pytest.mark.parametrize("case", ["gate", "wrong-length", "scalar"])
def test_multiply_outside_the_norm_stays(case: str) -> None:
    original = partial_weight(case, "float16")
    fused, _ = fuse(original)
    [node] = fused_nodes(fused)
    assert len(node.input) == 1
    assert [other.op_type for other in fused.graph.node if other.input[0] == node.output[0]] == ["Mul"]
    assert_same_numbers(original, fused, "float16")


@pytest.mark.parametrize("build", [lambda: shared_normalized("float16"), lambda: before_cast_gate("float16")])
def test_prefix_fusion_keeps_numerics(build) -> None:
    original = build()
    fused, _ = fuse(original)
    assert len(fused_nodes(fused)) == 1
    assert_same_numbers(original, fused, "float16")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", ["qk-head-dim", "qk-head-dim-transposed", "qk-full-width", "mla-latent"])
def test_qk_pair_becomes_one_node(layout: str, dtype: str) -> None:
    spec = AttentionSpec(layout, dtype)
    original = attention_block(spec)
    fused, records = fuse(original)
    ops = sorted(node.op_type for node in fused_nodes(fused))
    assert ops == [contract.QK_NORM_OP, contract.RMS_NORM_OP]
    [qk] = [node for node in fused_nodes(fused) if node.op_type == contract.QK_NORM_OP]
    attrs = attributes(qk)
    assert set(attrs) == {contract.ATTR_NAMESPACE, contract.ATTR_VERSION, *contract.QK_NORM_FIELDS}
    assert len(qk.input) == 4 and len(qk.output) == 2
    [qk_record] = [record for record in records if record.kind == contract.QK_NORM_OP]
    assert qk_record.hidden_sizes == (attrs[contract.ATTR_Q_HIDDEN], attrs[contract.ATTR_K_HIDDEN])
    assert layout in qk_record.tags
    assert_same_numbers(original, fused, dtype)


def test_gemma_qk_pair_numerics() -> None:
    norm = NormSpec(weight="before-cast", offset="add-one-first")
    original = attention_block(AttentionSpec("qk-head-dim-transposed", "float16", norm=norm))
    fused, _ = fuse(original)
    [qk] = [node for node in fused_nodes(fused) if node.op_type == contract.QK_NORM_OP]
    assert attributes(qk)[contract.ATTR_WEIGHT_OFFSET] == 1.0
    assert_same_numbers(original, fused, "float16")


def test_unpaired_qk_norms_become_rms_norm_nodes() -> None:
    original = attention_block(AttentionSpec("qk-head-dim", q_epsilon=1e-6, k_epsilon=1e-5))
    fused, _ = fuse(original)
    assert [node.op_type for node in fused_nodes(fused)] == [contract.RMS_NORM_OP] * 3
    assert_same_numbers(original, fused, "float32")


def test_cycle_is_not_created() -> None:
    original = attention_block(AttentionSpec("qk-head-dim", kv_heads=4, k_reads_q=True))
    fused, _ = fuse(original)
    assert [node.op_type for node in fused_nodes(fused)] == [contract.RMS_NORM_OP] * 3
    assert_same_numbers(original, fused, "float32")
