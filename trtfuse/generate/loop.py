"""The greedy loop: feed the prompt, take the argmax of the last position's logits, feed it back with the cache the
step returned (`present.N.*` -> `past_key_values.N.*`), and so on; or, without a cache, run the whole sequence at
every step. The loop takes any step function (feed -> outputs), so a model on the CPU and an engine run the same one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from trtfuse.errors import TrtfuseError
from trtfuse.generate.interface import GenerationInterface
from trtfuse.model.feeds import check_seed
from trtfuse.verify.onnxrt import Notify, StepFunction, quiet

# The default prompt's length, when the caller gives none.
DEFAULT_PROMPT_LENGTH = 5
# The least time between two "token k of N" lines but the first and the last: a line per token would be a thousand
# lines for 1000 steps, most of them within one second (Polygraphy's own progress lines keep a second apart).
PROGRESS_INTERVAL_S = 1.0


@dataclass(frozen=True)
class StepRecord:
    """One step: the token chosen, how long the step function took, and the top-2 logit margin it was chosen by
    (`scale`: the largest |logit| of that position, the unit the margin is judged in)."""

    token: int
    seconds: float
    margin: float
    scale: float
    finite: bool = True


@dataclass(frozen=True)
class Generation:
    """The prompt, one record per generated token, and whether the cache was fed back (else: recompute mode).
    `timings` holds every run's step times where the generation was repeated (`repeated`), else the one run's."""

    prompt: tuple[int, ...]
    steps: tuple[StepRecord, ...]
    cache: bool
    timings: tuple[tuple[float, ...], ...] = ()

    @property
    def tokens(self) -> list[int]:
        return [step.token for step in self.steps]

    @property
    def runs(self) -> tuple[tuple[float, ...], ...]:
        return self.timings or (tuple(step.seconds for step in self.steps),)

    @property
    def first_token_ms(self) -> float:
        """The first step's time (the prompt's prefill and the first token), the median over the runs."""
        return statistics.median(run[0] for run in self.runs) * 1e3

    @property
    def per_token_ms(self) -> float | None:
        """The median time of every later step of every run; None when there is only one step."""
        later = [seconds for run in self.runs for seconds in run[1:]]
        return statistics.median(later) * 1e3 if later else None

    def to_json(self) -> dict:
        return {
            "prompt": list(self.prompt),
            "tokens": self.tokens,
            "steps": len(self.steps),
            "cache": self.cache,
            "first_token_ms": self.first_token_ms,
            "per_token_ms": self.per_token_ms,
            "runs": len(self.runs),
            "step_ms": [step.seconds * 1e3 for step in self.steps],
            "non_finite_steps": [index + 1 for index, step in enumerate(self.steps) if not step.finite],
        }


class ThrottledNotify:
    """Passes a progress line on to `notify` when it is the first, the last, or `interval` seconds of `clock` after
    the last one passed on; the others are dropped."""

    def __init__(self, notify: Notify, clock: Callable[[], float], interval: float = PROGRESS_INTERVAL_S) -> None:
        self._notify = notify
        self._clock = clock
        self._interval = interval
        self._shown: float | None = None

    def __call__(self, line: str, last: bool = False) -> None:
        now = self._clock()
        if self._shown is not None and not last and now - self._shown < self._interval:
            return
        self._shown = now
        self._notify(line)


def default_prompt(interface: GenerationInterface, seed: int, length: int = DEFAULT_PROMPT_LENGTH) -> list[int]:
    """A few token ids inside the model's vocabulary, drawn from `seed` (ids below 2 where the size is unknown)."""
    check_seed(seed)
    size = interface.vocabulary.value if interface.vocabulary is not None else 2
    return [int(token) for token in np.random.default_rng(seed).integers(0, max(size, 1), size=length)]


