"""The rotary embedding after a QK-norm pair (docs/patterns.md, "Rotary embedding"): every spelling the exporters write
fuses into one TrtfuseQkNormRope whose lowering computes the original, every form one node cannot compute stays in the
graph with its reason, the fixtures that have rotations fuse them, and `check` catches a node that rotates wrongly."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx.reference import ReferenceEvaluator

from trtfuse import contract
from trtfuse.contract import HeadLayout, Rotation
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import FusionOptions

from support.cli import run_cli
from support.graphs import BATCH, HIDDEN, SEQUENCE
from support.paths import FIXTURES
from support.rope_graphs import HEAD_DIM, PRODUCT_SCALES, ROPE_NEAR_MISSES, RopeSpec, rope_block

ACCEPTED = {
    "qwen3": RopeSpec(),
    "qwen3-fp16": RopeSpec(dtype="float16"),
    "qwen3-bf16": RopeSpec(dtype="bfloat16"),
    "qwen3-torchscript-bounds": RopeSpec(spelling="rotate-half-shapes", dtype="float16"),
    "qwen3-per-batch-tables": RopeSpec(per_batch=True),
    "gemma3": RopeSpec(layout="qk-head-dim-transposed", weight="before-cast"),
    "gemma3-fp16": RopeSpec(layout="qk-head-dim-transposed", dtype="float16", weight="before-cast"),
    "olmo2": RopeSpec(layout="qk-full-width", weight="before-cast"),
    "olmo2-bf16-float32-rotation": RopeSpec(
        layout="qk-full-width", dtype="bfloat16", table_dtype="float32", weight="before-cast"
    ),
    "partial": RopeSpec(rotary_dim=8),
    "partial-fp16": RopeSpec(rotary_dim=8, dtype="float16", layout="qk-head-dim-transposed"),
    "rotary-embedding": RopeSpec(spelling="rotary-embedding"),
    "rotary-embedding-per-batch": RopeSpec(spelling="rotary-embedding", per_batch=True),
    "rotary-embedding-positions": RopeSpec(spelling="rotary-embedding", positions=True),
    "rotary-embedding-interleaved-partial": RopeSpec(spelling="rotary-embedding", interleaved=True, rotary_dim=8),
    "rotary-embedding-olmo2": RopeSpec(spelling="rotary-embedding", layout="qk-full-width", weight="before-cast"),
    "rotary-embedding-gemma3-fp16": RopeSpec(
        spelling="rotary-embedding", layout="qk-head-dim-transposed", dtype="float16"
    ),
    "int8-after-transpose": RopeSpec(quant="int8"),
    "fp8-gemma3": RopeSpec(layout="qk-head-dim-transposed", quant="float8_e4m3fn"),
    "fp8-gemma3-bf16": RopeSpec(layout="qk-head-dim-transposed", quant="float8_e4m3fn", dtype="bfloat16"),
    # ModelOpt's rotations: a pair on each product; with the Q of the result (INT8 moved by the Transpose).
    "modelopt-fp8-products-fp16": RopeSpec(dtype="float16", products="float8_e4m3fn"),
    "modelopt-int8-products-gemma3": RopeSpec(layout="qk-head-dim-transposed", dtype="float16", products="int8"),
    "modelopt-int8-products-and-output": RopeSpec(products="int8", quant="int8"),
    # A Q after the layout ops (ModelOpt FP8's attention input): the node writes their [B, H, S, D] itself.
    "fp8-after-transpose": RopeSpec(quant="float8_e4m3fn"),
    "fp8-after-reshape-and-transpose-olmo2": RopeSpec(
        layout="qk-full-width", quant="float8_e4m3fn", weight="before-cast"
    ),
    "modelopt-fp8-products-and-output": RopeSpec(dtype="float16", products="float8_e4m3fn", quant="float8_e4m3fn"),
    # ModelOpt's INT8 OLMo2 (each norm's input and inverse-root pairs) and Gemma3 (a pair on each norm's output
    # before the rotation reads it), with the products' pairs; and those pairs without product pairs.
    "modelopt-int8-olmo2": RopeSpec(layout="qk-full-width", dtype="float16", products="int8", norm_pairs="input-rsqrt"),
    "modelopt-int8-gemma3": RopeSpec(
        layout="qk-head-dim-transposed", dtype="float16", products="int8", quant="int8", norm_pairs="normalised"
    ),
    "input-rsqrt-pairs": RopeSpec(layout="qk-full-width", norm_pairs="input-rsqrt"),
    "normalised-pair-fp32": RopeSpec(layout="qk-head-dim-transposed", norm_pairs="normalised"),
}
# The stages each form of ModelOpt's q/k norm pairs gives the rotary node besides its products' and outputs'.
NORM_PAIR_STAGES = {
    "input-rsqrt": {"q_input", "q_rsqrt", "k_input", "k_rsqrt"},
    "normalised": {"q_normalised", "k_normalised"},
}
# Where the node writes the attention's [B, H, S, D] itself: a Q taken after layout ops.
WRITES_HEAD_MAJOR = {name for name, spec in ACCEPTED.items() if spec.quant and spec.layout != "qk-head-dim-transposed"}
# The norm's float32 y may differ by an ulp (onnxruntime reduces the graph's and the lowering's ReduceMean in its
# own order; tests/fusion/test_lowering_rope.py has the bit-exact rotation), 16-bit graphs round y before rotating.
TOLERANCE = {"float32": 1e-6, "float16": 2e-3, "bfloat16": 1e-2}


def _feed(spec: RopeSpec, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    batch = BATCH if spec.per_batch else 1
    feed = {
        "x": rng.standard_normal((BATCH, SEQUENCE, HIDDEN)).astype(np.float32),
        "positions": (np.arange(SEQUENCE, dtype=np.float32) + rng.integers(0, 20, (batch, 1))).astype(np.float32),
    }
    if spec.positions:
        feed["position_ids"] = (np.arange(SEQUENCE) + rng.integers(0, 20, (BATCH, 1))).astype(np.int64)
    return feed


def _run(model: onnx.ModelProto, spec: RopeSpec, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
    """onnxruntime, or onnx's reference evaluator where onnxruntime runs no such graph (bfloat16 MatMuls; a
    RotaryEmbedding whose caches broadcast over the batch, which onnxruntime 1.32 refuses) or rewrites it (its QDQ
    optimisations sum a rotation's dequantized products in float32) or may reduce the original's mean of squares in
    another order than the lowering's (the inverse root's pair, a step function of it)."""
    broadcast_caches = spec.spelling == "rotary-embedding" and not (spec.positions or spec.per_batch)
    if spec.dtype == "bfloat16" or broadcast_caches or spec.products or spec.norm_pairs:
        return [np.asarray(out) for out in ReferenceEvaluator(model).run(None, feed)]
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feed)


def _kinds(result: FuseResult) -> dict[str, int]:
    return {kind: count for kind, count in result.counts().nodes.items() if count}


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_each_spelling_fuses_into_one_rotary_node_that_computes_the_original(name: str) -> None:
    spec = ACCEPTED[name]
    original = rope_block(spec)
    result = fuse_model(original)
    op = contract.QK_NORM_ROPE_QUANT_OP if spec.quant or spec.products or spec.norm_pairs else contract.QK_NORM_ROPE_OP
    assert _kinds(result) == {op: 1}, result.counts().line()
    assert result.search.rope_near_misses == [] and result.search.quant_near_misses == []
    [node] = result.fused
    rotary = node.rotary
    layout = HeadLayout.HEAD_MAJOR if spec.layout == "qk-head-dim-transposed" else HeadLayout.TOKEN_MAJOR
    rotation = Rotation.INTERLEAVED if spec.interleaved else Rotation.HALF_SPLIT
    output_layout = HeadLayout.HEAD_MAJOR if name in WRITES_HEAD_MAJOR else layout
    assert (rotary.head_dim, rotary.rotary_dim, rotary.rotation, rotary.layout, rotary.output_layout) == (
        HEAD_DIM,
        spec.rotary_dim or HEAD_DIM,
        rotation,
        layout,
        output_layout,
    )
    if name in WRITES_HEAD_MAJOR:
        assert not any(n.op_type in ("Transpose", "Reshape") for n in _rotations(result.model))
        # The layout ops it writes past are among what it replaced (compile --baseline's norm sites time them).
        gone = {n.name for n in original.graph.node} - {n.name for n in result.model.graph.node}
        assert {n.name for n in original.graph.node if n.op_type in ("Transpose", "Reshape")} & gone <= set(
            node.replaced
        )
    assert not any(n.op_type in ("Neg", "RotaryEmbedding") for n in result.model.graph.node)
    onnx.checker.check_model(result.model, full_check=False)
    feed = _feed(spec)
    expected = _run(original, spec, feed)
    actual = _run(lower_fused_nodes(result.model), spec, feed)
    if spec.products:
        stages = {taken.stage for taken in node.quantizers if taken.stage.product}
        assert len(stages) == 4 and not any(n.op_type == "QuantizeLinear" for n in _rotations(result.model))
    if spec.norm_pairs:
        norm_stages = NORM_PAIR_STAGES[spec.norm_pairs]
        ends = {taken.stage.value for taken in node.quantizers if taken.stage.product or not taken.stage.fake}
        assert {taken.stage.value for taken in node.quantizers} - ends == norm_stages
        assert not any(n.op_type == "QuantizeLinear" for n in result.model.graph.node)
    for want, got in zip(expected, actual, strict=True):
        if spec.products and not spec.quant:
            # The graph's own rounding, from a y that may differ by a float32 ulp (ReduceMean's order): a rare code
            # of a product one step away.
            assert np.mean(got != want) < 0.05
            np.testing.assert_allclose(got, want, atol=2 * max(PRODUCT_SCALES[spec.products]) * 16)
        elif spec.quant:
            # Codes of values the node rounds once and the graph twice: a rare code one step away; after a normalised
            # pair a step of it (the reference evaluator's float16 division moves a code) moves both products.
            steps = np.abs(got - want) / (0.02 if spec.quant == "int8" else 0.005)
            allowed = 64 * (spec.quant != "int8") + 1 + 2 * (spec.norm_pairs == "normalised")
            assert np.mean(got != want) < 0.05 and np.max(steps) <= allowed
        else:
            np.testing.assert_allclose(got, want, rtol=TOLERANCE[spec.dtype], atol=TOLERANCE[spec.dtype])


def _rotations(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    """The nodes between the rotary node's outputs and the graph's outputs (what the node's rotation left)."""
    rotary = next(node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN)
    frontier, seen = set(rotary.output), []
    for node in model.graph.node:
        if frontier.intersection(node.input):
            seen.append(node)
            frontier.update(node.output)
    return seen


def test_modelopt_products_need_the_quantizers_and_a_full_rotation_where_the_norm_rounds_otherwise() -> None:
    """Without --no-fuse-quant's quantizers the pairs cannot go into the node. A norm computed in float16 (the graph
    rounds its y otherwise than the node: a product's code may move one step, which check allows) is taken with its
    rotation, ModelOpt's fixture's among them, but not where the rotation passes some of y's elements through."""
    result = fuse_model(rope_block(RopeSpec(dtype="float16", products="int8")), FusionOptions(fuse_quant=False))
    assert _kinds(result) == {contract.QK_NORM_OP: 1}
    assert "and quantizers are not taken" in result.search.rope_near_misses[0].reason
    float16_norms = RopeSpec(dtype="float16", products="int8", core_dtype="float16")
    assert _kinds(fuse_model(rope_block(float16_norms))) == {contract.QK_NORM_ROPE_QUANT_OP: 1}
    result = fuse_model(rope_block(replace(float16_norms, rotary_dim=HEAD_DIM // 2)))
    assert _kinds(result) == {contract.QK_NORM_OP: 1}
    assert "rounds otherwise than its node (core-float16) and the rotation passes" in (
        result.search.rope_near_misses[0].reason
    )
    for name in ("tools/qwen3-modelopt-fp8-kv.onnx", "tools/qwen3-modelopt-int8-fp16.onnx"):
        result = fuse_model(onnx.load(str(FIXTURES / name)))
        assert _kinds(result).get(contract.QK_NORM_ROPE_QUANT_OP) == 2 and not result.search.rope_near_misses


@pytest.mark.parametrize("case", sorted(ROPE_NEAR_MISSES))
def test_a_rotation_one_node_cannot_compute_stays_with_its_reason(case: str) -> None:
    spec = RopeSpec(case=case)
    original = rope_block(spec)
    result = fuse_model(original)
    assert _kinds(result) == {contract.QK_NORM_OP: 1}, result.counts().line()
    [miss] = result.search.rope_near_misses
    assert miss.reason.startswith("rotation not fused: ") and ROPE_NEAR_MISSES[case] in miss.reason, miss.reason
    assert "1 rotation kept out" in result.counts().line()
    feed = _feed(spec)
    for want, got in zip(_run(original, spec, feed), _run(lower_fused_nodes(result.model), spec, feed), strict=True):
        np.testing.assert_allclose(got, want, rtol=TOLERANCE["float32"], atol=TOLERANCE["float32"])


def test_an_fp8_quantizer_after_layout_ops_a_shape_reads_between_stays_out_and_the_rotation_fuses() -> None:
    """A node writing [B, H, S, D] would leave no tensor for a Shape of the Reshape's [B, S, H, D] between OLMo2's
    layout ops: the FP8 Qs stay in the graph (the Transpose cannot move FP8 codes) and the rotation fuses."""
    original = rope_block(RopeSpec(layout="qk-full-width", quant="float8_e4m3fn", weight="before-cast"))
    reshapes = [node for node in original.graph.node if node.op_type == "Reshape" and _reads_norm(original, node)]
    assert len(reshapes) == 2
    for index, reshape in enumerate(reshapes):
        shape = onnx.helper.make_node("Shape", [reshape.output[0]], [f"heads_shape_{index}"], name=f"shape_{index}")
        original.graph.node.append(shape)
        original.graph.output.append(onnx.helper.make_tensor_value_info(shape.output[0], onnx.TensorProto.INT64, [4]))
    result = fuse_model(original)
    assert _kinds(result) == {contract.QK_NORM_ROPE_OP: 1}
    assert result.fused[0].rotary.output_layout is HeadLayout.TOKEN_MAJOR
    assert len(result.search.quant_near_misses) == 2 and result.search.rope_near_misses == []
    assert all("would move FLOAT8E4M3FN codes" in miss.reason for miss in result.search.quant_near_misses)


def _reads_norm(model: onnx.ModelProto, node: onnx.NodeProto) -> bool:
    """Whether `node` reads a q/k norm's output (a Mul by the weight, in these graphs)."""
    producers = {output: producer for producer in model.graph.node for output in producer.output}
    producer = producers.get(node.input[0])
    return producer is not None and producer.op_type == "Mul"


def test_without_the_option_the_pair_is_fused_alone_and_nothing_is_reported() -> None:
    result = fuse_model(rope_block(RopeSpec()), FusionOptions(fuse_rope=False))
    assert _kinds(result) == {contract.QK_NORM_OP: 1} and result.search.rope_near_misses is None
    assert "rope_near_misses" not in result.report()
    quant = fuse_model(rope_block(RopeSpec(quant="int8")), FusionOptions(fuse_quant=False))
    assert _kinds(quant) == {contract.QK_NORM_ROPE_OP: 1} and quant.search.quantizers_taken() == []


# The fixtures with rotations after their q/k norms: every one fuses them.
ROTATED_FIXTURES = [
    "qwen3-dynamo-fp32.onnx",
    "qwen3-dynamo-fp16.onnx",
    "qwen3-torchscript-fp16.onnx",
    "gemma3-dynamo-fp16.onnx",
    "gemma3-dynamo-fp32.onnx",
    "gemma3-torchscript-fp16.onnx",
    "olmo2-dynamo-fp32.onnx",
    "olmo2-torchscript-fp16.onnx",
    "kv/qwen3-dynamo-fp32-kv.onnx",
    "tools/qwen3-optimum-fp16.onnx",
    "tools/qwen3-optimum-fp16-slim.onnx",
    "tools/olmo2-dynamo23-bf16.onnx",
]


@pytest.mark.parametrize("name", ROTATED_FIXTURES)
def test_every_fixture_rotation_fuses_and_layers_share_their_tables(name: str) -> None:
    result = fuse_model(onnx.load(str(FIXTURES / name)))
    nodes = [node for node in result.model.graph.node if node.op_type == contract.QK_NORM_ROPE_OP]
    assert len(nodes) == 2 and result.counts().nodes[contract.QK_NORM_OP] == 0
    assert result.search.rope_near_misses == []
    tables = {tuple(node.input[-2:]) for node in nodes}
    # Gemma3's local and global layers rotate by tables of their own; the others share one pair.
    assert len(tables) == (2 if name.startswith("gemma3") else 1)


def test_genai_rotations_stay_with_their_reason() -> None:
    result = fuse_model(onnx.load(str(FIXTURES / "tools/qwen3-genai-cpu-int4.onnx")))
    assert result.counts().nodes[contract.QK_NORM_ROPE_OP] == 0
    misses = result.search.rope_near_misses
    reason = "the rotary embedding is inside the attention op (do_rotary=1)"
    assert len(misses) == 2 and reason in misses[0].reason, misses


# ModelOpt's INT8 Gemma3 and OLMo2 fixtures: each rotation fuses with its norm's pairs, as the node's stages.
MODELOPT_INT8_FIXTURES = {
    "tools/gemma3-modelopt-int8-fp16.onnx": {"q_normalised", "k_normalised", "q_output"},
    "tools/olmo2-modelopt-int8-fp16-optimum.onnx": {"q_input", "q_rsqrt", "k_input", "k_rsqrt"},
}


@pytest.mark.parametrize("name", sorted(MODELOPT_INT8_FIXTURES))
def test_modelopt_int8_rotations_fuse_with_their_norms_pairs(name: str) -> None:
    result = fuse_model(onnx.load(str(FIXTURES / name)))
    assert _kinds(result).get(contract.QK_NORM_ROPE_QUANT_OP) == 2 and not result.search.rope_near_misses
    assert contract.QK_NORM_QUANT_OP not in _kinds(result)
    for node in (fused for fused in result.fused if fused.rotary is not None):
        stages = {taken.stage.value for taken in node.quantizers}
        products = {f"{role}_{product}_product" for role in "qk" for product in ("cos", "sin")}
        assert stages == MODELOPT_INT8_FIXTURES[name] | products, stages
        assert len(node.replaced) == len(set(node.replaced))


def test_a_normalised_pair_read_by_more_than_the_rotation_keeps_the_rotation_out() -> None:
    """The pair on k's norm output is also read by a graph output's Cast: the rotation of the pair stays out with the
    reason, the pair fused as TrtfuseQkNormQuant, its Qs its output stages."""
    result = fuse_model(rope_block(RopeSpec(layout="qk-head-dim-transposed", case="normalised-read-again")))
    assert _kinds(result) == {contract.QK_NORM_QUANT_OP: 1}, result.counts().line()
    [miss] = result.search.rope_near_misses
    assert miss.reason.startswith("rotation not fused: ") and "is read by Cast" in miss.reason, miss.reason


def test_inspect_and_fuse_report_the_rotation(tmp_path: Path) -> None:
    model = FIXTURES / "qwen3-dynamo-fp32.onnx"
    text = run_cli("inspect", model).stdout
    assert "  qk_rope   q: " in text and "rotation: head_dim=64 rotary_dim=64 half_split token_major" in text
    report = json.loads(run_cli("inspect", model, "--json").stdout)
    assert len(report["qk_norm_ropes"]) == 2 and report["rope_near_misses"] == []
    assert report["qk_norm_ropes"][0]["rotary"] == {
        "head_dim": 64,
        "rotary_dim": 64,
        "rotation": "HALF_SPLIT",
        "layout": "TOKEN_MAJOR",
        "output_layout": "TOKEN_MAJOR",
    }
    assert report["plugin_nodes"][contract.QK_NORM_ROPE_OP] == 2
    fused = json.loads(run_cli("fuse", model, "-o", tmp_path / "f.onnx", "--json").stdout)
    entry = next(node for node in fused["fused"] if node["kind"] == contract.QK_NORM_ROPE_OP)
    assert entry["rotary"]["layout"] == "TOKEN_MAJOR" and "node_neg" in entry["replaced"]
    plain = json.loads(run_cli("inspect", model, "--json", "--no-fuse-rope").stdout)
    assert "rope_near_misses" not in plain and contract.QK_NORM_ROPE_OP not in plain["plugin_nodes"]
    kept = run_cli("inspect", FIXTURES / "tools" / "qwen3-modelopt-int8-fp16.onnx", "--no-fuse-quant").stdout
    assert "  rope kept node_mean_1: rotation not fused: the product node_mul_168 is quantized" in kept


def _tampered(fused: Path, tmp_path: Path, change: str) -> Path:
    model = onnx.load(str(fused))
    node = next(node for node in model.graph.node if node.op_type == contract.QK_NORM_ROPE_OP)
    attributes = {attribute.name: attribute for attribute in node.attribute}
    if change == "swapped-tables":
        node.input[-2], node.input[-1] = node.input[-1], node.input[-2]
    elif change == "interleaved":
        attributes[contract.ATTR_ROTATION].i = int(Rotation.INTERLEAVED)
    elif change == "layout":
        attributes[contract.ATTR_LAYOUT].i = 1 - attributes[contract.ATTR_LAYOUT].i
    elif change == "half-rotated":
        attributes[contract.ATTR_ROTARY_DIM].i //= 2
    path = tmp_path / f"{change}.onnx"
    onnx.save(model, path)
    return path


# A node that rotates otherwise fails the comparison (exit 1); one whose rotary_dim its tables do not have is refused
# before anything runs, one whose layout puts the tokens where its tables' rows do not fit fails to run (exit 2).
TAMPERED = {"swapped-tables": 1, "interleaved": 1, "layout": 2, "half-rotated": 2}


@pytest.mark.parametrize("fixture", ["qwen3-dynamo-fp32.onnx", "gemma3-torchscript-fp16.onnx"])
@pytest.mark.parametrize("change", sorted(TAMPERED))
def test_check_fails_a_node_that_rotates_otherwise(tmp_path: Path, fixture: str, change: str) -> None:
    original = FIXTURES / fixture
    fused = tmp_path / "fused.onnx"
    assert run_cli("fuse", original, "-o", fused).exit_code == 0
    assert run_cli("check", original, fused).exit_code == 0
    result = run_cli("check", original, _tampered(fused, tmp_path, change))
    assert result.exit_code == TAMPERED[change], result.output


def test_a_bfloat16_table_of_a_float16_model_is_refused() -> None:
    """The tables are float32 or the activations' dtype: fp16 activations with bf16 tables stay out."""
    model = rope_block(RopeSpec(dtype="float16", table_dtype="bfloat16"))
    result = fuse_model(model)
    assert _kinds(result) == {contract.QK_NORM_OP: 1}
    [miss] = result.search.rope_near_misses
    assert "neither float32 nor the activations' float16" in miss.reason


def test_fuse_reports_the_product_pairs_a_rotary_node_replaced(tmp_path: Path) -> None:
    """The report names each Q/DQ pair on the products among what the node replaced (names, not graph nodes)."""
    model = FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx"
    result = run_cli("fuse", model, "-o", tmp_path / "f.onnx", "--json")
    assert result.exit_code == 0, result.output
    entry = next(node for node in json.loads(result.stdout)["fused"] if node["kind"] == contract.QK_NORM_ROPE_QUANT_OP)
    assert {"mul_186_QuantizeLinear", "mul_186_DequantizeLinear"} <= set(entry["replaced"])
