"""What every command shares: exit statuses, the shape grammar, -v/-q/--json, and printing to a terminal."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn, TypeVar

import click

from trtfuse.contract import QUANTIZED_OPS
from trtfuse.files import json_text, signals_held
from trtfuse.fusion.options import FusionOptions

# -h as well as --help on every command. Set on each command, not only inherited from the group: click keeps a
# command's help option once made, so a command first invoked on its own would lose -h under the group.
HELP_OPTIONS = {"help_option_names": ["-h", "--help"]}

EXIT_MISMATCH = 1
EXIT_BAD_INPUT = 2
# A missing optional dependency (TensorRT, a GPU, CuTeDSL) is not the user's input's fault: a status of its own.
EXIT_MISSING_DEPENDENCY = 3
# A bug in trtfuse, not in the input: the last-resort handler's status (a traceback is never shown).
EXIT_INTERNAL_ERROR = 4

F = TypeVar("F", bound=Callable[..., object])

# One shape: trtexec's `1x16` (or `1X16`) or Polygraphy's `[1,16]`. Digits are ASCII: `\d` would take any script's.
_SHAPE = r"(?:[0-9]+(?:[xX][0-9]+)*|\[\s*[0-9]+(?:\s*,\s*[0-9]+)*\s*\])"
_SHAPE_RANGE = rf"{_SHAPE}:{_SHAPE}:{_SHAPE}"
# trtexec's list form, `a:1x16,b:1x16`: the commas between entries, not those inside Polygraphy's brackets.
_LIST_COMMA = re.compile(r",(?![^\[]*\])")


def parse_dims(text: str) -> tuple[int, ...]:
    """`1x16` or `[1,16]` -> (1, 16)."""
    return tuple(int(dim) for dim in re.split(r"[xX,]", text.strip("[] ")))


def _split_name(text: str, value_pattern: str) -> tuple[str, str] | None:
    """NAME and VALUE of `NAME=VALUE` or `NAME:VALUE`, at the first separator after which VALUE is well formed
    (names may hold ':' and '=' themselves)."""
    for match in re.finditer(r"[=:]", text):
        name, value = text[: match.start()], text[match.end() :]
        if name and re.fullmatch(value_pattern, value.replace(" ", "")):
            return name, value.replace(" ", "")
    return None


def _entries(text: str, value_pattern: str) -> list[tuple[str, str]] | None:
    """NAME and VALUE of each entry of `text`: one `NAME=VALUE`, or trtexec's comma-separated list of them; None when
    an entry is not well formed."""
    whole = _split_name(text, value_pattern)
    pieces = _LIST_COMMA.split(text)
    if len(pieces) > 1:
        entries = [_split_name(piece.strip(), value_pattern) for piece in pieces]
        if all(entries):
            return entries
    return [whole] if whole else None


class TextType(click.ParamType):
    """A parameter type that reads its text with `parse`. Click's `convert` also takes values already converted (its
    contract for every type), a tuple for these, which stays as it is."""

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if isinstance(value, tuple):
            return value
        return self.parse(str(value))

    def parse(self, text: str) -> object:
        raise NotImplementedError


class _NamedListType(TextType):
    """`NAME=VALUE` or `NAME:VALUE`, or trtexec's comma-separated list of them -> ((NAME, value), ...), each VALUE
    matching `value_pattern`; `expected` says in the error what the option takes."""

    value_pattern: str
    expected: str

    def parse(self, text: str) -> object:
        entries = _entries(text, self.value_pattern)
        if entries is None:
            self.fail(f"'{text}' is not {self.expected}")
        return tuple((name, self.value(name, value)) for name, value in entries)

    def value(self, name: str, text: str) -> object:
        raise NotImplementedError


class ShapeType(_NamedListType):
    """`NAME=1x16`, `NAME:1x16` (trtexec) or `NAME:[1,16]` (Polygraphy), or trtexec's list `a:1x16,b:1x16` ->
    ((NAME, (1, 16)), ...)."""

    name = "NAME=D0xD1"
    value_pattern = _SHAPE
    expected = (
        "NAME=D0xD1, NAME:D0xD1, NAME:[D0,D1] or a comma-separated list of them (for example input_ids=1x16 or "
        "input_ids:2x5,attention_mask:2x5)"
    )

    def value(self, name: str, text: str) -> object:
        return parse_dims(text)


class ShapeRangeType(_NamedListType):
    """`NAME=MIN:OPT:MAX`, each a shape in either spelling, or a comma-separated list of them ->
    ((NAME, ShapeRange), ...)."""

    name = "NAME=MIN:OPT:MAX"
    value_pattern = _SHAPE_RANGE
    expected = (
        "NAME=MIN:OPT:MAX or a comma-separated list of them, shapes like 1x16 or [1,16] (e.g. input_ids=1x1:1x64:1x512)"
    )

    def value(self, name: str, text: str) -> object:
        from trtfuse.engine.profiles import ShapeRange

        low, opt, high = (parse_dims(shape) for shape in re.findall(_SHAPE, text))
        if not len(low) == len(opt) == len(high):
            self.fail(f"{name}: MIN, OPT and MAX have different ranks in {text!r}")
        for axis, dims in enumerate(zip(low, opt, high, strict=True)):
            if not dims[0] <= dims[1] <= dims[2]:
                self.fail(f"{name}: dim {axis} needs MIN <= OPT <= MAX, got {':'.join(map(str, dims))}")
        return ShapeRange(low, opt, high)


class RangeType(click.ParamType):
    """`MIN:OPT:MAX` with MIN <= OPT <= MAX and MIN >= `minimum` -> DimRange."""

    name = "MIN:OPT:MAX"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        from trtfuse.engine.profiles import DimRange

        if isinstance(value, DimRange):
            return value
        parts = str(value).strip().split(":")
        if len(parts) != 3 or not all(re.fullmatch(r"[0-9]+", part.strip()) for part in parts):
            self.fail(f"expected MIN:OPT:MAX with non-negative integers, got {value!r}")
        low, opt, high = (int(part) for part in parts)
        if not low <= opt <= high:
            self.fail(f"need MIN <= OPT <= MAX, got {value!r}")
        if low < self.minimum:
            self.fail(f"MIN must be at least {self.minimum}, got {value!r}")
        return DimRange(low, opt, high)


# An integer as every option spells it: ASCII digits, an optional sign.
ASCII_INTEGER = r"[+-]?[0-9]+"


class IntegerType(click.ParamType):
    """An integer in ASCII digits from `minimum` to `maximum` where given: every integer option's one parser (`int()`
    would also take `1_0` and other scripts' digits). A count (a `minimum` of 0 or more: steps, runs, a level) is
    digits alone, as `--tokens` and `--dim` take them; a sign is for an integer that may be negative (a seed, whose
    range check then names the range)."""

    name = "INTEGER"

    def __init__(self, minimum: int | None = None, maximum: int | None = None) -> None:
        self.minimum, self.maximum = minimum, maximum

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        text = str(value).strip()
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        elif not re.fullmatch(ASCII_INTEGER, text):
            self.fail(f"{value!r} is not an integer in ASCII digits (for example 16)")
        elif self.minimum is not None and self.minimum >= 0 and not text.isdigit():
            self.fail(f"{value!r} is not a count: ASCII digits alone, without a sign (for example 16)")
        else:
            number = int(text)
        if self.minimum is not None and number < self.minimum:
            self.fail(f"{number} is less than {self.minimum}")
        if self.maximum is not None and number > self.maximum:
            self.fail(f"{number} is more than {self.maximum}")
        return number


_SIZE_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class SizeType(click.ParamType):
    """A positive byte count such as `4G`, `512MiB` or `1073741824` (binary units) -> int."""

    name = "SIZE"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        if isinstance(value, int):
            return value
        match = re.fullmatch(r"\s*([0-9]+)\s*([kmgt]?)(?:i?b)?\s*", str(value).lower())
        if not match:
            self.fail(f"expected a size such as 4G, 512MiB or 1073741824, got {value!r}")
        size = int(match.group(1)) * _SIZE_UNITS[match.group(2)]
        if size <= 0:
            self.fail(f"must be positive, got {value!r}")
        return size


class DimType(TextType):
    """`SYMBOL=N` or `SYMBOL:N` -> (SYMBOL, N)."""

    name = "SYMBOL=N"

    def parse(self, text: str) -> object:
        split = _split_name(text, r"[0-9]+")
        if split is None:
            self.fail(f"'{text}' is not SYMBOL=N (for example batch=2)")
        return split[0], int(split[1])


class FilePath(click.Path):
    """A file name as a `Path`; one that is not valid UTF-8 is refused here, since onnx's and onnxruntime's C++
    bindings take only UTF-8 paths."""

    def __init__(self) -> None:
        super().__init__(path_type=Path)

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> object:
        path = super().convert(value, param, ctx)
        try:
            str(path).encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(path).decode("utf-8", "backslashreplace")
            self.fail(f"'{shown}': the file name is not valid UTF-8, which onnx and onnxruntime need; rename it")
        return path


def unique(kind: str) -> Callable[[click.Context, click.Parameter, Sequence[tuple]], dict]:
    """The option's (name, value) pairs as a dict; a name given twice with two values is an error. A value may be one
    pair or, from a list-form option, a tuple of them."""

    def collect(_ctx: click.Context, _param: click.Parameter, values: Sequence[tuple]) -> dict:
        found: dict = {}
        pairs = [pair for value in values for pair in (value if isinstance(value[0], tuple) else (value,))]
        for name, value in pairs:
            if name in found and found[name] != value:
                raise click.BadParameter(f"{kind} '{name}' is given twice, as {found[name]} and {value}")
            found[name] = value
        return found

    return collect


def named_option(flag: str, dest: str, value_type: click.ParamType, kind: str, help_text: str) -> Callable[[F], F]:
    """A repeatable option of NAME=VALUE entries; the command receives `dest`, a dict (`unique`: a `kind` named twice
    with two values is refused)."""
    return click.option(flag, dest, multiple=True, type=value_type, callback=unique(kind), help=help_text)


def feed_options(command: F) -> F:
    """--seed, --shape and --dim; the command receives `seed`, `shapes` (name -> shape) and `dims` (symbol -> int)."""
    options = (
        click.option("--seed", default=0, show_default=True, type=IntegerType(), help="Seed of the random inputs."),
        named_option(
            "--shape",
            "shapes",
            ShapeType(),
            "input",
            "Shape of one graph input (NAME=1x16, NAME:1x16 or NAME:[1,16]), or trtexec's list (a:1x16,b:1x16); "
            "repeatable.",
        ),
        named_option("--dim", "dims", DimType(), "dim", "Value of one symbolic dim; repeatable."),
    )
    for option in reversed(options):
        command = option(command)
    return command


# The quantized ops --no-fuse-quant leaves out, in the op table's order: "A, B or C".
_QUANTIZED = [op.name for op in QUANTIZED_OPS.values()]
_QUANTIZED_OP_NAMES = f"{', '.join(_QUANTIZED[:-1])} or {_QUANTIZED[-1]}"


def fusion_options(command: F) -> F:
    """--no-fuse-residual, --no-fuse-quant, --no-fuse-qk, --no-fuse-norm and --no-fuse-rope, on every command that
    fuses (and `inspect`, which shows what they would); the command receives `fusion`, a FusionOptions."""

    @functools.wraps(command)
    def with_fusion(
        *args: object,
        no_fuse_residual: bool,
        no_fuse_quant: bool,
        no_fuse_qk: bool,
        no_fuse_norm: bool,
        no_fuse_rope: bool,
        **kwargs: object,
    ) -> object:
        fusion = FusionOptions(
            fuse_residual=not no_fuse_residual,
            fuse_quant=not no_fuse_quant,
            fuse_qk=not no_fuse_qk,
            fuse_norm=not no_fuse_norm,
            fuse_rope=not no_fuse_rope,
        )
        return command(*args, fusion=fusion, **kwargs)

    options = (
        click.option(
            "--no-fuse-residual",
            is_flag=True,
            help="Keep each residual Add outside the norm after it: fuse the norm alone as TrtfuseRmsNorm, as trtfuse "
            "did before TrtfuseAddRmsNorm. For a TensorRT build that folds the Add into the preceding GEMM's "
            "epilogue (check with `trtexec --dumpLayerInfo`), where that is as fast or faster (docs/performance.md).",
        ),
        click.option(
            "--no-fuse-quant",
            is_flag=True,
            help="Keep every QuantizeLinear -> DequantizeLinear pair around a norm in the graph: no "
            f"{_QUANTIZED_OP_NAMES}, the output what trtfuse wrote before them "
            '(docs/patterns.md, "Quantized norms").',
        ),
        click.option(
            "--no-fuse-qk",
            is_flag=True,
            help="Leave each q-norm/k-norm pair as the graph computes it, for TensorRT to compile: no TrtfuseQkNorm.",
        ),
        click.option(
            "--no-fuse-norm",
            is_flag=True,
            help="Leave each norm that would be fused alone (a TrtfuseRmsNorm: no QK pair, no residual Add) as the "
            "graph computes it, for TensorRT to compile.",
        ),
        click.option(
            "--no-fuse-rope",
            is_flag=True,
            help="Keep the rotary embedding after each QK-norm pair in the graph: the pair fused as TrtfuseQkNorm, "
            'no TrtfuseQkNormRope, the output what trtfuse wrote before it (docs/patterns.md, "Rotary embedding").',
        ),
    )
    for option in reversed(options):
        with_fusion = option(with_fusion)
    return with_fusion  # type: ignore[return-value]


FORCE_OPTION = click.option(
    "--force",
    is_flag=True,
    help="Let an output replace an existing file trtfuse cannot tell it wrote; never an input, never an ONNX model "
    "trtfuse did not write (a file trtfuse wrote is replaced without it: docs/cli.md).",
)


MAX_POSITIONS = click.option(
    "--max-positions",
    "positions",
    type=IntegerType(minimum=1),
    metavar="N",
    help="The positions the model was trained for, where its export does not record them (max_position_embeddings "
    "in its metadata, which ModelOpt's exports drop); given, it takes the metadata's place. Going past it is "
    "warned about, as past the metadata's.",
)


@dataclass
class Verbosity:
    """-1 with -q (errors and results only), 0 by default, 1 with -v (library logs and details too)."""

    level: int = 0


VERBOSITY = Verbosity()


def _set_verbosity(ctx: click.Context, param: click.Parameter, value: bool) -> None:
    if not value:
        return
    level = 1 if param.name == "verbose" else -1
    seen = ctx.meta.setdefault("trtfuse.verbosity", set())
    seen.add(level)
    if len(seen) > 1:
        raise click.UsageError("-v/--verbose and -q/--quiet cannot be used together", ctx)
    VERBOSITY.level = level


def common_options(command: F) -> F:
    """-v/--verbose, -q/--quiet and --json, the same on every command; the command receives `as_json`.

    Without -v, the warnings numpy and the other libraries raise on odd data are not printed: the command's own
    lines say what matters.
    """

    @functools.wraps(command)
    def run(*args: object, **kwargs: object) -> object:
        with warnings.catch_warnings():
            if VERBOSITY.level < 1:
                warnings.simplefilter("ignore")
            else:
                warnings.simplefilter("default")
                warnings.showwarning = _echo_warning
            return command(*args, **kwargs)

    options = (
        click.option("-v", "--verbose", is_flag=True, expose_value=False, callback=_set_verbosity, help="Say more."),
        click.option(
            "-q", "--quiet", is_flag=True, expose_value=False, callback=_set_verbosity, help="Errors and results only."
        ),
        click.option("--json", "as_json", is_flag=True, help="Print the result as one JSON object on stdout."),
    )
    for option in reversed(options):
        run = option(run)
    return run


def _echo_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, *_rest: object) -> None:
    click.echo(printable(f"warning: {category.__name__}: {message} ({filename}:{lineno})"), err=True)


def info(message: str) -> None:
    """A progress or status line on stderr, unless -q."""
    if VERBOSITY.level >= 0:
        click.echo(printable(message), err=True)


def warning(message: str) -> None:
    """A warning line on stderr, unless -q."""
    if VERBOSITY.level >= 0:
        click.secho(printable(f"trtfuse: warning: {message}"), fg="yellow", err=True)


def detail(message: str) -> None:
    """A line only -v shows, on stderr: what was matched, rejected and timed along the way."""
    if VERBOSITY.level >= 1:
        click.echo(printable(message), err=True)


def fusion_details(report: dict, seconds: dict[str, float]) -> None:
    """With -v: each fused node, each rejected candidate, each Add, QuantizeLinear and rotation kept out of a fusion
    report, then the time of each phase."""
    for node in report["fused"]:
        dtypes = node["dtype"] if node["output_dtype"] == node["dtype"] else f"{node['dtype']}->{node['output_dtype']}"
        hidden = "x".join(str(size) for size in node["hidden_sizes"])
        detail(
            f"fused {node['kind']} {node['name']}: eps={node['epsilon']:g} hidden={hidden} {dtypes} "
            f"weight={node['weight_mode']} offset={node['weight_offset']:g}, {len(node['replaced'])} nodes replaced"
            + "".join(f", {stage} {quantizer['dtype']}" for stage, quantizer in node.get("quant", {}).items())
        )
    for miss in report["near_misses"]:
        detail(f"rejected {miss['node']}: {miss['reason']}")
    for miss in report["residual_near_misses"]:
        detail(f"add kept {miss['node']}: {miss['reason']}")
    for miss in report.get("quant_near_misses", []):
        detail(f"q kept {miss['node']}: {miss['reason']}")
    for miss in report.get("rope_near_misses", []):
        detail(f"rope kept {miss['node']}: {miss['reason']}")
    detail(", ".join(f"{phase} {seconds[phase]:.2f} s" for phase in seconds))


def summary(message: str, as_json: bool) -> None:
    """A command's one-line text result on stdout, unless -q or --json."""
    if VERBOSITY.level >= 0 and not as_json:
        click.echo(printable(message))


