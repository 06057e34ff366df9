"""`check --generate N` on quantized graphs (docs/cli.md, "quantizer flips"): a divergence beyond a near tie passes
when, at every step up to it, the candidate's logits are within FLIP_MARGIN x (rtol x max |logit| + the change of
the original's logits with its quantizer inputs nudged by +-rtol) of the original's. The ModelOpt fixtures pass
`check` and `check --generate 16` with no options; a fused FP8 model with a wrong weight, epsilon or scale still
fails."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from trtfuse import contract
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.generate.agreement import (
    FLIP_MARGIN,
    Divergence,
    FlipShift,
    GenerationRequest,
    GenerationVerdict,
    check_generation,
)
from trtfuse.generate.loop import Generation, StepRecord
from trtfuse.model.onnx_file import load_model
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.paths import TOOL_FIXTURES

FP8_KV = TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"
INT8 = TOOL_FIXTURES / "qwen3-modelopt-int8-fp16.onnx"


def _divergence(flips: FlipShift | None) -> Divergence:
    return Divergence(3, 48, 110, margin=0.01, scale=0.5, rtol=2e-3, flips=flips)


def _verdict(divergence: Divergence) -> GenerationVerdict:
    steps = tuple(StepRecord(token, 0.001, 0.1, 0.5) for token in (1, 2, 3))
    generation = Generation((7,), steps, cache=True)
    return GenerationVerdict(generation, generation, "onnxruntime", "onnxruntime-fused-lowered", "float16", divergence)


def test_a_divergence_beyond_a_near_tie_passes_only_within_the_flips_bound() -> None:
    # bound: 1.5 x (rtol x max |logit| 0.001 + nudged change 0.02) = 0.0315
    within = FlipShift(step=2, quantizer=0.02, rounding=0.001, candidate=0.03)
    beyond = FlipShift(step=2, quantizer=0.02, rounding=0.001, candidate=0.04)
    assert within.bound == pytest.approx(FLIP_MARGIN * 0.021)
    assert not _divergence(None).near_tie and not _verdict(_divergence(None)).passed
    passed = _verdict(_divergence(within))
    assert passed.passed and passed.to_json()["divergence"]["quantizer_flips"]["passed"]
    assert (
        "more than a near tie (> 2 x float16's rtol 0.002 x max |logit| 0.5 = 0.002). Expected in a quantized graph: a "
        "value within rounding of a quantizer's boundary lands one step off, which moves the logits further. Checked: "
        "fed the original's tokens up to there, the candidate's logits are compared with the original's at each step "
        "against 1.5 x (the rounding allowance rtol x max |logit| + how far the original's own logits move with every "
        "quantizer input nudged by +-rtol); they stay within it (closest at step 2: 0.03 <= 1.5 x (rounding 0.001 + "
        "quantizer flips 0.02) = 0.0315): passes, the tokens before it are equal" in (passed.verdict_line())
    )
    assert passed.agreement() == "the generated tokens agree up to quantizer flips at step 3"
    failed = _verdict(_divergence(beyond))
    assert not failed.passed and failed.to_json()["divergence"]["passed"] is False
    assert failed.verdict_line().endswith(
        "and more than quantizer flips explain: fed the original's tokens up to there, the candidate's logits are "
        "compared with the original's at each step against 1.5 x (the rounding allowance rtol x max |logit| + how far "
        "the original's own logits move with every quantizer input nudged by +-rtol); they go past it at step 2: "
        "0.04 > 1.5 x (rounding 0.001 + quantizer flips 0.02) = 0.0315"
    )
    # Logits that went non-finite are no flip.
    assert not FlipShift(step=1, quantizer=0.02, rounding=0.001, candidate=float("inf")).passed


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    folder = tmp_path_factory.mktemp("quantized")
    return {path: fuse_file(path, folder / path.name).output_path for path in (FP8_KV, INT8)}


@pytest.mark.parametrize("original", [FP8_KV, INT8], ids=lambda path: path.stem)
def test_the_modelopt_fixtures_pass_check_and_check_generate_16_with_no_options(original: Path, fused) -> None:
    checked = run_cli("check", original, fused[original])
    assert checked.exit_code == 0, checked.output
    result = run_cli("check", original, fused[original], "--generate", "16", "--json")
    assert result.exit_code == 0, result.output
    generation = json.loads(result.stdout)["generation"]
    assert generation["passed"] and generation["cache"] == (original == FP8_KV)
    divergence = generation["divergence"]
    assert divergence is None or divergence["near_tie"] or divergence["quantizer_flips"]["passed"]


def test_the_fp8_fixtures_divergence_is_one_quantizer_flips_explain(fused) -> None:
    # The fused norm is within 0.5 ulp of the float64 norm, the original's fp16 chain up to 2.3 ulps off: at step
    # 3 the tokens part at a margin beyond a near tie, and the nudged original's logits move as far.
    verdict = check_generation(load_model(FP8_KV), load_model(fused[FP8_KV]), GenerationRequest(16))
    divergence = verdict.divergence
    assert divergence is not None and not divergence.near_tie
    assert verdict.passed and divergence.flips is not None and divergence.flips.passed
    assert divergence.flips.step <= divergence.step and divergence.flips.quantizer > divergence.flips.rounding


def _corrupted(fused: Path, folder: Path, what: str) -> Path:
    """The fused FP8 model with its last norm's weight ramped from 0.5 to 1.5, its first norm's epsilon 1, or its
    first norm's output scale 1.25 times the graph's."""
    model = onnx.load(str(fused))
    quantized = (contract.RMS_NORM_QUANT_OP, contract.ADD_RMS_NORM_QUANT_OP)
    norms = [node for node in model.graph.node if node.op_type in quantized]
    if what == "weight":
        tensor = next(t for t in model.graph.initializer if t.name == norms[-1].input[-1])
        weight = numpy_helper.to_array(tensor)
        ramp = np.linspace(0.5, 1.5, weight.size).astype(weight.dtype).reshape(weight.shape)
        tensor.CopyFrom(numpy_helper.from_array(weight * ramp, tensor.name))
    else:
        name, value = {"epsilon": (contract.ATTR_EPSILON, 1.0), "scale": ("output_quant_scale", None)}[what]
        attribute = next(a for a in norms[0].attribute if a.name == name)
        attribute.f = value if value is not None else attribute.f * 1.25
    path = folder / f"{what}.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("what", ["weight", "epsilon", "scale"])
def test_a_wrong_fused_fp8_model_still_fails_and_its_generation_alone_too(what: str, fused, tmp_path: Path) -> None:
    corrupted = _corrupted(fused[FP8_KV], tmp_path, what)
    assert run_cli("check", FP8_KV, corrupted, "--generate", "16").exit_code == EXIT_MISMATCH
    # A tolerance so wide that every output passes: the failure is the generation's (and, for the scale, the node's
    # codes, which no tolerance loosens).
    result = run_cli("check", FP8_KV, corrupted, "--generate", "16", "--rtol", "1e9", "--json")
    assert result.exit_code == EXIT_MISMATCH, result.output
    report = json.loads(result.stdout)
    assert all(output["passed"] for step in report["steps"] for output in step["outputs"])
    assert all(node["passed"] == (what != "scale") for step in report["steps"] for node in step["nodes"][:1])
    flips = report["generation"]["divergence"]["quantizer_flips"]
    assert flips is not None and not flips["passed"] and flips["candidate_shift"] > flips["bound"]
