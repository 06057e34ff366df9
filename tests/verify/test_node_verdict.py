"""`check` judges each fused node where it stands (docs/cli.md, "Each fused node"): the node, fed the original's own
tensors, must give the original's QuantizeLinear codes of its own values bit for bit, and values no further from the
float32 evaluation of the original's ops than NODE_MARGIN times the original's. Each wrong fusion below passed the
end-to-end verdict alone (its outputs still pass) and fails now, naming the node; correct fusions, the committed
ModelOpt fixtures among them, pass."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto

from trtfuse import contract
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.fusion.fuse import fuse_model
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file
from trtfuse.verify.check import CheckInputs, check_fused
from trtfuse.verify.tolerances import NODE_MARGIN

from support.cli import run_cli
from support.paths import TOOL_FIXTURES
from support.quant_graphs import QuantSpec, quantized_decoder, quantized_lm

SPECS = {
    "fp8": QuantSpec(quant="float8_e4m3fn"),
    "int8": QuantSpec(quant="int8"),
    # An inverse-root pair whose range (0.8) every row's r (about 1) passes: each r is clipped.
    "int8-rsqrt-clipped": QuantSpec(quant="int8", rsqrt_pairs=True, rsqrt_range=0.8),
}


def _set(field: str, change: Callable[[float], float]) -> Callable[[onnx.NodeProto], None]:
    def tamper(node: onnx.NodeProto) -> None:
        attribute = next(attribute for attribute in node.attribute if attribute.name == field)
        if attribute.type == onnx.AttributeProto.FLOAT:
            attribute.f = change(attribute.f)
        else:
            attribute.i = int(change(attribute.i))

    return tamper


# (spec, which fused node (by position), what is changed): each a wrong fusion the outputs alone let pass.
TAMPERED = {
    "fp8-final-output-scale-x1.1": ("fp8", -1, _set("output_quant_scale", lambda scale: scale * 1.1)),
    "int8-final-output-scale-x1.1": ("int8", -1, _set("output_quant_scale", lambda scale: scale * 1.1)),
    "int8-output-scale-one-step-larger": ("int8", 0, _set("output_quant_scale", lambda scale: scale * 128 / 127)),
    "fp8-epsilon-0.1": ("fp8", 0, _set(contract.ATTR_EPSILON, lambda _: 0.1)),
    "int8-epsilon-0.1": ("int8", 0, _set(contract.ATTR_EPSILON, lambda _: 0.1)),
    "fp8-input-stage-dropped": ("fp8", 0, _set("input_quant_dtype", lambda _: contract.QUANT_OFF)),
    "int8-input-stage-dropped": ("int8", 0, _set("input_quant_dtype", lambda _: contract.QUANT_OFF)),
    "int8-input-scale-x2": ("int8", 0, _set("input_quant_scale", lambda scale: scale * 2)),
    "rsqrt-stage-dropped-where-it-clips": (
        "int8-rsqrt-clipped",
        0,
        _set("rsqrt_quant_dtype", lambda _: contract.QUANT_OFF),
    ),
}


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each spec's original LM and its fused model."""
    folder = tmp_path_factory.mktemp("node_verdict")
    built = {}
    for name, spec in SPECS.items():
        original = folder / f"{name}.onnx"
        onnx.save(quantized_lm(spec), str(original))
        built[name] = (original, fuse_file(original, folder / f"{name}.fused.onnx").output_path)
    return built


def _tampered(fused: Path, folder: Path, position: int, tamper: Callable[[onnx.NodeProto], None]) -> tuple[Path, str]:
    model = onnx.load(str(fused))
    node = [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN][position]
    tamper(node)
    path = folder / "tampered.onnx"
    onnx.save(model, str(path))
    return path, node.name


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_wrong_node_fails_where_it_stands_and_the_verdict_names_it(case: str, models, tmp_path: Path) -> None:
    spec, position, tamper = TAMPERED[case]
    original, fused = models[spec]
    tampered, node = _tampered(fused, tmp_path, position, tamper)
    result = run_cli("check", original, tampered, "--json")
    assert result.exit_code == EXIT_MISMATCH, result.output
    report = json.loads(result.stdout)
    [step] = report["steps"]
    # The end-to-end verdict alone passes it: the quantization error of the original leaves room for the mistake.
    assert all(output["passed"] for output in step["outputs"])
    failed = [entry for entry in step["nodes"] if not entry["passed"]]
    assert failed and failed[0]["node"] == node
    assert all(entry["passed"] for entry in step["nodes"] if entry["node"] != node)
    line = run_cli("check", original, tampered).stdout.splitlines()[-1]
    assert line.startswith(f"fused node '{node}' fails at step single: output '{failed[0]['output']}': "), line


