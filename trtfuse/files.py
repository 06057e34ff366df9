"""What a command writes: checked before any work, written atomically, and removed again if the call fails.

A writing command first checks its `OutputPlan` (every output against every input, external data files included,
against each other, and against what it would replace), then writes inside a `Transaction`. Every write goes through
`atomic_file`: a temp file in the target's folder, renamed into place. If the call then fails, or SIGINT/SIGTERM
interrupts it, the transaction removes the files and folders the call created and puts back the files it replaced, so
the folders are as they were.

What an output may replace is one rule (`OutputPlan.check`), the same for every command and script that writes:
- never one of the call's inputs (the same path, a symlink to it, a hard link of it, an input's external data), nor
  another output of the same call;
- never an ONNX model trtfuse did not write (a user's export), whatever the caller allows;
- a file trtfuse wrote as that output (each output's `ours` recognises one by its content: a fused model by its
  trtfuse opset or stamp, a report or sidecar by its schema, an engine by its sidecar) is replaced, so that running a
  command again works;
- any other existing file only when the caller says so (`OutputPlan(force=True)`: the CLI's `--force`), except an
  output that the call reads and writes back by design (`Overwrite.UPDATED`: a timing cache) and external data copies,
  which are reused when they hold the same bytes and never replaced (`Overwrite.IDENTICAL`).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import json
import math
import os
import signal
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from trtfuse.errors import Choice, Interrupted, OptionError, TrtfuseError

if TYPE_CHECKING:
    import onnx

# Copies above this size report their progress; smaller ones only say that they happen.
PROGRESS_BYTES = 1 << 30
_CHUNK_BYTES = 8 << 20
_PROGRESS_STEPS = 10
_HELD = (signal.SIGINT, signal.SIGTERM)
# Protobuf holds no message of 2 GiB or more, so no ONNX file (its external data apart) is larger; nor is a report,
# a sidecar or a stamp: a larger file is not read to recognise it.
_LARGEST_MODEL_BYTES = (1 << 31) - 1
_LARGEST_JSON_BYTES = 1 << 28


def resolved(path: Path) -> Path:
    """`path` with every symlink resolved, as far as they lead: a symlink loop stays as it is (Path.resolve raises on
    one), and the checks that follow then see a path that is not a regular file."""
    return Path(os.path.realpath(path))


def is_inside(path: Path, folder: Path) -> bool:
    """Whether `path`, every symlink followed, lies in `folder` (itself resolved): what a file named relative to a
    folder must do to be held to it (external data to its model's folder, the fused model to its engine's)."""
    return resolved(path).is_relative_to(resolved(folder))


def _identity(path: Path) -> tuple[int, int] | Path:
    """What `path` names on disk: (device, inode) for an existing file, so hard links compare equal; else the path
    with every symlink resolved."""
    resolved_path = resolved(path)
    with contextlib.suppress(OSError):
        status = resolved_path.stat()
        return status.st_dev, status.st_ino
    return resolved_path


Recognise = Callable[[Path], bool]


def _nothing(_path: Path) -> bool:
    return False


class Overwrite(enum.Enum):
    """What an output may do to a file already at its path, besides replacing one its `ours` recognises."""

    # Replace another file (never an ONNX model) only with the caller's leave (`OutputPlan.force`).
    ASKED = "asked"
    # Replace it whatever it holds (never an ONNX model): the call reads it and writes it back (a timing cache).
    UPDATED = "updated"
    # Reuse it when it holds the same bytes, else refuse (external data copies: `save_model` compares them).
    IDENTICAL = "identical"


@dataclass(frozen=True)
class PlannedOutput:
    """One output: what it is (for the message), where, how to recognise a file trtfuse wrote as it (`ours`: such a
    file is replaced), what else it may replace, and the folder it may make missing folders inside."""

    what: str
    path: Path
    ours: Recognise = _nothing
    overwrite: Overwrite = Overwrite.ASKED
    folders_under: Path | None = None


@dataclass
class OutputPlan:
    """The files a call reads and the files it will write; `force`: the caller's leave to replace existing files
    trtfuse cannot tell it wrote (never an input, never an ONNX model trtfuse did not write)."""

    force: bool = False
    reads: list[Path] = field(default_factory=list)
    writes: list[PlannedOutput] = field(default_factory=list)

    def read(self, *paths: Path) -> OutputPlan:
        self.reads.extend(paths)
        return self

    def write(
        self,
        what: str,
        path: Path | None,
        folders_under: Path | None = None,
        ours: Recognise = _nothing,
        overwrite: Overwrite = Overwrite.ASKED,
    ) -> OutputPlan:
        """Plan to write `path` (nothing for None); `ours` recognises a file trtfuse wrote as this output. With
        `folders_under`, its folder may not exist yet if it would be made inside that folder (an external data file
        `sub/dir/table.bin` copied beside a model written elsewhere)."""
        if path is not None:
            self.writes.append(PlannedOutput(what, path, ours, overwrite, folders_under))
        return self

    def check_paths(self) -> None:
        """A `TrtfuseError` for the first output whose path cannot be written (not a file name, no folder), is an
        input, or is another output's; only paths are looked at, no file is read (`check` reads what is there)."""
        read_ids = {_identity(path): path for path in self.reads}
        written: dict[object, PlannedOutput] = {}
        for output in self.writes:
            path = output.path
            check_writable(path, output.folders_under)
            identity = _identity(path)
            if identity in read_ids:
                raise TrtfuseError(
                    f"{path}: the {output.what} would overwrite the input {read_ids[identity]}; choose another"
                )
            if identity in written:
                other = written[identity]
                raise TrtfuseError(f"{path}: the {output.what} and the {other.what} ({other.path}) are the same file")
            written[identity] = output

    def check(self) -> None:
        """A `TrtfuseError` for the first output that cannot be written safely (`check_paths`, then what each would
        replace); nothing is touched."""
        self.check_paths()
        for output in self.writes:
            self._check_existing(output)

    def _check_existing(self, output: PlannedOutput) -> None:
        """The rule for a file already at the output's path (module docstring)."""
        path = output.path
        if output.overwrite is Overwrite.IDENTICAL or not resolved(path).is_file() or output.ours(path):
            return
        if is_onnx_model(path):
            swapped = any(output.ours(read) for read in self.reads)
            hint = "; the arguments look swapped (the input first, then the output)" if swapped else ""
            raise OptionError(
                "force",
                f"{path}: is an ONNX model, not {_article(output.what)} trtfuse wrote: it is never replaced, not even "
                "with ",
                Choice("force"),
                f"{hint}; write the {output.what} elsewhere",
            )
        if output.overwrite is Overwrite.UPDATED or self.force:
            return
        raise OptionError(
            "force",
            f"{path}: exists and is not {_article(output.what)} trtfuse wrote; write the {output.what} elsewhere, or "
            "give ",
            Choice("force"),
            " to replace it",
        )


