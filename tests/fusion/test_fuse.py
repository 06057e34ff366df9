"""fuse_model and its report on small hand-built graphs; the external-data path end to end on a small model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper

from trtfuse import contract
from trtfuse.cli.main import cli
from trtfuse.contract import WeightMode
from trtfuse.fusion.fuse import fuse_model, search_model
from trtfuse.model.onnx_file import external_tensors, load_model
from trtfuse.verify.check import check_fused

from support.cli import run_cli
from support.graphs import BATCH, HIDDEN, SEQUENCE, Builder, NormSpec, rms_norm
from support.models import layer_norm_model, llama_norm_model, projection_model, save_external


def _ops(model: onnx.ModelProto) -> list[str]:
    return [node.op_type for node in model.graph.node]


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_llama_norms_become_plugin_nodes(opset: int, dtype: int, tmp_path: Path) -> None:
    original = llama_norm_model(dtype=dtype, opset=opset, layers=2)
    before = original.SerializeToString()
    result = fuse_model(original)
    assert original.SerializeToString() == before
    fused = result.model
    assert _ops(fused) == [contract.RMS_NORM_OP, "MatMul", contract.RMS_NORM_OP, "MatMul", "Identity"]
    onnx.checker.check_model(fused, full_check=True)
    opsets = {(opset_id.domain, opset_id.version) for opset_id in fused.opset_import}
    assert opsets == {("", opset), (contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)}
    assert fused.producer_name == "trtfuse-tests"
    assert {entry.key: entry.value for entry in fused.metadata_props} == {"origin": "conftest"}
    node = fused.graph.node[0]
    attributes = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
    assert node.domain == contract.ONNX_DOMAIN
    assert list(node.input) == ["x", "layers.0.norm.weight"]
    assert list(node.output) == ["layers.0.norm/y"]
    assert attributes[contract.ATTR_EPSILON] == pytest.approx(1e-6)
    assert attributes[contract.ATTR_HIDDEN] == 64
    assert attributes[contract.ATTR_WEIGHT_MODE] == WeightMode.AFTER_CAST
    unused = {"two", "one", "epsilon", "axes"} & {tensor.name for tensor in fused.graph.initializer}
    assert not unused
    paths = [tmp_path / "original.onnx", tmp_path / "fused.onnx"]
    for model, path in zip((original, fused), paths, strict=True):
        onnx.save_model(model, str(path))
    check = check_fused(load_model(paths[0]), load_model(paths[1]))
    assert check.passed, check.errors


def test_report_lists_every_fused_node() -> None:
    result = fuse_model(llama_norm_model(layers=3))
    report = result.report()
    assert report["totals"] == {
        contract.RMS_NORM_OP: 3,
        contract.QK_NORM_OP: 0,
        contract.ADD_RMS_NORM_OP: 0,
        "norms": 3,
    }
    assert [entry["kind"] for entry in report["fused"]] == [contract.RMS_NORM_OP] * 3
    first = report["fused"][0]
    assert first["replaced"][0] == "layers.0.norm/Cast"
    assert "layers.0.norm/Mul_1" in first["replaced"]
    assert first["hidden_sizes"] == [64]
    assert first["weight_mode"] == "AFTER_CAST"
    assert first["weight_offset"] == 0.0
    assert first["epsilon"] == pytest.approx(1e-6)
    assert first["tags"]
    assert report["near_misses"] == []


def test_model_without_norms_is_unchanged() -> None:
    original = projection_model()
    result = fuse_model(original)
    assert result.fused == []
    assert _ops(result.model) == _ops(original)
    assert all(opset_id.domain != contract.ONNX_DOMAIN for opset_id in result.model.opset_import)
    assert result.report()["totals"] == {
        contract.RMS_NORM_OP: 0,
        contract.QK_NORM_OP: 0,
        contract.ADD_RMS_NORM_OP: 0,
        "norms": 0,
    }


def test_layer_norm_is_left_alone_and_explained() -> None:
    original = layer_norm_model()
    result = fuse_model(original)
    assert result.fused == []
    assert _ops(result.model) == _ops(original)
    assert result.report()["near_misses"]
    assert search_model(original).near_misses == result.search.near_misses


def test_external_data_stays_in_place(tmp_path: Path) -> None:
    """The CI version of the large-model path: weights external (threshold 0), fused into another folder by the CLI."""
    model = llama_norm_model(dtype=TensorProto.FLOAT, hidden=1024, layers=2)
    source = tmp_path / "source"
    source.mkdir()
    original_path = save_external(model, source / "model.onnx")
    data = source / "weights.data"
    before = data.stat()
    out = tmp_path / "out"
    out.mkdir()
    runner = CliRunner()
    result = runner.invoke(cli, ["fuse", str(original_path), "-o", str(out / "fused.onnx")])
    assert result.exit_code == 0, result.output
    after = data.stat()
    assert (before.st_ino, before.st_size, before.st_mtime_ns) == (after.st_ino, after.st_size, after.st_mtime_ns)
    fused_proto = onnx.load(str(out / "fused.onnx"), load_external_data=False)
    # The 4 MiB projections stay external, at the same offsets of a same-named data file; the norm weights move inline.
    source_refs = {
        tensor.name: list(tensor.external_data)
        for tensor in external_tensors(onnx.load(str(original_path), load_external_data=False))
    }
    fused_refs = {tensor.name: list(tensor.external_data) for tensor in external_tensors(fused_proto)}
    assert set(fused_refs) == {"layers.0.proj", "layers.1.proj"}
    for name, refs in fused_refs.items():
        assert refs == source_refs[name]
    assert (out / "weights.data").read_bytes() == data.read_bytes()
    assert fused_proto.ByteSize() < 64 * 1024
    check = check_fused(load_model(original_path), load_model(out / "fused.onnx"))
    assert check.passed
    assert check.errors[0].max_rel <= 1e-6


def test_fuse_result_keeps_large_weights_unloaded(tmp_path: Path) -> None:
    path = save_external(llama_norm_model(dtype=TensorProto.FLOAT, hidden=1024), tmp_path / "model.onnx")
    loaded = load_model(path)
    result = fuse_model(loaded.model)
    (projection,) = external_tensors(result.model)
    assert projection.name == "layers.0.proj"
    assert not projection.raw_data


def test_graph_outputs_keep_their_declared_dims_over_a_stale_value_info() -> None:
    """ModelOpt's exports carry value_info for the graph output with dims of their own (`unk__108`); graphsurgeon
    takes those, which renamed the fused model's `batch` and `sequence` (its interface) until the pass restored the
    declaration."""
    original = llama_norm_model(layers=2)
    output = original.graph.output[0]
    declared = [dim.dim_param or dim.dim_value for dim in output.type.tensor_type.shape.dim]
    stale = helper.make_tensor_value_info(output.name, output.type.tensor_type.elem_type, ["unk__1", "unk__2", 64])
    original.graph.value_info.append(stale)
    fused = fuse_model(original).model
    (fused_output,) = [value for value in fused.graph.output if value.name == output.name]
    assert [dim.dim_param or dim.dim_value for dim in fused_output.type.tensor_type.shape.dim] == declared
    assert [value.name for value in fused.graph.input] == [value.name for value in original.graph.input]


def _with_dead_norm(kind: str) -> onnx.ModelProto:
    """One live norm and one whose result reaches no graph output (genai's Phi-3 when a layer's projection was taken
    for the LM head). kind: "decomposed", "dead-reader" (the dead norm feeds a MatMul that is dead too), "skip-sum"
    (a SkipSimplifiedLayerNormalization whose normalised output is dead but whose residual sum is a graph output)."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    b.output(rms_norm(b, x, NormSpec()))
    if kind == "skip-sum":
        skip = b.input("skip", [BATCH, SEQUENCE, HIDDEN])
        outputs = b.op(
            "SkipSimplifiedLayerNormalization",
            x,
            skip,
            b.weight(HIDDEN, "float32"),
            domain="com.microsoft",
            outputs=4,
            epsilon=1e-6,
        )
        b.nodes[-1].output[1] = b.nodes[-1].output[2] = ""
        b.output(outputs[3], [BATCH, SEQUENCE, HIDDEN])
        return b.model(standard=False)
    dead = rms_norm(b, x, NormSpec(epsilon=1e-5))
    if kind == "dead-reader":
        b.op("MatMul", dead, b.constant(np.ones((HIDDEN, 4)), base="proj"))
    return b.model()


