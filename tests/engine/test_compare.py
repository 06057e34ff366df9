"""`trtfuse compare`: steps, verdict, report and exit status, run in CI with the lowered fused model in onnxruntime
standing in for the engine (exactly what `trtfuse check` runs); with TensorRT present the engine takes that place."""

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from trtfuse.cli.engine_commands import compare_command
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.engine.compare import LOWERED_RUNNER, compare
from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.model.onnx_file import load_model
from trtfuse.verify.check import CheckInputs, check_fused
from trtfuse.verify.tolerances import tolerance_for

from fakes.sessions import OnnxrtEngineSession
from support.models import save_model_file, tiny_lm


def _verdicts(result) -> dict:
    """A result's JSON without the runs' timings, which differ between two runs of the same steps, and without the
    fused nodes judged where they stand, which `check` judges in the fused model and an engine does not show."""
    data = result.to_json()
    data.pop("unjudged_nodes")
    for step in data["steps"]:
        step.pop("seconds")
        step.pop("nodes")
    return data


@pytest.fixture(params=[np.float32, np.float16], ids=["fp32", "fp16"])
def model_pair(request, tmp_path):
    dtype = request.param
    original = save_model_file(tiny_lm(dtype, fused=False), tmp_path / "original.onnx")
    fused = save_model_file(tiny_lm(dtype, fused=True), tmp_path / "fused.onnx")
    corrupted = save_model_file(tiny_lm(dtype, fused=True, epsilon=1.0), tmp_path / "corrupted.onnx")
    return original, fused, corrupted, np.dtype(dtype).name


def test_fused_model_matches_original(model_pair):
    original, fused, _, dtype = model_pair
    report = compare(original, fused, CheckInputs(seed=3))
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
    report = compare(original, corrupted, CheckInputs(seed=3))
    assert not report.passed
    (logits,) = report.result.errors
    assert logits.error.max_rel > 10 * tolerance_for(logits.dtype).rtol


def test_compare_without_an_engine_runs_exactly_what_check_runs(model_pair):
    original, fused, corrupted, _ = model_pair
    for candidate in (fused, corrupted):
        checked = check_fused(load_model(original), load_model(candidate), CheckInputs(seed=4))
        assert _verdicts(compare(original, candidate, CheckInputs(seed=4)).result) == _verdicts(checked)


def test_shape_and_dim_overrides_reach_the_feed(model_pair):
    original, fused, _, _ = model_pair
    assert compare(original, fused, CheckInputs(shapes={"input_ids": (1, 7)})).result.steps[0].input_shapes == {
        "input_ids": (1, 7)
    }
    assert compare(original, fused, CheckInputs(dims={"sequence": 3})).result.steps[0].input_shapes == {
        "input_ids": (2, 3)
    }


def test_missing_candidate_is_one_clear_error(model_pair, tmp_path):
    original, _, _, _ = model_pair
    with pytest.raises(TrtfuseError, match=r"missing\.onnx: no such file"):
        compare(original, tmp_path / "missing.onnx")


def test_the_cli_loads_the_original_once(model_pair, monkeypatch):
    """A large original with external weights costs seconds to load: the command and the core share one load."""
    from trtfuse.engine import compare as compare_module
    from trtfuse.model import onnx_file as model_io

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
    from trtfuse.engine import compare as compare_module
    from trtfuse.engine import session as session_module
    from trtfuse.engine.session import ENGINE_RUNNER
    from trtfuse.fusion.lowering import lower_fused_nodes
    from trtfuse.model.onnx_file import LoadedModel
    from trtfuse.verify.onnxrt import CpuSession

    original, fused, corrupted, _ = model_pair
    engine = tmp_path / "model.engine"
    engine.write_bytes(b"engine")
    monkeypatch.setattr(compare_module, "import_tensorrt", lambda: object())
    for candidate, passes in ((fused, True), (corrupted, False)):
        loaded = load_model(candidate)
        lowered = CpuSession(LoadedModel(model=lower_fused_nodes(loaded.model), path=loaded.path))
        monkeypatch.setattr(session_module, "EngineSession", OnnxrtEngineSession.running(lowered))
        report = compare(original, engine, CheckInputs(seed=4, dims={"sequence": 3}))
        assert report.candidate_runner == ENGINE_RUNNER
        assert report.passed is passes
        checked = check_fused(load_model(original), loaded, CheckInputs(seed=4, dims={"sequence": 3}))
        assert _verdicts(report.result) == _verdicts(checked)


def test_engine_comparison_saving_its_inputs_reads_the_engine_file_once(model_pair, tmp_path, monkeypatch):
    from trtfuse.engine import compare as compare_module
    from trtfuse.engine import session as session_module
    from trtfuse.engine.engine_file import EngineFile
    from trtfuse.fusion.lowering import lower_fused_nodes
    from trtfuse.model.feed_files import load_feeds
    from trtfuse.model.onnx_file import LoadedModel
    from trtfuse.verify.onnxrt import CpuSession

    original, fused, _, _ = model_pair
    engine, saved = tmp_path / "model.engine", tmp_path / "inputs.npz"
    engine.write_bytes(b"engine")
    loaded = load_model(fused)
    lowered = CpuSession(LoadedModel(model=lower_fused_nodes(loaded.model), path=loaded.path))
    monkeypatch.setattr(compare_module, "import_tensorrt", lambda: object())
    monkeypatch.setattr(session_module, "EngineSession", OnnxrtEngineSession.running(lowered))
    opened = []
    monkeypatch.setattr(compare_module.EngineFile, "open", lambda path: opened.append(path) or EngineFile(path, None))
    report = compare(original, engine, CheckInputs(seed=4, dims={"sequence": 3}, save_inputs=saved))
    assert opened == [engine]
    assert report.passed
    saved_steps = [feed.step for feed in load_feeds(saved, load_model(original).model)]
    assert saved_steps and saved_steps == [step.name for step in report.result.steps]


def test_opt_shapes_the_original_cannot_take_blame_the_engines_sidecar(model_pair, tmp_path, monkeypatch):
    from trtfuse.engine import compare as compare_module
    from trtfuse.engine.profiles import Profile, ShapeRange

    from support.engines import engine_with_sidecar

    original, _, _, _ = model_pair
    bad = Profile("p", {"input_ids": ShapeRange((1, 1, 1), (1, 2, 1), (1, 4, 1))})
    engine = engine_with_sidecar(tmp_path, profiles=(bad,))
    monkeypatch.setattr(compare_module, "import_tensorrt", lambda: object())
    with pytest.raises(
        TrtfuseError, match=r"m\.engine\.json: profile 'p' does not fit .*\(OPT shape input_ids: "
    ) as error:
        compare(original, engine, CheckInputs(seed=0))
    assert not isinstance(error.value, OptionError)
