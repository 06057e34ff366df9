"""`check --generate N` and `compare --generate N`: two greedy generations from one prompt pass when their tokens are
equal or first differ at a near tie of the original's logits; every KV-cache fixture passes, a fused model with a
corrupted epsilon or weight fails. The engine branch runs here with the lowered fused model standing in for the engine
(no TensorRT); with TensorRT, the real engine."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtfuse import contract
from trtfuse.cli.options import EXIT_BAD_INPUT, EXIT_MISMATCH
from trtfuse.engine.profiles import derive_profiles, request_from_options
from trtfuse.errors import OptionError
from trtfuse.generate.agreement import GenerationRequest, compare_generation, judge_generations
from trtfuse.generate.loop import Generation, StepRecord
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file

from fakes.sessions import OnnxrtEngineSession
from support.cli import run_cli
from support.engines import engine_with_sidecar
from support.markers import needs_tensorrt
from support.paths import FIXTURES, REPO_ROOT, TOOL_FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
# Every committed export with a KV cache: the KV fixture and the tools' optimum and genai ones.
CACHE_FIXTURES = [
    KV_FIXTURE,
    TOOL_FIXTURES / "qwen3-optimum-fp16.onnx",
    TOOL_FIXTURES / "qwen3-optimum-fp16-slim.onnx",
    TOOL_FIXTURES / "llama-optimum-fp16-O2.onnx",
    TOOL_FIXTURES / "qwen3-genai-cpu-int4.onnx",
]


def _generation(tokens: list[int], margins: list[float], scale: float = 1.0, finite: bool = True) -> Generation:
    steps = tuple(
        StepRecord(token, 0.001, margin, scale, finite) for token, margin in zip(tokens, margins, strict=True)
    )
    return Generation((1, 2), steps, cache=True)


def test_equal_tokens_pass_and_a_divergence_is_judged_by_the_original_margin():
    original = _generation([5, 6, 7], [0.5, 0.003, 0.5])
    assert judge_generations(original, _generation([5, 6, 7], [0.5, 0.5, 0.5]), "float16").passed
    # float16: 2 x rtol 2e-3 x max |logit| 1.0 = 4e-3; the margin 3e-3 at step 2 is a near tie.
    near = judge_generations(original, _generation([5, 9, 1], [0.5, 0.5, 0.5]), "float16")
    assert near.passed and near.divergence.step == 2 and near.divergence.near_tie
    assert near.divergence.bound == pytest.approx(4e-3)
    assert "a near tie (<= 2 x float16's rtol 0.002 x max |logit| 1 = 0.004): passes" in near.verdict_line()
    # float32's bound is 2e-5: the same margin is a real divergence, and so is any at a clear margin.
    assert not judge_generations(original, _generation([5, 9, 1], [0.5, 0.5, 0.5]), "float32").passed
    far = judge_generations(original, _generation([8, 6, 7], [0.5, 0.5, 0.5]), "bfloat16")
    assert not far.passed and far.divergence.step == 1
    assert "more than a near tie" in far.verdict_line()
    assert far.to_json()["divergence"]["original_token"] == 5


def test_an_exact_tie_passes_in_any_dtype_and_non_finite_candidate_logits_fail():
    original = _generation([5, 6], [0.0, 0.5])
    assert judge_generations(original, _generation([9, 6], [0.5, 0.5]), "float32").passed
    broken = judge_generations(original, _generation([5, 6], [0.5, 0.5], finite=False), "float32")
    assert not broken.passed and broken.non_finite_steps == (1, 2)


@pytest.fixture(scope="module")
def fused_fixtures(tmp_path_factory) -> dict[Path, Path]:
    folder = tmp_path_factory.mktemp("fused")
    return {path: fuse_file(path, folder / path.name).output_path for path in CACHE_FIXTURES}


@pytest.mark.parametrize("original", CACHE_FIXTURES, ids=lambda path: path.stem)
def test_every_kv_cache_fixture_passes_check_generate_16(original, fused_fixtures):
    result = run_cli("check", original, fused_fixtures[original], "--generate", "16", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    generation = report["generation"]
    assert report["passed"] and generation["passed"] and generation["cache"]
    assert len(generation["original_tokens"]) == 16
    assert generation["original_tokens"] == generation["candidate_tokens"]


def _corrupted(fused: Path, tmp_path: Path, what: str) -> Path:
    """The fused model with the first norm's epsilon or the last norm's weight changed: the final norm's epsilon
    only rescales each row, which no argmax can see."""
    model = onnx.load(str(fused))
    norms = [node for node in model.graph.node if node.op_type == contract.RMS_NORM_OP]
    if what == "epsilon":
        attribute = next(a for a in norms[0].attribute if a.name == contract.ATTR_EPSILON)
        attribute.f = 1.0
    else:
        tensor = next(t for t in model.graph.initializer if t.name == norms[-1].input[1])
        weight = numpy_helper.to_array(tensor)
        ramp = np.linspace(0.5, 1.5, weight.size).astype(weight.dtype).reshape(weight.shape)
        tensor.CopyFrom(numpy_helper.from_array(weight * ramp, tensor.name))
    path = tmp_path / f"{what}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("what", ["epsilon", "weight"])
@pytest.mark.parametrize("original", [CACHE_FIXTURES[0], CACHE_FIXTURES[1]], ids=lambda path: path.stem)
def test_a_corrupted_fused_model_fails_check_generate(original, what, fused_fixtures, tmp_path):
    corrupted = _corrupted(fused_fixtures[original], tmp_path, what)
    result = run_cli("check", original, corrupted, "--generate", "16")
    assert result.exit_code == EXIT_MISMATCH, result.output
    assert "more than a near tie" in result.output


def test_a_generation_failure_alone_fails_the_check(fused_fixtures, tmp_path):
    # A tolerance so wide that every output passes: the exit status and `passed` are the generation's.
    corrupted = _corrupted(fused_fixtures[KV_FIXTURE], tmp_path, "weight")
    result = run_cli("check", KV_FIXTURE, corrupted, "--generate", "16", "--rtol", "1e9", "--json")
    report = json.loads(result.stdout)
    assert result.exit_code == EXIT_MISMATCH
    assert all(step["passed"] for step in report["steps"])
    assert report["passed"] is False and report["generation"]["passed"] is False
    text = run_cli("check", KV_FIXTURE, corrupted, "--generate", "16", "--rtol", "1e9")
    assert text.exit_code == EXIT_MISMATCH
    # The verdict is the last line on stdout, fail or pass (-q keeps it alone).
    assert text.stdout.splitlines()[-1].startswith("generation: diverged at step")


def test_check_generate_takes_prompt_ids_and_refuses_bad_ones(fused_fixtures):
    fused = fused_fixtures[KV_FIXTURE]
    result = run_cli("check", KV_FIXTURE, fused, "--generate", "4", "--prompt-ids", "1,2,3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["generation"]["prompt"] == [1, 2, 3]
    for bad, message in (("128", "prompt id 128 is outside the vocabulary"), ("", "the prompt is empty")):
        result = run_cli("check", KV_FIXTURE, fused, "--generate", "4", "--prompt-ids", bad)
        assert result.exit_code == EXIT_BAD_INPUT
        assert message in result.output and "--prompt-ids" in result.output
    assert run_cli("check", KV_FIXTURE, fused, "--generate", "0").exit_code == EXIT_BAD_INPUT


def test_logits_only_fixtures_are_compared_in_recompute_mode(tmp_path):
    original = FIXTURES / "llama-torchscript-fp16.onnx"
    fused = fuse_file(original, tmp_path / "fused.onnx").output_path
    result = run_cli("check", original, fused, "--generate", "6", "--json")
    assert result.exit_code == 0, result.output
    generation = json.loads(result.stdout)["generation"]
    assert generation["cache"] is False and "no KV cache" in generation["notes"][0]


def test_compare_generate_on_a_fused_model_is_check_generate(fused_fixtures):
    fused = fused_fixtures[KV_FIXTURE]
    checked = json.loads(run_cli("check", KV_FIXTURE, fused, "--generate", "8", "--json").stdout)
    compared = json.loads(run_cli("compare", KV_FIXTURE, fused, "--generate", "8", "--json").stdout)
    assert compared["generation"] == checked["generation"]


def _stand_in_engine(tmp_path: Path, fused: Path, monkeypatch, presets=("decode", "prefill"), past=None) -> Path:
    """A sidecar with `compile`'s profiles for the fused model, and the lowered fused model standing in for the
    engine (no TensorRT here)."""
    from trtfuse.engine import session
    from trtfuse.generate import agreement, runners
    from trtfuse.verify.onnxrt import lowered_session

    tmp_path.mkdir(exist_ok=True)
    loaded = load_model(fused)
    profiles = derive_profiles(loaded.model, request_from_options(presets=presets, past=past))
    engine = engine_with_sidecar(tmp_path, profiles=profiles, model=loaded.model)
    lowered = lowered_session(load_model(engine.with_name("m.fused.onnx")), evaluator=False)
    for module in (agreement, runners):
        monkeypatch.setattr(module, "import_tensorrt", lambda: object())
    monkeypatch.setattr(session, "EngineSession", OnnxrtEngineSession.running(lowered))
    return engine


def test_the_engine_branch_runs_each_step_and_checks_the_profiles_first(fused_fixtures, tmp_path, monkeypatch):
    from trtfuse.engine.profiles import DimRange

    engine = _stand_in_engine(tmp_path, fused_fixtures[KV_FIXTURE], monkeypatch)
    verdict = compare_generation(load_model(KV_FIXTURE), engine, GenerationRequest(16))
    assert verdict.passed and verdict.candidate_runner == "tensorrt-engine"
    result = run_cli("generate", engine, "--steps", "6", "--prompt-ids", "1,2,3", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["runner"] == "tensorrt-engine"
    small = _stand_in_engine(tmp_path / "small", fused_fixtures[KV_FIXTURE], monkeypatch, past=DimRange(0, 4, 8))
    with pytest.raises(OptionError, match=r"step 7 \(1 token after 9\) fits none of the engine's optimisation"):
        compare_generation(load_model(KV_FIXTURE), small, GenerationRequest(16, prompt=[1, 2, 3, 4]))


def test_generate_cli_prints_tokens_and_latency_and_json(fused_fixtures):
    result = run_cli("generate", fused_fixtures[KV_FIXTURE], "--prompt-ids", "1,2,3", "--steps", "5")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].endswith("(onnxruntime-fused-lowered, KV cache): prompt 1 2 3")
    assert lines[1] == "tokens: 96 71 46 46 46"
    assert lines[2].startswith("first token ") and "per token" in lines[2]
    quiet = run_cli("generate", KV_FIXTURE, "--prompt-ids", "1,2,3", "--steps", "5", "-q")
    assert quiet.stdout == "tokens: 96 71 46 46 46\n"
    data = json.loads(run_cli("generate", KV_FIXTURE, "--prompt-ids", "1,2,3", "--steps", "5", "--json").stdout)
    assert data["tokens"] == [96, 71, 46, 46, 46] and data["steps"] == 5
    assert {"first_token_ms", "per_token_ms", "step_ms", "prompt", "runner"} <= data.keys()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--prompt-ids", "1,x"], "Invalid value for '--prompt-ids'"),
        (["--steps", "0"], "Invalid value for '--steps'"),
        (["--prompt-ids", "999"], "prompt id 999 is outside the vocabulary"),
    ],
)
def test_generate_cli_bad_input_is_one_line_exit_2(args, message):
    result = run_cli("generate", KV_FIXTURE, *args)
    assert result.exit_code == EXIT_BAD_INPUT
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_generate_on_a_logits_only_model_says_how_in_one_line():
    result = run_cli("generate", FIXTURES / "llama-torchscript-fp16.onnx")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "run it with --no-cache" in result.output and "models/export.py --cache" in result.output


@pytest.mark.gpu
@pytest.mark.tensorrt
@needs_tensorrt
def test_generate_on_a_real_engine_gives_the_original_tokens(tmp_path):
    engine = tmp_path / "kv.engine"
    # A process of its own: the build registers one plugin kind, this process must stay free to load the engine.
    built = subprocess.run(
        [
            *(sys.executable, "-m", "trtfuse.cli.main", "compile", str(KV_FIXTURE), "-o", str(engine)),
            *("--profile", "prefill", "--profile", "decode", "--batch", "1:1:1", "--past", "0:64:256"),
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        cwd=REPO_ROOT,
    )
    assert built.returncode == 0, built.stderr
    expected = json.loads(run_cli("generate", KV_FIXTURE, "--prompt-ids", "1,2,3", "--steps", "16", "--json").stdout)
    result = run_cli("generate", engine, "--prompt-ids", "1,2,3", "--steps", "16", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["tokens"] == expected["tokens"]
    compared = run_cli("compare", KV_FIXTURE, engine, "--generate", "16")
    assert compared.exit_code == 0, compared.output


def test_the_engine_branch_measures_quantizer_flips_too(tmp_path, monkeypatch):
    original = TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"
    fused = fuse_file(original, tmp_path / "fused.onnx").output_path
    engine = _stand_in_engine(tmp_path / "engine", fused, monkeypatch)
    verdict = compare_generation(load_model(original), engine, GenerationRequest(16))
    assert verdict.candidate_runner == "tensorrt-engine"
    assert verdict.passed and verdict.divergence is not None and verdict.divergence.flips is not None
    assert verdict.divergence.flips.passed