def _article(noun: str) -> str:
    return f"{'an' if noun[0] in 'aeiou' else 'a'} {noun}"


def is_onnx_model(path: Path) -> bool:
    """Whether `path` holds an ONNX model (`onnx_model_at`)."""
    return onnx_model_at(path) is not None


def onnx_model_at(path: Path) -> onnx.ModelProto | None:
    """The ONNX model in the file at `path`, parsed as protobuf without its external data, as `model.onnx_file` loads
    one (an IR version and a graph); None for any other file, or one too large to be a model."""
    import onnx
    from google.protobuf.message import DecodeError

    try:
        if path.stat().st_size > _LARGEST_MODEL_BYTES:
            return None
        model = onnx.load_model(str(path), format="protobuf", load_external_data=False)
    except (DecodeError, ValueError, RuntimeError, OSError):
        return None
    return model if model.ir_version > 0 and model.HasField("graph") else None


def json_object(path: Path) -> dict | None:
    """The JSON object in the file at `path`; None for anything else (no file, another JSON value, not JSON, too
    large to be a file trtfuse wrote)."""
    try:
        if path.stat().st_size > _LARGEST_JSON_BYTES:
            return None
        value = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def json_holding(*keys: str) -> Recognise:
    """Recognises a JSON object holding every one of `keys`: a report's schema, for `OutputPlan.write(ours=)`."""

    def holds(path: Path) -> bool:
        value = json_object(path)
        return value is not None and all(key in value for key in keys)

    return holds


