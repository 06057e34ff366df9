"""`trtfuse run --leak-check N`: is GPU memory still taken after an engine ran over N token-count changes and was
torn down? NVIDIA/TensorRT#4849 reports exactly that for AOT plugins (TensorRT 11.1 and 11.2.1): every input-shape
change in an execution context leaks a CUDA module, and the memory stays after the context, engine and runtime are
destroyed.

The measurement (`measure_leak`) takes the TensorRT-facing pieces as callables, so its schedule, arithmetic and
verdict run on any machine; `gpu_memory_in_use` and `engine_session` are the thin CUDA and TensorRT layer.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from trtfuse.contract import PluginKind
from trtfuse.engine.cuda_timing import gpu_memory_in_use
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile, profile_holds
from trtfuse.engine.session import EngineSession
from trtfuse.engine.sidecar import sidecar_path_for
from trtfuse.engine.tensorrt import import_tensorrt
from trtfuse.engine.timing_cases import profile_dims
from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.model.dims import DimRole, ModelDims, model_dims
from trtfuse.model.feeds import make_feed
from trtfuse.model.onnx_file import load_model

Feed = Mapping[str, np.ndarray]
Run = Callable[[Feed], None]
# Opens TensorRT (runtime, engine, execution context) and yields a function that runs one feed; leaving the context
# destroys all of it.
Session = Callable[[], AbstractContextManager[Run]]

# The CUDA driver hands out device memory in 2 MiB pages, so cudaMemGetInfo moves in such steps whatever was freed;
# a growth of two pages after teardown is more than rounding can explain in either direction.
DRIVER_PAGE_BYTES = 2 << 20
LEAK_THRESHOLD_BYTES = 2 * DRIVER_PAGE_BYTES
# The counts the schedule cycles through: a few, so the feeds are few to generate, and each one comes back many
# times (#4849: returning to a shape already used leaks again, which a per-shape cache would not).
MAX_TOKEN_COUNTS = 8
ISSUE = "NVIDIA/TensorRT#4849"


def token_schedule(low: int, high: int, changes: int) -> list[int]:
    """`changes + 1` token counts, each different from the one before: a cycle through up to MAX_TOKEN_COUNTS counts
    spread over low..high, both ends included."""
    if changes < 1:
        raise TrtfuseError(f"the leak check needs at least one token-count change, got {changes}")
    if high <= low:
        raise TrtfuseError(f"the leak check needs a token range, got {low}..{high}")
    count = min(high - low + 1, MAX_TOKEN_COUNTS, changes + 1)
    counts = sorted({low + round(index * (high - low) / (count - 1)) for index in range(count)})
    return [counts[index % len(counts)] for index in range(changes + 1)]


@dataclass(frozen=True)
class LeakMeasurement:
    """GPU memory in use (bytes, device-wide) before TensorRT existed, after a reference session that ran as often at
    the first token count only, and after the session over the schedule; each session torn down before reading."""

    token_counts: tuple[int, ...]
    before: int
    after_reference: int
    after_changes: int

    @property
    def changes(self) -> int:
        return sum(a != b for a, b in itertools.pairwise(self.token_counts))

    @property
    def total_growth(self) -> int:
        """What #4849 measures: from before TensorRT to after the session over the changes."""
        return self.after_changes - self.before

    @property
    def one_time(self) -> int:
        """What a session without a change left: libraries, TensorRT's own caches (loaded once per process)."""
        return self.after_reference - self.before

    @property
    def growth_from_changes(self) -> int:
        return self.after_changes - self.after_reference

    @property
    def per_change(self) -> float:
        return self.growth_from_changes / self.changes


def measure_leak(
    memory_in_use: Callable[[], int],
    open_session: Session,
    token_counts: Sequence[int],
    feed_for: Callable[[int], Feed],
) -> LeakMeasurement:
    """Read memory, run a reference session (as many runs as `token_counts`, all at its first count), read, run a
    session over `token_counts`, read. The reference takes the one-time costs out of what the changes are charged."""
    before = memory_in_use()
    with open_session() as run:
        for _ in token_counts:
            run(feed_for(token_counts[0]))
    after_reference = memory_in_use()
    with open_session() as run:
        for tokens in token_counts:
            run(feed_for(tokens))
    after_changes = memory_in_use()
    return LeakMeasurement(tuple(token_counts), before, after_reference, after_changes)


def _size(size: float, signed: bool = False) -> str:
    """Bytes in MiB, or KiB below one MiB (a leak per change is often that small)."""
    sign = "+" if signed else ""
    if abs(size) < 1 << 20:
        return f"{size / (1 << 10):{sign}.1f} KiB"
    return f"{size / (1 << 20):{sign}.1f} MiB"


