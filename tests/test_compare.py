"""`trtfuse compare`: steps, verdict, report and exit status, run in CI with the lowered fused model in onnxruntime
standing in for the engine (exactly what `trtfuse check` runs); with TensorRT present the engine takes that place."""

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.check import check_fused
from trtfuse.cli.engine_commands import compare_command
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.compare import LOWERED_RUNNER, compare
from trtfuse.errors import TrtfuseError
from trtfuse.model_io import load_model
from trtfuse.tolerances import tolerance_for

VOCAB, HIDDEN, OUT = 32, 16, 8
EPSILON = 1e-6


def tiny_lm(dtype: np.dtype, fused: bool, epsilon: float = EPSILON) -> onnx.ModelProto:
    """Embedding -> RMSNorm (Llama form: normalise in fp32, cast back, scale) -> projection.

    `fused` writes the norm as the plugin node the fusion pass would produce, so these tests need only the contract.
    """
    rng = np.random.default_rng(7)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    initializers = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(dtype), "embedding"),
        numpy_helper.from_array((1.0 + 0.5 * rng.standard_normal(HIDDEN)).astype(dtype), "norm.weight"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, OUT)).astype(dtype), "lm_head"),
    ]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["hidden"], name="embed")]
    if fused:
        nodes.append(
            helper.make_node(
                contract.RMS_NORM_OP,
                ["hidden", "norm.weight"],
                ["normed"],
                name="norm",
                domain=contract.ONNX_DOMAIN,
                **{
                    contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
                    contract.ATTR_VERSION: contract.PLUGIN_VERSION,
                    contract.ATTR_EPSILON: epsilon,
                    contract.ATTR_WEIGHT_OFFSET: 0.0,
                    contract.ATTR_WEIGHT_MODE: int(contract.WeightMode.AFTER_CAST),
                    contract.ATTR_HIDDEN: HIDDEN,
                },
            )
        )
    else:
        initializers += [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(epsilon, np.float32), "eps"),
        ]
        nodes += [
            helper.make_node("Cast", ["hidden"], ["x32"], to=TensorProto.FLOAT, name="norm/cast"),
            helper.make_node("Pow", ["x32", "two"], ["square"], name="norm/pow"),
            helper.make_node("ReduceMean", ["square"], ["mean"], axes=[-1], keepdims=1, name="norm/mean"),
            helper.make_node("Add", ["mean", "eps"], ["variance"], name="norm/add"),
            helper.make_node("Sqrt", ["variance"], ["root"], name="norm/sqrt"),
            helper.make_node("Reciprocal", ["root"], ["inverse"], name="norm/reciprocal"),
            helper.make_node("Mul", ["x32", "inverse"], ["normalised"], name="norm/mul"),
            helper.make_node("Cast", ["normalised"], ["rounded"], to=elem, name="norm/cast_back"),
            helper.make_node("Mul", ["rounded", "norm.weight"], ["normed"], name="norm/scale"),
        ]
    nodes.append(helper.make_node("MatMul", ["normed", "lm_head"], ["logits"], name="lm_head"))
    graph = helper.make_graph(
        nodes,
        "tiny_lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "sequence", OUT])],
        initializers,
        # Shape inference cannot see through a plugin node; the fusion pass records its output type like this.
        value_info=[helper.make_tensor_value_info("normed", elem, ["batch", "sequence", HIDDEN])] if fused else None,
    )
    opsets = [helper.make_opsetid("", 17)]
    if fused:
        opsets.append(helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION))
    return helper.make_model(graph, opset_imports=opsets)