def greedy_generate(
    run: StepFunction,
    interface: GenerationInterface,
    prompt: Sequence[int],
    steps: int,
    *,
    use_cache: bool = True,
    warm_up: bool = False,
    clock: Callable[[], float] = time.perf_counter,
    notify: Notify = quiet,
    follow: Sequence[int] = (),
) -> Generation:
    """`steps` greedy tokens after `prompt`, each step timed around `run`; the request is checked first (one line
    for an empty prompt, an id outside the vocabulary, too many positions, a model it cannot drive). `warm_up` runs
    the first step once untimed before: a runtime's first run allocates and initialises, which is no latency of the
    model's. `notify` hears "token k of N" before the first step, the last, and others at most once a second of
    `clock` (`ThrottledNotify`), which also times the steps. `follow` (another generation's tokens) is fed after the
    first len(follow) steps in place of the model's own choices, which the records still hold."""
    prompt = [int(token) for token in prompt]
    interface.check_drivable(use_cache)
    interface.check_prompt(prompt, steps, use_cache)
    records = []
    sequence = list(prompt)
    cache: dict[str, np.ndarray] | None = None
    progress = ThrottledNotify(notify, clock)
    if warm_up:
        run(interface.feed(prompt, 0))
    for index in range(steps):
        if use_cache:
            fed = prompt if index == 0 else sequence[-1:]
            past = len(sequence) - len(fed)
        else:
            fed, past = sequence, 0
        feed = interface.feed(fed, past, cache)
        progress(f"token {index + 1} of {steps}", last=index == steps - 1)
        start = clock()
        outputs = run(feed)
        seconds = clock() - start
        record = _choose(outputs, interface, index)
        records.append(StepRecord(record[0], seconds, *record[1:]))
        sequence.append(follow[index] if index < len(follow) else record[0])
        if use_cache:
            cache = {
                pair.past: np.asarray(outputs[pair.present]).astype(interface.dtypes[pair.past], copy=False)
                for pair in interface.caches
            }
    return Generation(prompt=tuple(prompt), steps=tuple(records), cache=use_cache)


def repeated(generate: Callable[[], Generation], runs: int) -> Generation:
    """`generate` run `runs` times: the first run's tokens, every run's step times (the medians are over all of
    them). Greedy generation is deterministic; a run whose tokens differ from the first is an error."""
    first = generate()
    timings = [tuple(step.seconds for step in first.steps)]
    for _ in range(runs - 1):
        again = generate()
        if again.tokens != first.tokens:
            raise TrtfuseError(f"two runs of the same generation gave different tokens: {first.tokens}, {again.tokens}")
        timings.append(tuple(step.seconds for step in again.steps))
    return Generation(first.prompt, first.steps, first.cache, tuple(timings))


def logits_along(
    run: StepFunction,
    interface: GenerationInterface,
    prompt: Sequence[int],
    tokens: Sequence[int],
    *,
    use_cache: bool = True,
    notify: Notify = quiet,
) -> list[np.ndarray]:
    """The last position's logits at each of the len(tokens) + 1 steps of a generation from `prompt` that feeds
    `tokens` (`greedy_generate`'s `follow`), whatever the model would choose: a model's logits along another's
    generation."""
    rows = []

    def kept(feed: Mapping[str, np.ndarray]) -> Mapping[str, np.ndarray]:
        outputs = run(feed)
        rows.append(np.array(_last_logits(outputs, interface, len(rows))))
        return outputs

    greedy_generate(kept, interface, prompt, len(tokens) + 1, use_cache=use_cache, notify=notify, follow=tokens)
    return rows


def _last_logits(outputs: Mapping[str, np.ndarray], interface: GenerationInterface, index: int) -> np.ndarray:
    """The last position's logits of the first batch row at step `index` (from 0), as computed."""
    missing = [name for name in (interface.logits, *(p.present for p in interface.caches)) if name not in outputs]
    if missing:
        raise TrtfuseError(f"{interface.source}: step {index + 1} returned no {missing[0]!r}")
    logits = np.asarray(outputs[interface.logits])
    if logits.ndim not in (2, 3) or logits.shape[0] < 1 or logits.shape[-1] < 1:
        raise TrtfuseError(
            f"{interface.source}: logits of shape {'x'.join(map(str, logits.shape))} at step {index + 1}; expected "
            "batch x tokens x vocabulary"
        )
    return logits[0, -1] if logits.ndim == 3 else logits[0]


def _choose(
    outputs: Mapping[str, np.ndarray], interface: GenerationInterface, index: int
) -> tuple[int, float, float, bool]:
    """The argmax of the last position's logits, the top-2 margin, the scale, and whether the logits are finite."""
    row = _last_logits(outputs, interface, index).astype(np.float64)
    finite = bool(np.all(np.isfinite(row)))
    # NaN never wins: a model whose logits went NaN still yields a token, and a comparison fails on it.
    ranked = np.where(np.isnan(row), -np.inf, row)
    token = int(np.argmax(ranked))
    if row.size < 2:
        return token, float("inf"), float(np.abs(ranked[token])), finite
    top_two = np.partition(ranked, -2)[-2:]
    magnitude = np.abs(ranked[np.isfinite(ranked)])
    scale = float(magnitude.max()) if magnitude.size else 0.0
    return token, float(top_two[1] - top_two[0]), scale, finite
