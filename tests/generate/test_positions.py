"""The positions a model was trained for, where its export records them (`max_position_embeddings` in the model's
metadata, written by models/export.py --cache): a profile or a generation that goes past them gets one warning line
on stderr, and still runs (the graph computes its rotary angles for any position)."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.engine.profiles import DimRange, profile_warnings, request_from_options
from trtfuse.generate.runners import generate_file
from trtfuse.model.dims import POSITIONS_METADATA_KEY, model_dims

from support.cli import run_cli
from support.paths import FIXTURES, TOOL_FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
WARNING = "past the 128 the model was trained for (its metadata's max_position_embeddings 128)"


def test_the_kv_fixture_records_its_positions():
    model = onnx.load(str(KV_FIXTURE))
    assert model_dims(model).declared_positions.value == 128
    assert model_dims(model).max_total is None


@pytest.mark.parametrize("value", ["0", "-5", "12x", "", "١٢٨"])
def test_a_value_that_is_no_positive_count_declares_nothing(value):
    model = onnx.load(str(KV_FIXTURE))
    next(entry for entry in model.metadata_props if entry.key == POSITIONS_METADATA_KEY).value = value
    assert model_dims(model).declared_positions is None


def test_profiles_past_the_positions_get_one_line():
    model = onnx.load(str(KV_FIXTURE))
    (line,) = profile_warnings(model, request_from_options(presets=["prefill", "decode"]))
    assert line.startswith(f"profiles 'prefill', 'decode' reach up to 4097 positions, {WARNING}")
    assert line.endswith("give token and past ranges whose MAX add up to at most 128")
    (prefill,) = profile_warnings(model, request_from_options(presets=["prefill"]))
    assert prefill.startswith(f"profile 'prefill' reaches up to 4096 positions, {WARNING}")
    # 127 past + 1 token: the last position the model was trained for.
    assert profile_warnings(model, request_from_options(presets=["decode"], past=DimRange(0, 64, 127))) == []


def test_compile_warns_once_and_goes_on(tmp_path: Path):
    result = run_cli("compile", KV_FIXTURE, "-o", tmp_path / "kv.engine", "--profile", "prefill", "--profile", "decode")
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and WARNING in warnings[0]
    assert (tmp_path / "kv.fused.onnx").exists()


def test_generation_past_the_positions_warns_once_before_it_runs(tmp_path: Path):
    heard: list[str] = []
    run = generate_file(KV_FIXTURE, 130, [1, 2, 3], warn=heard.append)
    assert len(run.generation.tokens) == 130
    assert heard == [
        f"{KV_FIXTURE}: a prompt of 3 ids and 130 steps feed 132 positions, {WARNING}; its outputs there are not "
        "what the checkpoint learned"
    ]
    within: list[str] = []
    generate_file(KV_FIXTURE, 126, [1, 2, 3], warn=within.append)
    assert within == []
    result = run_cli("generate", KV_FIXTURE, "--prompt-ids", "1,2,3", "--steps", "130")
    assert result.exit_code == 0
    assert [line for line in result.stderr.splitlines() if "warning" in line] == [f"trtfuse: warning: {heard[0]}"]
    fused = tmp_path / "kv.fused.onnx"
    assert run_cli("fuse", KV_FIXTURE, "-o", fused).exit_code == 0
    assert WARNING in run_cli("generate", fused, "--prompt-ids", "1,2,3", "--steps", "130").stderr


FP8_KV = TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"
STATED = "past the 128 the model was trained for (as stated for it)"


def _warnings(result) -> list[str]:
    return [line for line in result.stderr.splitlines() if "warning" in line]


def test_max_positions_states_what_a_modelopt_export_does_not_record(tmp_path: Path):
    """ModelOpt drops the metadata: its FP8 fixture ran 200 steps and built 8192-position profiles in silence."""
    assert model_dims(onnx.load(str(FP8_KV))).declared_positions is None
    silent = run_cli("generate", FP8_KV, "--steps", "130")
    assert silent.exit_code == 0 and _warnings(silent) == []
    stated = run_cli("generate", FP8_KV, "--steps", "130", "--max-positions", "128")
    assert stated.exit_code == 0, stated.output
    (line,) = _warnings(stated)
    assert f"a prompt of 5 ids and 130 steps feed 134 positions, {STATED}" in line
    compiled = run_cli("compile", FP8_KV, "-o", tmp_path / "fp8.engine", "--max-positions", "128")
    (line,) = _warnings(compiled)
    assert line == (
        f"trtfuse: warning: profile 'default' reaches up to 8192 positions, {STATED}; its outputs there are not what "
        "the checkpoint learned; give token and past ranges whose MAX add up to at most 128"
    )


def test_max_positions_takes_the_metadatas_place():
    longer = run_cli("generate", KV_FIXTURE, "--steps", "130", "--max-positions", "4096")
    assert longer.exit_code == 0 and _warnings(longer) == []
    request = request_from_options(presets=["decode"], positions=64)
    (line,) = profile_warnings(onnx.load(str(KV_FIXTURE)), request)
    assert "past the 64 the model was trained for (as stated for it)" in line


@pytest.mark.parametrize("value", ["0", "+128", "x"])
def test_max_positions_is_a_count(value):
    result = run_cli("generate", FP8_KV, "--max-positions", value)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "Invalid value for '--max-positions'" in result.stderr
