"""The exception types users see: a single line naming the file, node or tensor at fault."""

import signal


class TrtfuseError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


class MissingDependencyError(TrtfuseError):
    """An optional dependency (TensorRT, a GPU, CuTeDSL...) is not available; the message says how to get it."""


class Interrupted(BaseException):
    """SIGTERM arrived (SIGINT arrives as KeyboardInterrupt). A BaseException, so only cleanup code catches it."""

    def __init__(self, signal_number: int = signal.SIGTERM) -> None:
        super().__init__(signal.Signals(signal_number).name)
        self.signal_number = signal_number


def first_line(error: BaseException) -> str:
    """The first line of a library's exception message (or its type's name), for a one-line `TrtfuseError`."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
