"""benchmarks/engine_ab.py: without TensorRT one line and exit 3; its table from compile --baseline's JSON."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from support.paths import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "engine_ab.py"


def _module():
    spec = importlib.util.spec_from_file_location("engine_ab", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed: the script runs")
def test_without_tensorrt_it_says_why_in_one_line():
    done = subprocess.run([sys.executable, str(SCRIPT), "--no-large"], capture_output=True, text=True, check=False)
    assert done.returncode == 3
    assert done.stdout == ""
    assert done.stderr.count("\n") == 1 and "`tensorrt` is not installed" in done.stderr


def test_the_table_has_a_row_per_case_with_the_sites_and_memory():
    case = {"name": "prefill", "baseline_ms": 1.5, "trtfuse_ms": 1.2, "difference_pct": -20.0, "noise_ms": 0.01}
    result = {
        "baseline": {
            "cases": [{**case, "verdict": "faster"}],
            "norm_sites": {"prefill": {"baseline": {"ms": 0.3}, "trtfuse": None}},
            "gpu_memory_bytes": {"baseline": 3 << 20, "trtfuse": 2 << 20},
        }
    }
    lines = _module().table([("Qwen3", result)]).splitlines()
    assert lines[0].startswith("| model | case | TensorRT alone (ms) | trtfuse (ms) |")
    assert lines[2] == "| Qwen3 | prefill | 1.5000 | 1.2000 | -20.0 % | ±0.0100 | faster | 0.3000 / - | 3 / 2 |"
