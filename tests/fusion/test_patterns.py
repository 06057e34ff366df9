"""find_norms on synthetic graphs: every accepted spelling matched with the right parameters, every near miss named."""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_graphsurgeon as gs
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx.reference import ReferenceEvaluator

from trtfuse.cli.main import cli
from trtfuse.contract import WeightMode
from trtfuse.fusion.fuse import fuse_model
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions
from trtfuse.fusion.patterns import NormSearch, find_norms
from trtfuse.fusion.patterns.queries import dtype_name, qdq_mismatch

from support.graphs import (
    ACCEPTED,
    ACCEPTED_TAGS,
    BATCH,
    HIDDEN,
    NUMPY_TYPES,
    REJECTED,
    SEQUENCE,
    AttentionSpec,
    Builder,
    NormSpec,
    attention_block,
    autocast_norm,
    before_cast_gate,
    broadcasting_constant,
    expected,
    foreign_domain_norm,
    fused_op_norm,
    layer_norm_sum_mean,
    mixed_precision_norm,
    mixed_rms_normalization,
    no_epsilon_norm,
    overridable_constant,
    partial_weight,
    qdq_norm,
    rewidened_weight,
    rms_norm,
    rms_normalization_cast_back,
    shared_normalized,
    single_norm,
    stale_value_info,
    symbolic_hidden,
    unknown_shape_fused_norm,
    widened_norm,
)

# The pass as it was before the quantized ops: every Q/DQ pair stays in the graph (tests/fusion/test_quant.py has the
# pairs taken in).
NO_QUANT = FusionOptions(fuse_quant=False)


def search(model: onnx.ModelProto, options: FusionOptions = DEFAULT_FUSION) -> NormSearch:
    return find_norms(gs.import_onnx(model), options)


def only_match(model: onnx.ModelProto, options: FusionOptions = DEFAULT_FUSION):
    found = search(model, options)
    assert not found.qk_norm_pairs
    assert len(found.matches) == 1, found
    return found.matches[0], found


def output_source(model: onnx.ModelProto) -> str:
    """The tensor the first graph output is cast from: the norm's output in single-norm graphs."""
    name = model.graph.output[0].name
    return next(node.input[0] for node in model.graph.node if node.output[0] == name)


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_accepted_spelling_matches(name: str) -> None:
    spec, opset = ACCEPTED[name]
    model = single_norm(spec, opset)
    match, found = only_match(model)
    want = expected(spec)
    assert match.params.epsilon == want.epsilon
    assert match.params.weight_offset == want.weight_offset
    assert match.params.weight_mode == want.weight_mode
    assert match.hidden_size == want.hidden
    assert dtype_name(match.x) == dtype_name(match.y) == spec.dtype
    assert match.x.name == "x" or dtype_name(match.x.inputs[0].inputs[0]) == "float32"
    # In fp32 graphs the no-op Cast to the fp32 graph output is part of the chain.
    assert match.y.name in (output_source(model), model.graph.output[0].name)
    assert (match.weight is None) == (spec.weight == "none")
    assert {"decomposed", *ACCEPTED_TAGS.get(name, ())} <= set(match.tags)
    assert not found.near_misses
    ops = {node.op for node in match.nodes}
    assert {"Add"} <= ops and ops & {"ReduceMean", "ReduceSum", "ReduceSumSquare"}


def test_epsilon_is_the_float32_the_graph_adds() -> None:
    match, _ = only_match(single_norm(NormSpec(epsilon=1e-6)))
    assert match.params.epsilon == 9.999999974752427e-07


def test_weight_offset_and_dtype_for_gemma() -> None:
    match, _ = only_match(single_norm(NormSpec(dtype="bfloat16", weight="before-cast", offset="add-one-first")))
    assert (match.params.weight_mode, match.params.weight_offset) == (WeightMode.BEFORE_CAST, 1.0)
    assert isinstance(match.weight, gs.Constant) and dtype_name(match.weight) == "bfloat16"
    assert {node.op for node in match.nodes} >= {"Cast", "Add", "Mul"}


@pytest.mark.parametrize("name", sorted(REJECTED))
def test_rejected_form_is_a_near_miss(name: str) -> None:
    build, reason = REJECTED[name]
    found = search(build())
    assert not found.matches and not found.qk_norm_pairs
    assert any(reason in miss.reason for miss in found.near_misses), found.near_misses
    assert all(miss.node for miss in found.near_misses)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize(
    ("kind", "mode", "tag"),
    [
        ("RMSNormalization", WeightMode.AFTER_CAST, "onnx-rms-normalization"),
        ("SimplifiedLayerNormalization", WeightMode.BEFORE_CAST, "ort-simplified-layer-norm"),
        ("SkipSimplifiedLayerNormalization", WeightMode.BEFORE_CAST, "ort-skip-simplified-layer-norm"),
    ],
)
def test_fused_norm_ops(kind: str, mode: WeightMode, tag: str, dtype: str) -> None:
    match, _ = only_match(fused_op_norm(kind, dtype, epsilon=1e-6))
    # For float32 activations both weighted modes are one function, always written AFTER_CAST.
    expected_mode = WeightMode.AFTER_CAST if dtype == "float32" and mode == WeightMode.BEFORE_CAST else mode
    # The skip op here has a bias: no add-norm, and its tag says so.
    tags = (tag, "skip-bias-outside") if kind.startswith("Skip") else (tag,)
    assert (match.params.weight_mode, match.tags, match.hidden_size) == (expected_mode, tags, 64)
    assert match.params.epsilon == 9.999999974752427e-07
    assert dtype_name(match.x) == dtype
    if kind.startswith("Skip"):
        assert match.skip_inputs[0].name != match.x.name
        assert len(match.skip_inputs) == 2 and match.skip_sum is not None