def test_a_wrong_output_scale_is_named_by_its_codes(models, tmp_path: Path) -> None:
    original, fused = models["int8"]
    tampered, _ = _tampered(fused, tmp_path, 0, TAMPERED["int8-output-scale-one-step-larger"][2])
    result = check_fused(load_model(original), load_model(tampered))
    _, verdict = result.first_node_failure
    codes = verdict.codes
    # The values are the original's: only the quantizer differs, one step at the codes near the range's end.
    assert verdict.values_passed and verdict.worst is None
    assert not codes.passed and codes.wrong > 0 and abs(codes.code - codes.expected) == 1
    assert verdict.text().startswith(
        f"{codes.wrong} of {codes.elements} int8 codes are not the original {codes.quantizer}'s of the node's own "
        f"values, the first at [{', '.join(map(str, codes.first))}]: {codes.code:g}, where the original's quantizer "
        f"gives {codes.expected:g} (value "
    )


def test_a_wrong_value_is_named_with_its_worst_element(models, tmp_path: Path) -> None:
    original, fused = models["fp8"]
    tampered, _ = _tampered(fused, tmp_path, 0, TAMPERED["fp8-epsilon-0.1"][2])
    _, verdict = check_fused(load_model(original), load_model(tampered)).first_node_failure
    errors, worst = verdict.errors, verdict.worst
    assert verdict.codes.passed and not verdict.values_passed
    assert errors.candidate > 10 * NODE_MARGIN * errors.original
    assert f"the largest difference at [{', '.join(map(str, worst.index))}]: {worst.candidate:.6g}, " in verdict.text()


