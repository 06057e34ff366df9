"""trtfuse's one-line errors in Polygraphy's style: `G_LOGGER.critical` prints `[!] ...` and raises the
PolygraphyException that makes `polygraphy run` exit with status 1 without a traceback."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from polygraphy.exception import PolygraphyException
from polygraphy.logger import G_LOGGER

from trtfuse.errors import TrtfuseError


@contextmanager
def as_polygraphy_error(what: str) -> Iterator[None]:
    """Turns a TrtfuseError (bad input, a missing TensorRT or GPU) raised inside into one critical line that starts
    with `what` (the runner or loader at work). The PolygraphyException keeps the TrtfuseError as its cause, so
    trtfuse's own commands that use these runners can raise it again (MissingDependencyError exits with 3)."""
    try:
        yield
    except TrtfuseError as error:
        try:
            G_LOGGER.critical(f"{what}: {error}")
        except PolygraphyException as critical:
            raise critical from error
