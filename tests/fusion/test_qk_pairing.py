"""Q/k-norm pairing on the shapes real exporters emit: packed QKV projections (onnxruntime-genai, fp32 and int4
`MatMulNBits`), Q/DQ-wrapped projections (ModelOpt int8 / fp8 / int4), q/k norms absorbed into GroupQueryAttention,
and dependencies between the two norms that only an If/Loop body shows (pairing them would make a cycle).

Every pair is checked on the fused graph: its trtfuse nodes lowered to the contract's reference ops, run in
onnxruntime against the original.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import onnx
import onnxruntime
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from trtfuse import contract
from trtfuse.cli.main import cli
from trtfuse.fusion.fuse import fuse_model, import_graph
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.patterns import find_norms
from trtfuse.verify.tolerances import output_error, tolerance_for

from support.graphs import BATCH, HIDDEN, SEQUENCE, Builder, NormSpec, rms_norm

Q_HEADS, KV_HEADS, HEAD_DIM = 4, 2, 16
Q_WIDTH, KV_WIDTH = Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
QKV_WIDTH = Q_WIDTH + 2 * KV_WIDTH
MS_DOMAIN = "com.microsoft"


def _int_constant(b: Builder, values: list[int]) -> str:
    return b.constant(values, "int64", base="ints")


def _matmul_nbits(b: Builder, x: str, width: int) -> str:
    """onnxruntime's int4 MatMulNBits as genai's builder writes it: 4-bit blocks of 32 along K, no zero points."""
    block = 32
    packed = b.rng.integers(0, 256, (width, HIDDEN // block, block // 2)).astype(np.uint8)
    weight = b.constant(packed, "uint8", base="weight_q4")
    scales = b.constant(b.rng.uniform(0.01, 0.03, (width, HIDDEN // block)), "float32", base="weight_scales")
    return b.op("MatMulNBits", x, weight, scales, domain=MS_DOMAIN, K=HIDDEN, N=width, bits=4, block_size=block)


def _genai_norm(b: Builder, x: str, heads: int, norm: str, spec: NormSpec) -> str:
    """genai's q_norm/k_norm: [B, S, heads*D] -> [B, S*heads, D] -> norm -> [B, S, heads*D]."""
    split = b.op("Reshape", x, _int_constant(b, [0, -1, HEAD_DIM]))
    if norm == "simplified":
        weight = b.weight(HEAD_DIM, spec.dtype)
        normed = b.op("SimplifiedLayerNormalization", split, weight, axis=-1, epsilon=spec.epsilon, stash_type=1)
    else:
        normed = rms_norm(b, split, replace(spec, hidden=HEAD_DIM))
    return b.op("Reshape", normed, _int_constant(b, [0, -1, heads * HEAD_DIM]))


def _qkv_parts(b: Builder, qkv: str, part: str) -> list[str]:
    widths = [Q_WIDTH, KV_WIDTH, KV_WIDTH]
    if part == "split":
        return b.op("Split", qkv, _int_constant(b, widths), axis=-1, outputs=3)
    starts = np.cumsum([0, *widths])
    if part == "slice":
        return [
            b.op("Slice", qkv, _int_constant(b, [int(start)]), _int_constant(b, [int(end)]), _int_constant(b, [-1]))
            for start, end in itertools.pairwise(starts)
        ]
    return [
        b.op("Gather", qkv, _int_constant(b, list(range(start, end))), axis=-1)
        for start, end in itertools.pairwise(starts)
    ]


