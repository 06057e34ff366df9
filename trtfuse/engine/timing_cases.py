"""What an engine A/B times: each optimisation profile at its OPT shapes, and for a KV-cache model a decode step at
a few past lengths of its decode profile, each with one feed that both engines run.

Both engines come from the same export, so they take the same inputs: the feeds are made once, from the model
either engine was built from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx

from trtfuse.engine.profiles import Profile, profile_holds
from trtfuse.errors import TrtfuseError
from trtfuse.model.dims import DimRole, ModelDims, model_dims
from trtfuse.model.feeds import make_feed


@dataclass(frozen=True)
class TimingCase:
    """One shape set both engines run: its name in the table (`prefill`, `decode past=1024`), the profile that
    holds it (by index, in engine order) and the feed."""

    name: str
    profile_index: int
    profile: str
    feed: Mapping[str, np.ndarray]

    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: tuple(array.shape) for name, array in self.feed.items()}

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "profile": self.profile,
            "shapes": {name: list(shape) for name, shape in self.shapes().items()},
        }


def profile_dims(reading: ModelDims, profile: Profile, vary: Sequence[str] = ()) -> dict[str, int]:
    """Each plain symbol of the model's inputs at the profile's OPT value, except the symbols in `vary` and the
    totals (past + tokens), which a feed works out from the others."""
    dims: dict[str, int] = {}
    skipped = {*vary, *reading.symbols(DimRole.TOTAL)}
    for name, parsed in reading.expressions.items():
        for axis, expression in enumerate(parsed):
            symbol = expression.symbol if expression is not None else None
            if symbol is not None and symbol not in skipped and name in profile.shapes:
                dims.setdefault(symbol, profile.shapes[name].opt[axis])
    return dims


def _symbol_range(reading: ModelDims, profile: Profile, symbols: Sequence[str]) -> tuple[int, int, int] | None:
    """MIN, OPT and MAX of the first input axis that is one of `symbols`, in `profile`."""
    for name, parsed in reading.expressions.items():
        for axis, expression in enumerate(parsed):
            if expression is not None and expression.symbol in symbols and name in profile.shapes:
                shape = profile.shapes[name]
                return shape.min[axis], shape.opt[axis], shape.max[axis]
    return None


def _is_decode(reading: ModelDims, profile: Profile) -> bool:
    """A profile of one new token per sequence over a past that varies: what a generation's next steps run in."""
    tokens = _symbol_range(reading, profile, reading.symbols(DimRole.TOKENS))
    past = _symbol_range(reading, profile, reading.symbols(DimRole.PAST))
    return tokens is not None and tokens[2] == 1 and past is not None and past[0] != past[2]


def _case(model: onnx.ModelProto, seed: int, name: str, index: int, profile: Profile, **shape_or_dims) -> TimingCase:
    feed = make_feed(model, seed, **shape_or_dims)
    if not profile_holds(profile, feed):
        shapes = ", ".join(f"{input_name}={array.shape}" for input_name, array in feed.items())
        raise TrtfuseError(f"the {name} feed ({shapes}) does not fit profile '{profile.name}'")
    return TimingCase(name, index, profile.name, feed)


def timing_cases(model: onnx.ModelProto, profiles: Sequence[Profile], seed: int = 0) -> list[TimingCase]:
    """Every profile at its OPT shapes (named after the profile); then, for each decode profile of a KV-cache model,
    a decode step at its MIN and MAX past lengths where they differ from OPT (`decode past=4096`), so the table shows
    how a step's time grows with the cache."""
    reading = model_dims(model)
    cases = [
        _case(model, seed, profile.name, index, profile, shapes=profile.opt_shapes())
        for index, profile in enumerate(profiles)
    ]
    past_symbols = reading.symbols(DimRole.PAST)
    for index, profile in enumerate(profiles):
        if not reading.has_kv_cache or not _is_decode(reading, profile):
            continue
        low, opt, high = _symbol_range(reading, profile, past_symbols)
        base = profile_dims(reading, profile, vary=past_symbols)
        for past in sorted({low, high} - {opt}):
            dims = {**base, **dict.fromkeys(past_symbols, past)}
            cases.append(_case(model, seed, f"{profile.name} past={past}", index, profile, dims=dims))
    return cases
