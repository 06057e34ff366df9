"""The Q/DQ pairs around a norm go into the fused node (docs/patterns.md, "Quantized norms"): on ModelOpt-style
graphs in every activation dtype, both quantized dtypes and every `saturate`, each norm-output QuantizeLinear and each
input pair is taken in, no Add stays out, and the fused model (lowered) gives the original graph's FP8 / INT8 values
bit for bit. Those that cannot be taken in stay in the graph with the reason."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx.reference import ReferenceEvaluator
from onnx.reference.ops.op_quantize_linear import QuantizeLinear_25

from trtfuse import contract
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.fused_nodes import plugin_nodes
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import DEFAULT_FUSION, FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import check_fused
from trtfuse.verify.onnxrt import CpuSession

from support.cli import run_cli
from support.graphs import BATCH, HIDDEN, SEQUENCE, AttentionSpec, Builder, NormSpec, attention_block, rms_norm
from support.paths import TOOL_FIXTURES
from support.quant_graphs import (
    OLMO2_RANGES,
    OUTPUT_RANGE,
    QMAX,
    QUANT_TYPES,
    RSQRT_RANGE,
    QuantSpec,
    olmo2_attention,
    quantized_decoder,
    quantized_norm,
)

NO_QUANT = FusionOptions(fuse_quant=False)
DTYPES = ("float32", "float16", "bfloat16")
QUANTS = ("float8_e4m3fn", "int8")
MODELOPT_FIXTURE = TOOL_FIXTURES / "qwen3-modelopt-int8-fp16.onnx"


def _kinds(result: FuseResult) -> Counter:
    return Counter(node.op_type for node in result.model.graph.node if node.domain == contract.ONNX_DOMAIN)


def _feed(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    # Rows whose rms spans a decade, so each calibrated range clips some values.
    scale = rng.uniform(0.3, 3.0, (BATCH, SEQUENCE, 1))
    return {"x": (rng.standard_normal((BATCH, SEQUENCE, HIDDEN)) * scale).astype(np.float32)}


class QuantizeLinear(QuantizeLinear_25):
    """ONNX's QuantizeLinear with the division in float32, as onnxruntime and the contract divide (onnx's evaluator
    divides a float16 input by a float16 scale in float16, rounding the quotient before the quantizer does)."""

    def _run(self, x: np.ndarray, y_scale: np.ndarray, *args: object, **kwargs: object) -> tuple[np.ndarray]:
        return super()._run(x.astype(np.float32), y_scale.astype(np.float32), *args, **kwargs)


def _run(model: onnx.ModelProto, dtype: str, feed: dict[str, np.ndarray], runtime: str = "") -> dict[str, np.ndarray]:
    """Every output, in onnxruntime for float32 graphs; 16-bit graphs in onnx's evaluator, which rounds every step as
    written (onnxruntime's CPU provider runs no bfloat16 Mul, and rounds some float16 Adds otherwise than a float32
    sum rounded once), unless `runtime` is "onnxruntime"."""
    names = [value.name for value in model.graph.output]
    if dtype != "float32" and runtime != "onnxruntime":
        evaluator = ReferenceEvaluator(model, new_ops=[QuantizeLinear])
        return dict(zip(names, evaluator.run(None, feed), strict=True))
    options = ort.SessionOptions()
    # onnxruntime's optimiser would fuse the original's chains into its own ops: run both graphs as written.
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return dict(zip(names, session.run(None, feed), strict=True))


def _quantize_reads_trtfuse(model: onnx.ModelProto) -> list[str]:
    produced_by = {output: node for node in model.graph.node for output in node.output}
    return [
        node.name
        for node in model.graph.node
        if node.op_type == "QuantizeLinear"
        and node.input[0] in produced_by
        and produced_by[node.input[0]].domain == contract.ONNX_DOMAIN
    ]


SPECS = [
    QuantSpec(dtype=dtype, quant=quant, saturate=saturate)
    for dtype in DTYPES
    for quant in QUANTS
    for saturate in ((None, 0) if quant == "float8_e4m3fn" else (None,))
] + [
    # Opset 13's QuantizeLinear (INT8 and float32 only, no saturate), and opset 21's.
    QuantSpec(dtype="float32", quant="int8", opset=13),
    QuantSpec(dtype="float16", quant="float8_e4m3fn", saturate=1, opset=21),
]


@pytest.mark.parametrize(
    "spec", SPECS, ids=lambda spec: f"{spec.dtype}-{spec.quant}-saturate{spec.saturate}-opset{spec.opset}"
)
def test_every_pair_around_every_norm_is_taken_in_and_the_quantized_values_are_the_originals(spec: QuantSpec) -> None:
    original = quantized_decoder(spec)
    result = fuse_model(original)
    # 3 norms: the first reads DQ(Q(x)), the second DQ(Q(sum)), the last the sum itself; each output is quantized.
    assert _kinds(result) == {contract.RMS_NORM_QUANT_OP: 1, contract.ADD_RMS_NORM_QUANT_OP: 2}
    assert result.search.residual_near_misses == [] and result.search.near_misses == []
    assert result.search.quant_near_misses == []
    assert result.counts().quantizers_taken == 5
    assert _quantize_reads_trtfuse(result.model) == []
    assert [node.op_type for node in result.model.graph.node].count("QuantizeLinear") == 0
    stages = [plugin.fields.quant.stages for plugin in plugin_nodes(result.model)]
    input_output = (contract.QuantStage.INPUT, contract.QuantStage.OUTPUT)
    assert sorted(stages) == sorted([input_output, input_output, (contract.QuantStage.OUTPUT,)])
    for plugin in plugin_nodes(result.model):
        assert plugin.fields.output_quantizer(0).saturate == (spec.quant == "int8" or spec.saturate != 0)
    feed = _feed()
    want = _run(original, spec.dtype, feed)
    got = _run(lower_fused_nodes(result.model), spec.dtype, feed)
    assert want.keys() == got.keys()
    for name, value in want.items():
        # Every output quantizer clips or saturates some values (NaN past ±448 for FP8 without saturate).
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("quant", QUANTS)
def test_in_onnxruntime_the_node_quantizes_as_the_graph_quantizes_the_same_norm(quant: str) -> None:
    # A norm without a residual Add (onnxruntime rounds some float16 sums otherwise than the contract): with its
    # pairs in the graph after the plain fused node, and taken in, the quantized values are onnxruntime's own.
    original = quantized_norm("input-pair", QuantSpec(dtype="float16", quant=quant))
    feed = _feed(4)
    plain = _run(lower_fused_nodes(fuse_model(original, NO_QUANT).model), "float16", feed, "onnxruntime")
    quantized = _run(lower_fused_nodes(fuse_model(original).model), "float16", feed, "onnxruntime")
    for name, value in plain.items():
        np.testing.assert_array_equal(quantized[name], value, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_the_inverse_root_pair_is_the_rsqrt_stage(dtype: str) -> None:
    # ModelOpt's INT8 of TorchScript graphs: Div(1, Sqrt(...)) -> Q -> DQ -> Mul(x, r'); today's "left unfused".
    spec = QuantSpec(dtype=dtype, quant="int8", rsqrt_pairs=True)
    original = quantized_decoder(spec)
    alone = fuse_model(original, NO_QUANT)
    assert alone.fused == [] and all("the inverse root" in miss.reason for miss in alone.search.near_misses)
    result = fuse_model(original)
    assert _kinds(result) == {contract.RMS_NORM_QUANT_OP: 1, contract.ADD_RMS_NORM_QUANT_OP: 2}
    assert result.search.near_misses == [] and result.search.residual_near_misses == []
    assert all(any(tag.endswith("+rsqrt-quant") for tag in node.tags) for node in result.fused)
    assert result.counts().quantizers_taken == 8
    reported = [entry["quant"]["rsqrt"] for entry in result.report()["fused"]]
    assert reported and all(stage["input_dtype"] == "float32" and "dequant_dtype" in stage for stage in reported)
    for plugin in plugin_nodes(result.model):
        rsqrt = plugin.fields.quant.rsqrt
        assert (
            rsqrt is not None and (rsqrt.dtype, rsqrt.dequant_dtype, rsqrt.input_dtype) == ("int8",) + ("float32",) * 2
        )
    feed = _feed(1)
    want, got = _run(original, dtype, feed), _run(lower_fused_nodes(result.model), dtype, feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def _roots_the_rounding_moves(scale: float, epsilon: float, count: int) -> np.ndarray:
    """`count` float16 magnitudes c whose row of ±c has an inverse root r that the INT8 quantizer of `scale` puts on
    one level and float16(r) on the next. The row's mean of squares is c² exactly (c² fits float32), so r is the same
    float32 value in the graph and in the fused node whatever the order of the sum."""
    c = np.arange(0x3800, 0x4200, dtype=np.uint16).view(np.float16).astype(np.float32)  # [0.5, 3)
    r = np.float32(1) / np.sqrt(c * c + np.float32(epsilon))

    def level(v: np.ndarray) -> np.ndarray:
        return np.clip(np.rint(v / np.float32(scale)), -128, 127)

    moved = c[level(r) != level(r.astype(np.float16).astype(np.float32))]
    assert len(moved) >= count
    return moved[:: len(moved) // count][:count]


def test_an_inverse_root_the_graph_rounds_to_16_bits_is_quantized_as_rounded() -> None:
    # r cast to float16 before its pair (`+rsqrt-cast`): the Q reads float16(r), and so does the node's rsqrt stage.
    # On rows whose r and float16(r) quantize to different levels, the fused model is the original bit for bit (in
    # onnx's evaluator: onnxruntime's CPU provider rounds the float16 weight Mul otherwise than IEEE, in both).
    original = quantized_decoder(QuantSpec(dtype="float16", rsqrt_pairs=True, rsqrt_root="rounded", layers=0))
    result = fuse_model(original)
    [node] = result.fused
    assert "reciprocal+rsqrt-cast+rsqrt-quant" in node.tags or "div-one+rsqrt-cast+rsqrt-quant" in node.tags
    [plugin] = plugin_nodes(result.model)
    scale = float(np.float16(RSQRT_RANGE / QMAX["int8"]))
    assert plugin.fields.quant.rsqrt == contract.Quantizer("int8", scale, True, "float16", "float16")
    magnitudes = _roots_the_rounding_moves(scale, 1e-6, BATCH * SEQUENCE)
    signs = np.random.default_rng(6).choice([-1.0, 1.0], (BATCH * SEQUENCE, HIDDEN))
    feed = {"x": (signs * magnitudes[:, None]).astype(np.float32).reshape(BATCH, SEQUENCE, HIDDEN)}
    want, got = _run(original, "float16", feed), _run(lower_fused_nodes(result.model), "float16", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_an_inverse_root_computed_in_16_bits_is_read_in_16_bits() -> None:
    # ModelOpt's INT8 fp16 exports compute the whole root in float16 (`core-float16`): the stage rounds the node's
    # float32 r to float16 for its Q, the nearest the node comes to the graph's r (docs/patterns.md, "Exact").
    result = fuse_model(quantized_decoder(QuantSpec(dtype="float16", rsqrt_pairs=True, rsqrt_root="core", layers=0)))
    [node] = result.fused
    assert "core-float16" in node.tags
    [plugin] = plugin_nodes(result.model)
    assert (plugin.fields.quant.rsqrt.input_dtype, plugin.fields.quant.rsqrt.dequant_dtype) == ("float16", "float16")


def test_without_quantizers_the_pairs_stay_as_before() -> None:
    original = quantized_decoder(QuantSpec())
    result = fuse_model(original, NO_QUANT)
    # The second norm's Add stays out ("reads its sum through the pair"); the last norm reads its sum directly.
    assert _kinds(result) == {contract.RMS_NORM_OP: 2, contract.ADD_RMS_NORM_OP: 1}
    assert len(result.search.residual_near_misses) == 1 and result.search.quant_near_misses is None
    assert "quant_near_misses" not in result.report() and "quantizers_taken" not in result.report()
    assert ", Q" not in result.counts().line()


NEAR_MISSES = {
    "read": "is also read by",
    "per-channel": "is not a one-element constant",
    "zero-point": "is not a constant 0",
    "uint8": "it quantizes to UINT8, not to FLOAT8E4M3FN or INT8",
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_a_quantize_that_stays_out_says_why(case: str) -> None:
    original = quantized_norm(case, QuantSpec(dtype="float32"))
    result = fuse_model(original)
    assert _kinds(result) == {contract.RMS_NORM_OP: 1}
    [miss] = result.search.quant_near_misses
    quantize = next(node.name for node in original.graph.node if node.op_type == "QuantizeLinear")
    assert miss.node == quantize and NEAR_MISSES[case] in miss.reason, miss.reason
    assert miss.reason.startswith("not taken into the norm ")
    line = result.counts().line()
    assert line.endswith(f", 0 rejected, 1 Q kept out (first: {quantize}: {miss.reason})"), line
    assert result.report()["quant_near_misses"] == [{"node": miss.node, "reason": miss.reason}]
    assert result.report()["quantizers_taken"] == 0
    feed = _feed(2)
    want, got = _run(original, "float32", feed), _run(lower_fused_nodes(result.model), "float32", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("quant", QUANTS)
@pytest.mark.parametrize(
    ("opset", "precision", "taken"),
    [(19, None, True), (23, None, False), (23, onnx.TensorProto.FLOAT, True), (23, onnx.TensorProto.FLOAT16, False)],
)
def test_from_opset_23_a_quantize_that_divides_in_16_bits_stays_out(
    quant: str, opset: int, precision: int | None, taken: bool, tmp_path: Path
) -> None:
    # From opset 23 QuantizeLinear divides in its precision attribute's dtype, by default its scale's: float16 here,
    # which onnxruntime 1.32 follows and the node (float32) does not. Taken in, 1-3 of the norm's 384 codes came out
    # one step off the graph's. One norm (its chain in float32, as the node's) and its output QuantizeLinear.
    spec = QuantSpec(dtype="float16", quant=quant, opset=opset, precision=precision, layers=0)
    original = quantized_decoder(spec)
    result = fuse_model(original)
    assert result.counts().quantizers_taken == (1 if taken else 0)
    assert len(result.search.quant_near_misses) == (0 if taken else 1)
    for miss in result.search.quant_near_misses:
        how = "its precision attribute" if precision else "its scale's dtype, with no precision"
        assert f"at opset 23 it divides by its scale in float16 ({how}), the fused node in float32" in miss.reason
    # Both run as check runs them: onnxruntime with every float16 value rounded as the graph says.
    feed = _feed(3)
    want = CpuSession(LoadedModel(original, tmp_path / "original.onnx")).run(feed)
    got = CpuSession(LoadedModel(lower_fused_nodes(result.model), tmp_path / "fused.onnx")).run(feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_quantize_without_zero_point_takes_its_dtype_from_output_dtype() -> None:
    original = quantized_norm("output-dtype", QuantSpec(dtype="float32", opset=21))
    result = fuse_model(original)
    [plugin] = plugin_nodes(result.model)
    assert plugin.fields.output_quantizer(0) == contract.Quantizer("int8", float(np.float32(2.5 / 127)), True)
    feed = _feed(5)
    want, got = _run(original, "float32", feed), _run(lower_fused_nodes(result.model), "float32", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


QK_QUANT_LAYOUTS = {
    # MLA's latent norms (DeepSeek-V3 in ModelOpt's FP8) pair into one QK-norm; ModelOpt quantizes the q latent.
    "mla-latent": ("q",),
    # Gemma3 in ModelOpt's INT8: each of the q and k norms' outputs has its own Q, at its own scale.
    "qk-head-dim-transposed": ("q", "k"),
    "qk-head-dim": ("k",),
}


@pytest.mark.parametrize("layout", sorted(QK_QUANT_LAYOUTS))
def test_a_quantize_on_a_qk_norm_output_is_that_output_s_own_stage(layout: str) -> None:
    original = attention_block(AttentionSpec(layout=layout))
    [pair] = fuse_model(original).search.qk_norm_pairs
    quantized = original
    scales = {"q": 0.05, "k": 0.0375}
    for role in QK_QUANT_LAYOUTS[layout]:
        tensor = getattr(pair, role).y.name
        if layout == "qk-head-dim":
            # Qwen3's k norm is read by a Transpose: the Q after it is taken in, the Transpose moving the codes.
            tensor = next(node.output[0] for node in original.graph.node if tensor in node.input)
        quantized = _quantize_readers_of(quantized, tensor, scales[role], prefix=role)
    result = fuse_model(quantized)
    assert _kinds(result)[contract.QK_NORM_QUANT_OP] == 1 and contract.QK_NORM_OP not in _kinds(result)
    assert result.search.quant_near_misses == []
    assert result.counts().quantizers_taken == len(QK_QUANT_LAYOUTS[layout])
    assert _quantize_reads_trtfuse(result.model) == []
    [plugin] = [plugin for plugin in plugin_nodes(result.model) if plugin.op is contract.QK_NORM_QUANT]
    for index, role in enumerate(("q", "k")):
        quantizer = plugin.fields.output_quantizer(index)
        if role in QK_QUANT_LAYOUTS[layout]:
            assert quantizer == contract.Quantizer("int8", float(np.float32(scales[role])))
        else:
            assert quantizer is None
    [entry] = [entry for entry in result.report()["fused"] if entry["kind"] == contract.QK_NORM_QUANT_OP]
    assert sorted(entry["quant"]) == sorted(f"{role}_output" for role in QK_QUANT_LAYOUTS[layout])
    feed = _feed(2)
    want, got = _run(quantized, "float32", feed), _run(lower_fused_nodes(result.model), "float32", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


# ModelOpt's INT8 OLMo2, fp32 and fp16 elsewhere (the fp16 export computes the root in float16: `core-float16`), and
# the fp16 form with the root in float32, whose rsqrt stages are exact on every row.
OLMO2_INT8 = {
    "int8-fp32": QuantSpec(dtype="float32", rsqrt_pairs=True),
    "int8-fp16": QuantSpec(dtype="float16", rsqrt_pairs=True, rsqrt_root="core"),
    "int8-fp16-float32-root": QuantSpec(dtype="float16", rsqrt_pairs=True),
}
QK_PART_STAGES = {
    "q": (contract.QuantStage.Q_INPUT, contract.QuantStage.Q_RSQRT, contract.QuantStage.Q_OUTPUT),
    "k": (contract.QuantStage.K_INPUT, contract.QuantStage.K_RSQRT, contract.QuantStage.K_OUTPUT),
}


@pytest.mark.parametrize("output_quantizers", [False, True], ids=["as-exported", "with-output-qs"])
@pytest.mark.parametrize("variant", sorted(OLMO2_INT8))
def test_olmo2_int8_q_and_k_norms_pair_each_with_its_own_input_rsqrt_and_output_stages(
    variant: str, output_quantizers: bool
) -> None:
    """OLMo2's full-width q and k norms of different widths, each with its input pair and its inverse-root pair (and
    an output Q), are one TrtfuseQkNormQuant taking every pair in, each in its part's own stages at its own scale;
    lowered, it gives the original's outputs (Q outputs included) bit for bit where the graph's root is float32."""
    spec = OLMO2_INT8[variant]
    original = olmo2_attention(spec, output_quantizers)
    result = fuse_model(original)
    assert _kinds(result) == {contract.QK_NORM_QUANT_OP: 1}
    assert result.search.near_misses == [] and result.search.quant_near_misses == []
    assert result.counts().quantizers_taken == (6 if output_quantizers else 4) and result.counts().norms == 2
    assert [node.op_type for node in result.model.graph.node].count("QuantizeLinear") == 0
    [plugin] = plugin_nodes(result.model)
    assert plugin.fields.hidden_sizes == (64, 32)
    stages = tuple(stage for role in ("q", "k") for stage in QK_PART_STAGES[role][: 3 if output_quantizers else 2])
    assert plugin.fields.quant.stages == stages
    rsqrt_dtype = "float16" if spec.rsqrt_root == "core" else "float32"
    for part, role in enumerate(("q", "k")):
        quant = plugin.fields.part_quant(part)
        input_range, rsqrt_range, output_range = OLMO2_RANGES[role]
        scale_dtype = np.float32 if spec.dtype == "float32" else np.float16
        assert quant.input == contract.Quantizer("int8", float(scale_dtype(input_range / 127)), True, spec.dtype)
        rsqrt_scale = float((scale_dtype if spec.rsqrt_root == "core" else np.float32)(rsqrt_range / 127))
        assert quant.rsqrt == contract.Quantizer("int8", rsqrt_scale, True, rsqrt_dtype, rsqrt_dtype)
        if output_quantizers:
            assert quant.output == contract.Quantizer("int8", float(scale_dtype(output_range / 127)))
        assert plugin.fields.normalised_dtype(part) == ("int8" if output_quantizers else spec.dtype)
    [entry] = result.report()["fused"]
    assert sorted(entry["quant"]) == sorted(stage.value for stage in stages)
    assert entry["quant"]["k_rsqrt"]["input_dtype"] == rsqrt_dtype
    if spec.rsqrt_root == "core":
        return  # a float16 root is not always the float16 rounding of the node's float32 r (patterns.md, "Exact")
    feed = _feed(7)
    want, got = _run(original, spec.dtype, feed), _run(lower_fused_nodes(result.model), spec.dtype, feed)
    assert want.keys() == got.keys()
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_without_fused_quantizers_a_quantized_qk_norm_stays_a_plain_one_before_its_quantize() -> None:
    original = attention_block(AttentionSpec(layout="qk-head-dim-transposed"))
    [pair] = fuse_model(original).search.qk_norm_pairs
    quantized = _quantize_readers_of(original, pair.q.y.name, 0.05)
    result = fuse_model(quantized, NO_QUANT)
    assert _kinds(result)[contract.QK_NORM_OP] == 1 and contract.QK_NORM_QUANT_OP not in _kinds(result)
    assert [node.op_type for node in result.model.graph.node].count("QuantizeLinear") == 1


def _quantize_readers_of(
    model: onnx.ModelProto, tensor: str, scale: float = 0.05, prefix: str = "q"
) -> onnx.ModelProto:
    """`model` with an INT8 Q -> DQ pair of scale `scale` (nodes named `{prefix}_out_Q`, `{prefix}_DQ`) between
    `tensor` and every node that read it, and the graph output it was."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    graph = copy.graph
    for node in graph.node:
        node.input[:] = [f"{tensor}_dq" if name == tensor else name for name in node.input]
    for output in graph.output:
        if output.name == tensor:
            output.name = f"{tensor}_dq"
    scale_name, zero_name = f"{prefix}_scale", f"{prefix}_zero"
    graph.initializer.extend(
        [
            onnx.numpy_helper.from_array(np.float32(scale), scale_name),
            onnx.numpy_helper.from_array(np.int8(0), zero_name),
        ]
    )
    pair = [
        onnx.helper.make_node(
            "QuantizeLinear", [tensor, scale_name, zero_name], [f"{tensor}_q"], name=f"{prefix}_out_Q"
        ),
        onnx.helper.make_node(
            "DequantizeLinear", [f"{tensor}_q", scale_name, zero_name], [f"{tensor}_dq"], name=f"{prefix}_DQ"
        ),
    ]
    producer = next(index for index, node in enumerate(graph.node) if tensor in node.output)
    for offset, node in enumerate(pair, start=1):
        graph.node.insert(producer + offset, node)
    return onnx.shape_inference.infer_shapes(copy)


