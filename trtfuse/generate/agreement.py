"""Two greedy generations from one prompt, judged: `check ORIGINAL FUSED --generate N` and `compare ORIGINAL ENGINE
--generate N`.

They pass when the token sequences are equal. Where they first differ, the original's top-2 logit margin at that
step says whether it was a near tie: `check` passes a logits output whose every element is within the dtype's
tolerance of the original's (rtol times the largest |logit|, `verify.tolerances`), and two logits each moved that far
can swap when their gap is up to twice that. A divergence at such a margin is reported as a near tie and passes (for
any dtype: fp32's tolerance is small enough that it only covers exact ties).

In a graph with activation quantizers a rounding difference is not all a correct fusion makes: a value within the
tolerance of a quantizer's rounding boundary lands one quantization step off (FP8: 6-12% of the value), which moves
the logits far more than rtol. There a divergence beyond a near tie is judged by measuring that shift: the original
runs along its own first K-1 tokens (K the divergence step) with the input of every activation quantizer nudged by
+rtol and by -rtol (`verify.quantizer_flips`), which flips every quantized value within the tolerance of a boundary,
and the candidate runs along the same tokens. It passes when at every step up to K the candidate's logits are within
`FLIP_MARGIN` x (rtol x max |logit| + the nudged runs' largest logit change) of the original's. Any other divergence
fails. After the first divergence the two sequences continue from different contexts, so nothing after it is
compared.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.session import ENGINE_RUNNER, engine_steps
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.generate.interface import GenerationInterface, generation_interface
from trtfuse.generate.loop import Generation, default_prompt, greedy_generate, logits_along
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
from trtfuse.verify.onnxrt import (
    CpuSession,
    Notify,
    StepFunction,
    loading_line,
    lowered_session,
    original_session,
    quiet,
)
from trtfuse.verify.quantizer_flips import DIRECTIONS, nudged_session, nudged_step
from trtfuse.verify.tolerances import output_error, tolerance_for
from trtfuse.verify.verdict import LOWERED_NAME, computed_dtypes

# Each of the two top logits may move by the tolerance, so their gap by twice it.
NEAR_TIE_FACTOR = 2.0
# Measured on ModelOpt exports (the FP8 KV fixture, 12 prompts; llama, qwen3 and gemma3 FP8 and OLMo2 INT8-fp16,
# logits only, 6 prompts each; llama FP8 and gemma3 INT8-fp16 with KV cache, 8 each; every step of 16 fed the
# original's tokens): a correct fusion's logits are at most 1.29 times the shift (rtol x max |logit| + the nudged
# runs' change) from the original's, 1.19 at a divergence; a final norm's weight ramped from 0.5 to 1.5 is 1.45-7.6
# times it at its divergence. A mixture of experts' routing (TopK) is a choice no nudge flips (docs/cli.md).
FLIP_MARGIN = 1.5
# How progress lines name the nudged original.
NUDGED_NAME = "the original with its quantizer inputs nudged"


@dataclass(frozen=True)
class FlipShift:
    """One step (from 1) up to a divergence in a quantized graph, both models fed the original's tokens: how far the
    original's logits move with its quantizer inputs nudged by +-rtol (`quantizer`, the larger change of the two
    runs), the rounding allowance rtol x max |logit| (`rounding`), and how far the candidate's logits are from the
    original's (`candidate`); all max abs over the vocabulary."""

    step: int
    quantizer: float
    rounding: float
    candidate: float

    @property
    def bound(self) -> float:
        return FLIP_MARGIN * (self.rounding + self.quantizer)

    @property
    def passed(self) -> bool:
        return self.candidate <= self.bound

    @property
    def share(self) -> float:
        """The candidate's distance as a share of the bound: the step judged is the one where it is largest."""
        return self.candidate / self.bound if self.bound > 0.0 else math.inf

    def to_json(self) -> dict:
        return {
            "step": self.step,
            "quantizer_shift": self.quantizer,
            "rounding": self.rounding,
            "candidate_shift": self.candidate,
            "margin_factor": FLIP_MARGIN,
            "bound": self.bound,
            "passed": self.passed,
        }

    def text(self) -> str:
        """The step judged with its numbers: the candidate's distance against the bound, the bound's two parts."""
        relation = "<=" if self.passed else ">"
        return (
            f"at step {self.step}: {self.candidate:.3g} {relation} {FLIP_MARGIN:g} x (rounding {self.rounding:.3g} + "
            f"quantizer flips {self.quantizer:.3g}) = {self.bound:.3g}"
        )