def _broken_link(path: Path) -> str | None:
    """What a symlink that leads to no file is ("a symlink loop", "a symlink to nothing"); None otherwise."""
    if not os.path.islink(path) or os.path.exists(path):
        return None
    return "a symlink loop" if resolved(path) == path.absolute() else "a symlink to nothing"


def check_readable(path: Path, what: str = "file") -> None:
    """A `TrtfuseError` unless `path` is a regular file: one line for a missing path, a symlink loop or to nothing, a
    folder, a FIFO or a device (`what` names the kind of file the call expected)."""
    expected = _article(what)
    broken = _broken_link(path)
    if broken:
        target = f" ({resolved(path)})" if broken == "a symlink to nothing" else ""
        raise TrtfuseError(f"{path}: is {broken}{target}, not {expected}")
    if not path.exists():
        raise TrtfuseError(f"{path}: no such {what}")
    if not path.is_file():
        kind = "a folder" if path.is_dir() else "a device, FIFO or socket"
        raise TrtfuseError(f"{path}: is {kind}, not {expected}")


def check_writable(path: Path, folders_under: Path | None = None) -> Path:
    """The folder `path` goes into; a `TrtfuseError` unless the folder exists (or, with `folders_under`, can be made
    inside that folder) and `path` is absent or a regular file."""
    folder = path.absolute().parent
    if not folder.is_dir() and not _can_make_inside(folder, folders_under):
        raise TrtfuseError(f"{path}: output folder does not exist")
    # /dev/stdout and the like: whatever they point at, a rename onto them would replace the system's own entry.
    if any(str(candidate).startswith(("/dev/", "/proc/")) for candidate in (path.absolute(), resolved(path))):
        raise TrtfuseError(f"{path}: is not a regular file (a device or process file); choose a file name")
    broken = _broken_link(path)
    if broken:
        raise TrtfuseError(f"{path}: is {broken}; choose a file name")
    try:
        mode = resolved(path).stat().st_mode
    except OSError:
        return folder
    if stat.S_ISDIR(mode):
        raise TrtfuseError(f"{path}: is a folder, not a file name")
    if not stat.S_ISREG(mode):
        raise TrtfuseError(f"{path}: is not a regular file (a device, FIFO or socket); choose a file name")
    return folder