def test_a_shape_reader_of_the_unquantized_output_reads_the_node_input() -> None:
    original = quantized_norm("shape", QuantSpec(dtype="float16"))
    result = fuse_model(original)
    assert _kinds(result) == {contract.RMS_NORM_QUANT_OP: 1}
    [plugin] = plugin_nodes(result.model)
    [shape] = [node for node in result.model.graph.node if node.op_type == "Shape"]
    assert list(shape.input) == [plugin.node.input[0]]
    feed = _feed(3)
    want, got = _run(original, "float16", feed), _run(lower_fused_nodes(result.model), "float16", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_the_modelopt_fixture_keeps_no_add_out_and_takes_every_norm_output_quantize() -> None:
    original = load_model(MODELOPT_FIXTURE)
    result = fuse_model(original.model)
    assert result.search.residual_near_misses == [] and result.search.near_misses == []
    assert result.search.quant_near_misses == [] and result.search.rope_near_misses == []
    # 9 norms: 5 hidden norms, each with its output Q and, but for the final norm, the pair on its input (9 Qs), and
    # 4 QK-norms (no quantizer on them) with their rotations, each taking in the pairs on its cos and sin products and
    # q's the Q on its rotated output (5 per layer).
    assert _kinds(result) == {
        contract.QK_NORM_ROPE_QUANT_OP: 2,
        contract.RMS_NORM_QUANT_OP: 1,
        contract.ADD_RMS_NORM_QUANT_OP: 4,
    }
    assert result.counts().quantizers_taken == 19 and result.counts().norms == 9
    assert _quantize_reads_trtfuse(result.model) == []
    verdict = check_fused(original, LoadedModel(model=result.model, path=original.path))
    assert verdict.passed, verdict.to_json()
    # Without the rotations (--no-fuse-rope) the q/k norms are plain pairs and the hidden norms take the same 9 Qs.
    pairs = fuse_model(original.model, FusionOptions(fuse_rope=False))
    assert pairs.search.residual_near_misses == [] and pairs.search.quant_near_misses == []
    assert _kinds(pairs) == {contract.QK_NORM_OP: 2, contract.RMS_NORM_QUANT_OP: 1, contract.ADD_RMS_NORM_QUANT_OP: 4}
    assert pairs.counts().quantizers_taken == 9 and pairs.counts().norms == 9
    assert _quantize_reads_trtfuse(pairs.model) == []


def _fused_fixture(
    name: str, kinds: dict[str, int], options: FusionOptions = DEFAULT_FUSION
) -> tuple[LoadedModel, FuseResult]:
    """A tool fixture and its fusion as `options` say, which must write exactly `kinds` (plugin op -> nodes) and
    reject no norm."""
    original = load_model(TOOL_FIXTURES / name)
    result = fuse_model(original.model, options)
    assert _kinds(result) == kinds
    assert result.search.residual_near_misses == [] and result.search.near_misses == []
    return original, result


def _assert_quantized_and_checked(original: LoadedModel, result: FuseResult) -> None:
    """No Q left reading a fused node's output, and `check` passes on the fused model."""
    assert _quantize_reads_trtfuse(result.model) == []
    verdict = check_fused(original, LoadedModel(model=result.model, path=original.path))
    assert verdict.passed, verdict.to_json()


def test_the_modelopt_int8_gemma3_fixture_takes_each_q_and_k_norm_output_quantize_at_its_own_scale() -> None:
    """Without the rotations (`--no-fuse-rope`; with them the pairs are the rotary nodes' normalised stages:
    tests/fusion/test_rope.py) each q/k pair is one TrtfuseQkNormQuant, each output's Q at its own scale."""
    kinds = {contract.QK_NORM_QUANT_OP: 2, contract.RMS_NORM_QUANT_OP: 5, contract.ADD_RMS_NORM_QUANT_OP: 4}
    original, result = _fused_fixture("gemma3-modelopt-int8-fp16.onnx", kinds, FusionOptions(fuse_rope=False))
    # The one Q kept out: the embedding's pair, whose dequantized value the first residual Add reads too.
    [kept] = result.search.quant_near_misses
    assert "is also read by" in kept.reason and "the node reads the dequantized x" in kept.reason
    # The 21 around the single norms and add-norms, and the 4 on the q/k norms' outputs.
    assert result.counts().quantizers_taken == 25 and result.counts().norms == 13
    qk = [plugin for plugin in plugin_nodes(result.model) if plugin.op is contract.QK_NORM_QUANT]
    for plugin in qk:
        q_quantizer, k_quantizer = plugin.fields.output_quantizer(0), plugin.fields.output_quantizer(1)
        assert q_quantizer.dtype == k_quantizer.dtype == "int8" and q_quantizer.scale != k_quantizer.scale
    _assert_quantized_and_checked(original, result)


def test_the_modelopt_int8_olmo2_fixture_pairs_each_q_and_k_norm_with_its_own_input_and_rsqrt_pairs() -> None:
    """ModelOpt's INT8 of optimum's OLMo2 export: each layer's full-width q (64) and k (32) norms, each with its input
    pair and its inverse-root pair, are one TrtfuseQkNormQuant taking those four pairs in (they were two
    TrtfuseRmsNormQuant nodes); every Q taken in as before, and `check` passes at a prefill and a decode step. Without
    the rotations (`--no-fuse-rope`): with them each pair and its rotation are one TrtfuseQkNormRopeQuant with the
    same four pairs as its input and rsqrt stages (tests/fusion/test_rope.py)."""
    kinds = {contract.QK_NORM_QUANT_OP: 2, contract.RMS_NORM_QUANT_OP: 4, contract.ADD_RMS_NORM_QUANT_OP: 1}
    original, result = _fused_fixture("olmo2-modelopt-int8-fp16-optimum.onnx", kinds, FusionOptions(fuse_rope=False))
    assert result.search.quant_near_misses == []
    assert result.counts().quantizers_taken == 17 and result.counts().norms == 9
    stages = (*QK_PART_STAGES["q"][:2], *QK_PART_STAGES["k"][:2])
    for plugin in plugin_nodes(result.model):
        if plugin.op is contract.QK_NORM_QUANT:
            assert plugin.fields.hidden_sizes == (64, 32) and plugin.fields.quant.stages == stages
            q, k = plugin.fields.part_quant(0), plugin.fields.part_quant(1)
            assert q.rsqrt.scale != k.rsqrt.scale and q.input.scale != k.input.scale
            assert q.rsqrt.input_dtype == k.rsqrt.input_dtype == "float16"
    _assert_quantized_and_checked(original, result)


def test_inspect_and_fuse_report_the_quantizers(tmp_path) -> None:
    inspected = run_cli("inspect", MODELOPT_FIXTURE)
    first = inspected.stdout.splitlines()[0]
    assert first.endswith(
        "0 TrtfuseRmsNorm, 0 TrtfuseQkNorm, 1 TrtfuseRmsNormQuant, 4 TrtfuseAddRmsNormQuant and "
        "2 TrtfuseQkNormRopeQuant nodes (9 norms), 0 rejected, 19 Qs taken in"
    ), first
    assert "add kept" not in inspected.stdout and " quant=input:int8@" in inspected.stdout
    assert " quant=q_cos_product:int8@" in inspected.stdout
    report = json.loads(run_cli("inspect", MODELOPT_FIXTURE, "--json").stdout)
    assert report["quant_near_misses"] == [] and report["quantizers_taken"] == 19
    assert report["plugin_nodes"][contract.ADD_RMS_NORM_QUANT_OP] == 4
    assert report["plugin_nodes"][contract.QK_NORM_ROPE_QUANT_OP] == 2
    assert all(set(entry["quant"]) >= {"output"} for entry in report["add_rms_norms"])
    stages = {"q_cos_product", "q_sin_product", "q_output", "k_cos_product", "k_sin_product"}
    assert all(set(entry["quant"]) == stages for entry in report["qk_norm_ropes"])
    pairs = run_cli("inspect", MODELOPT_FIXTURE, "--no-fuse-rope").stdout.splitlines()[0]
    assert pairs.endswith(
        "0 TrtfuseRmsNorm, 2 TrtfuseQkNorm, 1 TrtfuseRmsNormQuant and 4 TrtfuseAddRmsNormQuant nodes (9 norms), "
        "0 rejected, 9 Qs taken in"
    ), pairs
    plain = json.loads(run_cli("inspect", MODELOPT_FIXTURE, "--json", "--no-fuse-quant").stdout)
    assert "quant_near_misses" not in plain and "quantizers_taken" not in plain
    assert set(plain["plugin_nodes"]) == {contract.RMS_NORM_OP, contract.QK_NORM_OP, contract.ADD_RMS_NORM_OP}
    fused = json.loads(run_cli("fuse", MODELOPT_FIXTURE, "-o", tmp_path / "f.onnx", "--json").stdout)
    assert fused["totals"]["norms"] == 9 and fused["quantizers_taken"] == 19
    [entry] = [node for node in fused["fused"] if node["kind"] == contract.RMS_NORM_QUANT_OP]
    assert entry["quant"]["input"]["dequant_dtype"] == "float16" and entry["quant"]["output"]["dtype"] == "int8"
    assert run_cli("check", MODELOPT_FIXTURE, tmp_path / "f.onnx").exit_code == 0


# The layout ops a per-tensor Q commutes with (docs/patterns.md, "Quantized norms"): each builds [.., HIDDEN] from
# the norm's y, so a MatMul by a [HIDDEN, 8] weight reads every result.
LAYOUTS = {
    "Reshape": lambda b, y: b.op("Reshape", y, b.constant([-1, HIDDEN], "int64", base="shape")),
    "Reshape-of-its-shape": lambda b, y: b.op("Reshape", y, b.op("Shape", y)),
    "Flatten": lambda b, y: b.op("Flatten", y, axis=2),
    "Unsqueeze": lambda b, y: b.op("Unsqueeze", y, b.constant([1], "int64", base="axes")),
    "Squeeze": lambda b, y: b.op("Squeeze", y, b.constant([2], "int64", base="axes")),
    "Transpose": lambda b, y: b.op("Transpose", y, perm=[1, 0, 2]),
}


def _norm_through_layout(
    layout: str, spec: QuantSpec, also_read: bool = False, residual: bool = False
) -> onnx.ModelProto:
    """norm -> layout op -> [Cast to float32, bfloat16] -> Q -> DQ -> [Cast back] -> MatMul, DeepSeek-V3's
    kv_a_layernorm in ModelOpt's exports (`view` -> Q); the Q's value is a graph output. `also_read`: a Mul reads the
    layout op's output too, unquantized; `residual`: the norm reads a residual sum, which is a graph output."""
    b = Builder(opset=spec.opset)
    squeezed = layout == "Squeeze"
    shape = [BATCH, SEQUENCE, *([1] if squeezed else []), HIDDEN]
    x = b.input("x", shape, spec.dtype)
    if residual:
        x = b.op("Add", x, b.op("Mul", x, b.weight(HIDDEN, spec.dtype)))
        b.output(x, shape)
    moved = LAYOUTS[layout](b, rms_norm(b, x, NormSpec(dtype=spec.dtype)))
    quantized_input = moved if spec.scale_dtype == spec.dtype else b.cast(moved, spec.scale_dtype)
    scale = b.constant(OUTPUT_RANGE / QMAX[spec.quant], spec.scale_dtype, base="scale")
    zero = b.fresh("zero_point")
    b.initializers.append(onnx.helper.make_tensor(zero, QUANT_TYPES[spec.quant], [], [0]))
    quantized = b.op("QuantizeLinear", quantized_input, scale, zero)
    b.output(quantized)
    dequantized = b.op("DequantizeLinear", quantized, scale, zero)
    if spec.scale_dtype != spec.dtype:
        dequantized = b.cast(dequantized, spec.dtype)
    b.output(b.op("MatMul", dequantized, b.constant(b.rng.normal(0.0, 0.5, (HIDDEN, 8)), spec.dtype, base="proj")))
    if also_read:
        b.output(b.op("Mul", moved, moved))
    return b.model()


def _layout_feed(layout: str) -> dict[str, np.ndarray]:
    feed = _feed(6)
    return {"x": feed["x"][:, :, None, :]} if layout == "Squeeze" else feed


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_quantize_after_a_layout_op_is_taken_in_and_the_op_moves_the_int8_codes(layout: str, dtype: str) -> None:
    original = _norm_through_layout(layout, QuantSpec(dtype=dtype, quant="int8"))
    result = fuse_model(original)
    assert _kinds(result) == {contract.RMS_NORM_QUANT_OP: 1}
    assert result.search.quant_near_misses == [] and result.counts().quantizers_taken == 1
    [plugin] = plugin_nodes(result.model)
    assert plugin.fields.output_quantizer(0).dtype == "int8"
    quantize = next(node for node in original.graph.node if node.op_type == "QuantizeLinear")
    [moved] = [node for node in result.model.graph.node if node.op_type == layout.split("-")[0]]
    # The op reads the node's INT8 output and writes the Q's output, which the DequantizeLinear still reads.
    assert moved.input[0] == plugin.node.output[0] and list(moved.output) == [quantize.output[0]]
    assert [node.op_type for node in result.model.graph.node].count("QuantizeLinear") == 0
    for shape in (node for node in result.model.graph.node if node.op_type == "Shape"):
        assert list(shape.input) == [plugin.node.input[0]]
    [entry] = result.report()["fused"]
    # The Q (and a bfloat16 graph's widening Cast) is replaced; the layout op stays in the graph.
    assert entry["quant"]["output"]["nodes"][0] == quantize.name
    assert len(entry["quant"]["output"]["nodes"]) == (2 if dtype == "bfloat16" else 1)
    assert moved.name not in entry["replaced"]
    feed = _layout_feed(layout)
    want, got = _run(original, dtype, feed), _run(lower_fused_nodes(result.model), dtype, feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_name_the_rewrite_makes_that_the_model_holds_already_gets_a_suffix(tmp_path) -> None:
    """The model has a tensor `y/quantized` of its own, the name the rewrite gives the node's codes ahead of a layout
    op: the new tensor gets `y/quantized_1`. Before, the two shared the name, the result failed the checker (exit 2,
    blaming the input), onnx-graphsurgeon's warnings about it went to stdout (no JSON there) and `inspect` counted
    a Q taken in that `fuse` could not write."""
    model = _norm_through_layout("Reshape", QuantSpec(dtype="float16", quant="int8"))
    y = next(node for node in model.graph.node if node.op_type == "Reshape").input[0]
    taken = f"{y}/quantized"
    model.graph.node.append(onnx.helper.make_node("Identity", ["x"], [taken], name="users_identity"))
    model.graph.output.append(
        onnx.helper.make_tensor_value_info(taken, onnx.TensorProto.FLOAT, [BATCH, SEQUENCE, HIDDEN])
    )
    path, out = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    onnx.save(model, str(path))
    inspected, fused = run_cli("inspect", path, "--json"), run_cli("fuse", path, "-o", out, "--json")
    assert (inspected.exit_code, fused.exit_code) == (0, 0), fused.output
    inspect_json, fuse_json = json.loads(inspected.stdout), json.loads(fused.stdout)
    for key in ("plugin_nodes", "quantizers_taken"):
        assert inspect_json[key] == fuse_json[key]
    assert fuse_json["quantizers_taken"] == 1
    written = load_model(out).model
    [plugin] = plugin_nodes(written)
    assert list(plugin.node.output) == [f"{taken}_1"]
    outputs = [name for node in written.graph.node for name in node.output]
    assert len(outputs) == len(set(outputs)) and taken in outputs
    assert run_cli("check", path, out).exit_code == 0


LAYOUT_NEAR_MISSES = {
    # The layout op's output has another reader, which needs it unquantized.
    "also-read": (QuantSpec(dtype="float16", quant="int8"), True, "is also read by"),
    # The op would move FP8 codes, which onnxruntime's Reshape-19 and the TensorRT Shuffle layer documented at
    # 10.6 do not take.
    "float8": (QuantSpec(dtype="float16", quant="float8_e4m3fn"), False, "FLOAT8E4M3FN"),
}


@pytest.mark.parametrize("case", sorted(LAYOUT_NEAR_MISSES))
def test_a_quantize_after_a_layout_op_that_stays_out_names_the_op_and_says_why(case: str) -> None:
    spec, also_read, reason = LAYOUT_NEAR_MISSES[case]
    original = _norm_through_layout("Reshape", spec, also_read=also_read)
    result = fuse_model(original)
    assert _kinds(result) == {contract.RMS_NORM_OP: 1}
    [miss] = result.search.quant_near_misses
    quantize = next(node.name for node in original.graph.node if node.op_type == "QuantizeLinear")
    reshape = next(node.name for node in original.graph.node if node.op_type == "Reshape")
    assert miss.node == quantize and miss.reason.startswith("not taken into the norm "), miss.reason
    assert f"through {reshape}" in miss.reason and reason in miss.reason, miss.reason
    assert result.counts().line().endswith(f", 1 Q kept out (first: {quantize}: {miss.reason})")
    feed = _layout_feed("Reshape")
    want = _run(original, spec.dtype, feed)
    got = _run(lower_fused_nodes(result.model), spec.dtype, feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_an_int8_quantize_after_a_qk_norm_reshape_is_taken_in_and_the_reshape_moves_the_codes() -> None:
    # DeepSeek-V3 in ModelOpt: the kv latent norm pairs with the q latent norm, its output reshaped, then quantized.
    original = attention_block(AttentionSpec(layout="mla-latent", latent_reshape=True))
    [pair] = fuse_model(original).search.qk_norm_pairs
    [reshape] = [node for node in original.graph.node if node.op_type == "Reshape" and pair.k.y.name in node.input]
    quantized = _quantize_readers_of(original, reshape.output[0])
    result = fuse_model(quantized)
    assert _kinds(result)[contract.QK_NORM_QUANT_OP] == 1 and result.search.quant_near_misses == []
    [plugin] = [plugin for plugin in plugin_nodes(result.model) if plugin.op is contract.QK_NORM_QUANT]
    assert plugin.fields.output_quantizer(0) is None and plugin.fields.output_quantizer(1).dtype == "int8"
    [moved] = [node for node in result.model.graph.node if node.name == reshape.name]
    assert moved.input[0] == plugin.node.output[1] and moved.output[0] == f"{reshape.output[0]}_q"
    feed = _feed(2)
    want, got = _run(quantized, "float32", feed), _run(lower_fused_nodes(result.model), "float32", feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_an_add_norm_takes_in_a_quantize_after_a_reshape(dtype: str) -> None:
    original = _norm_through_layout("Reshape", QuantSpec(dtype=dtype, quant="int8"), residual=True)
    result = fuse_model(original)
    assert _kinds(result) == {contract.ADD_RMS_NORM_QUANT_OP: 1}
    assert result.search.quant_near_misses == [] and result.counts().quantizers_taken == 1
    [plugin] = plugin_nodes(result.model)
    [reshape] = [node for node in result.model.graph.node if node.op_type == "Reshape"]
    assert reshape.input[0] == plugin.node.output[0]
    feed = _layout_feed("Reshape")
    want, got = _run(original, dtype, feed), _run(lower_fused_nodes(result.model), dtype, feed)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)
