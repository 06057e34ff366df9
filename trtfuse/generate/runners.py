"""The step functions generation runs, and `trtfuse generate`'s whole job but parsing and printing.

A model file runs on the CPU as `check` runs it (`verify.onnxrt`): an original as written, a fused model (one that
holds trtfuse nodes) with its plugin nodes lowered; onnx's reference evaluator where onnxruntime cannot load it. An
engine runs through `EngineSession`, which puts each feed in the optimisation profile that holds it: the prompt in
the prefill (or default) profile, each next token in the decode one. Its inputs and outputs are read off the fused
model its sidecar names.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from trtfuse.engine.engine_file import EngineFile, is_onnx_model_path
from trtfuse.engine.profiles import Profile
from trtfuse.engine.session import ENGINE_RUNNER, engine_steps
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.fusion.fused_nodes import plugin_node_counts
from trtfuse.generate.interface import GenerationInterface, generation_interface
from trtfuse.generate.loop import Generation, default_prompt, greedy_generate, repeated
from trtfuse.model.feeds import check_seed
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.onnxrt import CpuSession, Notify, loading_line, lowered_session, original_session, quiet
from trtfuse.verify.rotary_shapes import check_rotary_shapes
from trtfuse.verify.verdict import LOWERED_NAME

ORIGINAL_RUNNER = "onnxruntime"
EVALUATOR_RUNNER = "onnx-reference-evaluator"
LOWERED_SUFFIX = "-fused-lowered"
LOWERED_RUNNER = ORIGINAL_RUNNER + LOWERED_SUFFIX


@dataclass(frozen=True)
class GenerationRun:
    """What `trtfuse generate` ran and what came out; `notes` say where the run differs from the plain one."""

    model: Path
    runner: str
    generation: Generation
    notes: tuple[str, ...] = field(default_factory=tuple)

    def to_json(self) -> dict:
        return {"model": str(self.model), "runner": self.runner, **self.generation.to_json(), "notes": list(self.notes)}


def is_fused(model: LoadedModel) -> bool:
    """Whether the model holds trtfuse plugin nodes (they run lowered on the CPU)."""
    return any(plugin_node_counts(model.model).values())


def runner_name(session: CpuSession, lowered: bool) -> str:
    """What runs a model on the CPU, as reports name it: onnxruntime, or onnx's reference evaluator."""
    base = EVALUATOR_RUNNER if session.evaluator else ORIGINAL_RUNNER
    return f"{base}{LOWERED_SUFFIX}" if lowered else base


def cpu_session(model: LoadedModel, notify: Notify = quiet) -> tuple[CpuSession, str, str]:
    """The model on the CPU as `check` runs it, loaded, its runner's name, and a note where onnx's reference evaluator
    runs it because onnxruntime cannot load it; `notify` hears of each load."""
    if not is_fused(model):
        session, note = original_session(model, notify)
        return session, runner_name(session, lowered=False), note
    lowered, note = lowered_session(model, evaluator=False), ""
    notify(loading_line(LOWERED_NAME, lowered))
    try:
        lowered.load()
    except TrtfuseError as error:
        if lowered.evaluator:
            raise
        note = f"{error}; it runs in onnx's reference evaluator instead"
        lowered = CpuSession(lowered.model, evaluator=True)
        notify(loading_line(LOWERED_NAME, lowered))
        lowered.load()
    return lowered, runner_name(lowered, lowered=True), note


def generate_file(
    model_path: Path,
    steps: int,
    prompt: Sequence[int] | None = None,
    *,
    seed: int = 0,
    use_cache: bool = True,
    runs: int = 1,
    positions: int | None = None,
    warn: Callable[[str], None] | None = None,
    notify: Notify = quiet,
) -> GenerationRun:
    """Greedy generation on an ONNX file (original or fused) or an engine: `prompt` (None: `default_prompt` from
    `seed`), then `steps` tokens; `runs` times, the latencies the medians over all runs. `warn` hears, before the
    first step, that the steps go past the positions the model was trained for (its metadata's, or `positions`
    where given); `notify` hears the load and each token."""
    if runs < 1:
        raise OptionError("repeat", f"{runs} runs: generation runs at least once")
    check_seed(seed)
    if not is_onnx_model_path(model_path):
        return _generate_engine(model_path, steps, prompt, seed, use_cache, runs, positions, warn, notify)
    loaded = load_model(model_path)
    interface = generation_interface(loaded.model, str(model_path), positions)
    chosen = list(prompt) if prompt is not None else default_prompt(interface, seed)
    # The request is checked before the (slow) session is made.
    interface.check_drivable(use_cache)
    interface.check_prompt(chosen, steps, use_cache)
    _warn_positions(interface, len(chosen), steps, warn)
    if is_fused(loaded):
        # As `check` does: a rotary node whose inputs do not fit its layout is one line, not onnxruntime's error.
        steps_fed = [interface.feed_shapes(len(chosen), 0)]
        if use_cache and steps:
            steps_fed.append(interface.feed_shapes(1, len(chosen)))
        check_rotary_shapes(loaded, steps_fed)
    session, runner, note = cpu_session(loaded, notify)
    with session:
        generation = repeated(
            lambda: greedy_generate(
                session.run, interface, chosen, steps, use_cache=use_cache, warm_up=True, notify=notify
            ),
            runs,
        )
    notes = filter(None, [note, *run_notes(interface, use_cache)])
    return GenerationRun(model_path, runner, generation, tuple(notes))


