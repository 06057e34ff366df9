"""Two greedy generations from one prompt, judged: `check ORIGINAL FUSED --generate N` and `compare ORIGINAL ENGINE
--generate N`.

They pass when the token sequences are equal. Where they first differ, the original's top-2 logit margin at that
step says whether it was a near tie: `check` passes a logits output whose every element is within the dtype's
tolerance of the original's (rtol times the largest |logit|, `verify.tolerances`), and two logits each moved that far
can swap when their gap is up to twice that. A divergence at such a margin is reported as a near tie and passes (for
any dtype: fp32's tolerance is small enough that it only covers exact ties); any other divergence fails. After the
first divergence the two sequences continue from different contexts, so nothing after it is compared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.session import ENGINE_RUNNER, engine_steps
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.generate.interface import GenerationInterface, generation_interface
from trtfuse.generate.loop import Generation, default_prompt, greedy_generate
from trtfuse.generate.runners import (
    LOWERED_RUNNER,
    ORIGINAL_RUNNER,
    check_engine_holds,
    run_notes,
    runner_name,
)
from trtfuse.model.interface import elem_type_name
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.verify.interface import check_same_inputs
from trtfuse.verify.onnxrt import Notify, StepFunction, loading_line, lowered_session, original_session, quiet
from trtfuse.verify.tolerances import tolerance_for
from trtfuse.verify.verdict import LOWERED_NAME, computed_dtypes

# Each of the two top logits may move by the tolerance, so their gap by twice it.
NEAR_TIE_FACTOR = 2.0


@dataclass(frozen=True)
class Divergence:
    """The first step (from 1) where the tokens differ, with the original's top-2 margin there and the near-tie
    bound it is judged by (`NEAR_TIE_FACTOR` x rtol x the largest |logit|)."""

    step: int
    original_token: int
    candidate_token: int
    margin: float
    scale: float
    rtol: float

    @property
    def bound(self) -> float:
        return NEAR_TIE_FACTOR * self.rtol * self.scale

    @property
    def near_tie(self) -> bool:
        return bool(np.isfinite(self.margin)) and self.margin <= self.bound

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "original_token": self.original_token,
            "candidate_token": self.candidate_token,
            "margin": self.margin,
            "max_abs_logit": self.scale,
            "rtol": self.rtol,
            "bound": self.bound,
            "near_tie": self.near_tie,
        }


@dataclass(frozen=True)
class GenerationVerdict:
    """Both generations, the dtype the original computes its logits in, and where they diverged (None: nowhere)."""

    original: Generation
    candidate: Generation
    original_runner: str
    candidate_runner: str
    dtype: str
    divergence: Divergence | None
    non_finite_steps: tuple[int, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def passed(self) -> bool:
        if self.non_finite_steps:
            return False
        return self.divergence is None or self.divergence.near_tie

    @property
    def rtol(self) -> float:
        return tolerance_for(self.dtype).rtol

    def to_json(self) -> dict:
        return {
            "passed": self.passed,
            "prompt": list(self.original.prompt),
            "steps": len(self.original.steps),
            "cache": self.original.cache,
            "logits_dtype": self.dtype,
            "near_tie_rule": f"margin <= {NEAR_TIE_FACTOR:g} x rtol {self.rtol:g} x max |logit|",
            "runners": [self.original_runner, self.candidate_runner],
            "original_tokens": self.original.tokens,
            "candidate_tokens": self.candidate.tokens,
            "divergence": None if self.divergence is None else self.divergence.to_json(),
            "non_finite_steps": list(self.non_finite_steps),
            "notes": list(self.notes),
        }

    def agreement(self) -> str:
        """How the tokens agree, for a summary line: all of them, or up to a near tie."""
        if self.divergence is None:
            return f"the {len(self.original.steps)} generated tokens agree"
        return f"the generated tokens agree up to a near tie at step {self.divergence.step}"

    def verdict_line(self) -> str:
        steps = len(self.original.steps)
        if self.non_finite_steps:
            listed = ", ".join(map(str, self.non_finite_steps))
            return f"generation: the candidate's logits are NaN or infinite at step {listed}, the original's are not"
        divergence = self.divergence
        if divergence is None:
            return f"generation: all {steps} tokens equal"
        rule = (
            f"{NEAR_TIE_FACTOR:g} x {self.dtype}'s rtol {self.rtol:g} x max |logit| {divergence.scale:.3g} = "
            f"{divergence.bound:.3g}"
        )
        where = (
            f"generation: diverged at step {divergence.step} of {steps} (original {divergence.original_token}, "
            f"candidate {divergence.candidate_token}); the original's top-2 margin there is {divergence.margin:.3g}"
        )
        if divergence.near_tie:
            return f"{where}, a near tie (<= {rule}): passes, the tokens before it are equal"
        return f"{where}, more than a near tie (> {rule})"


def judge_generations(
    original: Generation,
    candidate: Generation,
    dtype: str,
    runners: tuple[str, str] = (ORIGINAL_RUNNER, LOWERED_RUNNER),
    notes: Sequence[str] = (),
) -> GenerationVerdict:
    """The verdict on two generations from the same prompt; `dtype` is the dtype the original's logits are computed
    in."""
    divergence = None
    rtol = tolerance_for(dtype).rtol
    for index, (expected, actual) in enumerate(zip(original.steps, candidate.steps, strict=True)):
        if expected.token != actual.token:
            divergence = Divergence(index + 1, expected.token, actual.token, expected.margin, expected.scale, rtol)
            break
    compared = original.steps if divergence is None else original.steps[: divergence.step]
    non_finite = tuple(
        index + 1
        for index, (expected, actual) in enumerate(zip(compared, candidate.steps, strict=False))
        if expected.finite and not actual.finite
    )
    return GenerationVerdict(original, candidate, *runners, dtype, divergence, non_finite, tuple(notes))


def logits_dtype(original: LoadedModel, interface: GenerationInterface) -> str:
    """The dtype of the computation that produces the original's logits (an fp16 model's `logits.float()` is
    float16's)."""
    computed = computed_dtypes(original.model).get(interface.logits or "")
    if computed:
        return computed
    output = next(value for value in original.model.graph.output if value.name == interface.logits)
    return elem_type_name(output.type.tensor_type.elem_type)


