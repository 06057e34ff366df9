"""The `trtfuse` command group; every command module adds its commands here."""

from __future__ import annotations

import signal
import sys
from collections.abc import Sequence

import click

from trtfuse import __version__
from trtfuse.cli.bench_commands import bench
from trtfuse.cli.deploy_commands import triton_config_command
from trtfuse.cli.engine_commands import compare_command, compile_command, run_command
from trtfuse.cli.fuse_commands import check, fuse, inspect
from trtfuse.cli.generate_commands import generate_command
from trtfuse.cli.options import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL_ERROR,
    EXIT_MISSING_DEPENDENCY,
    HELP_OPTIONS,
    VERBOSITY,
    printable,
)
from trtfuse.errors import Interrupted, MissingDependencyError, OptionError, TrtfuseError, first_line
from trtfuse.files import termination_as_exception

# The shell's convention for a process ended by a signal: 128 + its number.
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
# click 8.2 and later raise this for a group called without a command (8.1 prints the help itself).
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _error_line(message: str, colour: str = "red") -> None:
    click.secho(printable(" ".join(message.split("\n"))), fg=colour, err=True)


class TrtfuseGroup(click.Group):
    """Every way a command can end becomes an exit status and at most one line on stderr, never a traceback:
    3 for a missing optional dependency, 2 for bad input or usage, 130/143 for SIGINT/SIGTERM, 4 for a bug."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        # -h as well as --help on the group; each command sets the same for itself (options.HELP_OPTIONS).
        kwargs.setdefault("context_settings", {}).setdefault("help_option_names", HELP_OPTIONS["help_option_names"])
        super().__init__(*args, **kwargs)

    def main(
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: object,
    ) -> object:
        VERBOSITY.level = 0
        try:
            with termination_as_exception():
                status = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except MissingDependencyError as error:
            _error_line(f"trtfuse: {error}", "yellow")
            status = EXIT_MISSING_DEPENDENCY
        except OptionError as error:
            _error_line(f"trtfuse: error: {error.spelled(lambda name: f'--{name}')}")
            status = EXIT_BAD_INPUT
        except TrtfuseError as error:
            _error_line(f"trtfuse: error: {error}")
            status = EXIT_BAD_INPUT
        except _NO_ARGS_IS_HELP as error:
            # `trtfuse` or `trtfuse bench` alone: the help that -h gives, not an error.
            click.echo(error.ctx.get_help())
            status = 0
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx is not None else "trtfuse"
            _error_line(f"trtfuse: error: {error.format_message()} (see '{command} --help')")
            status = EXIT_BAD_INPUT
        except click.ClickException as error:
            _error_line(f"trtfuse: error: {error.format_message()}")
            status = error.exit_code
        except (click.Abort, KeyboardInterrupt):
            _error_line("trtfuse: interrupted")
            status = EXIT_SIGINT
        except Interrupted as error:
            _error_line(f"trtfuse: stopped by {error}")
            status = 128 + error.signal_number
        except Exception as error:
            _error_line(
                f"trtfuse: internal error: {type(error).__name__}: {first_line(error)} (a bug in trtfuse; please "
                "report it with the command line)"
            )
            status = EXIT_INTERNAL_ERROR
        if not standalone_mode:
            return status
        sys.exit(status if isinstance(status, int) else 0)

    def invoke(self, ctx: click.Context) -> object:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            # Raised past click, which would turn it into Abort after printing an empty line.
            raise Interrupted(signal.SIGINT) from None


@click.group(cls=TrtfuseGroup)
@click.version_option(__version__, "-V", "--version", prog_name="trtfuse")
def cli() -> None:
    """Fuse the RMSNorms and QK-norms of an ONNX LLM into CuTeDSL-backed TensorRT plugin nodes."""


cli.add_command(inspect)
cli.add_command(fuse)
cli.add_command(check)
cli.add_command(compile_command)
cli.add_command(run_command)
cli.add_command(compare_command)
cli.add_command(generate_command)
cli.add_command(triton_config_command)
cli.add_command(bench)


def main() -> None:
    cli(prog_name="trtfuse")


if __name__ == "__main__":
    main()
