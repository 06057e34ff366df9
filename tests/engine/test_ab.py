"""The A/B of `compile --baseline` without TensorRT: the statistics, the cases, the schedule, the never-slower search
and the report. What touches TensorRT (engine_runner) is in tests/engine/test_ab_tensorrt.py, which skips here;
what touches CUDA (cuda_timing) in tests/gpu/test_cuda_timing_gpu.py."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from trtfuse import contract
from trtfuse.engine.ab import CaseTiming, PairMeasurement, TimingSettings, paired_rounds, runs_per_batch
from trtfuse.engine.ab_report import ABReport, SiteTotal
from trtfuse.engine.ab_stats import MIN_ROUNDS, Comparison, Verdict, _interval_rank, compare_rounds
from trtfuse.engine.fusion_choice import (
    Candidate,
    FusionKind,
    choose_fusion,
    kinds_present,
    search_bound,
    without,
)
from trtfuse.engine.timing_cases import TimingCase, timing_cases
from trtfuse.fusion.options import DEFAULT_FUSION
from trtfuse.model.onnx_file import load_model

from support.paths import FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"


# --- statistics -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("rounds", "rank"), [(6, 0), (9, 1), (10, 1), (15, 3), (20, 5), (30, 9)])
def test_the_interval_ranks_are_the_sign_tests(rounds, rank):
    """The standard table of distribution-free 95 % intervals for a median: [x(k), x(n-k+1)], k = rank + 1."""
    assert _interval_rank(rounds) == rank
    coverage = 1 - 2 * sum(math.comb(rounds, i) for i in range(rank + 1)) / 2**rounds
    assert coverage >= 0.95
    if rank + 1 < rounds // 2:
        tighter = 1 - 2 * sum(math.comb(rounds, i) for i in range(rank + 2)) / 2**rounds
        assert tighter < 0.95, "the interval is the tightest with 95 %"


def test_a_clear_difference_is_called_and_noise_is_not():
    rng = np.random.default_rng(0)
    baseline = list(10.0 + 0.05 * rng.standard_normal(15))
    faster = compare_rounds(baseline, [b - 0.5 + 0.05 * rng.standard_normal() for b in baseline])
    assert faster.verdict is Verdict.FASTER
    assert faster.difference_ms == pytest.approx(-0.5, abs=0.1)
    assert faster.ratio < 1.0
    slower = compare_rounds(baseline, [b + 0.5 for b in baseline])
    assert slower.verdict is Verdict.SLOWER
    same = compare_rounds(baseline, [b + 0.05 * rng.standard_normal() for b in baseline])
    assert same.verdict is Verdict.NOISE
    assert same.low_ms < 0.0 < same.high_ms
    assert same.noise_ms == pytest.approx((same.high_ms - same.low_ms) / 2)


def test_the_verdict_reads_the_paired_differences_not_the_spread_of_each_side():
    """A drift that moves both engines alike (clock changes between rounds) cancels in the pairs."""
    drift = [10.0 + index for index in range(12)]
    assert compare_rounds(drift, [d + 0.01 for d in drift]).verdict is Verdict.SLOWER


def test_too_few_or_unpaired_rounds_are_refused():
    with pytest.raises(ValueError, match=f"at least {MIN_ROUNDS} rounds"):
        compare_rounds([1.0] * 5, [1.0] * 5)
    with pytest.raises(ValueError, match="differ in number"):
        compare_rounds([1.0] * 6, [1.0] * 7)


# --- the schedule -----------------------------------------------------------------------------------------------
def test_rounds_alternate_which_engine_runs_first():
    order = []
    counter = itertools.count()

    def timer(name):
        return lambda: order.append(name) or float(next(counter))

    baseline, candidate = paired_rounds(timer("b"), timer("c"), 4)
    assert order == ["b", "c", "c", "b", "b", "c", "c", "b"]
    assert len(baseline) == len(candidate) == 4


@pytest.mark.parametrize(("one_run_ms", "runs"), [(0.01, 1000), (2.0, 10), (20.0, 1), (100.0, 1), (0.0, 1000)])
def test_a_batch_lasts_about_batch_ms(one_run_ms, runs):
    assert runs_per_batch(one_run_ms, TimingSettings(batch_ms=20.0, max_runs=1000)) == runs


# --- the cases --------------------------------------------------------------------------------------------------
def _profiles_of(model, request):
    from trtfuse.engine.profiles import derive_profiles, request_from_options

    return derive_profiles(model, request_from_options(**request))


def test_a_kv_model_gets_every_profile_at_opt_and_decode_at_its_min_and_max_past():
    model = load_model(KV_FIXTURE).model
    profiles = _profiles_of(model, {"presets": ("prefill", "decode"), "past": None})
    decode = profiles[1].shapes["past_key_values.0.key"]
    cases = timing_cases(model, profiles)
    names = [case.name for case in cases]
    past_min, past_max = decode.min[2], decode.max[2]
    assert names == ["prefill", "decode", f"decode past={past_min}", f"decode past={past_max}"]
    assert cases[0].shapes() == {name: tuple(shape) for name, shape in profiles[0].opt_shapes().items()}
    assert cases[3].shapes()["past_key_values.0.key"][2] == past_max
    assert cases[3].shapes()["input_ids"][1] == 1, "a decode step is one token"
    assert [case.profile_index for case in cases] == [0, 1, 1, 1]


def test_a_model_without_a_cache_gets_its_profiles_only():
    model = load_model(FIXTURES / "qwen3-dynamo-fp32.onnx").model
    profiles = _profiles_of(model, {"presets": ("default",)})
    assert [case.name for case in timing_cases(model, profiles)] == ["default"]


# --- the never-slower search ------------------------------------------------------------------------------------
def _comparison(ratio: float, verdict: Verdict) -> Comparison:
    difference = ratio - 1.0
    low, high = {Verdict.FASTER: (-0.2, -0.1), Verdict.SLOWER: (0.1, 0.2), Verdict.NOISE: (-0.1, 0.1)}[verdict]
    return Comparison(1.0, ratio, difference, low, high, 15)


def _measured(left, **cases):
    return Candidate(frozenset(left), {name: _comparison(*value) for name, value in cases.items()})


ALL_KINDS = [FusionKind.NORM, FusionKind.ADD_NORM, FusionKind.QK, FusionKind.QUANT]


def test_a_fusion_slower_nowhere_is_kept_without_a_build():
    full = _measured((), prefill=(0.9, Verdict.FASTER), decode=(1.01, Verdict.NOISE))

    def measure(_left):
        raise AssertionError("no extra build")

    choice = choose_fusion(full, ALL_KINDS, measure)
    assert choice.kept is full and choice.builds == 0
    assert "every trtfuse node is kept" in choice.why


def test_the_kind_that_loses_is_left_to_tensorrt_within_the_bound():
    full = _measured((), prefill=(1.05, Verdict.SLOWER), decode=(0.95, Verdict.FASTER))
    results = {
        frozenset({FusionKind.NORM}): _measured(
            {FusionKind.NORM}, prefill=(1.04, Verdict.SLOWER), decode=(0.96, Verdict.FASTER)
        ),
        frozenset({FusionKind.ADD_NORM}): _measured(
            {FusionKind.ADD_NORM}, prefill=(0.97, Verdict.FASTER), decode=(0.96, Verdict.FASTER)
        ),
        frozenset({FusionKind.QK}): _measured(
            {FusionKind.QK}, prefill=(1.06, Verdict.SLOWER), decode=(0.99, Verdict.NOISE)
        ),
    }
    asked = []

    def measure(left):
        asked.append(left)
        return results[left]

    present = [FusionKind.NORM, FusionKind.ADD_NORM, FusionKind.QK]
    choice = choose_fusion(full, present, measure)
    assert choice.kept.left == {FusionKind.ADD_NORM}
    assert choice.builds == len(asked) == 3 <= search_bound(present)
    assert "prefill was slower than TensorRT alone" in choice.why
    assert "--no-fuse-residual" in choice.kept.label()
    assert choice.to_json()["flags"] == ["--no-fuse-residual"]


def test_kinds_that_each_help_are_also_tried_together():
    full = _measured((), prefill=(1.10, Verdict.SLOWER))
    singles = {
        FusionKind.NORM: (1.05, Verdict.SLOWER),
        FusionKind.QK: (1.04, Verdict.SLOWER),
    }
    asked = []

    def measure(left):
        asked.append(left)
        if len(left) == 2:
            return _measured(left, prefill=(0.98, Verdict.NOISE))
        (kind,) = left
        return _measured(left, prefill=singles[kind])

    choice = choose_fusion(full, [FusionKind.NORM, FusionKind.QK], measure)
    assert asked[-1] == {FusionKind.NORM, FusionKind.QK}
    assert choice.kept.left == {FusionKind.NORM, FusionKind.QK}
    assert choice.builds == 3 == search_bound([FusionKind.NORM, FusionKind.QK])


def test_when_every_configuration_loses_tensorrt_alone_is_kept():
    full = _measured((), prefill=(1.10, Verdict.SLOWER))
    choice = choose_fusion(full, [FusionKind.NORM], lambda left: _measured(left, prefill=(1.02, Verdict.SLOWER)))
    assert choice.kept.alone
    assert choice.kept.left == {FusionKind.NORM}
    assert "TensorRT's own" in choice.why
    assert choice.to_json()["tensorrt_alone"] is True


def test_the_kinds_present_and_the_options_that_leave_them():
    nodes = {op: 0 for op in contract.FUSED_OPS}
    nodes.update({contract.RMS_NORM_OP: 1, contract.QK_NORM_QUANT_OP: 2})
    assert kinds_present(nodes) == [FusionKind.NORM, FusionKind.QK, FusionKind.QUANT]
    rotary = {**nodes, contract.QK_NORM_QUANT_OP: 0, contract.QK_NORM_ROPE_OP: 2}
    assert kinds_present(rotary) == [FusionKind.NORM, FusionKind.QK, FusionKind.ROPE]
    assert not without(DEFAULT_FUSION, [FusionKind.ROPE]).fuse_rope
    options = without(DEFAULT_FUSION, [FusionKind.QK, FusionKind.QUANT])
    assert (options.fuse_qk, options.fuse_quant, options.fuse_norm, options.fuse_residual) == (False, False, True, True)
    assert search_bound([FusionKind.NORM]) == 1


# --- the report -------------------------------------------------------------------------------------------------
def _report() -> ABReport:
    cases = tuple(
        CaseTiming(TimingCase(name, 0, "p", {"x": np.zeros((1, n), np.int64)}), _comparison(*value), 10, (True, True))
        for name, n, value in [("prefill", 8, (0.9, Verdict.FASTER)), ("decode", 1, (1.1, Verdict.SLOWER))]
    )
    measurement = PairMeasurement(cases, (3 << 20, 2 << 20), ((), ()))
    sites = {"prefill": (SiteTotal(0.25, 12, 2), SiteTotal(0.1, 5))}
    return ABReport("NVIDIA H100 80GB HBM3", "10.16.1", TimingSettings(), measurement, (30.0, 31.5), sites)


def test_the_table_has_one_row_per_case_with_its_verdict():
    lines = _report().lines()
    assert lines[0].startswith("A/B on NVIDIA H100 80GB HBM3, TensorRT 10.16.1: 15 paired rounds per case")
    header, prefill, decode = lines[1:4]
    assert header.split()[:3] == ["case", "TensorRT", "alone"]
    assert prefill.startswith("prefill") and prefill.endswith("faster") and "(-10.0 %)" in prefill
    assert decode.endswith("slower")
    assert "0.2500 ms in 12 layers, 2 shared" in lines[4] and "0.1000 ms in 5 layers" in lines[4]
    assert lines[5] == (
        "GPU memory (each engine alone): TensorRT alone 3.0 MiB, trtfuse 2.0 MiB; build: TensorRT alone 30.0 s, "
        "trtfuse 31.5 s"
    )


def test_the_json_carries_every_number_of_the_table():
    data = _report().to_json()
    assert data["slower_cases"] == ["decode"]
    assert [case["name"] for case in data["cases"]] == ["prefill", "decode"]
    assert data["cases"][0]["difference_pct"] == pytest.approx(-10.0)
    assert data["cases"][0]["shapes"] == {"x": [1, 8]}
    assert data["norm_sites"]["prefill"]["baseline"] == {"ms": 0.25, "layers": 12, "shared_layers": 2}
    assert data["gpu_memory_bytes"] == {"baseline": 3 << 20, "trtfuse": 2 << 20}


# --- the command line without TensorRT --------------------------------------------------------------------------
@pytest.mark.parametrize("flag", ["--baseline", "--never-slower"])
def test_compile_with_the_ab_fuses_then_says_tensorrt_is_missing(tmp_path, flag):
    from support.cli import run_cli

    if _has_tensorrt():
        pytest.skip("TensorRT is installed: the A/B runs (tests/engine/test_ab_tensorrt.py)")
    engine = tmp_path / "m.engine"
    result = run_cli("compile", FIXTURES / "qwen3-torchscript-fp16.onnx", "-o", engine, flag)
    assert result.exit_code == 3, result.output
    assert "fused, but no engine built" in result.stderr and "`tensorrt` is not installed" in result.stderr
    assert (tmp_path / "m.fused.onnx").is_file() and (tmp_path / "m.fusion.json").is_file()
    assert not engine.exists() and not list(tmp_path.glob("m.engine*"))


def test_the_ab_needs_six_rounds_at_least(tmp_path):
    from support.cli import run_cli

    result = run_cli("compile", FIXTURES / "qwen3-torchscript-fp16.onnx", "-o", tmp_path / "m.engine", "--ab-rounds", 5)
    assert result.exit_code == 2
    assert "--ab-rounds" in result.stderr
    assert not list(tmp_path.iterdir()), "nothing written"


def _has_tensorrt() -> bool:
    import importlib.util

    return importlib.util.find_spec("tensorrt") is not None
