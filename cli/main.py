"""The `trtfuse` command group; every command module adds its commands here."""

from __future__ import annotations

import click

from cli.bench_commands import bench
from cli.engine_commands import compare_command, compile_command, run_command
from cli.fuse_commands import check, fuse, inspect
from cli.options import EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY
from trtfuse import __version__
from trtfuse.errors import MissingDependencyError, TrtfuseError


class TrtfuseGroup(click.Group):
    """Turns a `TrtfuseError` from any command into one line on stderr, never a traceback: exit status 3 for a
    missing optional dependency, 2 for anything wrong with the input."""

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except MissingDependencyError as error:
            message = " ".join(str(error).split("\n"))
            click.secho(f"trtfuse: {message}", fg="yellow", err=True)
            ctx.exit(EXIT_MISSING_DEPENDENCY)
        except TrtfuseError as error:
            message = " ".join(str(error).split("\n"))
            click.secho(f"trtfuse: error: {message}", fg="red", err=True)
            ctx.exit(EXIT_BAD_INPUT)


@click.group(cls=TrtfuseGroup)
@click.version_option(__version__, prog_name="trtfuse")
def cli() -> None:
    """Fuse the RMSNorms and QK-norms of an ONNX LLM into CuTeDSL-backed TensorRT plugin nodes."""


cli.add_command(inspect)
cli.add_command(fuse)
cli.add_command(check)
cli.add_command(compile_command)
cli.add_command(run_command)
cli.add_command(compare_command)
cli.add_command(bench)


def main() -> None:
    cli(prog_name="trtfuse")


if __name__ == "__main__":
    main()