def packed_qkv(
    part: str = "split",
    projection: str = "matmul",
    norm: str = "simplified",
    dtype: str = "float32",
    layers: int = 1,
    k_epsilon: float = 1e-6,
    q_view_domain: str = "",
) -> onnx.ModelProto:
    """onnxruntime-genai's attention input: one packed QKV projection, split into q/k/v, q and k normalised per head.

    `q_view_domain`: q passes an Identity of that domain first (another domain's Identity is not ONNX's).
    """
    b = Builder()
    spec = NormSpec(dtype=dtype, epsilon=1e-6)
    hidden = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    for _ in range(layers):
        normed = rms_norm(b, hidden, spec)
        if projection == "matmul":
            weight = b.constant(b.rng.normal(0, HIDDEN**-0.5, (HIDDEN, QKV_WIDTH)), dtype, base="qkv_proj")
            qkv = b.op("MatMul", normed, weight)
        else:
            qkv = _matmul_nbits(b, normed, QKV_WIDTH)
        q, k, v = _qkv_parts(b, qkv, part)
        if q_view_domain:
            q = b.op("Identity", q, domain=q_view_domain)
        q_out = _genai_norm(b, q, Q_HEADS, norm, spec)
        k_out = _genai_norm(b, k, KV_HEADS, norm, replace(spec, epsilon=k_epsilon))
        for tensor in (q_out, k_out, v):
            b.output(tensor)
        hidden = b.op("Add", hidden, b.op("Concat", v, v, axis=-1))
    model = b.model(standard=False)
    # onnx's shape inference knows neither MatMulNBits nor another domain's ops; an exporter writes their value_info.
    widths = {"MatMulNBits": QKV_WIDTH, "Identity": Q_WIDTH}
    foreign = [node for node in model.graph.node if node.domain and node.op_type in widths]
    shapes = {node.output[0]: (elem_type(dtype), [BATCH, SEQUENCE, widths[node.op_type]]) for node in foreign}
    return _with_value_info(model, shapes) if shapes else model


def elem_type(dtype: str) -> int:
    return {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16}[dtype]


def _with_value_info(model: onnx.ModelProto, shapes: dict[str, tuple[int, list[int]]]) -> onnx.ModelProto:
    """The model with these tensors' types stated, as an exporter does where ONNX shape inference cannot see."""
    model.graph.value_info.extend(
        helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in shapes.items()
    )
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _quantize(b: Builder, x: str, quant: str) -> str:
    """ModelOpt's activation Q/DQ pair: int8 with a zero point, or float8 e4m3."""
    scale = b.constant(0.05, "float32", base="act_scale")
    if quant == "fp8":
        zero = b.constant(np.zeros((), np.float32), "float32", base="act_zero")
        zero = b.op("Cast", zero, to=TensorProto.FLOAT8E4M3FN)
    else:
        zero = b.constant(np.zeros((), np.int8), "int8", base="act_zero")
    return b.op("DequantizeLinear", b.op("QuantizeLinear", x, scale, zero), scale, zero)