def exit_missing(error: Exception, done: str, as_json: bool) -> NoReturn:
    """Exit 3 with one line saying what was done and what is missing (under --json, also as the call's JSON)."""
    message = f"{done}: {error}"
    click.secho(printable(f"trtfuse: {message}"), fg="yellow", err=True)
    if as_json:
        echo_json({"error": message, "exit": EXIT_MISSING_DEPENDENCY})
    raise SystemExit(EXIT_MISSING_DEPENDENCY)


@dataclass
class JsonOutput:
    """Whether this call has written its JSON object: --json prints one object, never a second after it."""

    written: bool = False


JSON_OUTPUT = JsonOutput()


def echo_json(value: object) -> None:
    """The call's JSON object on stdout, written whole: the text is made first, and SIGINT/SIGTERM wait until the
    write is done, so an interruption never leaves half an object (the interruption is raised after it)."""
    text = json_text(value) + "\n"
    with signals_held():
        JSON_OUTPUT.written = True
        _write_whole(text)


def _write_whole(text: str) -> None:
    """Every byte of `text` on stdout. A write to a pipe that a signal interrupts returns short, and Python's buffered
    stdout then drops the rest (CPython 3.11: 64 KiB of a larger object came out), so the bytes go to the file
    descriptor one write after another until all are out; a stdout without one (a test's) is written as it is."""
    stream = sys.stdout
    try:
        descriptor = stream.fileno()
    except (AttributeError, OSError, ValueError):
        click.echo(text, nl=False)
        return
    data = memoryview(text.encode("utf-8"))
    try:
        stream.flush()
        while data:
            data = data[os.write(descriptor, data) :]
    except OSError as error:
        raise StdoutLost(error.strerror or str(error)) from None


class StdoutLost(Exception):
    """stdout cannot be written (a full disk, a closed pipe): the result is lost, which is no bug of trtfuse's."""


class _GuardedStdout:
    """sys.stdout whose write and flush failures are a `StdoutLost` (an OSError elsewhere is a bug)."""

    def __init__(self, stream: object) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except OSError as error:
            raise StdoutLost(error.strerror or str(error)) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except OSError as error:
            raise StdoutLost(error.strerror or str(error)) from None

    def __getattr__(self, name: str) -> object:
        return getattr(self._stream, name)


@contextlib.contextmanager
def guarded_stdout() -> Iterator[None]:
    """While the block runs, a write to stdout that fails raises `StdoutLost`; afterwards stdout, if lost, leads to
    /dev/null, so that the interpreter's last flush at exit does not print a traceback of its own."""
    stream = sys.stdout
    sys.stdout = _GuardedStdout(stream)
    try:
        yield
    except StdoutLost:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
        raise
    finally:
        sys.stdout = stream


def printable(text: str) -> str:
    """`text` with control characters (from node or tensor names in a user's file) escaped, safe for a terminal."""
    return "".join(char if char.isprintable() else char.encode("unicode_escape").decode("ascii") for char in text)
