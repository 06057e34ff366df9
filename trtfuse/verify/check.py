"""`trtfuse check`: a fused model against its original, both run on the CPU (`verify.onnxrt`), judged by
`verify.verdict`.

Each step's feed (a prefill and a decode step on KV-cache models, `model.feeds.default_feeds`) goes to the original
twice, to the lowered fused model once and, for 16-bit and quantized graphs, to a float32 evaluation of the original
graph (`verify.widening`): each model runs every step in turn, one onnxruntime session alive at a time. `trtfuse
compare` runs the same steps with a TensorRT engine as the candidate.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trtfuse.files import Transaction
from trtfuse.model.feed_files import save_feeds
from trtfuse.model.feeds import StepFeed, default_feeds
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.verify.interface import check_original_unfused
from trtfuse.verify.onnxrt import Notify, quiet
from trtfuse.verify.tolerances import Tolerance
from trtfuse.verify.verdict import CheckResult, judge_lowered


@dataclass(frozen=True)
class CheckInputs:
    """What a check or comparison runs and how it judges: `feeds` as given (`inputs_file` names where they came
    from), else the original's `default_feeds` from `seed`, `shapes` and `dims`; written to `save_inputs` first when
    asked; judged within `tolerance` where given, else by the default verdict."""

    seed: int = 0
    shapes: Mapping[str, Sequence[int]] | None = None
    dims: Mapping[str, int] | None = None
    tolerance: Tolerance | None = None
    feeds: Sequence[StepFeed] | None = None
    inputs_file: Path | None = None
    save_inputs: Path | None = None

    @property
    def step_seed(self) -> int | None:
        """The seed the steps report: none for feeds from a file, which the file names instead."""
        return None if self.inputs_file else self.seed

    def step_feeds(self, original: LoadedModel) -> Sequence[StepFeed]:
        """The feeds the steps run on `original`, saved first when asked (removed again if the call fails later)."""
        feeds = self.feeds
        if feeds is None:
            feeds = default_feeds(original.model, self.seed, shapes=self.shapes, dims=self.dims)
        if self.save_inputs is not None:
            with Transaction():
                save_feeds(self.save_inputs, feeds)
        return feeds


def check_fused(
    original: LoadedModel, fused: LoadedModel, inputs: CheckInputs | None = None, *, notify: Notify = quiet
) -> CheckResult:
    """Judge `fused`, its plugin nodes lowered to standard ops, against `original` at each step of `inputs` (by
    default the original's default feeds from seed 0); `notify` hears which model loads and which step runs. A fused
    original is refused before any feed is saved."""
    inputs = inputs or CheckInputs()
    check_original_unfused(original)
    feeds = inputs.step_feeds(original)
    return judge_lowered(original, fused, feeds, inputs.step_seed, inputs.inputs_file, inputs.tolerance, notify)