def run_notes(interface: GenerationInterface, use_cache: bool) -> list[str]:
    """What a reader of the result should know about how the steps were fed."""
    if not use_cache:
        return ["recompute mode: every step runs the whole sequence, no cache fed back"]
    return list(interface.cast_notes)


def _warn_positions(
    interface: GenerationInterface, prompt_length: int, steps: int, warn: Callable[[str], None] | None
) -> None:
    line = interface.position_warning(prompt_length, steps)
    if line and warn is not None:
        warn(line)


def _generate_engine(
    engine_path: Path,
    steps: int,
    prompt: Sequence[int] | None,
    seed: int,
    use_cache: bool,
    runs: int,
    positions: int | None,
    warn: Callable[[str], None] | None,
    notify: Notify,
) -> GenerationRun:
    engine = EngineFile.open(engine_path)
    if engine.sidecar is None:
        raise TrtfuseError(
            f"{engine_path}: no sidecar beside the engine (written by trtfuse compile): generation reads the "
            "engine's inputs and profiles from it"
        )
    fused = load_model(engine.fused_model_path)
    interface = generation_interface(fused.model, str(engine_path), positions)
    chosen = list(prompt) if prompt is not None else default_prompt(interface, seed)
    interface.check_drivable(use_cache)
    interface.check_prompt(chosen, steps, use_cache)
    check_engine_holds(engine, interface, len(chosen), steps, use_cache)
    _warn_positions(interface, len(chosen), steps, warn)
    import_tensorrt()
    with engine_steps(engine, notify) as run:
        generation = repeated(
            lambda: greedy_generate(run, interface, chosen, steps, use_cache=use_cache, warm_up=True, notify=notify),
            runs,
        )
    return GenerationRun(engine_path, ENGINE_RUNNER, generation, tuple(run_notes(interface, use_cache)))


@dataclass(frozen=True)
class _StepRun:
    """Steps `first` to `first + count - 1` of a generation, each `shift` more tokens and `grow` more past than the
    one before: the prompt's step alone, then the decode steps (or, without a cache, every step)."""

    first: int
    count: int
    tokens: int
    past: int
    shift: int = 0
    grow: int = 0

    def at(self, offset: int) -> tuple[int, int]:
        return self.tokens + offset * self.shift, self.past + offset * self.grow


def _step_runs(prompt_length: int, steps: int, use_cache: bool) -> list[_StepRun]:
    if not use_cache:
        return [_StepRun(1, steps, prompt_length, 0, shift=1)]
    decode = [_StepRun(2, steps - 1, 1, prompt_length, grow=1)] if steps > 1 else []
    return [_StepRun(1, 1, prompt_length, 0), *decode]


def _held_offsets(profile: Profile, run: _StepRun, base: dict, slope: dict) -> tuple[int, int] | None:
    """The offsets into `run` whose shapes `profile` holds: each dim is affine in the offset (base + offset *
    slope), so each range bounds the offset on one side or both, and together they leave one interval or none."""
    low, high = 0, run.count - 1
    for name, ranges in profile.shapes.items():
        if name not in base:
            continue
        if len(base[name]) != len(ranges.min):
            return None
        for start, step, least, most in zip(base[name], slope[name], ranges.min, ranges.max, strict=True):
            if step == 0 and not least <= start <= most:
                return None
            if step != 0:
                # least <= start + offset * step <= most, solved for the offset (rounding inward).
                ends = sorted(((least - start) / step, (most - start) / step))
                low, high = max(low, math.ceil(ends[0])), min(high, math.floor(ends[1]))
    return (low, high) if low <= high else None


def _first_refused(profiles: Sequence[Profile], interface: GenerationInterface, run: _StepRun) -> int | None:
    """The first offset into `run` that no profile holds, or None: from one interval per profile, so the cost does
    not grow with the step count."""
    base = {name: np.array(shape) for name, shape in interface.feed_shapes(*run.at(0)).items()}
    after = interface.feed_shapes(*run.at(1))
    slope = {name: np.array(after[name]) - base[name] for name in base}
    intervals = sorted(filter(None, (_held_offsets(profile, run, base, slope) for profile in profiles)))
    offset = 0
    for low, high in intervals:
        if low > offset:
            break
        offset = max(offset, high + 1)
    return offset if offset < run.count else None


def check_engine_holds(
    engine: EngineFile, interface: GenerationInterface, prompt_length: int, steps: int, use_cache: bool
) -> None:
    """Every step's shapes inside one of the engine's profiles, checked before it runs: one line naming the first
    step that fits none, with the profiles' ranges. The check solves for the steps each profile holds rather than
    walking them (a billion steps cost as little as two)."""
    profiles = engine.profiles
    if not profiles:
        return
    for run in _step_runs(prompt_length, steps, use_cache):
        offset = _first_refused(profiles, interface, run)
        if offset is None:
            continue
        tokens, past = run.at(offset)
        ranges = "; ".join(
            f"{profile.name}: " + ", ".join(f"{name} {shape}" for name, shape in profile.shapes.items())
            for profile in profiles
        )
        fed = f"{tokens} token{'s' if tokens != 1 else ''} after {past}"
        raise OptionError(
            "prompt-ids",
            f"{engine.path}: step {run.first + offset} ({fed}) fits none of the engine's optimisation profiles "
            f"({ranges}); build the engine with token and past ranges that hold a prompt of {prompt_length} ids and "
            f"{steps} steps, or shorten ",
            Choice("prompt-ids"),
            " or ask for fewer steps",
        )
