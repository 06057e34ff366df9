"""What a command writes: checked before any work, written atomically, and removed again if the call fails.

A writing command first checks its `OutputPlan` (every output against every input, external data files included, and
against each other), then writes inside a `Transaction`. Every write goes through `atomic_file`: a temp file in the
target's folder, renamed into place. If the call then fails, or SIGINT/SIGTERM interrupts it, the transaction removes
the files and folders the call created and puts back the files it replaced, so the folders are as they were.
"""

from __future__ import annotations

import contextlib
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

from trtfuse.errors import Interrupted, TrtfuseError

# Copies above this size report their progress; smaller ones only say that they happen.
PROGRESS_BYTES = 1 << 30
_CHUNK_BYTES = 8 << 20
_PROGRESS_STEPS = 10
_HELD = (signal.SIGINT, signal.SIGTERM)


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


@dataclass
class OutputPlan:
    """The files a call reads and the files it will write, each output with what it is (for the message)."""

    reads: list[Path] = field(default_factory=list)
    writes: list[tuple[str, Path]] = field(default_factory=list)
    # Outputs whose missing folders the call makes (`make_folders`), each with the folder they must stay inside.
    folders_under: dict[Path, Path] = field(default_factory=dict)

    def read(self, *paths: Path) -> OutputPlan:
        self.reads.extend(paths)
        return self

    def write(self, what: str, path: Path | None, folders_under: Path | None = None) -> OutputPlan:
        """Plan to write `path`; with `folders_under`, its folder may not exist yet if it would be made inside that
        folder (an external data file `sub/dir/table.bin` copied beside a model written elsewhere)."""
        if path is not None:
            self.writes.append((what, path))
            if folders_under is not None:
                self.folders_under[path] = folders_under
        return self

    def check(self) -> None:
        """A `TrtfuseError` for the first output that cannot be written safely; nothing is touched."""
        read_ids = {_identity(path): path for path in self.reads}
        written: dict[object, tuple[str, Path]] = {}
        for what, path in self.writes:
            check_writable(path, self.folders_under.get(path))
            identity = _identity(path)
            if identity in read_ids:
                raise TrtfuseError(f"{path}: the {what} would overwrite the input {read_ids[identity]}; choose another")
            if identity in written:
                other, other_path = written[identity]
                raise TrtfuseError(f"{path}: the {what} and the {other} ({other_path}) are the same file")
            written[identity] = (what, path)


def _broken_link(path: Path) -> str | None:
    """What a symlink that leads to no file is ("a symlink loop", "a symlink to nothing"); None otherwise."""
    if not os.path.islink(path) or os.path.exists(path):
        return None
    return "a symlink loop" if resolved(path) == path.absolute() else "a symlink to nothing"


def check_readable(path: Path, what: str = "file") -> None:
    """A `TrtfuseError` unless `path` is a regular file: one line for a missing path, a symlink loop or to nothing, a
    folder, a FIFO or a device (`what` names the kind of file the call expected)."""
    expected = f"{'an' if what[0] in 'aeiou' else 'a'} {what}"
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
    """Copy `source` to `target` atomically; runs of zeros become holes, so a sparse file stays sparse.

    `notify` hears that the copy happens and, above `PROGRESS_BYTES`, how far it got.
    """
    size = source.stat().st_size
    if notify is not None:
        notify(f"copying external data {source} ({_size_text(size)}) to {target.parent}")
    next_report = size // _PROGRESS_STEPS
    zeros = bytes(_CHUNK_BYTES)
    with atomic_file(target) as temp, source.open("rb") as reader, temp.open("r+b") as writer:
        done = 0
        while chunk := reader.read(_CHUNK_BYTES):
            if chunk == zeros[: len(chunk)]:
                writer.seek(len(chunk), os.SEEK_CUR)
            else:
                writer.write(chunk)
            done += len(chunk)
            if notify is not None and size > PROGRESS_BYTES and done >= next_report:
                notify(f"  {_size_text(done)} of {_size_text(size)} ({100 * done // size}%)")
                next_report += size // _PROGRESS_STEPS
        writer.truncate(size)


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
