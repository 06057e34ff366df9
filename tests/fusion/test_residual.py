"""The residual Add in front of a norm (patterns/residual.py, rewrite): decoder stacks become 2·L add-norms and one
RMSNorm whose h is the original residual sum bit for bit; every Add that stays out says why and leaves the norm fused
alone; onnxruntime's SkipSimplifiedLayerNormalization maps onto the add-norm exactly as onnxruntime computes it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest

from trtfuse import contract
from trtfuse.contract.codec import NodeFields, from_node
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.lowering import lower_fused_nodes
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import CheckInputs, check_fused
from trtfuse.verify.onnxrt import CpuSession
from trtfuse.verify.tolerances import output_error, tolerance_for

from support.graphs import (
    BATCH,
    HIDDEN,
    SEQUENCE,
    Builder,
    NormSpec,
    residual_near_miss,
    residual_stack,
    rms_norm,
    skip_norm,
)
from support.paths import FIXTURES

DTYPES = ("float32", "float16", "bfloat16")
LAYERS = 2


def _plugin_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN]


def _declared(model: onnx.ModelProto) -> dict[str, int]:
    values = [*model.graph.value_info, *model.graph.output]
    return {value.name: value.type.tensor_type.elem_type for value in values}


def _feed(model: onnx.ModelProto, seed: int = 0, scale: float = 2.0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        value.name: rng.normal(0.0, scale, [dim.dim_value for dim in value.type.tensor_type.shape.dim]).astype(
            np.float32
        )
        for value in model.graph.input
    }


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every output by name, as `check` runs a model: onnxruntime without graph optimisations, every 16-bit value
    rounded where the graph says (its CPU kernels would otherwise run fp16 chains in float32); onnx's evaluator for
    bfloat16."""
    return CpuSession(LoadedModel(model, Path("model.onnx"))).run(feed)


def _passes_check(original: onnx.ModelProto, result: FuseResult, folder: Path, seeds: int = 1) -> None:
    paths = folder / "original.onnx", folder / "fused.onnx"
    onnx.save_model(original, str(paths[0]))
    onnx.save_model(result.model, str(paths[1]))
    for seed in range(seeds):
        verdict = check_fused(load_model(paths[0]), load_model(paths[1]), CheckInputs(seed=seed))
        assert verdict.passed, (seed, verdict.to_json())


# --- decoder stacks -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_decoder_stack_fuses_2L_add_norms_and_one_rms_norm(dtype: str) -> None:
    original = residual_stack(dtype, LAYERS)
    result = fuse_model(original)
    kinds = [node.op_type for node in _plugin_nodes(result.model)]
    assert sorted(kinds) == sorted([contract.RMS_NORM_OP] + [contract.ADD_RMS_NORM_OP] * 2 * LAYERS)
    assert not [node for node in result.model.graph.node if node.op_type == "Add"]
    assert result.search.near_misses == [] and result.search.residual_near_misses == []
    totals = result.report()["totals"]
    assert (totals[contract.ADD_RMS_NORM_OP], totals[contract.RMS_NORM_OP], totals["norms"]) == (4, 1, 5)
    line = result.counts().line()
    assert line == "1 TrtfuseRmsNorm, 0 TrtfuseQkNorm and 4 TrtfuseAddRmsNorm nodes (5 norms), 0 rejected"
    sums = {node.output[0]: list(node.input) for node in original.graph.node if node.op_type == "Add"}
    declared = _declared(result.model)
    code = contract.OUTPUT_DTYPE_CODES[dtype]
    for node in _plugin_nodes(result.model):
        if node.op_type != contract.ADD_RMS_NORM_OP:
            continue
        y, h = node.output
        # h keeps the Add's output name and its two operands are x and residual; the weight follows.
        assert list(node.input[:2]) == sums[h] and len(node.input) == 3
        assert (declared[y], declared[h]) == (code, code)
        fields = from_node(node, "fused")
        assert fields == NodeFields(contract.ADD_RMS_NORM, fields.params, (HIDDEN,), dtype)
        assert set(fields.onnx_attributes()) == {a.name for a in node.attribute}
    # The first norm reads the stack's input, no sum: it stays TrtfuseRmsNorm.
    [first] = [node for node in _plugin_nodes(result.model) if node.op_type == contract.RMS_NORM_OP]
    assert first.input[0] not in sums


@pytest.mark.parametrize("dtype", DTYPES)
def test_h_is_the_original_residual_sum_bit_for_bit(dtype: str) -> None:
    original = residual_stack(dtype, LAYERS, sums_as_outputs=True)
    result = fuse_model(original)
    feed = _feed(original)
    want, got = _run(original, feed), _run(lower_fused_nodes(result.model), feed)
    names = [value.name for value in original.graph.output]
    *sums, last = names
    assert len(sums) == 2 * LAYERS
    for name in sums:
        np.testing.assert_array_equal(got[name], want[name])
    assert output_error(last, got[last], want[last]).max_rel <= tolerance_for(dtype).rtol


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_fused_decoder_stack_passes_check(dtype: str, tmp_path: Path) -> None:
    original = residual_stack(dtype, LAYERS)
    _passes_check(original, fuse_model(original), tmp_path)