@dataclass(frozen=True)
class Divergence:
    """The first step (from 1) where the tokens differ, with the original's top-2 margin there and the near-tie
    bound it is judged by (`NEAR_TIE_FACTOR` x rtol x the largest |logit|); in a quantized graph, beyond a near tie,
    the step up to it where the candidate comes closest to the quantizer flips' bound (`flips`)."""

    step: int
    original_token: int
    candidate_token: int
    margin: float
    scale: float
    rtol: float
    flips: FlipShift | None = None

    @property
    def bound(self) -> float:
        return NEAR_TIE_FACTOR * self.rtol * self.scale

    @property
    def near_tie(self) -> bool:
        return bool(np.isfinite(self.margin)) and self.margin <= self.bound

    @property
    def passed(self) -> bool:
        return self.near_tie or (self.flips is not None and self.flips.passed)

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
            "quantizer_flips": None if self.flips is None else self.flips.to_json(),
            "passed": self.passed,
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
        return self.divergence is None or self.divergence.passed

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
            "quantizer_flip_rule": (
                f"in a quantized graph: max |candidate - original logit| <= {FLIP_MARGIN:g} x (rtol x max |logit| "
                "+ the original's max logit change with its quantizer inputs nudged by +-rtol), at every step up to "
                "the divergence"
            ),
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
        if self.divergence.near_tie:
            return f"the generated tokens agree up to a near tie at step {self.divergence.step}"
        return f"the generated tokens agree up to quantizer flips at step {self.divergence.step}"

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
        if divergence.flips is None:
            return f"{where}, more than a near tie (> {rule})"
        flips = divergence.flips.text()
        checked = (
            "fed the original's tokens up to there, the candidate's logits are compared with the original's at each "
            f"step against {FLIP_MARGIN:g} x (the rounding allowance rtol x max |logit| + how far the original's own "
            "logits move with every quantizer input nudged by +-rtol)"
        )
        if divergence.flips.passed:
            return (
                f"{where}, more than a near tie (> {rule}). Expected in a quantized graph: a value within rounding of "
                "a quantizer's boundary lands one step off, which moves the logits further. Checked: "
                f"{checked}; they stay within it (closest {flips}): passes, the tokens before it are equal"
            )
        return (
            f"{where}, more than a near tie (> {rule}), and more than quantizer flips explain: {checked}; they go past "
            f"it {flips}"
        )


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


def check_engine_generation(original: LoadedModel, engine_path: Path, request: GenerationRequest) -> None:
    """`generation_request`'s checks and the engine's profiles holding every step, refused in one line before
    TensorRT is needed (`compare` calls this before its steps, which need TensorRT)."""
    _engine_generation_request(original, EngineFile.open(engine_path), request)


def _engine_generation_request(
    original: LoadedModel, engine: EngineFile, request: GenerationRequest
) -> tuple[GenerationInterface, list[int], bool, list[str]]:
    interface, chosen, use_cache, notes = generation_request(original, request)
    check_engine_holds(engine, interface, len(chosen), request.steps, use_cache)
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
    candidate = functools.partial(_cpu_steps, lowered, heard)
    with candidate() as run:
        actual = _generated(run, LOWERED_NAME, interface, chosen, steps, use_cache, heard)
    notes = [note, *notes] if note else notes
    runners = (runner_name(runner, lowered=False), runner_name(lowered, lowered=True))
    verdict = judge_generations(expected, actual, logits_dtype(original, interface), runners, notes)
    flips = _FlipRuns(original, runner.evaluator, interface, use_cache, heard)
    return flips.judged(verdict, LOWERED_NAME, candidate)


