"""Polygraphy's Comparator between onnxruntime on the original model and a candidate on identical inputs.

The candidate is a TensorRT engine or, where TensorRT is absent (CI), the fused ONNX model with its plugin nodes
lowered to standard ops (`trtfuse.reference`) and run by onnxruntime. Both go through the same Polygraphy runner
interface, data loader, comparison function, tolerances and report, so CI exercises everything but the engine itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import numpy as np

from trtfuse.check import onnxruntime_session
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.inputs import make_feed
from trtfuse.io import LoadedModel, load_model
from trtfuse.reference import lower_fused_nodes
from trtfuse.runner import engine_profiles, profile_for_feed, trt_runner
from trtfuse.tolerances import OutputError, output_error, tolerance_for

ORIGINAL_RUNNER = "onnxruntime-original"
LOWERED_RUNNER = "onnxruntime-fused-lowered"


@dataclass(frozen=True)
class ComparisonReport:
    original: Path
    candidate: Path
    candidate_runner: str
    seed: int
    input_shapes: dict[str, tuple[int, ...]]
    outputs: list[OutputError]

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(error.passed for error in self.outputs)

    def to_json(self) -> dict:
        return {
            "original": str(self.original),
            "candidate": str(self.candidate),
            "runners": [ORIGINAL_RUNNER, self.candidate_runner],
            "seed": self.seed,
            "input_shapes": {name: list(shape) for name, shape in self.input_shapes.items()},
            "passed": self.passed,
            "outputs": [
                {
                    "name": error.name,
                    "dtype": error.dtype,
                    "max_abs": _json_float(error.max_abs),
                    "max_rel": _json_float(error.max_rel),
                    "atol": error.tolerance.atol,
                    "rtol": error.tolerance.rtol,
                    "passed": error.passed,
                }
                for error in self.outputs
            ],
        }


def _json_float(value: float) -> float | str:
    # JSON has no infinity; a missing or NaN-mismatched output is reported as the string "inf".
    return value if math.isfinite(value) else "inf"


class ToleranceCompareFunc:
    """A Polygraphy compare_func: each output of the candidate against the reference, with trtfuse's tolerances.

    Polygraphy only needs a verdict per output; the errors themselves are kept in `errors` for the report.
    """

    def __init__(self) -> None:
        self.errors: list[OutputError] = []

    def __call__(self, reference: Mapping[str, np.ndarray], candidate: Mapping[str, np.ndarray]) -> dict[str, bool]:
        verdicts = {}
        for name in reference:
            expected = reference[name]
            if name in candidate:
                error = output_error(name, np.asarray(candidate[name]), np.asarray(expected))
            else:
                dtype = np.dtype(expected.dtype).name
                error = OutputError(name, dtype, math.inf, math.inf, tolerance_for(dtype))
            self.errors.append(error)
            verdicts[name] = error.passed
        return verdicts


def is_engine(path: Path) -> bool:
    return path.suffix.lower() != ".onnx"


def candidate_runner(candidate: Path, feed: Mapping[str, np.ndarray]) -> object:
    """The engine in the profile that holds `feed`, or the lowered fused model in onnxruntime."""
    from polygraphy.backend.onnxrt import OnnxrtRunner

    if is_engine(candidate):
        return trt_runner(candidate, profile_for_feed(engine_profiles(candidate), feed))
    fused = load_model(candidate)
    lowered = LoadedModel(model=lower_fused_nodes(fused.model), path=fused.path)
    return OnnxrtRunner(partial(onnxruntime_session, lowered), name=LOWERED_RUNNER)


def comparison_feed(
    original: LoadedModel,
    candidate: Path,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
) -> dict[str, np.ndarray]:
    """Random inputs for the original model; for an engine without explicit sizes, its first profile's OPT shapes."""
    if is_engine(candidate) and not shapes and not dims:
        profiles = engine_profiles(candidate)
        if profiles:
            shapes = profiles[0].opt_shapes()
    return make_feed(original.model, seed, shapes=shapes, dims=dims)


def compare(
    original_path: Path,
    candidate_path: Path,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> ComparisonReport:
    """Run the original in onnxruntime and the candidate on the same generated inputs; report each output's error."""
    from polygraphy.backend.onnxrt import OnnxrtRunner
    from polygraphy.comparator import Comparator
    from polygraphy.exception import PolygraphyException
    from polygraphy.logger import G_LOGGER

    if not candidate_path.exists():
        raise TrtfuseError(f"{candidate_path}: no such file")
    original = load_model(original_path)
    feed = comparison_feed(original, candidate_path, seed, shapes, dims)
    candidate = candidate_runner(candidate_path, feed)
    runners = [OnnxrtRunner(partial(onnxruntime_session, original), name=ORIGINAL_RUNNER), candidate]
    compare_func = ToleranceCompareFunc()
    # trtfuse prints its own report; Polygraphy's log would repeat it at length.
    with G_LOGGER.verbosity(G_LOGGER.CRITICAL):
        try:
            results = Comparator.run(runners, data_loader=[feed])
            Comparator.compare_accuracy(results, compare_func=compare_func)
        except PolygraphyException as error:
            raise TrtfuseError(f"{candidate_path}: comparison failed: {first_line(error)}") from None
    return ComparisonReport(
        original=original_path,
        candidate=candidate_path,
        candidate_runner=candidate.name,
        seed=seed,
        input_shapes={name: tuple(array.shape) for name, array in feed.items()},
        outputs=compare_func.errors,
    )
