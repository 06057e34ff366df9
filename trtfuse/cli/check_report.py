"""What `trtfuse check` and `trtfuse compare` share: their options (the feeds', the verdict's and --generate's, taken
as one CheckRequest), the inputs they run, and how they print."""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import click

from trtfuse.cli.options import (
    ASCII_INTEGER,
    EXIT_MISMATCH,
    VERBOSITY,
    FilePath,
    IntegerType,
    TextType,
    detail,
    echo_json,
    feed_options,
    printable,
)
from trtfuse.errors import TrtfuseError

if TYPE_CHECKING:
    import onnx

    from trtfuse.generate.agreement import GenerationRequest, GenerationVerdict
    from trtfuse.model.feeds import StepFeed
    from trtfuse.model.onnx_file import LoadedModel
    from trtfuse.verify.check import CheckInputs
    from trtfuse.verify.tolerances import Tolerance
    from trtfuse.verify.verdict import CheckResult, OutputVerdict, StepResult

F = TypeVar("F", bound=Callable[..., object])


def _non_negative(_ctx: click.Context, param: click.Parameter, value: float | None) -> float | None:
    if value is not None and not (math.isfinite(value) and value >= 0.0):
        raise click.BadParameter(f"{value} is not a finite non-negative number", param=param)
    return value