@pytest.mark.parametrize("kind", ["decomposed", "dead-reader", "skip-sum"])
def test_a_dead_norm_is_a_near_miss_in_inspect_and_fuse_alike(kind: str, tmp_path: Path) -> None:
    model = _with_dead_norm(kind)
    search = search_model(model)
    assert len(search.matches) == 1 and len(search.dead) == 1 and not search.qk_norm_pairs
    [miss] = [miss for miss in search.near_misses if "reaches no graph output" in miss.reason]
    assert miss.node == search.dead[0].name
    result = fuse_model(model)
    assert result.report()["totals"]["norms"] == 1 and result.search.near_misses == search.near_misses
    path, fused_path = tmp_path / "model.onnx", tmp_path / "fused.onnx"
    onnx.save_model(model, str(path))
    inspected = run_cli("inspect", path)
    counts = f"1 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (1 norms), {len(search.near_misses)} rejected"
    assert inspected.exit_code == 0 and counts in inspected.output, inspected.output
    fused = run_cli("fuse", path, "-o", fused_path)
    assert fused.exit_code == 0 and counts in fused.output, fused.output
    check = check_fused(load_model(path), load_model(fused_path))
    assert check.passed, check.errors


def test_the_dead_norm_of_a_live_skip_sum_keeps_its_original_node() -> None:
    # Nothing of a dead match is rewritten: the original node still computes the live sum, exactly as before.
    result = fuse_model(_with_dead_norm("skip-sum"))
    skips = [node for node in result.model.graph.node if node.op_type == "SkipSimplifiedLayerNormalization"]
    read = {name for node in result.model.graph.node for name in node.input}
    assert len(skips) == 1 and skips[0].output[3] in read


