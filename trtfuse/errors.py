"""The exception types users see: a single line naming the file, node or tensor at fault."""

import signal
from collections.abc import Callable
from dataclasses import dataclass


class TrtfuseError(Exception):
    """A problem with the user's input or environment, reported as one line without a traceback."""


@dataclass(frozen=True)
class Choice:
    """A user choice named in model terms inside an `OptionError`'s message; each interface spells it its own way."""

    name: str


class OptionError(TrtfuseError):
    """A user choice does not fit the model: `choice` names which in model terms ("shape", "dim", "seed", "tokens",
    "past", "batch", "inputs"); `parts` is the message, with every choice it mentions as a `Choice`.

    The core never names a command-line flag: the CLI spells each `Choice` as its flag (`--shape`), in one place.
    """

    def __init__(self, choice: str, *parts: str | Choice) -> None:
        self.choice = choice
        self.parts = parts
        super().__init__(self.spelled(lambda name: name))

    def spelled(self, spell: Callable[[str], str]) -> str:
        """The message with each choice spelled by `spell`."""
        return "".join(spell(part.name) if isinstance(part, Choice) else part for part in self.parts)


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