def verdict_options(command: F) -> F:
    """--rtol, --atol, --save-inputs and --load-inputs; the command receives `rtol`, `atol`, `save_inputs` and
    `load_inputs`."""
    options = (
        click.option(
            "--rtol",
            type=float,
            callback=_non_negative,
            help="Judge every float output by this max relative error to the original instead of the default verdict.",
        ),
        click.option(
            "--atol",
            type=float,
            callback=_non_negative,
            help="Judge every float output by this max abs error to the original (passes if either bound holds).",
        ),
        click.option(
            "--save-inputs",
            type=FilePath(),
            metavar="FILE.npz",
            help="Write the inputs of every step to FILE.npz.",
        ),
        click.option(
            "--load-inputs",
            type=FilePath(),
            metavar="FILE.npz",
            help="Run on the inputs in FILE.npz (from --save-inputs, or one array per input) instead of random ones.",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command


class PromptIdsType(TextType):
    """`1,2,3` (or `1 2 3`) -> (1, 2, 3); an empty string is an empty prompt, which the core refuses in its words."""

    name = "ID,ID,..."

    def parse(self, text: str) -> object:
        parts = [part for part in re.split(r"[,\s]+", text.strip()) if part]
        if not all(re.fullmatch(ASCII_INTEGER, part) for part in parts):
            self.fail(f"expected token ids separated by commas (e.g. 1,2,3), got {text!r}")
        return tuple(int(part) for part in parts)


PROMPT_IDS = click.option(
    "--prompt-ids",
    "prompt_ids",
    type=PromptIdsType(),
    help="The prompt's token ids, e.g. 1,2,3 [default: 5 ids inside the vocabulary, drawn from --seed].",
)


def generation_options(command: F) -> F:
    """--generate N and --prompt-ids; the command receives `generate_steps` and `prompt_ids`."""
    options = (
        click.option(
            "--generate",
            "generate_steps",
            type=IntegerType(minimum=1),
            metavar="N",
            help="Also generate N tokens greedily on both from the same prompt; fail if the tokens differ, except "
            "where they diverge at a near tie of the original's logits or, in a quantized graph, where quantizer "
            "flips explain it (docs/cli.md).",
        ),
        PROMPT_IDS,
    )
    for option in reversed(options):
        command = option(command)
    return command


def generation_lines(verdict: GenerationVerdict) -> list[str]:
    """The text `check --generate` and `compare --generate` print after their tables."""
    original, candidate = verdict.original, verdict.candidate
    prompt = " ".join(map(str, original.prompt))
    mode = "KV cache" if original.cache else "recompute"
    width = max(len(verdict.original_runner), len(verdict.candidate_runner))
    lines = [
        f"generation ({len(original.steps)} steps, {mode}, logits in {verdict.dtype}) from prompt {prompt}:",
        f"  {verdict.original_runner:<{width}}  {' '.join(map(str, original.tokens))}",
        f"  {verdict.candidate_runner:<{width}}  {' '.join(map(str, candidate.tokens))}",
        f"  {verdict.verdict_line()}",
    ]
    lines += [f"  note: {note}" for note in verdict.notes]
    return [printable(line) for line in lines]


def tolerance_from(rtol: float | None, atol: float | None) -> Tolerance | None:
    """The user's tolerance (an option not given is 0), or None for the default verdict."""
    from trtfuse.verify.tolerances import Tolerance

    if rtol is None and atol is None:
        return None
    return Tolerance(atol=atol or 0.0, rtol=rtol or 0.0)


@dataclass(frozen=True)
class CheckRequest:
    """What `check` and `compare` are asked: the feed options, the verdict's and --generate's (`generation`, None
    without it)."""

    seed: int
    shapes: dict[str, tuple[int, ...]]
    dims: dict[str, int]
    tolerance: Tolerance | None
    save_inputs: Path | None
    load_inputs: Path | None
    generation: GenerationRequest | None

    @property
    def reads(self) -> tuple[Path, ...]:
        """The files the options name for reading."""
        return (self.load_inputs,) if self.load_inputs else ()

    def inputs(self, original: LoadedModel) -> CheckInputs:
        """The check's inputs on `original`, with --load-inputs's steps loaded (its fixed sizes refuse --shape, --dim
        and --seed); --generate's request is checked here too, so that a refusal of either comes before any run."""
        from trtfuse.verify.check import CheckInputs

        feeds = None
        if self.load_inputs is not None:
            feeds = _loaded_feeds(original.model, self.load_inputs)
        if self.generation is not None:
            from trtfuse.generate.agreement import generation_request

            generation_request(original, self.generation)
        return CheckInputs(self.seed, self.shapes, self.dims, self.tolerance, feeds, self.load_inputs, self.save_inputs)


def check_options(command: F) -> F:
    """--seed/--shape/--dim, the verdict options and --generate/--prompt-ids, as `check` and `compare` take them; the
    command receives `request`, a CheckRequest."""

    @functools.wraps(command)
    def with_request(
        *args: object,
        seed: int,
        shapes: dict[str, tuple[int, ...]],
        dims: dict[str, int],
        rtol: float | None,
        atol: float | None,
        save_inputs: Path | None,
        load_inputs: Path | None,
        generate_steps: int | None,
        prompt_ids: tuple[int, ...] | None,
        **kwargs: object,
    ) -> object:
        from trtfuse.generate.agreement import GenerationRequest

        tolerance = tolerance_from(rtol, atol)
        generation = None if generate_steps is None else GenerationRequest(generate_steps, prompt_ids, seed)
        request = CheckRequest(seed, shapes, dims, tolerance, save_inputs, load_inputs, generation)
        return command(*args, request=request, **kwargs)

    return feed_options(verdict_options(generation_options(with_request)))  # type: ignore[return-value]


def _loaded_feeds(model: onnx.ModelProto, load_inputs: Path) -> list[StepFeed]:
    """The steps of --load-inputs; it fixes every size, so --shape/--dim/--seed conflict."""
    from trtfuse.model.feed_files import load_feeds

    ctx = click.get_current_context()
    flags = {"--shape": "shapes", "--dim": "dims", "--seed": "seed"}
    defaults = (None, click.core.ParameterSource.DEFAULT)
    given = [flag for flag, param in flags.items() if ctx.get_parameter_source(param) not in defaults]
    if given:
        raise TrtfuseError(f"--load-inputs {load_inputs} fixes the inputs; drop {', '.join(given)}")
    return load_feeds(load_inputs, model)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "x".join(map(str, shape)) or "scalar"


def echo_result(
    result: CheckResult,
    as_json: bool,
    extra_json: Mapping[str, object] | None = None,
    generation: GenerationVerdict | None = None,
) -> None:
    """A table per step, then the generation's tokens and verdict where `--generate` asked for one, then the verdict
    line on stdout, pass or fail (-q drops the tables, never the verdict); with --json, one JSON object instead,
    `passed` covering both. Exit 1 unless every step and the generation passed."""
    passed = result.passed and (generation is None or generation.passed)
    if as_json:
        both = {"passed": passed, "generation": generation.to_json()} if generation is not None else {}
        echo_json({**(extra_json or {}), **result.to_json(), **both})
    elif VERBOSITY.level >= 0:
        origin = f"inputs from {result.inputs_file}" if result.inputs_file else f"seed {result.seed}"
        for step in result.steps:
            _echo_step(step, origin)
        for name, note in result.unjudged_nodes:
            click.echo(printable(f"note: fused node '{name}': {note}"))
        for line in generation_lines(generation) if generation is not None else ():
            click.echo(line)
    if not as_json:
        click.secho(_verdict_line(result, generation), fg=None if passed else "red")
    if not passed:
        raise SystemExit(EXIT_MISMATCH)


def _verdict_line(result: CheckResult, generation: GenerationVerdict | None) -> str:
    if not result.passed:
        return _failure_line(result)
    if generation is not None and not generation.passed:
        return generation.verdict_line()
    judged = sum(len(step.judged) for step in result.steps)
    generated = f"; {generation.agreement()}" if generation is not None else ""
    return f"all {judged} outputs pass ({_judged_by_text(result)}){_unjudged_text(result)}{generated}"


def _unjudged_text(result: CheckResult) -> str:
    """What the verdict left out and why: outputs two runs of the original disagree on, and outputs (named, as -q
    prints no table) with no value to compare."""
    outputs = [output for step in result.steps for output in step.outputs if output.passed is None]
    left_out = sum(output.compared for output in outputs)
    uncompared = sorted({output.name for output in outputs if not output.compared})
    text = f", {left_out} left out (they differ between runs of the original)" if left_out else ""
    if uncompared:
        names = ", ".join(f"'{printable(name)}'" for name in uncompared)
        text += f", not compared: {names} (no tensor of real numbers, bools or strings)"
    return text


def _judged_by_text(result: CheckResult) -> str:
    from trtfuse.verify.tolerances import REFERENCE_MARGIN

    if result.judged_by == "tolerance":
        return "within tolerance of the original"
    return f"16-bit/quantized graph: error against a float32 evaluation at most {REFERENCE_MARGIN:g}x the original's"


def _failure_line(result: CheckResult) -> str:
    """The first fused node that fails where it stands, named with its numbers, and how many outputs fail; else why
    no output could be judged."""
    failed = sum(1 for step in result.steps for output in step.judged if not output.passed)
    failure = result.first_node_failure
    if failure is not None:
        step, node = failure
        nodes = len({node.node for step in result.steps for node in step.nodes if not node.passed})
        others = f"{nodes} fused node(s) and {failed} output(s) fail in all"
        return printable(
            f"fused node '{node.node}' fails at step {step}: output '{node.tensor}': {node.text()}; {others}"
        )
    empty = [step.name for step in result.steps if not step.judged]
    if empty and not failed:
        return f"no output could be judged at step {', '.join(empty)}: {_unjudged_text(result).removeprefix(', ')}"
    return f"{failed} output(s) fail"


def _echo_step(step: StepResult, origin: str) -> None:
    names = [printable(output.name) for output in step.outputs]
    width = max([len("output"), *(len(name) for name in names)])
    shapes = ", ".join(f"{name}={_shape_text(shape)}" for name, shape in step.input_shapes.items())
    click.echo(printable(f"step {step.name} ({origin}): {shapes}"))
    click.echo(
        f"  {'output':<{width}}  {'dtype':<17}  {'max abs':>9}  {'max rel':>9}  "
        f"{'orig err':>9}  {'fused err':>9}  {'limit':>9}  result"
    )
    for name, output in zip(names, step.outputs, strict=True):
        click.echo(f"  {name:<{width}}  {_row(output)}")
    _echo_nodes(step)
    for note in step.notes:
        click.echo(f"  note: {printable(note)}")
    detail(
        f"  step {step.name}: " + ", ".join(f"{what} {seconds * 1e3:.1f} ms" for what, seconds in step.seconds.items())
    )


def _echo_nodes(step: StepResult) -> None:
    """One line on the fused nodes where they stand, then each node output that fails (with -v each that passes, on
    stderr)."""
    if not step.nodes:
        return
    failed = [node for node in step.nodes if not node.passed]
    nodes = len({node.node for node in step.nodes})
    verdict = "all pass" if not failed else click.style(f"{len(failed)} FAIL", fg="red")
    click.echo(f"  fused nodes where they stand: {len(step.nodes)} outputs of {nodes} nodes, {verdict}")
    for node in step.nodes:
        line = f"    node '{node.node}' output '{node.tensor}': {node.text()}"
        if node.passed:
            detail(line)
        else:
            click.echo(f"{printable(line)}  {click.style('FAIL', fg='red')}")


def _row(output: OutputVerdict) -> str:
    dtype = output.dtype if output.computed_in == output.dtype else f"{output.dtype}<-{output.computed_in}"
    error, reference = output.error, output.reference
    max_abs = f"{error.max_abs:9.3e}" if error else f"{'-':>9}"
    max_rel = f"{error.max_rel:9.3e}" if error else f"{'-':>9}"
    if reference is not None:
        errors = f"{reference.original:9.3e}  {reference.candidate:9.3e}  {reference.bound:9.3e}"
    else:
        limit = f"{error.tolerance.rtol:9.0e}" if error else f"{'-':>9}"
        errors = f"{'-':>9}  {'-':>9}  {limit}"
    if output.passed is None:
        status = click.style("left out", fg="yellow")
    else:
        status = click.style("ok", fg="green") if output.passed else click.style("FAIL", fg="red")
    note = f"  ({printable(output.note)})" if output.note else ""
    return f"{dtype:<17}  {max_abs}  {max_rel}  {errors}  {status}{note}"
