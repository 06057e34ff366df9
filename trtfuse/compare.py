"""`trtfuse compare`: the original model against a TensorRT engine or, where there is none (CI), against the fused
ONNX model run exactly as `trtfuse check` runs it (`verdict.judge_lowered`). Either way the steps, runs and verdict are
`verdict.judge_steps`'s; only the candidate's runner differs (for an engine, `polygraphy run --trtfuse`'s runner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtfuse.engine_file import EngineFile
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.inputs import StepFeed, default_feeds
from trtfuse.model_io import LoadedModel, load_model
from trtfuse.onnxrt import original_runner
from trtfuse.outputs import Transaction
from trtfuse.runner import ENGINE_RUNNER
from trtfuse.saved_inputs import save_feeds
from trtfuse.tolerances import Tolerance
from trtfuse.verdict import CheckResult, judge_for, judge_lowered, judge_steps

ORIGINAL_RUNNER = "onnxruntime-original"
LOWERED_RUNNER = "onnxruntime-fused-lowered"


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


def is_engine(path: Path) -> bool:
    return path.suffix.lower() != ".onnx"


def compare(
    original_path: Path,
    candidate_path: Path,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    tolerance: Tolerance | None = None,
    feeds: Sequence[StepFeed] | None = None,
    inputs_file: Path | None = None,
    save_inputs: Path | None = None,
    loaded_original: LoadedModel | None = None,
) -> ComparisonReport:
    """Judge the candidate (an engine, or a fused .onnx) against the original at each step of `feeds` (by default
    the original's `default_feeds`; for an engine without `shapes` or `dims`, its first profile's OPT shapes), the
    feeds saved to `save_inputs` first when asked; an engine's file and sidecar are read once, and the original
    once (`loaded_original`: the caller's, already loaded from `original_path`)."""
    if not candidate_path.exists():
        raise TrtfuseError(f"{candidate_path}: no such file")
    original = loaded_original if loaded_original is not None else load_model(original_path)
    seed_used = None if inputs_file else seed
    engine = EngineFile.open(candidate_path) if is_engine(candidate_path) else None
    fused = load_model(candidate_path) if engine is None else None
    if feeds is None:
        feeds = comparison_feeds(original, engine, seed, shapes, dims)
    if save_inputs is not None:
        with Transaction():
            save_feeds(save_inputs, feeds)
    if fused is not None:
        result = judge_lowered(original, fused, feeds, seed_used, inputs_file, tolerance)
        return ComparisonReport(original_path, candidate_path, LOWERED_RUNNER, result)
    judge = judge_for(original, tolerance)
    runner, note = original_runner(original)
    result = judge_steps(runner, engine_run(engine), feeds, judge, seed_used, inputs_file, note)
    return ComparisonReport(original_path, candidate_path, ENGINE_RUNNER, result)


def comparison_feeds(
    original: LoadedModel,
    engine: EngineFile | None,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
) -> list[StepFeed]:
    """`check`'s default feeds; for an engine, at `EngineFile.feed_shapes` (its first profile's OPT shapes without
    `shapes` or `dims`)."""
    if engine is not None:
        shapes = engine.feed_shapes(shapes, dims)
    return default_feeds(original.model, seed, shapes=shapes, dims=dims)


def engine_run(engine: EngineFile) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """Runs the engine on one feed with the runner of `polygraphy run --trtfuse` (`TrtfuseTrtRunner`: trtfuse's
    TrtRunner, the feed in the first optimisation profile that holds it)."""

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polygraphy.exception import PolygraphyException
        from polygraphy.logger import G_LOGGER

        from trtfuse.polygraphy_ext.runners import TrtfuseTrtRunner

        # trtfuse prints its own report and error line; Polygraphy's log, even its critical line, would repeat them.
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
            try:
                with TrtfuseTrtRunner(engine, name=ENGINE_RUNNER) as runner:
                    return runner.infer(dict(feed))
            except PolygraphyException as error:
                if isinstance(error.__cause__, TrtfuseError):
                    raise error.__cause__ from None
                raise TrtfuseError(f"{engine.path}: inference failed: {first_line(error)}") from None

    return run