def _quantized_weight(b: Builder, width: int, quant: str) -> str:
    """A projection weight stored quantised and dequantised in the graph (int8 per channel, fp8, int4 blocks of 32)."""
    values = b.rng.normal(0, HIDDEN**-0.5, (HIDDEN, width))
    if quant == "int4":
        block = 32
        stored = onnx.helper.make_tensor(
            b.fresh("weight_int4"), TensorProto.INT4, (HIDDEN, width), np.clip(np.round(values * 40), -8, 7).astype(int)
        )
        b.initializers.append(stored)
        scales = b.constant(np.full((HIDDEN // block, width), 1 / 40), "float32", base="weight_scale")
        return b.op("DequantizeLinear", stored.name, scales, axis=0, block_size=block)
    if quant == "fp8":
        stored = b.op("Cast", b.constant(values * 8, "float32", base="weight_fp32"), to=TensorProto.FLOAT8E4M3FN)
        return b.op("DequantizeLinear", stored, b.constant(1 / 8, "float32", base="weight_scale"))
    stored = b.constant(np.clip(np.round(values * 100), -127, 127), "int8", base="weight_int8")
    return b.op("DequantizeLinear", stored, b.constant(np.full(width, 0.01), "float32", base="weight_scale"), axis=1)


def quantized_attention(quant: str = "int8", shared_qdq: bool = True, output_qdq: bool = False) -> onnx.ModelProto:
    """ModelOpt's PTQ of an fp32 export: Q/DQ on the projections' input (shared or one per projection) and weights."""
    b = Builder(opset=21)
    spec = NormSpec(epsilon=1e-6)
    normed = rms_norm(b, b.input("x", [BATCH, SEQUENCE, HIDDEN]), spec)
    shared = _quantize(b, normed, quant)
    outputs = []
    for heads in (Q_HEADS, KV_HEADS, KV_HEADS):
        activation = shared if shared_qdq else _quantize(b, normed, quant)
        projected = b.op("MatMul", activation, _quantized_weight(b, heads * HEAD_DIM, quant))
        if output_qdq:
            projected = _quantize(b, projected, quant)
        outputs.append(b.op("Reshape", projected, _int_constant(b, [BATCH, SEQUENCE, heads, HEAD_DIM])))
    q, k, v = outputs
    for tensor in (q, k):
        b.output(b.op("Transpose", rms_norm(b, tensor, replace(spec, hidden=HEAD_DIM)), perm=[0, 2, 1, 3]))
    b.output(v)
    return b.model()


HEADS_SHAPE = [BATCH, SEQUENCE, Q_HEADS, HEAD_DIM]


def _copy_of(b: Builder, reads: str, name: str) -> tuple[onnx.NodeProto, onnx.ValueInfoProto]:
    """A body node that reads the outer tensor `reads` without listing it among its op's inputs: Identity(reads)."""
    out = b.fresh(f"{name}_copy")
    node = helper.make_node("Identity", [reads], [out], name=b.fresh(f"{name}_Identity"))
    return node, helper.make_tensor_value_info(out, TensorProto.FLOAT, HEADS_SHAPE)


def _branch(b: Builder, name: str, reads: str) -> onnx.GraphProto:
    node, output = _copy_of(b, reads, name)
    return helper.make_graph([node], name, [], [output])


def _through_body(b: Builder, reads: str, body: str) -> str:
    """A copy of `reads` made inside an If, an If nested in an If's branch, a Loop or a Scan."""
    condition = b.constant(True, "bool", base="cond")
    if body == "if":
        return b.op("If", condition, then_branch=_branch(b, "then", reads), else_branch=_branch(b, "else", reads))
    if body == "nested-if":
        inner_out = b.fresh("inner_if")
        inner = helper.make_node(
            "If", [condition], [inner_out], then_branch=_branch(b, "then", reads), else_branch=_branch(b, "else", reads)
        )
        outer = helper.make_graph(
            [inner], "outer", [], [helper.make_tensor_value_info(inner_out, TensorProto.FLOAT, HEADS_SHAPE)]
        )
        return b.op("If", condition, then_branch=outer, else_branch=_branch(b, "else", reads))
    state = b.fresh("state")
    copy, state_out = _copy_of(b, reads, body)
    initial = b.constant(np.zeros(HEADS_SHAPE), "float32", base="initial_state")
    if body == "scan":
        element, element_out = b.fresh("element"), b.fresh("element_out")
        scan_body = helper.make_graph(
            [copy, helper.make_node("Identity", [element], [element_out])],
            "scan_body",
            [
                helper.make_tensor_value_info(state, TensorProto.FLOAT, HEADS_SHAPE),
                helper.make_tensor_value_info(element, TensorProto.FLOAT, [1]),
            ],
            [state_out, helper.make_tensor_value_info(element_out, TensorProto.FLOAT, [1])],
        )
        elements = b.constant(np.zeros((1, 1)), "float32", base="scan_elements")
        final_state, _ = b.op("Scan", initial, elements, body=scan_body, num_scan_inputs=1, outputs=2)
        return final_state
    iteration, condition_in, condition_out = b.fresh("i"), b.fresh("cond_in"), b.fresh("cond_out")
    loop_body = helper.make_graph(
        [helper.make_node("Identity", [condition_in], [condition_out]), copy],
        "loop_body",
        [
            helper.make_tensor_value_info(iteration, TensorProto.INT64, []),
            helper.make_tensor_value_info(condition_in, TensorProto.BOOL, []),
            helper.make_tensor_value_info(state, TensorProto.FLOAT, HEADS_SHAPE),
        ],
        [helper.make_tensor_value_info(condition_out, TensorProto.BOOL, []), state_out],
    )
    return b.op("Loop", b.constant(1, "int64", base="trips"), condition, initial, body=loop_body)


def k_scaled_by_q(body: str) -> onnx.ModelProto:
    """Qwen3-style q/k norms where k's projection dequantises its int8 weight with a scale computed from q's
    normalised output, copied by an If/Loop/Scan body that reads it as an outer tensor: pairing would make a cycle."""
    b = Builder()
    spec = NormSpec(epsilon=1e-6)
    normed = rms_norm(b, b.input("x", [BATCH, SEQUENCE, HIDDEN]), spec)
    q_proj = b.op("MatMul", normed, b.constant(b.rng.normal(0, 0.1, (HIDDEN, Q_WIDTH)), base="q_proj"))
    q_out = rms_norm(b, b.op("Reshape", q_proj, _int_constant(b, HEADS_SHAPE)), replace(spec, hidden=HEAD_DIM))
    peak = b.op("Abs", b.op("ReduceMax", _through_body(b, q_out, body), keepdims=0))
    scale = b.op("Mul", b.op("Add", peak, b.constant(1.0)), b.constant(0.01))
    k_weight = b.op("DequantizeLinear", b.constant(b.rng.integers(-100, 100, (HIDDEN, Q_WIDTH)), "int8"), scale)
    k_proj = b.op("MatMul", normed, k_weight)
    k_out = rms_norm(b, b.op("Reshape", k_proj, _int_constant(b, HEADS_SHAPE)), replace(spec, hidden=HEAD_DIM))
    v = b.op("MatMul", normed, b.constant(b.rng.normal(0, 0.1, (HIDDEN, Q_WIDTH)), base="v_proj"))
    for tensor in (q_out, k_out, v):
        b.output(tensor)
    return b.model()


def absorbed_gqa(with_norm_weights: bool = True) -> onnx.ModelProto:
    """genai's CUDA build of Qwen3: the q/k norm weights are GroupQueryAttention inputs 14 and 15."""
    b = Builder()
    spec = NormSpec(epsilon=1e-6)
    normed = rms_norm(b, b.input("x", [BATCH, SEQUENCE, HIDDEN]), spec)
    qkv = b.op("MatMul", normed, b.constant(b.rng.normal(0, 0.1, (HIDDEN, QKV_WIDTH)), base="qkv_proj"))
    q, k, v = _qkv_parts(b, qkv, "split")
    past = [b.input(name, [BATCH, KV_HEADS, 0, HEAD_DIM]) for name in ("past_key", "past_value")]
    lengths = [
        b.constant(np.full(shape, value), "int32", base=base)
        for shape, value, base in (((BATCH,), SEQUENCE - 1, "seqlens_k"), ((), SEQUENCE, "total"))
    ]
    norm_weights = [b.weight(HEAD_DIM, "float32", base=f"{which}_norm") for which in "qk"] if with_norm_weights else []
    optional = [""] * 7 if with_norm_weights else []
    attention = b.op(
        "GroupQueryAttention",
        q,
        k,
        v,
        *past,
        *lengths,
        *optional,
        *norm_weights,
        domain=MS_DOMAIN,
        outputs=3,
        num_heads=Q_HEADS,
        kv_num_heads=KV_HEADS,
    )
    b.output(attention[0], [BATCH, SEQUENCE, Q_WIDTH])
    return b.model(standard=False)


def search(model: onnx.ModelProto):
    return find_norms(import_graph(model))


def _session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    # onnxruntime's optimiser would fuse the reference lowering's chains with its own rounding: run them as written.
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def assert_fused_matches(original: onnx.ModelProto, dtype: str = "float32") -> dict:
    """Fuse, lower the trtfuse nodes to reference ops, and compare every output in onnxruntime; returns the totals."""
    result = fuse_model(original)
    rng = np.random.default_rng(0)
    feed = {
        value.name: rng.normal(0, 2, [dim.dim_value for dim in value.type.tensor_type.shape.dim]).astype(np.float32)
        for value in original.graph.input
    }
    expected = _session(original).run(None, feed)
    actual = _session(lower_fused_nodes(result.model)).run(None, feed)
    for want, got in zip(expected, actual, strict=True):
        assert got.shape == want.shape
        relative = output_error("output", got, want).max_rel
        assert relative <= tolerance_for(dtype).rtol, relative
    return result.report()["totals"]


@pytest.mark.parametrize("norm", ["simplified", "decomposed"])
@pytest.mark.parametrize("part", ["split", "slice", "gather"])
def test_packed_qkv_norms_pair(part: str, norm: str) -> None:
    model = packed_qkv(part=part, norm=norm)
    found = search(model)
    [pair] = found.qk_norm_pairs
    assert (pair.q.hidden_size, pair.k.hidden_size) == (HEAD_DIM, HEAD_DIM)
    assert "qk-head-dim" in pair.q.tags and "qk-head-dim" in pair.k.tags
    totals = assert_fused_matches(model)
    assert (totals[contract.QK_NORM_OP], totals[contract.RMS_NORM_OP]) == (1, 1)


def test_int4_matmul_nbits_qkv_norms_pair() -> None:
    totals = assert_fused_matches(packed_qkv(projection="matmulnbits"))
    assert totals[contract.QK_NORM_OP] == 1


@pytest.mark.parametrize("norm", ["simplified", "decomposed"])
def test_float16_packed_qkv_norms_pair(norm: str) -> None:
    totals = assert_fused_matches(packed_qkv(norm=norm, dtype="float16"), "float16")
    assert totals[contract.QK_NORM_OP] == 1


def test_each_layer_pairs_its_own_q_and_k() -> None:
    found = search(packed_qkv(projection="matmulnbits", layers=3))
    assert len(found.qk_norm_pairs) == 3
    for pair in found.qk_norm_pairs:
        q_split, k_split = (match.x.inputs[0].inputs[0] for match in (pair.q, pair.k))
        assert q_split.inputs[0] is k_split.inputs[0], "q and k of one layer come out of one Split"


def test_a_view_op_of_another_domain_is_not_a_view() -> None:
    found = search(packed_qkv(q_view_domain="custom.ops"))
    assert not found.qk_norm_pairs
    assert [match.hidden_size for match in found.matches if "qk-head-dim" in match.tags] == [HEAD_DIM]


def test_packed_qkv_norms_with_different_epsilon_stay_separate_and_say_why() -> None:
    found = search(packed_qkv(k_epsilon=1e-5))
    assert not found.qk_norm_pairs
    q, k = (match for match in found.matches if "qk-head-dim" in match.tags)
    notes = {miss.node: miss.reason for miss in found.near_misses}
    assert (
        notes[q.name]
        == f"not paired with the q/k norm {k.name}: epsilon {q.params.epsilon} here, {k.params.epsilon} there"
    )
    assert notes[k.name].startswith(f"not paired with the q/k norm {q.name}: epsilon")


@pytest.mark.parametrize("output_qdq", [False, True])
@pytest.mark.parametrize("shared_qdq", [True, False])
@pytest.mark.parametrize("quant", ["int8", "fp8", "int4"])
def test_quantized_projection_norms_pair(quant: str, shared_qdq: bool, output_qdq: bool) -> None:
    model = quantized_attention(quant, shared_qdq, output_qdq)
    [pair] = search(model).qk_norm_pairs
    assert (pair.q.hidden_size, pair.k.hidden_size) == (HEAD_DIM, HEAD_DIM)
    totals = assert_fused_matches(model)
    # The hidden norm takes the shared QuantizeLinear of its output in (the activations are INT8 or FP8 in all three);
    # three of them, one per projection, stay after it.
    quantized = shared_qdq
    assert (totals[contract.QK_NORM_OP], totals.get(contract.RMS_NORM_QUANT_OP, 0)) == (1, int(quantized))
    assert totals[contract.RMS_NORM_OP] == int(not quantized)


@pytest.mark.parametrize("body", ["if", "nested-if", "loop", "scan"])
def test_no_pair_when_k_depends_on_q_through_a_subgraph(body: str) -> None:
    model = k_scaled_by_q(body)
    found = search(model)
    assert not found.qk_norm_pairs
    assert sum("would be a cycle" in miss.reason for miss in found.near_misses) == 2
    totals = assert_fused_matches(model)
    assert (totals[contract.QK_NORM_OP], totals[contract.RMS_NORM_OP]) == (0, 3)


def test_norms_absorbed_into_group_query_attention_are_reported(tmp_path) -> None:
    found = search(absorbed_gqa())
    [miss] = [miss for miss in found.near_misses if "GroupQueryAttention" in miss.node]
    assert "already inside the attention op" in miss.reason and "q_norm" in miss.reason and "k_norm" in miss.reason
    assert not found.qk_norm_pairs
    path = tmp_path / "gqa.onnx"
    onnx.save(absorbed_gqa(), path)
    printed = CliRunner().invoke(cli, ["inspect", str(path)])
    assert printed.exit_code == 0, printed.output
    assert f"{miss.node}: {miss.reason}" in printed.output


def test_group_query_attention_without_norm_weights_says_nothing() -> None:
    found = search(absorbed_gqa(with_norm_weights=False))
    assert not any("GroupQueryAttention" in miss.node for miss in found.near_misses)
