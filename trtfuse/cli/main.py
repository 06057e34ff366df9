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
from trtfuse.cli.explain_commands import explain_command
from trtfuse.cli.fuse_commands import check, fuse, inspect
from trtfuse.cli.generate_commands import generate_command
from trtfuse.cli.options import (
    EXIT_BAD_INPUT,
    EXIT_INTERNAL_ERROR,
    EXIT_MISSING_DEPENDENCY,
    HELP_OPTIONS,
    JSON_OUTPUT,
    VERBOSITY,
    StdoutLost,
    echo_json,
    guarded_stdout,
    printable,
)
from trtfuse.errors import Interrupted, MissingDependencyError, OptionError, TrtfuseError, first_line
from trtfuse.files import Transaction, termination_as_exception

# The shell's convention for a process ended by a signal: 128 + its number.
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
# click 8.2 and later raise this for a group called without a command (8.1 prints the help itself).
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


def _error_line(message: str, colour: str = "red") -> None:
    click.secho(printable(" ".join(message.split("\n"))), fg=colour, err=True)


def _fail(message: str, status: int, as_json: bool, kind: str = "error: ", colour: str = "red") -> int:
    """`trtfuse: KIND MESSAGE`, one line on stderr; under --json also `{"error": MESSAGE, "exit": N}` on stdout, the
    call's one JSON object (none where the command had written its own before it failed or was interrupted)."""
    _error_line(f"trtfuse: {kind}{message}", colour)
    if as_json and not JSON_OUTPUT.written:
        echo_json({"error": " ".join(message.split("\n")), "exit": status})
    return status


class TrtfuseGroup(click.Group):
    """Every way a command can end becomes an exit status and at most one line on stderr, never a traceback:
    3 for a missing optional dependency, 2 for bad input or usage or a stdout that cannot be written (a full disk, a
    closed pipe), 130/143 for SIGINT/SIGTERM, 4 for a bug."""

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
        JSON_OUTPUT.written = False
        arguments = list(sys.argv[1:] if args is None else args)
        # Read off the raw arguments: a usage error can come before click has seen the flag.
        as_json = "--json" in arguments[: arguments.index("--")] if "--" in arguments else "--json" in arguments
        try:
            with guarded_stdout():
                status = self._status(arguments, prog_name, complete_var, as_json, **extra)
        except StdoutLost as error:
            # The result is lost, so the call failed: what it wrote was rolled back on the way out.
            status = _fail(f"cannot write to stdout: {error}", EXIT_BAD_INPUT, as_json=False)
        if not standalone_mode:
            return status
        sys.exit(status if isinstance(status, int) else 0)

    def _status(
        self, arguments: list[str], prog_name: str | None, complete_var: str | None, as_json: bool, **extra: object
    ) -> object:
        """Run the command; every way it ends as an exit status (a lost stdout is raised, `StdoutLost`)."""
        try:
            # One transaction around the whole call: whatever the command wrote is removed again if it fails or is
            # interrupted. A command's own exit status (1: a mismatch or a leak, 3: no engine built) is a result:
            # what it wrote stays.
            with termination_as_exception(), Transaction():
                try:
                    status = super().main(arguments, prog_name, complete_var, standalone_mode=False, **extra)
                except SystemExit as done:
                    status = done.code
        except MissingDependencyError as error:
            status = _fail(str(error), EXIT_MISSING_DEPENDENCY, as_json, "", "yellow")
        except OptionError as error:
            status = _fail(error.spelled(lambda name: f"--{name}"), EXIT_BAD_INPUT, as_json)
        except TrtfuseError as error:
            status = _fail(str(error), EXIT_BAD_INPUT, as_json)
        except _NO_ARGS_IS_HELP as error:
            # `trtfuse` or `trtfuse bench` alone: the help that -h gives, not an error.
            click.echo(error.ctx.get_help())
            status = 0
        except click.UsageError as error:
            command = error.ctx.command_path if error.ctx is not None else "trtfuse"
            status = _fail(f"{error.format_message()} (see '{command} --help')", EXIT_BAD_INPUT, as_json)
        except click.ClickException as error:
            status = _fail(error.format_message(), error.exit_code, as_json)
        except (click.Abort, KeyboardInterrupt):
            status = _fail("interrupted", EXIT_SIGINT, as_json, "")
        except Interrupted as error:
            status = _fail(f"stopped by {error}", 128 + error.signal_number, as_json, "")
        except StdoutLost:
            raise
        except Exception as error:
            bug = "a bug in trtfuse; please report it with the command line"
            message = f"{type(error).__name__}: {first_line(error)} ({bug})"
            status = _fail(message, EXIT_INTERNAL_ERROR, as_json, "internal error: ")
        return status

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
cli.add_command(explain_command)
cli.add_command(generate_command)
cli.add_command(triton_config_command)
cli.add_command(bench)


def main() -> None:
    cli(prog_name="trtfuse")


if __name__ == "__main__":
    main()