def test_a_float32_norm_of_a_widened_sum_reads_the_16_bit_sum_before_the_weight() -> None:
    # bf16 Add, widened, normalised and weighted in float32 with a float32 y: D is bfloat16, and AFTER_CAST there
    # would round to bfloat16 before the weight, which the original never does, so the node is BEFORE_CAST.
    b = Builder()
    x, r = b.input("x", [BATCH, SEQUENCE, HIDDEN], "bfloat16"), b.input("r", [BATCH, SEQUENCE, HIDDEN], "bfloat16")
    b.output(rms_norm(b, b.cast(b.op("Add", x, r), "float32"), NormSpec()), [BATCH, SEQUENCE, HIDDEN])
    original = b.model()
    result = fuse_model(original)
    [record] = result.fused
    assert (record.kind, record.dtype, record.output_dtype) == (contract.ADD_RMS_NORM_OP, "bfloat16", "float32")
    assert record.params.weight_mode is contract.WeightMode.BEFORE_CAST
    feed = _feed(original)
    [want], [got] = _run(original, feed).values(), _run(lower_fused_nodes(result.model), feed).values()
    assert output_error("y", got, want).max_rel <= tolerance_for("float32").rtol


def test_an_operand_of_no_inferred_dtype_takes_the_adds_and_is_declared() -> None:
    # optimum --optimize O2: a contrib op's output has no type onnx infers, nor has the projection reading it; ONNX's
    # Add has one type for both operands, so the projection's is the stream's, and the rewrite declares it.
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    normed = b.op("SimplifiedLayerNormalization", x, b.weight(HIDDEN, "float32"), epsilon=1e-6)
    projected = b.op("MatMul", normed, b.constant(b.rng.normal(0.0, 0.1, (HIDDEN, HIDDEN)), base="proj"))
    total = b.op("Add", x, projected)
    b.output(b.op("SimplifiedLayerNormalization", total, b.weight(HIDDEN, "float32"), epsilon=1e-6))
    original = b.model(standard=False)
    result = fuse_model(original)
    kinds = sorted(node.op_type for node in _plugin_nodes(result.model))
    assert kinds == [contract.ADD_RMS_NORM_OP, contract.RMS_NORM_OP], result.counts().line()
    assert _declared(result.model)[projected] == onnx.TensorProto.FLOAT
    feed = _feed(original)
    [want], [got] = _run(original, feed).values(), _run(lower_fused_nodes(result.model), feed).values()
    assert output_error("y", got, want).max_rel <= tolerance_for("float32").rtol


def test_qk_norms_are_never_add_norms_and_a_stack_keeps_its_pairs() -> None:
    result = fuse_model(onnx.load(str(FIXTURES / "qwen3-dynamo-fp32.onnx")), FusionOptions(fuse_rope=False))
    totals = result.report()["totals"]
    assert (totals[contract.QK_NORM_OP], totals[contract.ADD_RMS_NORM_OP], totals[contract.RMS_NORM_OP]) == (2, 4, 1)
    rotated = fuse_model(onnx.load(str(FIXTURES / "qwen3-dynamo-fp32.onnx"))).report()["totals"]
    assert (rotated[contract.QK_NORM_ROPE_OP], rotated[contract.ADD_RMS_NORM_OP], rotated[contract.RMS_NORM_OP]) == (
        2,
        4,
        1,
    )


def test_without_the_residual_fusion_every_norm_is_fused_alone() -> None:
    result = fuse_model(residual_stack("float16", LAYERS), FusionOptions(fuse_residual=False))
    assert [node.op_type for node in _plugin_nodes(result.model)] == [contract.RMS_NORM_OP] * (2 * LAYERS + 1)
    assert len([node for node in result.model.graph.node if node.op_type == "Add"]) == 2 * LAYERS
    assert result.counts().line() == "5 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (5 norms), 0 rejected"


# --- Adds that stay out --------------------------------------------------------------------------------------------

# case -> (dtype, what the reason says, whether onnxruntime runs the graph)
NEAR_MISSES = {
    "bias": ("float16", "it adds the constant bias", True),
    "cast-bias": ("float16", "it adds the constant cast", True),
    "identity-bias": ("float16", "it adds the constant identity", True),
    "folded-bias": ("float16", "it adds the constant reshape", True),
    "broadcast": ("float16", "may broadcast (dim 0), and the add-norm adds without broadcasting", True),
    "chain": ("float16", "(x + a + b): neither operand is read elsewhere, so it is no residual Add", True),
    "widened": ("float16", "its sum is also read as float32", True),
    "rounded": ("float16", "the norm reads its sum rounded to float16 by", True),
    "qdq": ("float32", "the norm reads its sum through the pair", True),
    "shared": ("float16", "its sum is normalised by", True),
    "dtypes": ("float16", "are not of one known dtype", False),
}


