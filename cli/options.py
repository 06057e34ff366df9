"""Options and output shared by the commands that feed a model random inputs and compare its outputs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import click

from trtfuse.tolerances import OutputError

EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
# A missing optional dependency (TensorRT, a GPU, CuTeDSL) is not the user's input's fault: a status of its own.
EXIT_MISSING_DEPENDENCY = 3

F = TypeVar("F", bound=Callable[..., object])


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=D0xD1x...` -> (NAME, (D0, D1, ...))."""
    name, _, dims = text.rpartition("=")
    try:
        shape = tuple(int(dim) for dim in dims.split("x"))
    except ValueError:
        shape = ()
    if not name or not shape or min(shape) < 0:
        raise click.BadParameter(f"'{text}' is not NAME=D0xD1x... (for example input_ids=1x16)")
    return name, shape


def parse_dim(text: str) -> tuple[str, int]:
    """`SYMBOL=N` -> (SYMBOL, N)."""
    name, _, value = text.rpartition("=")
    if not name or not value.isdigit():
        raise click.BadParameter(f"'{text}' is not SYMBOL=N (for example batch=2)")
    return name, int(value)


def feed_options(command: F) -> F:
    """--seed, --shape and --dim; the command receives `seed`, `shapes` (name -> shape) and `dims` (symbol -> int)."""
    options = (
        click.option("--seed", default=0, show_default=True, help="Seed of the random inputs."),
        click.option(
            "--shape",
            "shapes",
            multiple=True,
            metavar="NAME=D0xD1",
            callback=lambda _ctx, _param, values: dict(parse_shape(text) for text in values),
            help="Shape of one graph input; repeatable.",
        ),
        click.option(
            "--dim",
            "dims",
            multiple=True,
            metavar="SYMBOL=N",
            callback=lambda _ctx, _param, values: dict(parse_dim(text) for text in values),
            help="Value of one symbolic dim; repeatable.",
        ),
    )
    for option in reversed(options):
        command = option(command)
    return command


def echo_output_errors(errors: Sequence[OutputError]) -> None:
    """One table row per output; exit 1 when any output is beyond its dtype's tolerance."""
    width = max([len("output"), *(len(error.name) for error in errors)])
    click.echo(f"{'output':<{width}}  {'dtype':<8}  {'max abs':>9}  {'max rel':>9}  {'rtol':>7}  result")
    for error in errors:
        status = click.style("ok", fg="green") if error.passed else click.style("FAIL", fg="red")
        click.echo(
            f"{error.name:<{width}}  {error.dtype:<8}  {error.max_abs:9.3e}  {error.max_rel:9.3e}  "
            f"{error.tolerance.rtol:7.0e}  {status}"
        )
    failed = sum(not error.passed for error in errors)
    if failed:
        click.secho(f"{failed} of {len(errors)} outputs differ beyond tolerance", fg="red", err=True)
        raise SystemExit(EXIT_MISMATCH)
    click.echo(f"all {len(errors)} outputs within tolerance")
