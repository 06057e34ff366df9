"""EngineRun: what `trtfuse run` prints and writes as JSON, without TensorRT."""

from pathlib import Path

import numpy as np

from trtfuse.engine.run import EngineRun, RunResult, TimingSummary


def _run() -> EngineRun:
    timing = TimingSummary.from_seconds([0.001, 0.003])
    result = RunResult(outputs={"logits": np.zeros((1, 4, 8), np.float16)}, timing=timing)
    return EngineRun(engine_path=Path("m.engine"), feed={"input_ids": np.zeros((1, 4), np.int64)}, result=result)


def test_engine_run_lines_name_each_input_and_output_then_the_timings():
    lines = _run().lines()
    assert lines[:2] == ["input  input_ids: 1x4 int64", "output logits: 1x4x8 float16"]
    assert lines[2].startswith("2 runs, end to end") and "median 2.000 ms" in lines[2]


def test_engine_run_json_holds_shapes_dtypes_and_timings():
    assert _run().to_json() == {
        "engine": "m.engine",
        "plugins": "python",
        "inputs": {"input_ids": {"shape": [1, 4], "dtype": "int64"}},
        "outputs": {"logits": {"shape": [1, 4, 8], "dtype": "float16"}},
        "timing_ms": {"runs": 2, "min_ms": 1.0, "median_ms": 2.0, "mean_ms": 2.0, "max_ms": 3.0},
    }