@dataclass(frozen=True)
class LeakCheckReport:
    engine_path: Path
    plugin_kind: PluginKind
    tensorrt_version: str
    profile: str
    measurement: LeakMeasurement
    threshold_bytes: int = LEAK_THRESHOLD_BYTES

    @property
    def leaked(self) -> bool:
        return self.measurement.growth_from_changes >= self.threshold_bytes

    def verdict(self) -> str:
        m = self.measurement
        growth = (
            f"{_size(m.growth_from_changes, signed=True)} after {m.changes} token-count changes "
            f"({_size(m.per_change, signed=True)} per change)"
        )
        if self.leaked:
            return (
                f"LEAK: {growth} beyond a session without changes, at or over the {_size(self.threshold_bytes)} "
                f"threshold; {ISSUE} (docs/aot.md says what to do)"
            )
        return (
            f"no leak: {growth}, under the {_size(self.threshold_bytes)} threshold (two 2 MiB driver pages); a leak "
            f"under {_size(self.threshold_bytes / m.changes)} per change would not show, so give more changes to see "
            "one"
        )

    def lines(self) -> list[str]:
        m = self.measurement
        counts = sorted(set(m.token_counts))
        return [
            f"leak check of {self.engine_path} ({self.plugin_kind.value} plugins, TensorRT {self.tensorrt_version}), "
            f"profile '{self.profile}': {m.changes} token-count changes through {len(counts)} counts "
            f"({', '.join(map(str, counts))})",
            f"GPU memory in use: {_size(m.before)} before TensorRT; {_size(m.one_time, signed=True)} after a "
            f"session at {m.token_counts[0]} tokens only (one-time costs); {_size(m.total_growth, signed=True)} after "
            "the session with the changes (each session torn down: context, engine, runtime)",
            self.verdict(),
        ]

    def to_json(self) -> dict:
        m = self.measurement
        return {
            "engine": str(self.engine_path),
            "plugins": self.plugin_kind.value,
            "tensorrt": self.tensorrt_version,
            "profile": self.profile,
            "token_counts": list(m.token_counts),
            "changes": m.changes,
            "bytes_in_use": {
                "before": m.before,
                "after_reference": m.after_reference,
                "after_changes": m.after_changes,
            },
            "bytes_leaked": m.growth_from_changes,
            "bytes_leaked_per_change": m.per_change,
            "bytes_leaked_total": m.total_growth,
            "threshold_bytes": self.threshold_bytes,
            "leaked": self.leaked,
            "verdict": self.verdict(),
        }


@dataclass(frozen=True)
class TokenRange:
    """The profile a leak check runs in and its token range, read off an input dim that is a tokens symbol."""

    profile_index: int
    profile: Profile
    symbols: tuple[str, ...]
    low: int
    high: int


def token_range(engine: EngineFile, reading: ModelDims) -> TokenRange:
    """The first profile of the engine whose token count varies (a prefill or `--tokens` profile, not decode)."""
    symbols = tuple(reading.symbols(DimRole.TOKENS))
    axes = [
        (name, axis)
        for name, parsed in reading.expressions.items()
        for axis, expression in enumerate(parsed)
        if expression is not None and expression.symbol in symbols
    ]
    if not axes:
        raise TrtfuseError(
            f"{engine.path}: no input of its model has a tokens dim (a symbol named like sequence or tokens); the "
            "leak check varies the token count"
        )
    for index, profile in enumerate(engine.profiles):
        bounds = [(profile.shapes[name].min[axis], profile.shapes[name].max[axis]) for name, axis in axes]
        low, high = max(low for low, _ in bounds), min(high for _, high in bounds)
        if high > low:
            return TokenRange(index, profile, symbols, low, high)
    ranges = "; ".join(f"{profile.name}: {profile.shapes[axes[0][0]]}" for profile in engine.profiles)
    raise OptionError(
        "tokens",
        f"{engine.path}: every optimisation profile fixes the token count ({ranges}); build the engine with a profile "
        "whose ",
        Choice("tokens"),
        " range has more than one value",
    )


def feeds_by_tokens(
    model: onnx.ModelProto, reading: ModelDims, seed: int, tokens: TokenRange, counts: Sequence[int]
) -> dict[int, Feed]:
    """One feed of the engine's fused model per token count, every other dim at the profile's OPT; each must fit the
    profile."""
    base = profile_dims(reading, tokens.profile, tokens.symbols)
    feeds = {}
    for count in sorted(set(counts)):
        feed = make_feed(model, seed, dims={**base, **dict.fromkeys(tokens.symbols, count)})
        if not profile_holds(tokens.profile, feed):
            raise TrtfuseError(
                f"the feed at {count} tokens does not fit profile '{tokens.profile.name}' "
                f"({', '.join(f'{name}={value.shape}' for name, value in feed.items())})"
            )
        feeds[count] = feed
    return feeds


@contextlib.contextmanager
def engine_session(engine: EngineFile, profile_index: int) -> Iterator[Run]:
    """The engine in a new runtime with one execution context held in `profile_index`; on leaving, context, engine
    and runtime destroyed and collected (`EngineSession`)."""
    with EngineSession(engine, profile_index) as session:
        yield session.infer


def leak_check_engine_file(engine_path: Path, changes: int, seed: int = 0) -> LeakCheckReport:
    """`trtfuse run --leak-check N`: the engine over `changes` token-count changes in its first profile with a token
    range, measured against a session without changes."""
    engine = EngineFile.open(engine_path)
    if engine.sidecar is None:
        raise TrtfuseError(
            f"{engine_path}: no sidecar beside the engine ({sidecar_path_for(engine_path).name}, written by trtfuse "
            "compile): the leak check reads the fused model and the token range of the profiles from it"
        )
    # TensorRT first: without it there is nothing to check, and that comes before any question about the inputs.
    import_tensorrt()
    model = load_model(engine.fused_model_path).model
    reading = model_dims(model)
    tokens = token_range(engine, reading)
    counts = token_schedule(tokens.low, tokens.high, changes)
    feeds = feeds_by_tokens(model, reading, seed, tokens, counts)
    # TensorRT imported, not started: the first reading is before any runtime exists.
    version = import_tensorrt().__version__
    measurement = measure_leak(
        gpu_memory_in_use, lambda: engine_session(engine, tokens.profile_index), counts, feeds.__getitem__
    )
    return LeakCheckReport(engine_path, engine.plugin_kind, version, tokens.profile.name, measurement)
