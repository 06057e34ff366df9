"""What the scripts in models/ say when an extra they need is not installed: one line on stderr and exit status 3
(a missing optional dependency, as trtfuse's commands exit), instead of a ModuleNotFoundError traceback."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn

EXIT_MISSING_DEPENDENCY = 3
EXPORT_EXTRA = (
    "install trtfuse's export extra: pip install -e '.[export]' (on a machine without a GPU, the CPU build of torch "
    "first, as README.md shows)"
)


def exit_missing(error: ModuleNotFoundError, install: str = EXPORT_EXTRA) -> NoReturn:
    """Exit 3 naming the module that is missing and how to install it."""
    script = Path(sys.argv[0]).name or "models"
    print(f"{script}: error: {error.name or error} is not installed; {install}", file=sys.stderr)
    raise SystemExit(EXIT_MISSING_DEPENDENCY)