@pytest.mark.parametrize("case", sorted(NEAR_MISSES))
def test_an_add_that_stays_out_says_why_and_the_norm_is_fused_alone(case: str) -> None:
    dtype, reason, runs = NEAR_MISSES[case]
    original = residual_near_miss(case, dtype)
    # The pair is the node's input quantizer unless the fusion leaves quantizers out (tests/fusion/test_quant.py).
    result = fuse_model(original, FusionOptions(fuse_quant=case != "qdq"))
    [miss] = result.search.residual_near_misses
    assert reason in miss.reason and miss.reason.endswith("; the norm was fused alone"), miss.reason
    assert miss.node.startswith("Add") and result.search.near_misses == []
    kinds = [node.op_type for node in _plugin_nodes(result.model)]
    # "shared": the first norm took the Add, the second reads its h.
    assert sorted(kinds) == sorted([contract.RMS_NORM_OP, *([contract.ADD_RMS_NORM_OP] if case == "shared" else [])])
    line = result.counts().line()
    assert ", 0 rejected, 1 Add kept out (first: Add" in line and miss.reason in line
    report = result.report()
    assert report["near_misses"] == [] and report["residual_near_misses"] == [
        {"node": miss.node, "reason": miss.reason}
    ]
    if runs:
        feed = _feed(original)
        want, got = _run(original, feed), _run(lower_fused_nodes(result.model), feed)
        for name, value in want.items():
            assert output_error(name, got[name], value).max_rel <= tolerance_for(dtype).rtol


# --- onnxruntime's SkipSimplifiedLayerNormalization ----------------------------------------------------------------


def _skip_session(model: onnx.ModelProto) -> onnxruntime.InferenceSession:
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    return onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


@pytest.mark.parametrize("sum_output", [False, True], ids=["no-sum", "sum"])
@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_skip_op_without_a_bias_is_one_add_norm_as_onnxruntime_computes_it(dtype: str, sum_output: bool) -> None:
    original = skip_norm(dtype, bias=False, sum_output=sum_output)
    skip_op = next(node for node in original.graph.node if node.op_type == "SkipSimplifiedLayerNormalization")
    result = fuse_model(original)
    [node] = _plugin_nodes(result.model)
    [record] = result.fused
    assert node.op_type == contract.ADD_RMS_NORM_OP and (record.dtype, record.output_dtype) == ("float32", dtype)
    assert not [other for other in result.model.graph.node if other.op_type == "Add"]
    casts = {other.output[0]: other for other in result.model.graph.node if other.op_type == "Cast"}
    y, h = node.output
    if dtype == "float32":
        assert list(node.input[:2]) == list(skip_op.input[:2])
        assert h == skip_op.output[3] if sum_output else h not in casts
    else:
        # x and skip widened to float32 (exact), h the float32 sum; the op's 16-bit sum output is h rounded once.
        assert [casts[name].input[0] for name in node.input[:2]] == list(skip_op.input[:2])
        assert record.tags[-1] == "skip-widened-to-float32"
        if sum_output:
            assert casts[skip_op.output[3]].input[0] == h
    assert y == skip_op.output[0]
    expected, actual = _skip_session(original), _skip_session(lower_fused_nodes(result.model))
    for seed in range(8):
        feed = _feed(original, seed, scale=30.0)
        want, got = expected.run(None, feed), actual.run(None, feed)
        if sum_output:
            np.testing.assert_array_equal(got[1], want[1])
        # float32 x·(1/rms) against onnxruntime's x / rms: at most one fp16 step, or float32's tolerance.
        if dtype == "float16":
            step = np.spacing(np.abs(want[0]).astype(np.float16)).astype(np.float32)
            assert np.all(np.abs(got[0] - want[0]) <= step)
        else:
            assert output_error("y", got[0], want[0]).max_rel <= tolerance_for(dtype).rtol


def test_an_fp16_skip_add_norm_passes_check_on_every_seed(tmp_path: Path) -> None:
    original = skip_norm("float16", bias=False, sum_output=True)
    _passes_check(original, fuse_model(original), tmp_path, seeds=12)


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_a_skip_op_with_a_bias_keeps_its_float32_adds_and_says_why(dtype: str) -> None:
    original = skip_norm(dtype, bias=True, sum_output=True)
    result = fuse_model(original)
    assert result.model == fuse_model(original, FusionOptions(fuse_residual=False)).model
    [record] = result.fused
    assert record.kind == contract.RMS_NORM_OP and record.tags[-1] == "skip-bias-outside"
    [miss] = result.search.residual_near_misses
    assert miss.reason.startswith("no TrtfuseAddRmsNorm: it adds the bias ") and "(input + skip) + bias" in miss.reason
