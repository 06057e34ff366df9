"""trtexec's per-layer profile (`trtexec --exportProfile=FILE`), read and written in trtexec's own layout, and the
layer information written as trtexec writes it, so TensorRT Engine Explorer (trex) and users' scripts read both.

The profile is a JSON list: `{ "count" : N }` (the profiled iterations), then one record per layer in engine order,
`{ "name" : NAME, "timeMs" : TOTAL, "averageMs" : TOTAL / N, "medianMs" : MEDIAN, "percentage" : SHARE }`
(`Profiler::exportJSONProfile`, samples/common/sampleReporting.cpp of NVIDIA/TensorRT 10.16). `name` is the layer's
name in the layer information, ` [profile N]` included; older profiles lack `medianMs`. trtexec computes in float32
and prints C++ ostream defaults (6 significant digits, `0` for zero); `profile_text` does the same, so a profile
trtfuse writes is the one trtexec would write for the same per-iteration times, byte for byte, but for two cases
trtexec gets wrong: a name holding `"`, `\\` or a control character is escaped (trtexec writes it raw, which is not
JSON), and when every layer took 0 ms the percentages are 0 (trtexec divides 0 by 0 and prints `nan`).
"""

from __future__ import annotations

import json
import math
from collections import Counter, defaultdict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trtfuse.engine.layer_info import Layer, profile_of, read_text_file
from trtfuse.errors import TrtfuseError, first_line
from trtfuse.files import write_bytes_atomic

PROFILE_HINT = "expected what `trtexec --exportProfile=FILE` writes"


@dataclass(frozen=True)
class LayerTime:
    """One layer's record: total time over the profiled iterations, its average per iteration, the median (None in
    profiles written before trtexec recorded it) and the share of the sum of all layers' totals, in percent."""

    name: str
    time_ms: float
    average_ms: float
    median_ms: float | None
    percentage: float | None

    def to_json(self) -> dict[str, Any]:
        return {"average_ms": self.average_ms, "median_ms": self.median_ms}


@dataclass(frozen=True)
class LayerProfile:
    """A per-layer profile: the iteration count (None where the file gives none) and the layers' records in order."""

    source: str
    count: int | None
    layers: tuple[LayerTime, ...]

    @property
    def engine_profile(self) -> int:
        """The optimisation profile the timed layers belong to: the one most of their names carry (` [profile N]`)."""
        counts = Counter(profile_of(record.name) for record in self.layers)
        return counts.most_common(1)[0][0]

    def times_of(self, layers: Iterable[Layer]) -> dict[int, LayerTime]:
        """Each layer's record by the layer's index, joined on the name exactly; a name that repeats is paired in
        order (the first layer of that name with the first record of it)."""
        queues: dict[str, deque[LayerTime]] = defaultdict(deque)
        for record in self.layers:
            queues[record.name].append(record)
        return {layer.index: queues[layer.name].popleft() for layer in layers if queues.get(layer.name)}


def read_profile(path: Path) -> LayerProfile:
    """The profile in `path`; one line naming it for anything that is not a per-layer profile."""
    return parse_profile(read_text_file(path, "profile"), str(path))


def parse_profile(text: str, source: str = "the profile") -> LayerProfile:
    """trtexec's profile JSON, read: the count record and every layer record (4 or 5 keys, as trex keeps them);
    other records are left out, as trex leaves them out."""
    try:
        data = json.loads(text)
    except ValueError as error:
        raise TrtfuseError(f"{source}: not JSON ({first_line(error)}); {PROFILE_HINT}") from None
    if not isinstance(data, list):
        raise TrtfuseError(f"{source}: not a per-layer profile (not a JSON list); {PROFILE_HINT}")
    count = next((record["count"] for record in data if isinstance(record, dict) and set(record) == {"count"}), None)
    if count is not None and (not isinstance(count, int) or isinstance(count, bool) or count < 0):
        raise TrtfuseError(f'{source}: "count" is {count!r}, not a number of iterations')
    layers = tuple(_record(record, source) for record in data if isinstance(record, dict) and "name" in record)
    if not layers:
        raise TrtfuseError(f"{source}: not a per-layer profile (no record with a layer's name); {PROFILE_HINT}")
    return LayerProfile(source=source, count=count, layers=layers)