def test_rms_normalization_over_several_axes_is_rejected() -> None:
    found = search(fused_op_norm("RMSNormalization", axis=1))
    assert not found.matches
    assert "not over the last axis" in found.near_misses[0].reason


def test_fused_norm_whose_output_dtype_differs_is_rejected() -> None:
    model = fused_op_norm("SimplifiedLayerNormalization", "float16")
    scale = model.graph.node[1].input[1]
    initializer = next(tensor for tensor in model.graph.initializer if tensor.name == scale)
    initializer.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(initializer).astype("float32"), scale))
    found = search(model)
    assert not found.matches and "has dtype float32, the input float16" in found.near_misses[0].reason


@pytest.mark.parametrize(("dtype", "stash_type"), [("float32", 11), ("float16", 6)])
def test_fused_norm_with_stash_type_not_float32_is_rejected(dtype: str, stash_type: int) -> None:
    found = search(fused_op_norm("RMSNormalization", dtype, stash_type=stash_type))
    assert not found.matches and "stash_type" in found.near_misses[0].reason


@pytest.mark.parametrize(
    ("dtype", "stash_type", "tag"), [("float16", 10, "stash-float16"), ("bfloat16", 16, "stash-bfloat16")]
)
def test_fused_norm_with_a_16_bit_stash_is_fused_tagged(dtype: str, stash_type: int, tag: str) -> None:
    # The kernels reduce in float32: at least as precise as the 16-bit stash the node asks for, so fused and tagged.
    match, _ = only_match(fused_op_norm("RMSNormalization", dtype, stash_type=stash_type))
    assert tag in match.tags and match.params.weight_mode == WeightMode.AFTER_CAST


@pytest.mark.parametrize(
    ("kind", "epsilon"),
    [("RMSNormalization", 1e-5), ("SimplifiedLayerNormalization", 1e-5), ("SkipSimplifiedLayerNormalization", 1e-12)],
)
def test_fused_norm_without_epsilon_takes_the_op_default(kind: str, epsilon: float) -> None:
    model = fused_op_norm(kind, "float16")
    (node,) = [node for node in model.graph.node if node.op_type == kind]
    node.attribute.remove(next(attribute for attribute in node.attribute if attribute.name == "epsilon"))
    match, _ = only_match(model)
    assert match.params.epsilon == float(np.float32(epsilon))


@pytest.mark.parametrize(
    ("case", "reason"),
    [("gate", "not a constant"), ("wrong-length", "not a weight of the hidden size"), ("scalar", "of shape []")],
)
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_multiply_that_is_not_a_weight_stays_outside(case: str, reason: str, dtype: str) -> None:
    model = partial_weight(case, dtype)
    match, found = only_match(model)
    assert match.weight is None and match.params.weight_mode == WeightMode.NONE
    assert dtype_name(match.y) == dtype
    assert [consumer.op for consumer in match.y.outputs] == ["Mul"]
    assert any(reason in miss.reason and "weight multiply not fused" in miss.reason for miss in found.near_misses)


def test_normalised_value_read_twice_fuses_without_the_weight() -> None:
    match, _ = only_match(shared_normalized("float16"))
    assert match.params.weight_mode == WeightMode.NONE and dtype_name(match.y) == "float16"
    assert sorted(consumer.op for consumer in match.y.outputs) == ["Mul", "Relu"]


def test_fp32_multiply_by_a_gate_fuses_the_fp32_part() -> None:
    match, _ = only_match(before_cast_gate("float16"))
    assert dtype_name(match.x) == dtype_name(match.y) == "float32"
    assert match.x.inputs[0].op == "Cast" and match.params.weight_mode == WeightMode.NONE


LAYOUTS = ["qk-head-dim", "qk-head-dim-transposed", "qk-full-width", "mla-latent"]


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_qk_norms_pair_per_attention_block(layout: str, dtype: str) -> None:
    spec = AttentionSpec(layout, dtype)
    found = search(attention_block(spec))
    assert len(found.qk_norm_pairs) == 1, found.near_misses
    pair = found.qk_norm_pairs[0]
    assert layout in pair.q.tags and layout in pair.k.tags
    hidden = {
        "qk-head-dim": (16, 16),
        "qk-head-dim-transposed": (16, 16),
        "qk-full-width": (64, 32),
        "mla-latent": (spec.q_rank, spec.kv_rank),
    }[layout]
    assert (pair.q.hidden_size, pair.k.hidden_size) == hidden
    assert pair.q.params.weight_mode == pair.k.params.weight_mode == expected(spec.norm).weight_mode
    [input_norm] = found.matches
    assert input_norm.x.name == "x" or input_norm.hidden_size == 64
    assert not any(tag.startswith(("qk-", "mla-")) for tag in input_norm.tags)