def test_a_norm_read_only_inside_an_if_body_is_live() -> None:
    # A body names outer tensors without listing them as its node's inputs: the norm feeding it still counts.
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    y = rms_norm(b, x, NormSpec())
    branch_out = helper.make_tensor_value_info("branch", TensorProto.FLOAT, [BATCH, SEQUENCE, HIDDEN])
    body = helper.make_graph([helper.make_node("Identity", [y], ["branch"])], "body", [], [branch_out])
    condition = b.constant(True, "bool", base="condition")
    b.nodes.append(helper.make_node("If", [condition], ["chosen"], name="if", then_branch=body, else_branch=body))
    b.outputs.append(helper.make_tensor_value_info("chosen", TensorProto.FLOAT, [BATCH, SEQUENCE, HIDDEN]))
    search = search_model(b.model())
    assert len(search.matches) == 1 and not search.dead


def _norm_on_the_interface(outputs: tuple[str, ...], dtype: int, residual: bool) -> onnx.ModelProto:
    """x (+ res, the residual Add: h) -> a Llama RMSNorm (fp32 inside) -> y -> MatMul -> z, with `outputs` among x,
    res, h, y and z the graph outputs: a graph input passed straight through, the norm's input or output read on."""
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    rng = np.random.default_rng(3)
    initializers = [
        onnx.numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        onnx.numpy_helper.from_array(np.array(1e-6, np.float32), "epsilon"),
        onnx.numpy_helper.from_array(rng.normal(1.0, 0.5, HIDDEN).astype(np_dtype), "weight"),
        onnx.numpy_helper.from_array(rng.standard_normal((HIDDEN, HIDDEN)).astype(np_dtype), "projection"),
    ]
    nodes = [helper.make_node("Add", ["x", "res"], ["h"], name="residual")] if residual else []
    normalised = "h" if residual else "x"
    nodes += [
        helper.make_node("Cast", [normalised], ["x32"], to=TensorProto.FLOAT),
        helper.make_node("Pow", ["x32", "two"], ["square"]),
        helper.make_node("ReduceMean", ["square"], ["mean"], axes=[-1], keepdims=1),
        helper.make_node("Add", ["mean", "epsilon"], ["variance"]),
        helper.make_node("Sqrt", ["variance"], ["root"]),
        helper.make_node("Div", ["x32", "root"], ["normalised32"]),
        helper.make_node("Cast", ["normalised32"], ["normalised"], to=dtype),
        helper.make_node("Mul", ["normalised", "weight"], ["y"]),
        helper.make_node("MatMul", ["y", "projection"], ["z"]),
    ]
    inputs = ["x", "res"] if residual else ["x"]
    graph = helper.make_graph(
        nodes,
        "interface",
        [helper.make_tensor_value_info(name, dtype, ["batch", "sequence", HIDDEN]) for name in inputs],
        [helper.make_tensor_value_info(name, dtype, ["batch", "sequence", HIDDEN]) for name in outputs],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.checker.check_model(model, full_check=True)
    return model


@pytest.mark.parametrize(
    ("outputs", "residual"),
    [
        (("x", "z"), False),
        (("z", "x"), False),
        (("x", "y"), False),
        (("y", "z"), False),
        (("x", "y", "z"), False),
        (("x", "z"), True),
        (("h", "z"), True),
        (("res", "h", "y", "z", "x"), True),
    ],
)
@pytest.mark.parametrize("dtype", [TensorProto.FLOAT, TensorProto.FLOAT16])
def test_a_norm_on_the_graph_interface_is_fused_and_the_interface_kept(
    tmp_path: Path, outputs: tuple[str, ...], residual: bool, dtype: int
) -> None:
    # A graph input that is also a graph output was declared untyped for the matcher's shape inference, which then
    # knew no shape computed from it: the norm was rejected ("no static length the graph proves").
    model = _norm_on_the_interface(outputs, dtype, residual)
    original, fused = tmp_path / "m.onnx", tmp_path / "fused.onnx"
    onnx.save(model, original)
    result = run_cli("fuse", original, "-o", fused)
    op = contract.ADD_RMS_NORM_OP if residual else contract.RMS_NORM_OP
    assert result.exit_code == 0 and "0 rejected" in result.output, result.output
    written = onnx.load(fused)
    assert _ops(written).count(op) == 1, _ops(written)
    assert list(written.graph.input) == list(model.graph.input)
    assert list(written.graph.output) == list(model.graph.output)
    checked = run_cli("check", original, fused)
    assert checked.exit_code == 0, checked.output