class Transaction:
    """Records what the call writes; on an exception it removes what was created and restores what was replaced.

    One transaction at a time is current (`active()`); `atomic_file` and `make_folders` report to it.
    """

    _current: Transaction | None = None

    def __init__(self) -> None:
        self._created: list[Path] = []
        self._backups: list[tuple[Path, Path]] = []

    def __enter__(self) -> Transaction:
        self._outer = Transaction._current
        Transaction._current = self
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, _tb: object) -> None:
        Transaction._current = self._outer
        if kind is None and self._outer is not None:
            # A transaction inside another: what it wrote is undone if the outer one fails.
            self._outer._created += self._created
            self._outer._backups += self._backups
            return
        with signals_held():
            if kind is None:
                for _, backup in self._backups:
                    _unlink(backup)
            else:
                self._roll_back()

    def _roll_back(self) -> None:
        for path in reversed(self._created):
            if path.is_dir() and not path.is_symlink():
                with contextlib.suppress(OSError):
                    path.rmdir()
            else:
                _unlink(path)
        for path, backup in reversed(self._backups):
            with contextlib.suppress(OSError):
                os.replace(backup, path)

    @staticmethod
    def active() -> Transaction | None:
        return Transaction._current

    def created(self, path: Path) -> None:
        self._created.append(path)

    def replacing(self, path: Path) -> None:
        """Keep the current content of `path` (a hard link beside it) until the transaction ends."""
        backup = Path(tempfile.mktemp(dir=path.absolute().parent, prefix=f".{path.name}.", suffix=".old"))
        try:
            os.link(path, backup, follow_symlinks=False)
        except OSError:
            return
        self._backups.append((path, backup))


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """SIGINT and SIGTERM wait until the block is done, so a second Ctrl-C cannot stop a cleanup halfway.

    Their handlers are swapped for one that only remembers (a signal mask would not do: another thread of the
    process, onnxruntime's, would take the signal); the first one that arrived is raised again afterwards.
    """
    arrived: list[int] = []
    try:
        previous = {number: signal.signal(number, lambda got, _frame: arrived.append(got)) for number in _HELD}
    except ValueError:
        # Not the main thread, where Python runs signal handlers anyway.
        yield
        return
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        if arrived:
            signal.raise_signal(arrived[0])


def _can_make_inside(folder: Path, base: Path | None) -> bool:
    """Whether `make_folders(folder)` would make only folders inside `base`: the nearest part of `folder` that exists
    is a folder, and it is `base` or lies inside it once symlinks are resolved."""
    if base is None:
        return False
    existing = folder
    while not existing.exists() and not existing.is_symlink():
        existing = existing.parent
    if not existing.is_dir():
        return False
    root, found = resolved(base.absolute()), resolved(existing)
    return found == root or root in found.parents