@pytest.mark.parametrize("bias", ["constant", "cast", "identity"])
@pytest.mark.parametrize("layout", ["qk-head-dim", "qk-full-width"])
def test_qk_norms_behind_a_projection_bias_pair_however_the_bias_is_spelled(layout: str, bias: str) -> None:
    # One rule for "this operand is a constant" (queries.is_constant_value), as the residual matcher has it: a bias
    # Add(proj, Cast(const)) or Add(proj, Identity(const)) hid the projection, and the q/k norms stayed two norms.
    model = attention_block(AttentionSpec(layout, bias=bias))
    found = search(model)
    [pair] = found.qk_norm_pairs
    assert layout in pair.q.tags and layout in pair.k.tags
    assert not found.residual_near_misses
    fused = fuse_model(model).model
    assert [node.op_type for node in fused.graph.node if node.domain == "trtfuse"].count("TrtfuseQkNorm") == 1
    feed = {"x": np.random.default_rng(5).standard_normal((BATCH, SEQUENCE, HIDDEN)).astype(np.float32)}
    expected_outputs = ort.InferenceSession(model.SerializeToString()).run(None, feed)
    lowered = ort.InferenceSession(lower_fused_nodes(fused).SerializeToString()).run(None, feed)
    for got, want in zip(lowered, expected_outputs, strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_mla_latent_read_through_a_reshape() -> None:
    found = search(attention_block(AttentionSpec("mla-latent", latent_reshape=True)))
    [pair] = found.qk_norm_pairs
    assert "mla-latent" in pair.q.tags and "mla-latent" in pair.k.tags


def test_qk_norms_with_different_epsilon_stay_separate() -> None:
    found = search(attention_block(AttentionSpec("qk-head-dim", q_epsilon=1e-6, k_epsilon=1e-5)))
    assert not found.qk_norm_pairs
    assert sum("qk-head-dim" in match.tags for match in found.matches) == 2


def test_qk_norms_that_would_form_a_cycle_stay_separate() -> None:
    found = search(attention_block(AttentionSpec("qk-head-dim", kv_heads=4, k_reads_q=True)))
    assert not found.qk_norm_pairs
    assert len(found.matches) == 3


def test_gemma_qk_norms_pair_with_offset() -> None:
    norm = NormSpec(weight="before-cast", offset="add-one-first")
    found = search(attention_block(AttentionSpec("qk-head-dim-transposed", "bfloat16", norm=norm)))
    [pair] = found.qk_norm_pairs
    assert (pair.q.params.weight_offset, pair.q.params.weight_mode) == (1.0, WeightMode.BEFORE_CAST)


def test_lazily_loaded_weights_are_not_read(tmp_path) -> None:
    path = tmp_path / "model.onnx"
    onnx.save_model(single_norm(NormSpec(dtype="bfloat16")), str(path), save_as_external_data=True, size_threshold=100)
    model = onnx.load(str(path), load_external_data=False)
    graph = gs.import_onnx(model)
    match, _ = only_match_graph(graph)
    assert match.params.epsilon == 9.999999974752427e-07
    weight = match.weight
    assert isinstance(weight, gs.Constant) and isinstance(weight._values, gs.ir.tensor.LazyValues)


def only_match_graph(graph: gs.Graph):
    found = find_norms(graph)
    assert len(found.matches) == 1
    return found.matches[0], found


def test_float64_core_is_rejected() -> None:
    # Fusing would move the reduction from float64 to the kernels' float32: a loss of precision, so never fused.
    found = search(single_norm(NormSpec(dtype="float32", core_dtype="float64")))
    assert not found.matches
    assert any("float64" in miss.reason for miss in found.near_misses), found.near_misses


@pytest.mark.parametrize("op", ["Pow", "Add", "Sqrt", "Div", "Mul"])
def test_an_op_of_another_domain_is_not_the_onnx_op(op: str) -> None:
    found = search(foreign_domain_norm(op))
    assert not found.matches
    assert any(f"{op} of domain custom.ops, not the ONNX op" in miss.reason for miss in found.near_misses)


def test_a_local_function_named_like_an_onnx_op_is_not_the_onnx_op() -> None:
    found = search(foreign_domain_norm("Sqrt", local_function=True))
    assert not found.matches
    assert "redefines the ONNX op(s) Sqrt" in found.near_misses[0].reason


@pytest.mark.parametrize("which", ["exponent", "epsilon", "numerator"])
def test_a_scalar_of_higher_rank_is_rejected(which: str) -> None:
    # x [2, 3, 64] with a [1, 1, 1, 1] constant gives a [1, 2, 3, 64] result: not the shape a fused node writes.
    found = search(broadcasting_constant(which))
    assert not found.matches
    assert any("would broadcast" in miss.reason and which in miss.reason for miss in found.near_misses)


@pytest.mark.parametrize(("which", "reason"), [("weight", "of shape [1, 1, 1, 64]"), ("offset", "has rank 4")])
def test_a_weight_of_higher_rank_stays_outside(which: str, reason: str) -> None:
    match, found = only_match(broadcasting_constant(which))
    assert match.weight is None and match.params.weight_mode == WeightMode.NONE
    assert [consumer.op for consumer in match.y.outputs] == ["Mul"]
    assert any(reason in miss.reason and "weight multiply not fused" in miss.reason for miss in found.near_misses)


@pytest.mark.parametrize("spelling", ["mul", "div"])
def test_layer_norm_with_a_reduce_sum_mean_is_rejected(spelling: str) -> None:
    found = search(layer_norm_sum_mean(spelling))
    assert not found.matches
    assert any("LayerNorm" in miss.reason for miss in found.near_misses)


def test_hidden_size_comes_from_the_data_not_a_stale_value_info() -> None:
    match, _ = only_match(stale_value_info(claimed=32))
    assert match.hidden_size == HIDDEN and match.weight is not None


def test_symbolic_last_dim_is_not_fused_when_decomposed() -> None:
    found = search(symbolic_hidden("decomposed"))
    assert not found.matches
    assert "no static length the graph proves" in found.near_misses[0].reason


@pytest.mark.parametrize("kind", ["RMSNormalization", "SimplifiedLayerNormalization"])
def test_fused_op_takes_the_hidden_size_from_its_scale(kind: str) -> None:
    # Each op requires the scale's length to be the normalised length: the weight proves H on a symbolic dim.
    match, _ = only_match(symbolic_hidden(kind))
    assert match.hidden_size == HIDDEN


def test_fused_op_without_shape_information_takes_the_scale_length() -> None:
    match, _ = only_match(unknown_shape_fused_norm())
    assert match.hidden_size == HIDDEN


@pytest.mark.parametrize("root", ["div-one", "pow-half"])
def test_norm_without_epsilon_fuses_with_epsilon_zero(root: str) -> None:
    match, found = only_match(no_epsilon_norm(root))
    assert (match.params.epsilon, match.params.weight_mode) == (0.0, WeightMode.AFTER_CAST)
    assert "no-epsilon" in match.tags and not found.near_misses


@pytest.mark.parametrize(
    ("order", "mode"), [("cast-then-weight", WeightMode.AFTER_CAST), ("weight-then-cast", WeightMode.BEFORE_CAST)]
)
@pytest.mark.parametrize("out_dtype", ["float16", "bfloat16"])
def test_fp32_input_with_16_bit_output_is_one_match(order: str, mode: WeightMode, out_dtype: str) -> None:
    # optimum fp16 exports with an fp32 residual stream: the cast and the weight belong to the norm.
    model = mixed_precision_norm(order, out_dtype)
    match, found = only_match(model)
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == ("float32", out_dtype, mode)
    assert match.x.name == "x" and match.y.name == output_source(model)
    assert dtype_name(match.weight) == ("float32" if order == "weight-then-cast" else out_dtype)
    assert {node.op for node in match.nodes} >= {"Cast", "Mul"} and not found.near_misses


@pytest.mark.parametrize(
    ("x_dtype", "scale_dtype", "mode"),
    [
        ("float16", "float32", WeightMode.AFTER_CAST),
        ("bfloat16", "float32", WeightMode.AFTER_CAST),
        ("float32", "float16", WeightMode.BEFORE_CAST),
    ],
)
def test_rms_normalization_with_mixed_dtypes(x_dtype: str, scale_dtype: str, mode: WeightMode) -> None:
    match, _ = only_match(mixed_rms_normalization(x_dtype, scale_dtype))
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == (x_dtype, scale_dtype, mode)


def test_rms_normalization_between_two_16_bit_dtypes_is_rejected() -> None:
    found = search(mixed_rms_normalization("float16", "bfloat16"))
    assert not found.matches and "float16 in, bfloat16 out" in found.near_misses[0].reason


@pytest.mark.parametrize("which", ["epsilon", "weight"])
def test_initializers_listed_as_inputs_stay_overridable(which: str) -> None:
    model = overridable_constant(which)
    name = model.graph.input[-1].name
    fused = fuse_model(model).model
    assert name in {value.name for value in fused.graph.input}
    assert name in {tensor.name for tensor in fused.graph.initializer}
    default = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == name))
    feed = {
        "x": np.random.default_rng(0).standard_normal((2, 3, HIDDEN)).astype(np.float32),
        name: np.asarray(default * 3),
    }
    expected_output = ort.InferenceSession(model.SerializeToString()).run(None, feed)[0]
    fused_output = ort.InferenceSession(lower_fused_nodes(fused).SerializeToString()).run(None, feed)[0]
    np.testing.assert_allclose(fused_output, expected_output, rtol=1e-5, atol=1e-6)


