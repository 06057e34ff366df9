"""What the scripts in models/ share with trtfuse's commands: one line on stderr and exit status 3 when an extra they
need is not installed (a missing optional dependency, instead of a ModuleNotFoundError traceback), and the rule of
what an output may replace (`trtfuse.files.OutputPlan`: one line and exit status 2 for a file it may not)."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import NoReturn

from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.files import OutputPlan, json_holding, json_object

EXIT_BAD_INPUT = 2
EXIT_MISSING_DEPENDENCY = 3
MANIFEST = "expected.json"
# The manifest an export script writes (export.py's and tool_exports.Manifest's both hold `files`).
is_manifest = json_holding("files")
FORCE_HELP = (
    "Replace a file in the output folder that its expected.json does not list (never an ONNX model: only the exports "
    "the folder's manifest lists are replaced)."
)
EXPORT_EXTRA = (
    "install trtfuse's export extra: pip install -e '.[export]' (on a machine without a GPU, the CPU build of torch "
    "first, as README.md shows)"
)


def exit_missing(error: ModuleNotFoundError, install: str = EXPORT_EXTRA) -> NoReturn:
    """Exit 3 naming the module that is missing and how to install it."""
    script = Path(sys.argv[0]).name or "models"
    print(f"{script}: error: {error.name or error} is not installed; {install}", file=sys.stderr)
    raise SystemExit(EXIT_MISSING_DEPENDENCY)


def listed_exports(folder: Path) -> set[str]:
    """The files the manifest in `folder` says an export script wrote: each export listed (or recorded as failed)
    and its external data file."""
    manifest = json_object(folder / MANIFEST) or {}
    names = [name for key in ("files", "failures") if isinstance(manifest.get(key), dict) for name in manifest[key]]
    return {written for name in names for written in (name, f"{name}.data")}


def check_exports(folder: Path, names: Iterable[str], force: bool) -> None:
    """Before an export script writes `names` and its manifest into `folder`: each may replace a file the folder's
    manifest lists (the script's own), another file only with --force, never an ONNX model the manifest does not list;
    a refusal is one line on stderr and exit status 2, with nothing written."""
    if not folder.is_dir():
        return
    listed = listed_exports(folder)
    plan = OutputPlan(force)
    for name in names:
        plan.write("export", folder / name, ours=lambda path: path.name in listed)
    plan.write("manifest", folder / MANIFEST, ours=is_manifest)
    try:
        plan.check()
    except OptionError as error:
        _exit_bad_input(error.spelled(lambda choice: f"--{choice}"))
    except TrtfuseError as error:
        _exit_bad_input(str(error))


def _exit_bad_input(message: str) -> NoReturn:
    print(f"{Path(sys.argv[0]).name or 'models'}: error: {message}", file=sys.stderr)
    raise SystemExit(EXIT_BAD_INPUT)
