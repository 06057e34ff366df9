"""`trtfuse compare`: the original model against a TensorRT engine or, where there is none (CI), against the fused
ONNX model, which is `trtfuse check` itself. Either way the steps, runs and verdict are `verify.verdict.judge_steps`'s;
only the candidate differs (for an engine, an `EngineSession`, loaded after the original's runs and released before
the float32 evaluation's).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from trtfuse.engine.engine_file import EngineFile, is_onnx_model_path
from trtfuse.engine.session import ENGINE_RUNNER, engine_steps
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.files import OutputPlan, check_readable, json_holding
from trtfuse.model.feed_files import is_trtfuse_archive
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import CheckInputs, check_fused
from trtfuse.verify.interface import check_original_unfused
from trtfuse.verify.onnxrt import Notify, original_session, quiet
from trtfuse.verify.verdict import CheckResult, judge_for, judge_steps

ORIGINAL_RUNNER = "onnxruntime-original"
LOWERED_RUNNER = "onnxruntime-fused-lowered"
# A comparison report trtfuse wrote (`compare --report`), which a later call may replace.
is_comparison_report = json_holding("original", "candidate", "runners", "steps")


@dataclass(frozen=True)
class ComparisonReport:
    original: Path
    candidate: Path
    candidate_runner: str
    result: CheckResult

    @property
    def passed(self) -> bool:
        return self.result.passed

    def to_json(self) -> dict:
        return {
            "original": str(self.original),
            "candidate": str(self.candidate),
            "runners": [ORIGINAL_RUNNER, self.candidate_runner],
            **self.result.to_json(),
        }


def compare(
    original_path: Path,
    candidate_path: Path,
    inputs: CheckInputs | None = None,
    *,
    loaded_original: LoadedModel | None = None,
    plan: OutputPlan | None = None,
    notify: Notify = quiet,
) -> ComparisonReport:
    """Judge the candidate (an engine, or a fused .onnx) against the original at each step of `inputs` (by default
    the original's default feeds from seed 0; for an engine without shapes or dims, at its first profile's OPT
    shapes), the feeds saved first when asked; an engine's file and sidecar are read once, and the original once
    (`loaded_original`: the caller's, already loaded from `original_path`). `plan` holds the caller's outputs (a
    report): every file read here joins its reads, and it is checked before any work. `notify` hears which model
    loads and which step runs."""
    inputs = inputs or CheckInputs()
    check_readable(candidate_path, "file" if is_onnx_model_path(candidate_path) else "engine file")
    original = loaded_original if loaded_original is not None else load_model(original_path)
    check_original_unfused(original)
    plan = (plan or OutputPlan()).read(*original.files)
    plan.write("saved inputs", inputs.save_inputs, ours=is_trtfuse_archive)
    if is_onnx_model_path(candidate_path):
        fused = load_model(candidate_path)
        plan.read(*fused.files).check()
        result = check_fused(original, fused, inputs, notify=notify)
        return ComparisonReport(original_path, candidate_path, LOWERED_RUNNER, result)
    engine = EngineFile.open(candidate_path)
    plan.read(*engine.files()).check()
    import_tensorrt()
    feeds = engine.at_sidecar_shapes(
        inputs.shapes, inputs.dims, lambda chosen: dataclasses.replace(inputs, shapes=chosen).step_feeds(original)
    )
    judge = judge_for(original, inputs.tolerance)
    runner, note = original_session(original, notify)
    # The engine loads when its turn comes, after the original's runs, and is gone before the float32 evaluation.
    candidate = engine_steps(engine, notify)
    result = judge_steps(
        runner, candidate, feeds, judge, inputs.step_seed, inputs.inputs_file, note, notify, "the engine"
    )
    return ComparisonReport(original_path, candidate_path, ENGINE_RUNNER, result)
