"""The `trtfuse` command line in-process, as the tests drive it."""

from __future__ import annotations

from click.testing import CliRunner, Result

from trtfuse.cli.main import cli


def run_cli(*args: object, input: str | None = None) -> Result:
    """`trtfuse ARGS...` in this process, through the group (its error handling and exit statuses included)."""
    return CliRunner().invoke(cli, [str(arg) for arg in args], input=input)
