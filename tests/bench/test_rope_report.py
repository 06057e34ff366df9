"""CPU/CI: the rope section's targets and report read a run's numbers as issue 29 states the targets."""

from __future__ import annotations

import pytest

pytest.importorskip("cutlass", reason="trtfuse.bench.rope imports the kernels (nvidia-cutlass-dsl)")
pytest.importorskip("torch", reason="torch is not installed")

from trtfuse.bench.rope import SWEEP_BLOCK_THREADS, print_rope_report, rope_target_checks


def decode_row(ours: float, qk: float) -> dict[str, object]:
    return {"tokens": 1, "timing": "graph", "ours_us": ours, "ours_us_again": ours + 0.05, "qk_us": qk}


def prefill_row(pct: float, ours: float, compile_us: float) -> dict[str, object]:
    return {
        "tokens": 16384,
        "timing": "events",
        "ours_us": ours,
        "ours_us_again": ours,
        "qk_us": ours - 3,
        "qk_then_compile_us": ours + 40,
        "compile_us": compile_us,
        "same_size_copy_us": ours * pct / 100,
        "ours_pct_same_size_copy": pct,
    }


def test_decode_is_held_to_our_qk_norm_plus_a_fifth_of_a_microsecond() -> None:
    checks = dict(rope_target_checks({"rope": [decode_row(1.55, 1.40)]}))
    assert checks == {"rope tokens=1 within 0.2 µs of our QK-norm alone": True}
    assert not any(dict(rope_target_checks({"rope": [decode_row(1.61, 1.40)]})).values())


def test_prefill_is_held_to_95_percent_of_a_copy_and_to_both_torch_compile_baselines() -> None:
    checks = rope_target_checks({"rope": [prefill_row(96.0, 100.0, 150.0)]})
    assert [met for _, met in checks] == [True, True, True]
    missed = dict(rope_target_checks({"rope": [prefill_row(94.0, 100.0, 99.0)]}))
    assert missed["rope tokens=16384 >= 95.0% of a same-size copy"] is False
    assert missed["rope tokens=16384 faster than torch.compile"] is False
    assert missed["rope tokens=16384 faster than our QK-norm + torch.compile's rotation"] is True


def test_the_report_prints_every_row_and_the_block_sweep(capsys: pytest.CaptureFixture[str]) -> None:
    sweep = [{"block_threads": t, "tokens": 1, "us": 1.5, "rule": t == 128} for t in SWEEP_BLOCK_THREADS]
    print_rope_report({"rope": [decode_row(1.5, 1.4), prefill_row(96.0, 100.0, 150.0)], "rope_block_sizes": sweep})
    out = capsys.readouterr().out
    assert "tokens     1 ( graph): ours    1.50    1.55 | qk    1.40" in out
    assert "copy   96.00 ( 96.0% of copy)" in out and " 128 threads, tokens     1:     1.50*" in out
