"""`trtfuse check`: a fused model against its original, both run on the CPU (`trtfuse.onnxrt`), judged by
`trtfuse.verdict`.

Each step's feed (a prefill and a decode step on KV-cache models, `trtfuse.inputs.default_feeds`) goes to the original
twice, to the lowered fused model once and, for 16-bit and quantized graphs, to a float32 evaluation of the original
graph (`trtfuse.widening`). `trtfuse compare` runs the same `verdict.judge_lowered`, or `verdict.judge_steps` with a
TensorRT engine as the candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from trtfuse.inputs import StepFeed, default_feeds
from trtfuse.model_io import LoadedModel
from trtfuse.outputs import Transaction
from trtfuse.saved_inputs import save_feeds
from trtfuse.tolerances import Tolerance
from trtfuse.verdict import CheckResult, judge_lowered


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
) -> CheckResult:
    """Judge `fused`, its plugin nodes lowered to standard ops, against `original` at each of `feeds` (by default
    `default_feeds` of the original with `seed`, `shapes` and `dims`; `inputs_file` names where given feeds came from),
    the feeds saved to `save_inputs` first when asked.
    """
    if feeds is None:
        feeds = default_feeds(original.model, seed, shapes=shapes, dims=dims)
    if save_inputs is not None:
        with Transaction():
            save_feeds(save_inputs, feeds)
    return judge_lowered(original, fused, feeds, None if inputs_file else seed, inputs_file, tolerance)