@dataclass(frozen=True)
class GenerationRequest:
    """`steps` tokens generated greedily from `prompt` (None: a few ids inside the vocabulary drawn from `seed`)."""

    steps: int
    prompt: Sequence[int] | None = None
    seed: int = 0


def generation_request(
    original: LoadedModel, request: GenerationRequest
) -> tuple[GenerationInterface, list[int], bool, list[str]]:
    """The original's interface, the prompt, whether the cache is fed back, and notes; checked before any run (a
    caller that runs other steps first, `check`'s, calls this before them too, so a refusal comes before any work).
    A model without a cache runs in recompute mode here: the comparison is about the tokens, not the speed."""
    interface = generation_interface(original.model, str(original.path))
    use_cache = interface.has_cache
    chosen = list(request.prompt) if request.prompt is not None else default_prompt(interface, request.seed)
    interface.check_drivable(use_cache)
    interface.check_prompt(chosen, request.steps, use_cache)
    notes = run_notes(interface, use_cache)
    if not use_cache:
        notes = ["no KV cache: " + notes[0]]
    return interface, chosen, use_cache, notes


def check_generation(
    original: LoadedModel, fused: LoadedModel, request: GenerationRequest, notify: Notify = quiet
) -> GenerationVerdict:
    """Greedy generation on the original and on the fused model (plugin nodes lowered), both on the CPU as `check`
    runs them, as `request` asks, judged by `judge_generations`. The original generates all its tokens and is
    released before the fused model loads; `notify` hears each load and token."""
    check_same_inputs(original, fused)
    interface, chosen, use_cache, notes = generation_request(original, request)
    steps = request.steps
    heard = _generation_lines(notify)
    runner, note = original_session(original, heard)
    with runner:
        expected = _generated(runner.run, "the original", interface, chosen, steps, use_cache, heard)
    lowered = lowered_session(fused, evaluator=runner.evaluator)
    heard(loading_line(LOWERED_NAME, lowered))
    with lowered:
        actual = _generated(lowered.run, LOWERED_NAME, interface, chosen, steps, use_cache, heard)
    notes = [note, *notes] if note else notes
    runners = (runner_name(runner, lowered=False), runner_name(lowered, lowered=True))
    return judge_generations(expected, actual, logits_dtype(original, interface), runners, notes)


def compare_generation(
    original: LoadedModel, engine_path: Path, request: GenerationRequest, notify: Notify = quiet
) -> GenerationVerdict:
    """Greedy generation on the original (CPU) and on the engine (TensorRT, each step in the profile that holds
    it), as `request` asks, judged by `judge_generations`; the engine's profiles are checked to hold every step
    first. The original is released before the engine loads; `notify` hears each load and token."""
    engine = EngineFile.open(engine_path)
    interface, chosen, use_cache, notes = generation_request(original, request)
    steps = request.steps
    check_engine_holds(engine, interface, len(chosen), steps, use_cache)
    import_tensorrt()
    heard = _generation_lines(notify)
    runner, note = original_session(original, heard)
    with runner:
        expected = _generated(runner.run, "the original", interface, chosen, steps, use_cache, heard)
    with engine_steps(engine, heard) as run:
        actual = _generated(run, "the engine", interface, chosen, steps, use_cache, heard)
    notes = [note, *notes] if note else notes
    dtype = logits_dtype(original, interface)
    return judge_generations(expected, actual, dtype, (runner_name(runner, lowered=False), ENGINE_RUNNER), notes)


def _generation_lines(notify: Notify) -> Notify:
    """`notify` with each line marked as the generation's (a check's steps say the same about the same models)."""
    return lambda line: notify(f"generation: {line}")


def _generated(
    run: StepFunction,
    name: str,
    interface: GenerationInterface,
    prompt: Sequence[int],
    steps: int,
    use_cache: bool,
    notify: Notify,
) -> Generation:
    return greedy_generate(
        run, interface, prompt, steps, use_cache=use_cache, notify=lambda line: notify(f"{name}: {line}")
    )
