"""`trtfuse check`: a fused model against its original, both run on the CPU (`verify.onnxrt`), judged by
`verify.verdict`.

Each step's feed (a prefill and a decode step on KV-cache models, `model.feeds.default_feeds`) goes to the original
twice, to the lowered fused model once and, for 16-bit and quantized graphs, to a float32 evaluation of the original
graph (`verify.widening`): each model runs every step in turn, one onnxruntime session alive at a time. `trtfuse
compare` runs the same steps with a TensorRT engine as the candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from trtfuse.files import Transaction
from trtfuse.model.feed_files import save_feeds
from trtfuse.model.feeds import StepFeed, default_feeds
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.verify.interface import check_original_unfused
from trtfuse.verify.onnxrt import Notify, quiet
from trtfuse.verify.tolerances import Tolerance
from trtfuse.verify.verdict import CheckResult, judge_lowered


def step_feeds(
    original: LoadedModel,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None,
    dims: Mapping[str, int] | None,
    feeds: Sequence[StepFeed] | None = None,
    save_inputs: Path | None = None,
) -> Sequence[StepFeed]:
    """The feeds a check or comparison runs: `feeds` as given, else the original's `default_feeds`; written to
    `save_inputs` first when asked (removed again if the call fails later)."""
    if feeds is None:
        feeds = default_feeds(original.model, seed, shapes=shapes, dims=dims)
    if save_inputs is not None:
        with Transaction():
            save_feeds(save_inputs, feeds)
    return feeds


def check_fused(
    original: LoadedModel,
    fused: LoadedModel,
    seed: int = 0,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    *,
    tolerance: Tolerance | None = None,
    feeds: Sequence[StepFeed] | None = None,
    inputs_file: Path | None = None,
    save_inputs: Path | None = None,
    notify: Notify = quiet,
) -> CheckResult:
    """Judge `fused`, its plugin nodes lowered to standard ops, against `original` at each of `step_feeds`
    (`inputs_file` names where given feeds came from); `notify` hears which model loads and which step runs. A fused
    original is refused before any feed is saved."""
    check_original_unfused(original)
    feeds = step_feeds(original, seed, shapes, dims, feeds, save_inputs)
    return judge_lowered(original, fused, feeds, None if inputs_file else seed, inputs_file, tolerance, notify)
