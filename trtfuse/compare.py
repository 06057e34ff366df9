"""`trtfuse compare`: the original model against a TensorRT engine or, where there is none (CI), against the fused
ONNX model run exactly as `trtfuse check` runs it. Either way the steps, runs and verdict are `check.judge_steps`'s;
only the candidate's runner differs (for an engine, `polygraphy run --trtfuse`'s runner).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtfuse.check import CheckResult, check_fused, judge_for, judge_steps, original_runner
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.inputs import StepFeed, default_feeds
from trtfuse.io import LoadedModel, load_model
from trtfuse.runner import ENGINE_RUNNER, engine_profiles
from trtfuse.tolerances import Tolerance

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
) -> ComparisonReport:
    """Judge the candidate (an engine, or a fused .onnx) against the original at each step of `feeds` (by default
    the original's `default_feeds`; for an engine without `shapes` or `dims`, its first profile's OPT shapes)."""
    if not candidate_path.exists():
        raise TrtfuseError(f"{candidate_path}: no such file")
    original = load_model(original_path)
    if not is_engine(candidate_path):
        fused = load_model(candidate_path)
        result = check_fused(
            original, fused, seed, shapes, dims, tolerance=tolerance, feeds=feeds, inputs_file=inputs_file
        )
        return ComparisonReport(original_path, candidate_path, LOWERED_RUNNER, result)
    if feeds is None:
        feeds = comparison_feeds(original, candidate_path, seed, shapes, dims)
    judge = judge_for(original, tolerance)
    runner, note = original_runner(original)
    seed_used = None if inputs_file else seed
    result = judge_steps(runner, engine_run(candidate_path), feeds, judge, seed_used, inputs_file, note)
    return ComparisonReport(original_path, candidate_path, ENGINE_RUNNER, result)


def comparison_feeds(
    original: LoadedModel,
    candidate_path: Path,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
) -> list[StepFeed]:
    """`check`'s default feeds; for an engine without `shapes` or `dims`, at its first profile's OPT shapes."""
    if is_engine(candidate_path) and not shapes and not dims:
        profiles = engine_profiles(candidate_path)
        if profiles:
            shapes = profiles[0].opt_shapes()
    return default_feeds(original.model, seed, shapes=shapes, dims=dims)


def engine_run(engine_path: Path) -> Callable[[Mapping[str, np.ndarray]], dict[str, np.ndarray]]:
    """Runs the engine on one feed with the runner of `polygraphy run --trtfuse` (`TrtfuseTrtRunner`: trtfuse's
    TrtRunner, the feed in the first optimisation profile that holds it)."""

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from polygraphy.exception import PolygraphyException
        from polygraphy.logger import G_LOGGER

        from trtfuse.polygraphy_ext.runners import TrtfuseTrtRunner

        # trtfuse prints its own report and error line; Polygraphy's log, even its critical line, would repeat them.
        with G_LOGGER.verbosity(G_LOGGER.CRITICAL + 1):
            try:
                with TrtfuseTrtRunner(str(engine_path), name=ENGINE_RUNNER) as runner:
                    return runner.infer(dict(feed))
            except PolygraphyException as error:
                if isinstance(error.__cause__, TrtfuseError):
                    raise error.__cause__ from None
                raise TrtfuseError(f"{engine_path}: inference failed: {first_line(error)}") from None

    return run