def run_model(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> np.ndarray:
    options = ort.SessionOptions()
    # onnxruntime's optimiser fuses RMSNorm chains into its own op with other rounding: run the graph as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    return ort.InferenceSession(model.SerializeToString(), options).run(None, feed)[0]


def _qdq_feed() -> dict[str, np.ndarray]:
    # Rows whose rms spans more than a decade: the pairs clip some of them, as a calibrated range does.
    rng = np.random.default_rng(0)
    return {"x": (rng.standard_normal((2, 3, HIDDEN)) * rng.uniform(0.2, 5, (2, 3, 1))).astype(np.float32)}


@pytest.mark.parametrize("dequantize", ["exact", "scale", "zero-point"])
@pytest.mark.parametrize("place", ["rsqrt", "x"])
def test_qdq_inside_the_chain_leaves_the_norm_unfused_naming_the_pair(place: str, dequantize: str) -> None:
    # An exact pair rounds and clips r (or the x only the scaling Mul reads) to its calibrated range; the fused node
    # computes them in float, so dropping the pair is not a rounding removed: ModelOpt int8 OLMo2 clips every r of
    # a k_norm at prefill and the fused model was off by O(1). A pair that does not undo itself is arithmetic.
    model = qdq_norm(place, dequantize=dequantize)
    found = search(model, NO_QUANT)
    assert not found.matches and not found.qk_norm_pairs
    [miss] = found.near_misses
    quantize = next(node.name for node in model.graph.node if node.op_type == "QuantizeLinear")
    assert f"the pair {quantize} -> " in miss.reason
    if dequantize == "exact":
        assert "rounds and clips" in miss.reason and miss.reason.endswith("left unfused"), miss.reason
    else:
        assert "is arithmetic, not a rounding" in miss.reason and miss.reason.endswith("not a norm"), miss.reason
    assert ("inverse root" if place == "rsqrt" else "the x that") in miss.reason
    result = fuse_model(model, NO_QUANT)
    assert result.fused == [] and result.report()["near_misses"] == [{"node": miss.node, "reason": miss.reason}]
    np.testing.assert_array_equal(run_model(result.model, _qdq_feed()), run_model(model, _qdq_feed()))


@pytest.mark.parametrize("dequantize", ["exact", "scale", "zero-point"])
def test_qdq_before_the_weight_ends_the_norm_before_the_pair(dequantize: str) -> None:
    # The pair and the weight multiply stay in the graph reading the normalised value, which the fused node computes
    # exactly: the fused model is the original up to float32 rounding of x·r, never the pair dropped.
    model = qdq_norm("normalized", dequantize=dequantize)
    match, found = only_match(model, NO_QUANT)
    assert match.weight is None and match.params.weight_mode is WeightMode.NONE
    assert [reader.op for reader in match.y.outputs] == ["QuantizeLinear"]
    [miss] = found.near_misses
    dequantized = next(node.output[0] for node in model.graph.node if node.op_type == "DequantizeLinear")
    assert miss.node == next(node.name for node in model.graph.node if dequantized in node.input)
    assert "the norm ends before the pair" in miss.reason
    assert ("rounds and clips" if dequantize == "exact" else "is arithmetic, not a rounding") in miss.reason
    feed = _qdq_feed()
    original = run_model(model, feed)
    fused = run_model(lower_fused_nodes(fuse_model(model, NO_QUANT).model), feed)
    # x·r computed in another order may land on the other side of a rounding boundary of the pair: one step.
    step = 4.0 / 127 * (1.25 if dequantize == "scale" else 1.0)
    differs = np.abs(fused - original) > 1e-5 * np.abs(original).max()
    assert differs.mean() < 0.05, differs.mean()
    np.testing.assert_allclose(fused, original, atol=step * 1.5 * 8, rtol=0)


@pytest.mark.parametrize("dequantize", ["scale", "zero-point"])
@pytest.mark.parametrize("place", ["shared-x", "output"])
def test_a_pair_outside_the_chain_stays_outside_whatever_it_computes(place: str, dequantize: str) -> None:
    # On x as it enters (the node reads the dequantized x) or on the output: the fused node computes exactly the
    # chain between them, so even a pair that rescales stays in the graph as written.
    model = qdq_norm(place, dequantize=dequantize)
    match, found = only_match(model, NO_QUANT)
    assert match.weight is not None and not found.near_misses
    feed = _qdq_feed()
    np.testing.assert_allclose(
        run_model(lower_fused_nodes(fuse_model(model, NO_QUANT).model), feed),
        run_model(model, feed),
        rtol=1e-5,
        atol=1e-5,
    )


def test_qdq_on_the_output_stays_after_the_fused_node() -> None:
    match, found = only_match(qdq_norm("output"), NO_QUANT)
    assert [consumer.op for consumer in match.y.outputs] == ["QuantizeLinear"]
    assert match.weight is not None and not found.near_misses
    fused = fuse_model(qdq_norm("output"), NO_QUANT).model
    quantize = next(node for node in fused.graph.node if node.op_type == "QuantizeLinear")
    assert next(node for node in fused.graph.node if quantize.input[0] in node.output).op_type == "TrtfuseRmsNorm"


def test_a_weight_after_widening_the_rounded_fp16_result_is_after_cast_from_fp16() -> None:
    # fp32(fp16(x·r)) · w32 is AFTER_CAST with an fp16 input and a float32 output: R, the node's 16-bit dtype, is x's.
    model = rewidened_weight("float16")
    match, found = only_match(model)
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == ("float16", "float32", WeightMode.AFTER_CAST)
    assert match.weight is not None and not found.near_misses
    feed = {"x": np.random.default_rng(2).standard_normal((2, 3, HIDDEN)).astype(np.float32)}
    fused = lower_fused_nodes(fuse_model(model).model)
    np.testing.assert_array_equal(
        ReferenceEvaluator(fused).run(None, feed)[0], ReferenceEvaluator(model).run(None, feed)[0]
    )


def test_a_weight_after_widening_the_rounded_result_of_an_fp32_input_is_named() -> None:
    # No fused form rounds an fp32 input's result to fp16 and then scales it in fp32: fused up to the rounding.
    match, found = only_match(rewidened_weight("float32"))
    assert match.weight is None and match.output_dtype == "float16"
    assert any("widened again before the weight" in miss.reason for miss in found.near_misses)


@pytest.mark.parametrize(
    ("x_dtype", "cast_to", "mode"),
    [
        ("float16", "float16", WeightMode.AFTER_CAST),
        ("bfloat16", "bfloat16", WeightMode.AFTER_CAST),
        ("float32", "float16", WeightMode.BEFORE_CAST),
    ],
)
def test_fused_op_takes_the_cast_down_of_its_float32_output(x_dtype: str, cast_to: str, mode: WeightMode) -> None:
    match, _ = only_match(rms_normalization_cast_back(x_dtype, cast_to=cast_to))
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == (x_dtype, cast_to, mode)
    assert [node.op for node in match.nodes][-2:] == ["RMSNormalization", "Cast"]


@pytest.mark.parametrize("order", ["cast-then-weight", "weight-then-cast"])
def test_fp32_input_with_16_bit_output_keeps_its_numbers(order: str) -> None:
    model = mixed_precision_norm(order, "float16")
    feed = {"x": np.random.default_rng(1).standard_normal((2, 3, HIDDEN)).astype(np.float32)}
    fused = fuse_model(model).model
    assert [node.op_type for node in fused.graph.node if node.domain == "trtfuse"] == ["TrtfuseRmsNorm"]
    # onnx's evaluator rounds every fp16 step as written (onnxruntime's CPU provider computes fp16 Mul in fp32).
    expected_output = ReferenceEvaluator(model).run(None, feed)[0]
    np.testing.assert_array_equal(ReferenceEvaluator(lower_fused_nodes(fused)).run(None, feed)[0], expected_output)


@pytest.mark.parametrize(("x_dtype", "out_dtype"), [("float16", "bfloat16"), ("bfloat16", "float16")])
def test_a_16_bit_input_widened_and_cast_to_the_other_16_bit_dtype_takes_the_weight(
    x_dtype: str, out_dtype: str, tmp_path
) -> None:
    # fp16 -> fp32, normalised, -> bf16 x a bf16 weight: float32 -> bfloat16 is a pair of the contract, read from the
    # widened x. The match read the widened x as a float32 -> float32 norm and left the cast and the weight out.
    model = widened_norm(x_dtype, out_dtype)
    match, found = only_match(model)
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == ("float32", out_dtype, WeightMode.AFTER_CAST)
    assert match.x.inputs[0].op == "Cast" and dtype_name(match.x.inputs[0].inputs[0]) == x_dtype
    assert match.weight is not None and match.y.name == output_source(model) and not found.near_misses
    feed = {"x": np.random.default_rng(4).standard_normal((2, 3, HIDDEN)).astype(np.float32)}
    fused = fuse_model(model).model
    expected_output = ReferenceEvaluator(model).run(None, feed)[0]
    np.testing.assert_array_equal(ReferenceEvaluator(lower_fused_nodes(fused)).run(None, feed)[0], expected_output)
    original, fused_path = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(model, original)
    assert CliRunner().invoke(cli, ["fuse", str(original), "-o", str(fused_path)]).exit_code == 0
    checked = CliRunner().invoke(cli, ["check", str(original), str(fused_path)])
    assert checked.exit_code == 0, checked.output


def test_inspect_shows_both_dtypes_of_a_mixed_norm(tmp_path) -> None:
    path = tmp_path / "mixed.onnx"
    onnx.save_model(mixed_precision_norm("cast-then-weight"), str(path))
    result = CliRunner().invoke(cli, ["inspect", str(path)])
    assert result.exit_code == 0 and " float32->float16 weight=AFTER_CAST " in result.output, result.output
    found = json.loads(CliRunner().invoke(cli, ["inspect", str(path), "--json"]).output)
    assert (found["rms_norms"][0]["dtype"], found["rms_norms"][0]["output_dtype"]) == ("float32", "float16")


def test_qdq_on_x_read_by_the_square_and_the_multiply_stays_before_the_fused_node() -> None:
    # ModelOpt's int8/fp8 spelling: the fused node reads the dequantized x, exactly what the chain read.
    match, found = only_match(qdq_norm("shared-x"), NO_QUANT)
    assert match.x.inputs[0].op == "DequantizeLinear" and not found.near_misses


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_autocast_norm_with_a_16_bit_root_widened_for_the_reciprocal(dtype: str) -> None:
    model = autocast_norm(dtype)
    match, found = only_match(model)
    assert (match.dtype, match.output_dtype, match.params.weight_mode) == (dtype, dtype, WeightMode.AFTER_CAST)
    assert {"core-" + dtype, "reciprocal"} <= set(match.tags) and not found.near_misses
    # The contract computes the root in float32: closer to the exact norm than the 16-bit root it replaces.
    rng = np.random.default_rng(3)
    feed = {"x": (rng.standard_normal((2, 3, HIDDEN)) * 2).astype(NUMPY_TYPES[dtype]).astype(np.float32)}
    weight = next(onnx.numpy_helper.to_array(t) for t in model.graph.initializer if list(t.dims) == [HIDDEN])
    x = feed["x"].astype(np.float64)
    exact = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight.astype(np.float64)
    original = ReferenceEvaluator(model).run(None, feed)[0]
    fused = ReferenceEvaluator(lower_fused_nodes(fuse_model(model).model)).run(None, feed)[0]
    assert np.abs(fused - exact).max() <= np.abs(original - exact).max()


def test_integer_reductions_are_not_norm_candidates() -> None:
    """onnxruntime-genai turns the attention mask into sequence lengths with a ReduceSum over int64: no norm, so not
    a rejected norm either (it used to be listed on every genai export as "the reduced tensor is not a square")."""
    mask = gs.Variable("attention_mask", dtype=np.int64, shape=["batch", "total"])
    lengths = gs.Variable("lengths", dtype=np.int64, shape=["batch", 1])
    axes = gs.Constant("axes", np.array([1], np.int64))
    node = gs.Node("ReduceSum", "attn_mask_reformat/ReduceSum", inputs=[mask, axes], outputs=[lengths])
    graph = gs.Graph(nodes=[node], inputs=[mask], outputs=[lengths], opset=18)
    search = find_norms(graph)
    assert search.matches == [] and search.near_misses == []


FUSED_KINDS = ["RMSNormalization", "SimplifiedLayerNormalization", "SkipSimplifiedLayerNormalization"]


def _with_attributes(model: onnx.ModelProto, kind: str, **attrs: object) -> onnx.ModelProto:
    """`model` with the `kind` node's attributes set as given (onnx's checker refuses some of them; the matcher must
    not rely on it having run)."""
    (node,) = [node for node in model.graph.node if node.op_type == kind]
    kept = [attribute for attribute in node.attribute if attribute.name not in attrs]
    del node.attribute[:]
    node.attribute.extend([*kept, *(onnx.helper.make_attribute(name, value) for name, value in attrs.items())])
    return model


@pytest.mark.parametrize("epsilon", [-1e-5, float("nan"), float("inf")])
@pytest.mark.parametrize("kind", FUSED_KINDS)
def test_a_fused_norm_op_with_an_epsilon_outside_the_contract_is_refused(kind: str, epsilon: float) -> None:
    # onnxruntime runs a negative epsilon (the root of whatever results); the contract refuses it, so fuse must not
    # write a node that check then refuses.
    model = _with_attributes(fused_op_norm(kind, "float16"), kind, epsilon=epsilon)
    found = search(model)
    assert not found.matches
    [miss] = found.near_misses
    node = next(node.name for node in model.graph.node if node.op_type == kind)
    assert miss.node == node and miss.reason == f"epsilon {np.float32(epsilon):g} is negative or not finite"
    assert fuse_model(model).fused == []


@pytest.mark.parametrize(
    ("kind", "attrs", "reason"),
    [
        ("RMSNormalization", {"scale_output": 1}, "attribute 'scale_output' is not one of RMSNormalization's"),
        ("SimplifiedLayerNormalization", {"axis": 0}, "not over the last axis"),
        ("SkipSimplifiedLayerNormalization", {"axis": 0}, "attribute 'axis' is not one of"),
        ("SkipSimplifiedLayerNormalization", {"stash_type": 1}, "attribute 'stash_type' is not one of"),
        ("SimplifiedLayerNormalization", {"stash_type": 7}, "stash_type 7 is not float32"),
        ("SimplifiedLayerNormalization", {"epsilon": 1}, "attribute 'epsilon' is 1, not a float"),
        ("RMSNormalization", {"axis": 1.0}, "attribute 'axis' is 1.0, not a int"),
    ],
)
def test_a_fused_norm_op_attribute_outside_the_contract_is_refused(kind: str, attrs: dict, reason: str) -> None:
    model = _with_attributes(fused_op_norm(kind, "float32"), kind, **attrs)
    found = search(model)
    assert not found.matches and reason in found.near_misses[0].reason, found.near_misses


def test_a_decomposed_epsilon_beyond_float32_is_refused() -> None:
    # A float64 constant of 1e300 is finite, but the fused node's float32 attribute would hold inf.
    found = search(single_norm(NormSpec(epsilon=1e300, epsilon_dtype="float64")))
    assert not found.matches and any("negative or not finite" in miss.reason for miss in found.near_misses)


def _sparse_weight_norm(kind: str) -> onnx.ModelProto:
    """A norm whose weight is a sparse tensor: a `Constant` with `sparse_value`, or a sparse initializer."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    normalized = rms_norm(b, x, NormSpec(weight="none"))
    weight = np.linspace(0.5, 1.5, HIDDEN, dtype=np.float32)
    weight[::3] = 0
    kept = np.nonzero(weight)[0]
    sparse = onnx.helper.make_sparse_tensor(
        onnx.numpy_helper.from_array(weight[kept], "sparse_weight"),
        onnx.numpy_helper.from_array(kept.astype(np.int64), "sparse_weight_indices"),
        [HIDDEN],
    )
    if kind == "constant":
        b.nodes.append(onnx.helper.make_node("Constant", [], ["sparse_weight"], name="weight", sparse_value=sparse))
    b.output(b.op("Mul", normalized, "sparse_weight"), [BATCH, SEQUENCE, HIDDEN])
    graph = onnx.helper.make_graph(
        b.nodes,
        "sparse",
        b.inputs,
        b.outputs,
        b.initializers,
        sparse_initializer=[sparse] if kind != "constant" else [],
    )
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=10)
    # onnx's full check does not type a sparse initializer's readers; onnxruntime runs the model.
    onnx.checker.check_model(model)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("kind", ["constant", "initializer"])
def test_a_sparse_weight_stays_outside_the_fused_node(kind: str, tmp_path) -> None:
    # graphsurgeon imports a sparse_value Constant without any attribute: reading its shape crashed inspect and fuse.
    # A sparse initializer was taken as the weight, and the fused model then had a weight no lowering could type.
    model = _sparse_weight_norm(kind)
    match, found = only_match(model)
    assert match.weight is None and match.params.weight_mode is WeightMode.NONE
    assert any("sparse_weight is a sparse tensor" in miss.reason for miss in found.near_misses)
    fused = fuse_model(model).model
    feed = {"x": np.random.default_rng(0).standard_normal((BATCH, SEQUENCE, HIDDEN)).astype(np.float32)}
    np.testing.assert_allclose(run_model(lower_fused_nodes(fused), feed), run_model(model, feed), rtol=1e-5, atol=1e-6)
    path = tmp_path / "sparse.onnx"
    onnx.save_model(model, str(path))
    for command in (["inspect", str(path)], ["fuse", str(path), "-o", str(tmp_path / "fused.onnx")]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 0, result.output


def test_a_pair_is_one_only_when_the_dequantize_undoes_the_quantize() -> None:
    x = gs.Variable("x", dtype=np.float32, shape=[4, 8])
    scale = gs.Constant("scale", np.full(8, 0.1, np.float32))
    zero = gs.Constant("zero", np.zeros(8, np.int8))
    other_zero = gs.Constant("other_zero", np.zeros(8, np.int8))

    def pair(dq_inputs: list, q_axis: int = 1, dq_axis: int = 1, q_inputs: list | None = None) -> tuple:
        q_out = gs.Variable("q", dtype=np.int8, shape=[4, 8])
        y = gs.Variable("y", dtype=np.float32, shape=[4, 8])
        quantize = gs.Node("QuantizeLinear", "Q", {"axis": q_axis}, [x, *(q_inputs or [scale, zero])], [q_out])
        dequantize = gs.Node("DequantizeLinear", "DQ", {"axis": dq_axis}, [q_out, *dq_inputs], [y])
        return quantize, dequantize

    assert qdq_mismatch(*pair([scale, zero])) is None
    # Equal constants, not one tensor: still the same values.
    assert qdq_mismatch(*pair([scale, other_zero])) is None
    assert "scale" in qdq_mismatch(*pair([gs.Constant("s2", np.full(8, 0.2, np.float32)), zero]))
    assert "zero point" in qdq_mismatch(*pair([scale, gs.Constant("z2", np.full(8, 3, np.int8))]))
    assert "axis" in qdq_mismatch(*pair([scale, zero], q_axis=1, dq_axis=0))
    # No zero point on either side, or an explicit 0: both mean 0.
    assert qdq_mismatch(*pair([scale], q_inputs=[scale])) is None
