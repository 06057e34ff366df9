"""`trtfuse generate`: it parses and prints; the loop and the runners are `trtfuse.generate`'s."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import click

from trtfuse.cli.check_report import PROMPT_IDS
from trtfuse.cli.options import (
    HELP_OPTIONS,
    MAX_POSITIONS,
    FilePath,
    IntegerType,
    common_options,
    echo_json,
    exit_missing,
    info,
    printable,
    summary,
    warning,
)
from trtfuse.errors import MissingDependencyError

if TYPE_CHECKING:
    from trtfuse.generate.runners import GenerationRun


@click.command("generate", context_settings=HELP_OPTIONS)
@click.argument("model_path", metavar="MODEL.onnx|MODEL.engine", type=FilePath())
@PROMPT_IDS
@click.option("--steps", default=16, show_default=True, type=IntegerType(minimum=1), help="Tokens to generate.")
@click.option("--seed", default=0, show_default=True, type=IntegerType(), help="Seed of the default prompt.")
@click.option(
    "--repeat",
    default=1,
    show_default=True,
    type=IntegerType(minimum=1),
    help="Run the whole generation this many times; the latencies are medians over every run.",
)
@click.option(
    "--no-cache",
    "no_cache",
    is_flag=True,
    help="Recompute mode, for models without a KV cache: every step runs the whole sequence.",
)
@MAX_POSITIONS
@common_options
def generate_command(
    model_path: Path,
    prompt_ids: tuple[int, ...] | None,
    steps: int,
    seed: int,
    repeat: int,
    no_cache: bool,
    positions: int | None,
    as_json: bool,
) -> None:
    """Generate tokens greedily from a prompt with MODEL: an ONNX file on the CPU (a fused one with its plugin nodes
    lowered, as `trtfuse check` runs it) or an engine in TensorRT (the prompt in the profile that holds it, each next
    token in the decode profile). Prints the tokens and the first-token and per-token latency."""
    from trtfuse.generate.runners import generate_file

    try:
        run = generate_file(
            model_path,
            steps,
            prompt_ids,
            seed=seed,
            use_cache=not no_cache,
            runs=repeat,
            positions=positions,
            warn=warning,
            notify=info,
        )
    except MissingDependencyError as error:
        exit_missing(error, f"cannot generate with {model_path}", as_json)
    if as_json:
        echo_json(run.to_json())
        return
    _echo_run(run)


def _echo_run(run: GenerationRun) -> None:
    generation = run.generation
    mode = "KV cache" if generation.cache else "recompute mode"
    prompt = " ".join(map(str, generation.prompt))
    summary(f"{run.model} ({run.runner}, {mode}): prompt {prompt}", as_json=False)
    click.echo(printable("tokens: " + " ".join(map(str, generation.tokens))))
    runs = len(generation.runs)
    latency = f"first token {generation.first_token_ms:.3f} ms" + (f" (median of {runs} runs)" if runs > 1 else "")
    if generation.per_token_ms is not None:
        timed = runs * (len(generation.steps) - 1)
        latency += f", per token {generation.per_token_ms:.3f} ms (median of {timed} steps)"
    summary(latency, as_json=False)
    for note in run.notes:
        summary(f"note: {note}", as_json=False)
    for step in (index + 1 for index, record in enumerate(generation.steps) if not record.finite):
        summary(f"note: the logits at step {step} are NaN or infinite", as_json=False)