@pytest.mark.parametrize("spec", sorted(SPECS))
def test_a_correct_fusion_passes_every_node_where_it_stands(spec: str, models) -> None:
    original, fused = models[spec]
    result = run_cli("check", original, fused, "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    nodes = report["steps"][0]["nodes"]
    # Each norm's codes, and each add-norm's sum too.
    assert len(nodes) == 5 and all(entry["passed"] for entry in nodes)
    codes = [entry["codes"] for entry in nodes if entry["codes"] is not None]
    assert len(codes) == 3 and all(entry["not_the_quantizers"] == 0 for entry in codes)
    assert report["unjudged_nodes"] == []
    printed = run_cli("check", original, fused).stdout.splitlines()
    assert "  fused nodes where they stand: 5 outputs of 3 nodes, all pass" in printed


@pytest.mark.parametrize("case", ["int8-input-stage-dropped", "int8-input-scale-x2"])
def test_check_generate_fails_a_wrong_node_whose_tokens_do_not_diverge(case: str, models, tmp_path: Path) -> None:
    spec, position, tamper = TAMPERED[case]
    original, fused = models[spec]
    tampered, node = _tampered(fused, tmp_path, position, tamper)
    result = run_cli("check", original, tampered, "--generate", "16", "--json")
    assert result.exit_code == EXIT_MISMATCH, result.output
    report = json.loads(result.stdout)
    assert report["generation"]["divergence"] is None
    assert [entry["node"] for entry in report["steps"][0]["nodes"] if not entry["passed"]] == [node]


@pytest.mark.parametrize(("opset", "passed"), [(19, True), (23, False)])
def test_a_node_dividing_in_float32_where_the_graph_divides_in_float16_fails(
    opset: int, passed: bool, tmp_path
) -> None:
    # A fused model as trtfuse wrote before opset 23's QuantizeLinear stayed out (issue 30, item 2): the node divides
    # in float32, the original's QuantizeLinear in its float16 scale's dtype; 1-7 of each norm's 384 codes differ.
    spec = QuantSpec(dtype="float16", quant="int8", layers=0)
    fused = fuse_model(quantized_decoder(spec)).model
    next(entry for entry in fused.opset_import if entry.domain == "").version = opset
    original, fused_path = tmp_path / "original.onnx", tmp_path / "fused.onnx"
    onnx.save(quantized_decoder(QuantSpec(dtype="float16", quant="int8", layers=0, opset=opset)), str(original))
    onnx.save(fused, str(fused_path))
    results = [check_fused(load_model(original), load_model(fused_path), CheckInputs(seed=seed)) for seed in range(3)]
    assert all(result.passed == passed for result in results)
    if not passed:
        # The codes the graph gives (an output) differ only at a few elements: within the outputs' verdict.
        assert all(output.passed for result in results for output in result.errors)
        _, verdict = results[0].first_node_failure
        assert not verdict.codes.passed and verdict.values_passed and verdict.codes.wrong < 10


def test_a_node_no_tensor_of_the_original_holds_is_judged_end_to_end_and_said_so(models, tmp_path: Path) -> None:
    original, fused = models["int8"]
    model = onnx.load(str(fused))
    last = [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN][-1]
    # Its codes go to the graph through an op that computes (a Neg of a Neg): no longer a tensor of the original.
    codes = last.output[0]
    last.output[0] = f"{codes}/moved"
    negated = f"{codes}/negated"
    position = list(model.graph.node).index(last) + 1
    model.graph.node.insert(position, onnx.helper.make_node("Neg", [negated], [codes], name="neg_twice"))
    model.graph.node.insert(position, onnx.helper.make_node("Neg", [last.output[0]], [negated], name="neg_once"))
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(last.output[0], TensorProto.INT8, None))
    moved = tmp_path / "moved.onnx"
    onnx.save(model, str(moved))
    result = check_fused(load_model(original), load_model(moved))
    assert result.passed
    [(name, note)] = result.unjudged_nodes
    assert name == last.name
    assert note == f"output '{codes}/moved' not judged where it stands: no tensor of the original holds it"
    printed = run_cli("check", original, moved).stdout.splitlines()
    assert f"note: fused node '{name}': {note}" in printed
    # Every other output is judged where it stands: the three nodes' codes and sums, but the last one's codes.
    assert "  fused nodes where they stand: 4 outputs of 3 nodes, all pass" in printed


def test_the_gemma3_int8_fixture_s_float16_roots_pass_where_they_stand(tmp_path: Path) -> None:
    # Its norms compute the root in float16 (`core-float16`), one with an INT8 pair on it: the original's r is a few
    # float16 ulps from the node's, which may move a quantization step of r, yet the node is judged honestly: each
    # quantizer reads its value rounded as the graph rounds it in the evaluation as in the node.
    original = TOOL_FIXTURES / "gemma3-modelopt-int8-fp16.onnx"
    fused = fuse_file(original, tmp_path / "gemma3.fused.onnx").output_path
    for seed in range(3):
        result = check_fused(load_model(original), load_model(fused), CheckInputs(seed=seed))
        assert result.passed and not result.unjudged_nodes
        rsqrt = [node for node in result.steps[0].nodes if node.node.startswith(contract.RMS_NORM_QUANT_OP)]
        assert rsqrt and all(node.errors is not None and node.errors.original > 0 for node in rsqrt)
        assert np.isfinite([node.errors.candidate for node in result.steps[0].nodes if node.errors]).all()


@pytest.mark.parametrize("evaluator", [False, True], ids=["onnxruntime", "evaluator"])
def test_the_original_gives_the_tensors_asked_for_besides_its_outputs_an_output_among_them(
    evaluator: bool, tmp_path: Path
) -> None:
    from onnx import helper

    from trtfuse.model.onnx_file import LoadedModel
    from trtfuse.verify.onnxrt import CpuSession

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])],
        "exposed",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    session = CpuSession(LoadedModel(model, tmp_path / "model.onnx"), evaluator=evaluator, exposed=("a", "y"))
    outputs, exposed = session.run_exposing({"x": np.array([-1.0, 2.0], np.float32)})
    assert list(outputs) == ["y"] and list(exposed) == ["a", "y"]
    np.testing.assert_array_equal(exposed["a"], [0.0, 2.0])
    np.testing.assert_array_equal(exposed["y"], outputs["y"])