def save_model_file(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path


@pytest.fixture(params=[np.float32, np.float16], ids=["fp32", "fp16"])
def model_pair(request, tmp_path):
    dtype = request.param
    original = save_model_file(tiny_lm(dtype, fused=False), tmp_path / "original.onnx")
    fused = save_model_file(tiny_lm(dtype, fused=True), tmp_path / "fused.onnx")
    corrupted = save_model_file(tiny_lm(dtype, fused=True, epsilon=1.0), tmp_path / "corrupted.onnx")
    return original, fused, corrupted, np.dtype(dtype).name


def test_fused_model_matches_original(model_pair):
    original, fused, _, dtype = model_pair
    report = compare(original, fused, seed=3)
    assert report.passed
    assert report.candidate_runner == LOWERED_RUNNER
    (step,) = report.result.steps
    assert step.input_shapes == {"input_ids": (2, 5)}
    (logits,) = step.outputs
    assert logits.name == "logits"
    assert logits.dtype == dtype
    if dtype == "float16":
        assert logits.reference is not None
        assert logits.reference.candidate <= logits.reference.bound
    else:
        assert logits.error.max_rel <= logits.error.tolerance.rtol


def test_corrupted_fused_model_fails(model_pair):
    original, _, corrupted, _ = model_pair
    report = compare(original, corrupted, seed=3)
    assert not report.passed
    (logits,) = report.result.errors
    assert logits.error.max_rel > 10 * tolerance_for(logits.dtype).rtol


def test_compare_without_an_engine_runs_exactly_what_check_runs(model_pair):
    original, fused, corrupted, _ = model_pair
    for candidate in (fused, corrupted):
        checked = check_fused(load_model(original), load_model(candidate), seed=4)
        assert compare(original, candidate, seed=4).result.to_json() == checked.to_json()


def test_shape_and_dim_overrides_reach_the_feed(model_pair):
    original, fused, _, _ = model_pair
    assert compare(original, fused, shapes={"input_ids": (1, 7)}).result.steps[0].input_shapes == {"input_ids": (1, 7)}
    assert compare(original, fused, dims={"sequence": 3}).result.steps[0].input_shapes == {"input_ids": (2, 3)}


def test_missing_candidate_is_one_clear_error(model_pair, tmp_path):
    original, _, _, _ = model_pair
    with pytest.raises(TrtfuseError, match=r"missing\.onnx: no such file"):
        compare(original, tmp_path / "missing.onnx")


def test_the_cli_loads_the_original_once(model_pair, monkeypatch):
    """A large original with external weights costs seconds to load: the command and the core share one load."""
    from trtfuse import compare as compare_module
    from trtfuse import model_io

    original, fused, _, _ = model_pair
    loads = []
    real = model_io.load_model

    def counting(path, *args, **kwargs):
        loads.append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(model_io, "load_model", counting)
    monkeypatch.setattr(compare_module, "load_model", counting)
    result = CliRunner().invoke(compare_command, [str(original), str(fused)])
    assert result.exit_code == 0, result.output
    assert loads.count(Path(original)) == 1


def test_cli_exit_status_and_json_report(model_pair, tmp_path):
    original, fused, corrupted, _ = model_pair
    runner = CliRunner()
    report_path = tmp_path / "report.json"
    passed = runner.invoke(compare_command, [str(original), str(fused), "--report", str(report_path)])
    assert passed.exit_code == 0, passed.output
    assert "logits" in passed.output
    assert "all 1 outputs pass" in passed.output
    assert "seed 0" in passed.output
    assert "input_ids=2x5" in passed.output
    saved = json.loads(report_path.read_text())
    assert saved["passed"] is True
    assert saved["runners"] == ["onnxruntime-original", LOWERED_RUNNER]
    assert saved["steps"][0]["outputs"][0]["name"] == "logits"

    failed = runner.invoke(compare_command, [str(original), str(corrupted), "--report", str(report_path)])
    assert failed.exit_code == EXIT_MISMATCH, failed.output
    assert "FAIL" in failed.output
    assert json.loads(report_path.read_text())["passed"] is False


def test_cli_bad_input_is_exit_2_in_the_trtfuse_group(model_pair, tmp_path):
    from trtfuse.cli.main import TrtfuseGroup

    group = TrtfuseGroup(commands={"compare": compare_command})
    original, _, _, _ = model_pair
    not_onnx = tmp_path / "junk.onnx"
    not_onnx.write_text("not a model")
    result = CliRunner().invoke(group, ["compare", str(original), str(not_onnx)])
    assert result.exit_code == 2
    assert "junk.onnx: not an ONNX model" in result.output


def test_cli_saved_inputs_repeat_the_comparison(model_pair, tmp_path):
    original, fused, _, _ = model_pair
    saved, first_report, second_report = tmp_path / "inputs.npz", tmp_path / "first.json", tmp_path / "second.json"
    runner = CliRunner()
    first = runner.invoke(
        compare_command,
        [str(original), str(fused), "--seed", "9", "--save-inputs", str(saved), "--report", str(first_report)],
    )
    assert first.exit_code == 0, first.output
    second = runner.invoke(
        compare_command, [str(original), str(fused), "--load-inputs", str(saved), "--report", str(second_report)]
    )
    assert second.exit_code == 0, second.output
    assert f"inputs from {saved}" in second.output
    first_json, second_json = json.loads(first_report.read_text()), json.loads(second_report.read_text())
    assert first_json["seed"] == 9
    assert second_json["inputs_file"] == str(saved)
    assert second_json["steps"][0]["outputs"] == first_json["steps"][0]["outputs"]


def test_engine_candidates_get_the_same_steps_and_verdict(model_pair, tmp_path, monkeypatch):
    # No TensorRT here: the engine's runner is replaced by the lowered fused model, so this drives compare's engine
    # branch (feeds, runner, verdict, report) around it.
    from trtfuse import compare as compare_module
    from trtfuse.model_io import LoadedModel
    from trtfuse.onnxrt import ModelRunner
    from trtfuse.reference import lower_fused_nodes
    from trtfuse.runner import ENGINE_RUNNER

    original, fused, corrupted, _ = model_pair
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine")
    for candidate, passes in ((fused, True), (corrupted, False)):
        loaded = load_model(candidate)
        lowered = ModelRunner(LoadedModel(model=lower_fused_nodes(loaded.model), path=loaded.path))
        monkeypatch.setattr(compare_module, "engine_run", lambda path, runner=lowered: runner.run)
        report = compare(original, engine, seed=4, dims={"sequence": 3})
        assert report.candidate_runner == ENGINE_RUNNER
        assert report.passed is passes
        checked = check_fused(load_model(original), loaded, seed=4, dims={"sequence": 3})
        assert report.result.to_json() == checked.to_json()


def test_engine_comparison_saving_its_inputs_reads_the_engine_file_once(model_pair, tmp_path, monkeypatch):
    from trtfuse import compare as compare_module
    from trtfuse.engine_file import EngineFile
    from trtfuse.model_io import LoadedModel
    from trtfuse.onnxrt import ModelRunner
    from trtfuse.reference import lower_fused_nodes
    from trtfuse.saved_inputs import load_feeds

    original, fused, _, _ = model_pair
    engine, saved = tmp_path / "model.engine", tmp_path / "inputs.npz"
    engine.write_bytes(b"engine")
    loaded = load_model(fused)
    lowered = ModelRunner(LoadedModel(model=lower_fused_nodes(loaded.model), path=loaded.path))
    monkeypatch.setattr(compare_module, "engine_run", lambda path: lowered.run)
    opened = []
    monkeypatch.setattr(
        compare_module.EngineFile, "open", lambda path: opened.append(path) or EngineFile(path, None, [])
    )
    report = compare(original, engine, seed=4, dims={"sequence": 3}, save_inputs=saved)
    assert opened == [engine]
    assert report.passed
    saved_steps = [feed.step for feed in load_feeds(saved, load_model(original).model)]
    assert saved_steps and saved_steps == [step.name for step in report.result.steps]