def compare_generation(
    original: LoadedModel, engine_path: Path, request: GenerationRequest, notify: Notify = quiet
) -> GenerationVerdict:
    """Greedy generation on the original (CPU) and on the engine (TensorRT, each step in the profile that holds
    it), as `request` asks, judged by `judge_generations`; the engine's profiles are checked to hold every step
    first. The original is released before the engine loads; `notify` hears each load and token."""
    engine = EngineFile.open(engine_path)
    interface, chosen, use_cache, notes = _engine_generation_request(original, engine, request)
    steps = request.steps
    import_tensorrt()
    heard = _generation_lines(notify)
    runner, note = original_session(original, heard)
    with runner:
        expected = _generated(runner.run, "the original", interface, chosen, steps, use_cache, heard)
    candidate = functools.partial(engine_steps, engine, heard)
    with candidate() as run:
        actual = _generated(run, "the engine", interface, chosen, steps, use_cache, heard)
    notes = [note, *notes] if note else notes
    dtype = logits_dtype(original, interface)
    verdict = judge_generations(expected, actual, dtype, (runner_name(runner, lowered=False), ENGINE_RUNNER), notes)
    flips = _FlipRuns(original, runner.evaluator, interface, use_cache, heard)
    return flips.judged(verdict, "the engine", candidate)


@contextlib.contextmanager
def _cpu_steps(session: CpuSession, notify: Notify) -> Iterator[StepFunction]:
    """The lowered fused model's step function, loaded for the block and released after it."""
    notify(loading_line(LOWERED_NAME, session))
    with session:
        yield session.run


CandidateSteps = Callable[[], contextlib.AbstractContextManager[StepFunction]]


@dataclass(frozen=True)
class _FlipRuns:
    """The runs that measure quantizer flips up to a divergence (`FlipShift`): the original, nudged as
    `verify.quantizer_flips` says in each of its `DIRECTIONS`, then the candidate, every one fed the original's
    tokens; one session alive at a time."""

    original: LoadedModel
    evaluator: bool
    interface: GenerationInterface
    use_cache: bool
    notify: Notify

    def judged(self, verdict: GenerationVerdict, candidate_name: str, candidate: CandidateSteps) -> GenerationVerdict:
        """`verdict`, where it diverged beyond a near tie in a graph with activation quantizers, with the step up to
        the divergence where the candidate comes nearest the flips' bound or goes furthest past it; else as it
        is."""
        divergence = verdict.divergence
        if divergence is None or divergence.near_tie:
            return verdict
        session = nudged_session(self.original, self.evaluator)
        if session is None:
            return verdict
        tokens = verdict.original.tokens[: divergence.step - 1]
        self.notify(loading_line(NUDGED_NAME, session))
        with session:
            reference = self._along(nudged_step(session, DIRECTIONS[0]), verdict, tokens, _NUDGE_NAMES[0])
            quantizer = [0.0] * len(reference)
            for direction in DIRECTIONS[1:]:
                rows = self._along(nudged_step(session, direction), verdict, tokens, _NUDGE_NAMES[direction])
                changes = zip(quantizer, rows, reference, strict=True)
                quantizer = [max(shift, _distance(row, base)) for shift, row, base in changes]
        with candidate() as run:
            rows = self._along(run, verdict, tokens, candidate_name)
        shifts = [
            FlipShift(index + 1, shift, divergence.rtol * _largest(base), _distance(row, base))
            for index, (shift, row, base) in enumerate(zip(quantizer, rows, reference, strict=True))
        ]
        return replace(verdict, divergence=replace(divergence, flips=max(shifts, key=lambda shift: shift.share)))

    def _along(
        self, run: StepFunction, verdict: GenerationVerdict, tokens: Sequence[int], name: str
    ) -> list[np.ndarray]:
        heard = self.notify
        return logits_along(
            run,
            self.interface,
            verdict.original.prompt,
            tokens,
            use_cache=self.use_cache,
            notify=lambda line: heard(f"{name}: {line}"),
        )


_NUDGE_NAMES = {
    0.0: "the original, not nudged",
    1.0: "the original, its quantizer inputs nudged by +rtol",
    -1.0: "the original, its quantizer inputs nudged by -rtol",
}


def _distance(row: np.ndarray, reference: np.ndarray) -> float:
    """The largest |difference| of two logits rows (inf where their shapes, NaNs or infinities differ)."""
    return output_error("logits", row, reference).max_abs


def _largest(row: np.ndarray) -> float:
    values = np.abs(np.asarray(row, dtype=np.float64))
    return float(values[np.isfinite(values)].max(initial=0.0))


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