def _record(record: dict[str, Any], source: str) -> LayerTime:
    name = record["name"]
    if not isinstance(name, str):
        raise TrtfuseError(f'{source}: a record\'s "name" is {name!r}, not a layer name')

    def number(key: str, required: bool) -> float | None:
        value = record.get(key)
        if value is None and not required:
            return None
        if not isinstance(value, int | float) or isinstance(value, bool) or not math.isfinite(value):
            raise TrtfuseError(f"{source}: layer '{name}': \"{key}\" is {value!r}, not a number of milliseconds")
        return float(value)

    return LayerTime(
        name=name,
        time_ms=number("timeMs", True),
        average_ms=number("averageMs", True),
        median_ms=number("medianMs", False),
        percentage=number("percentage", False),
    )


@dataclass(frozen=True)
class LayerTimes:
    """One layer's time in each profiled iteration (what TensorRT's IProfiler reports), in milliseconds."""

    name: str
    times_ms: tuple[float, ...]


class LayerTimeCollector:
    """What an IProfiler hears, gathered as trtexec's profiler gathers it (`Profiler::reportLayerTime`): layers in
    the order first reported, one time per layer per iteration, a new iteration counted each time the first layer
    is reported again. `report` is the IProfiler callback's body (`report_layer_time(name, ms)`)."""

    def __init__(self) -> None:
        self._names: list[str] = []
        self._times: list[list[float]] = []
        self._next = 0
        self.count = 0

    def report(self, name: str, ms: float) -> None:
        if self._next == len(self._names):
            first = bool(self._names) and self._names[0] == name
            self.count += not self._names or first
            if first:
                self._next = 0
            else:
                self._names.append(name)
                self._times.append([])
        self._times[self._next].append(float(ms))
        self._next += 1

    def layer_times(self) -> tuple[LayerTimes, ...]:
        return tuple(LayerTimes(name, tuple(times)) for name, times in zip(self._names, self._times, strict=True))


def _ostream(value: np.float32) -> str:
    """A float as C++'s `std::ostream << float` prints it by default: 6 significant digits, `%g` style."""
    return f"{float(value):.6g}"


def _sequential_sum(values: np.ndarray) -> np.float32:
    """`std::accumulate` over float32 values from 0.F: left to right, rounded to float32 at each step."""
    return np.cumsum(values, dtype=np.float32)[-1] if len(values) else np.float32(0.0)


def _median(values: np.ndarray) -> np.float32:
    ordered = np.sort(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) * np.float32(0.5)


def profile_text(layers: Sequence[LayerTimes], count: int | None = None) -> str:
    """The profile trtexec's `--exportProfile` writes for these per-iteration times; `count` is the iteration count
    of its first record (`LayerTimeCollector.count`; by default the most times any layer has)."""
    arrays = []
    for layer in layers:
        times = np.asarray(layer.times_ms, dtype=np.float32)
        if not len(times) or not np.all(np.isfinite(times)) or np.any(times < 0):
            raise TrtfuseError(f"layer '{layer.name}': needs one finite, non-negative time per profiled iteration")
        arrays.append(times)
    totals = [_sequential_sum(times) for times in arrays]
    grand_total = _sequential_sum(np.asarray(totals, dtype=np.float32))
    iterations = count if count is not None else max((len(times) for times in arrays), default=0)
    lines = ["[", f'  {{ "count" : {iterations} }}']
    for layer, times, total in zip(layers, arrays, totals, strict=True):
        average = total / np.float32(len(times))
        share = total / grand_total * np.float32(100) if grand_total > 0 else np.float32(0)
        name = json.dumps(layer.name, ensure_ascii=False)
        lines.append(
            f', {{ "name" : {name}, "timeMs" : {_ostream(total)}, "averageMs" : {_ostream(average)}, '
            f'"medianMs" : {_ostream(_median(times))}, "percentage" : {_ostream(share)} }}'
        )
    lines.append("]")
    return "\n".join(lines) + "\n"


def write_profile(path: Path, layers: Sequence[LayerTimes], count: int | None = None) -> None:
    """`profile_text`, written atomically."""
    write_bytes_atomic(path, profile_text(layers, count).encode("utf-8"))


def write_layer_information(path: Path, text: str) -> None:
    """The engine inspector's JSON string written as is, as `trtexec --exportLayerInfo` writes it (no newline added,
    nothing re-encoded), atomically."""
    write_bytes_atomic(path, text.encode("utf-8"))