def _unlink(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


def make_folders(folder: Path) -> None:
    """`mkdir -p`, with every folder it creates recorded in the active transaction."""
    missing = []
    current = folder.absolute()
    while not current.exists():
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            path.mkdir()
        except OSError as error:
            raise TrtfuseError(f"{path}: cannot create the folder: {error.strerror or error}") from None
        transaction = Transaction.active()
        if transaction is not None:
            transaction.created(path)


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yields a temp path beside `path` to write; when the block ends normally it replaces `path` in one rename.

    On any exception (signals included) the temp file is removed. The active transaction learns of the new file.
    Signals wait while the temp file is made and while the rename is recorded, so none can slip between the two
    steps of either and leave a file nobody knows of.
    """
    folder = check_writable(path)
    temp: Path | None = None
    try:
        with signals_held():
            handle, temp_name = tempfile.mkstemp(dir=folder, prefix=f".{path.name}.", suffix=".tmp")
            os.close(handle)
            temp = Path(temp_name)
        yield temp
        _set_default_permissions(temp)
        transaction = Transaction.active()
        with signals_held():
            existed = path.exists()
            if transaction is not None and existed:
                transaction.replacing(path)
            os.replace(temp, path)
            if transaction is not None and not existed:
                transaction.created(path)
    except OSError as error:
        if temp is not None:
            _unlink(temp)
        raise TrtfuseError(f"{path}: cannot write: {error.strerror or error}") from None
    except BaseException:
        if temp is not None:
            _unlink(temp)
        raise


def write_bytes_atomic(path: Path, data: bytes | memoryview) -> None:
    with atomic_file(Path(path)) as temp:
        temp.write_bytes(data)


def write_json_atomic(path: Path, value: object) -> None:
    """Valid JSON: a non-finite float (which JSON cannot hold) becomes the string "nan", "inf" or "-inf"."""
    write_bytes_atomic(path, (json_text(value) + "\n").encode("utf-8"))


def json_text(value: object) -> str:
    return json.dumps(_finite(value), indent=2, allow_nan=False)


def _finite(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def same_content(first: Path, second: Path) -> bool:
    if first.stat().st_size != second.stat().st_size:
        return False
    with first.open("rb") as a, second.open("rb") as b:
        while True:
            chunk = a.read(_CHUNK_BYTES)
            if chunk != b.read(_CHUNK_BYTES):
                return False
            if not chunk:
                return True


def copy_sparse(source: Path, target: Path, notify: Callable[[str], None] | None = None) -> None:
    """Copy `source` to `target` atomically, keeping a sparse file sparse: only the data regions the filesystem
    reports (`SEEK_DATA` / `SEEK_HOLE`, at its own granularity) are read, and within them a chunk of zeros becomes a
    hole too.

    `notify` hears that the copy happens and, above `PROGRESS_BYTES`, each tenth of the file passed.
    """
    size = source.stat().st_size
    if notify is not None:
        notify(f"copying external data {source} ({_size_text(size)}) to {target.parent}")
    progress = _Progress(size, notify if size > PROGRESS_BYTES else None)
    zeros = bytes(_CHUNK_BYTES)
    # Unbuffered: `_data_regions` moves the file offset, which a buffered reader would not know of.
    with atomic_file(target) as temp, source.open("rb", buffering=0) as reader, temp.open("r+b") as writer:
        for start, end in _data_regions(reader.fileno(), size):
            progress.reached(start)
            reader.seek(start)
            position = start
            while position < end and (chunk := reader.read(min(_CHUNK_BYTES, end - position))):
                if chunk != zeros[: len(chunk)]:
                    writer.seek(position)
                    writer.write(chunk)
                position += len(chunk)
                progress.reached(position)
        writer.truncate(size)
    progress.reached(size)


def _data_regions(handle: int, size: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each region of the open file that holds data, as `SEEK_DATA` / `SEEK_HOLE` report them; the
    whole file as one region where the system or the filesystem cannot tell."""
    if not hasattr(os, "SEEK_DATA"):
        yield 0, size
        return
    position = 0
    while position < size:
        try:
            start = os.lseek(handle, position, os.SEEK_DATA)
        except OSError as error:
            # ENXIO: nothing but a hole from `position` on; anything else: no hole is reported here.
            if error.errno != errno.ENXIO:
                yield position, size
            return
        position = min(os.lseek(handle, start, os.SEEK_HOLE), size)
        yield start, position


class _Progress:
    """Says each tenth of a copy passed, once, in order (a hole passes several at a time)."""

    def __init__(self, size: int, notify: Callable[[str], None] | None) -> None:
        self.size, self.notify, self.step = size, notify, 1

    def reached(self, position: int) -> None:
        while self.notify is not None and self.step <= _PROGRESS_STEPS and position >= self._mark(self.step):
            mark = self._mark(self.step)
            self.notify(f"  {_size_text(mark)} of {_size_text(self.size)} ({100 * self.step // _PROGRESS_STEPS}%)")
            self.step += 1

    def _mark(self, step: int) -> int:
        return self.size * step // _PROGRESS_STEPS


def _size_text(size: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if size >= scale:
            return f"{size / scale:.1f} {unit}"
    return f"{size} bytes"


def _set_default_permissions(path: Path) -> None:
    # mkstemp creates files readable by the owner only; an output should get the usual umask-derived mode.
    umask = os.umask(0)
    os.umask(umask)
    path.chmod(0o666 & ~umask)


@contextlib.contextmanager
def termination_as_exception(signals: Sequence[signal.Signals] = (signal.SIGTERM,)) -> Iterator[None]:
    """While the block runs, SIGTERM raises `Interrupted` (as SIGINT raises KeyboardInterrupt), so cleanup runs."""

    def raise_interrupted(number: int, _frame: FrameType | None) -> None:
        raise Interrupted(number)

    previous = {}
    try:
        for number in signals:
            previous[number] = signal.signal(number, raise_interrupted)
    except ValueError:
        # Not the main thread: signals cannot be caught here, and the default action applies.
        previous = {}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
