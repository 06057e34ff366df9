"""TensorRT optimisation profiles derived from the symbolic input dims of an ONNX model.

`trtfuse.model.dims` says what each symbolic dim means: a role from its name (batch, tokens of this call, past
tokens in the KV cache, total = past + tokens) or a value the graph requires (a cache's head count or head size).
A profile fixes a MIN:OPT:MAX range per role; every input shape follows from it, so dims that share a name share a
range, and a dim written as arithmetic (`past_sequence_length + sequence_length`) is evaluated at MIN, OPT and MAX.
The command line's specs are parsed into these ranges by trtfuse/cli/options.py (syntax: docs/engine.md).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import onnx

from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.model.dims import (
    DimExpressionError,
    DimRole,
    ModelDims,
    model_dims,
    position_warning,
    stated_positions,
)


@dataclass(frozen=True)
class DimRange:
    min: int
    opt: int
    max: int

    def __add__(self, other: DimRange) -> DimRange:
        return DimRange(self.min + other.min, self.opt + other.opt, self.max + other.max)

    def __str__(self) -> str:
        return f"{self.min}:{self.opt}:{self.max}"


@dataclass(frozen=True)
class ShapeRange:
    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def __str__(self) -> str:
        return ":".join("x".join(str(d) for d in shape) for shape in (self.min, self.opt, self.max))


@dataclass(frozen=True)
class RoleRanges:
    """What varies between the profiles of one engine: the token and past-length ranges, and whether the user gave
    each (a given range is never cut to the model's positions; a preset's or default one may be)."""

    name: str
    tokens: DimRange
    past: DimRange
    tokens_given: bool = False
    past_given: bool = False


DEFAULT_PAST = DimRange(0, 256, 4096)
DEFAULT_TOKENS = DimRange(1, 256, 4096)
NO_PAST = DimRange(0, 0, 0)
PRESETS = {
    "default": RoleRanges("default", DEFAULT_TOKENS, DEFAULT_PAST),
    "decode": RoleRanges("decode", DimRange(1, 1, 1), DEFAULT_PAST),
    "prefill": RoleRanges("prefill", DEFAULT_TOKENS, NO_PAST),
}


@dataclass(frozen=True)
class ProfileRequest:
    """Everything the user said about profiles: one RoleRanges per profile, plus what holds in all of them.

    `batch` None means the model's default (`ModelDims.default_batch`); `past_given` and `tokens_given` record that
    the user gave a past / tokens range, so that a conflicting input shape or a model without a KV cache is an error
    rather than a silently ignored choice.
    """

    profiles: tuple[RoleRanges, ...] = (PRESETS["default"],)
    batch: DimRange | None = None
    shapes: Mapping[str, ShapeRange] = field(default_factory=dict)
    past_given: bool = False
    tokens_given: bool = False
    # The positions the model was trained for, stated where its metadata records none (`dims.stated_positions`).
    positions: int | None = None


@dataclass(frozen=True)
class Profile:
    """Per input, its shape range; per length input of a fixed shape (genai's `past_sequence_length`,
    `total_sequence_length`), the range of its values, one entry per element, as TensorRT's shape-input ranges."""

    name: str
    shapes: dict[str, ShapeRange]
    values: dict[str, ShapeRange] = field(default_factory=dict)

    def opt_shapes(self) -> dict[str, tuple[int, ...]]:
        return {name: shape.opt for name, shape in self.shapes.items()}

    def to_json(self) -> dict:
        def ranges(items: Mapping[str, ShapeRange]) -> dict:
            return {name: {"min": list(s.min), "opt": list(s.opt), "max": list(s.max)} for name, s in items.items()}

        return {
            "name": self.name,
            "shapes": ranges(self.shapes),
            **({"values": ranges(self.values)} if self.values else {}),
        }

    @staticmethod
    def from_json(data: Mapping) -> Profile:
        def ranges(items: Mapping) -> dict[str, ShapeRange]:
            return {name: ShapeRange(tuple(s["min"]), tuple(s["opt"]), tuple(s["max"])) for name, s in items.items()}

        return Profile(name=data["name"], shapes=ranges(data["shapes"]), values=ranges(data.get("values", {})))


def request_from_options(
    presets: Sequence[str] = (),
    tokens: Sequence[DimRange] = (),
    batch: DimRange | None = None,
    past: DimRange | None = None,
    shapes: Mapping[str, ShapeRange] | None = None,
    positions: int | None = None,
) -> ProfileRequest:
    """The user's view: one profile per preset and per token range; batch, past and shapes apply to all.

    `past` sets the past range of every profile that has one (all but `prefill`, whose past is 0 by definition);
    `positions` states the positions the model was trained for, warned past as its metadata's would be.
    """
    past_range = past if past is not None else DEFAULT_PAST
    profiles = []
    past_given = past is not None
    for preset in presets:
        if preset not in PRESETS:
            raise TrtfuseError(f"unknown profile {preset!r}; choose from {', '.join(PRESETS)}")
        ranges = PRESETS[preset]
        if ranges.past != NO_PAST:
            ranges = RoleRanges(ranges.name, ranges.tokens, past_range, past_given=past_given)
        profiles.append(ranges)
    for token_range in tokens:
        profiles.append(RoleRanges(f"tokens {token_range}", token_range, past_range, True, past_given))
    if not profiles:
        profiles.append(RoleRanges("default", DEFAULT_TOKENS, past_range, past_given=past_given))
    names = [p.name for p in profiles]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise TrtfuseError(f"profile {duplicates[0]!r} is asked for twice")
    return ProfileRequest(
        profiles=tuple(profiles),
        batch=batch,
        shapes=dict(shapes or {}),
        past_given=past is not None,
        tokens_given=bool(tokens),
        positions=positions,
    )


NO_CACHE_DECODE = (
    "profile {name!r}: the model has no KV cache (no past_key_values inputs), so a 1-token profile is no decode step: "
    "without a cache each new token needs the whole sequence run again, which this profile cannot hold; export the "
    "model with a cache for decoding (models/export.py --cache, or optimum-cli export onnx --task "
    "text-generation-with-past); the engine is built as asked"
)


def profile_warnings(model: onnx.ModelProto, request: ProfileRequest) -> list[str]:
    """One line per requested profile that cannot do what its name says (a decode profile on a model without a KV
    cache), and one for the profiles that reach past the positions the model was trained for. The build still goes
    on; the caller shows the lines."""
    reading = stated_positions(model_dims(model), request.positions)
    lines = []
    if not reading.has_kv_cache:
        lines = [
            NO_CACHE_DECODE.format(name=ranges.name)
            for ranges in request.profiles
            if ranges.name == "decode" or ranges.tokens == DimRange(1, 1, 1)
        ]
    totals = {
        ranges.name: ranges.tokens.max + (ranges.past.max if reading.has_kv_cache else 0)
        for ranges in _role_ranges(reading, request)
    }
    declared = reading.declared_positions
    past_it = [name for name, total in totals.items() if declared is not None and total > declared.value]
    if past_it:
        names = ", ".join(repr(name) for name in past_it)
        what = f"profile{'s' if len(past_it) > 1 else ''} {names} reach{'' if len(past_it) > 1 else 'es'} up to"
        line = position_warning(reading, max(totals[name] for name in past_it), what)
        lines.append(f"{line}; give token and past ranges whose MAX add up to at most {declared.value}")
    return lines


def _role_ranges(reading: ModelDims, request: ProfileRequest) -> list[RoleRanges]:
    """Each requested profile's token and past ranges as its shapes are derived: the sizes given shapes set, then cut
    to the positions the graph holds."""
    given = _ranges_from_shapes(reading, request.shapes)
    return [_within_positions(_with_given(requested, given), reading) for requested in request.profiles]


def _check_override(value: onnx.ValueInfoProto, shape_range: ShapeRange) -> None:
    dims = value.type.tensor_type.shape.dim
    if len(dims) != len(shape_range.min):
        raise OptionError(
            "shape",
            Choice("shape"),
            f" {value.name}: the input has rank {len(dims)}, the shapes have {len(shape_range.min)}",
        )
    for axis, dim in enumerate(dims):
        fixed = dim.dim_value if dim.HasField("dim_value") else None
        if fixed is not None and {shape_range.min[axis], shape_range.opt[axis], shape_range.max[axis]} != {fixed}:
            raise OptionError("shape", Choice("shape"), f" {value.name}: dim {axis} is fixed at {fixed} in the model")


# The roles each range sets: a shape given for an input with such a dim contradicts the range.
_RANGE_ROLES = {
    "tokens": (DimRole.TOKENS, DimRole.TOTAL),
    "past": (DimRole.PAST, DimRole.TOTAL),
    "batch": (DimRole.BATCH,),
}


def _check_flags(reading: ModelDims, request: ProfileRequest) -> None:
    if request.past_given and not reading.has_kv_cache:
        raise OptionError(
            "past",
            Choice("past"),
            ": the model has no KV cache (no input dim or length input named like past_sequence_length); drop ",
            Choice("past"),
        )
    given = {"tokens": request.tokens_given, "past": request.past_given, "batch": request.batch is not None}
    for name in request.shapes:
        for expression in reading.expressions[name]:
            for symbol in sorted(expression.symbols) if expression is not None else ():
                role = reading.roles.get(symbol)
                setter = next((r for r, roles in _RANGE_ROLES.items() if given[r] and role in roles), None)
                if setter is not None:
                    raise OptionError(
                        "shape",
                        Choice("shape"),
                        f" {name} fixes dim {expression.text!r}, which ",
                        Choice(setter),
                        " also sets; give one or the other",
                    )
    if request.batch is not None and reading.batch is not None:
        required = reading.batch.value
        if (request.batch.min, request.batch.max) != (required, required):
            raise OptionError(
                "batch",
                Choice("batch"),
                f" {request.batch}: the model allows only batch {required} ({reading.batch.reason})",
            )


def _batch_range(reading: ModelDims, request: ProfileRequest) -> DimRange:
    """The batch range asked for, else the model's one rule: exactly the batch it requires, or 1 up to the default."""
    if request.batch is not None:
        return request.batch
    batch = reading.default_batch()
    return DimRange(batch, batch, batch) if reading.batch is not None else DimRange(1, batch, batch)


def _dim_range(
    input_name: str,
    axis: int,
    dim: onnx.TensorShapeProto.Dimension,
    reading: ModelDims,
    ranges: Mapping[DimRole, DimRange],
) -> DimRange:
    if dim.HasField("dim_value"):
        return DimRange(dim.dim_value, dim.dim_value, dim.dim_value)
    return _symbolic_range(input_name, axis, reading, ranges)


def _symbolic_range(input_name: str, axis: int, reading: ModelDims, ranges: Mapping[DimRole, DimRange]) -> DimRange:
    expression = reading.expressions[input_name][axis]
    hint = ("; give its shape with ", Choice("shape"), f" {input_name}=MIN:OPT:MAX")
    if expression is None:
        raise OptionError("shape", f"input {input_name!r} dim {axis} is an unnamed dynamic dim", *hint)
    for symbol in sorted(expression.symbols):
        if symbol not in reading.roles and symbol not in reading.fixed:
            raise OptionError(
                "shape",
                f"input {input_name!r} dim {axis} is symbolic dim {expression.text!r} with no known role (batch, "
                "sequence/tokens, past, total) nor a value the graph requires",
                *hint,
            )
    bounds = []
    for pick in (lambda r: r.min, lambda r: r.opt, lambda r: r.max):
        values = {symbol: pick(ranges[role]) for symbol, role in reading.roles.items()}
        values.update({symbol: bound.value for symbol, bound in reading.fixed.items()})
        try:
            bounds.append(expression.evaluate(values))
        except DimExpressionError as error:
            raise OptionError(
                "shape", f"input {input_name!r} dim {axis} ({expression.text!r}): {error}", *hint
            ) from None
    low, opt, high = bounds
    if not 0 <= low <= opt <= high:
        raise OptionError(
            "shape",
            f"input {input_name!r} dim {axis} ({expression.text!r}) spans {low}:{opt}:{high}, not a range of sizes",
            *hint,
        )
    return DimRange(low, opt, high)


def _within_positions(role_ranges: RoleRanges, reading: ModelDims) -> RoleRanges:
    """Ranges whose every shape fits the positions the model holds (rotary cos cache, position table).

    What the user left at its default is cut to fit: with neither range given, MAX tokens to half the positions when
    there is a past (all of them otherwise) and MAX past to the rest; with one given, the other to what it leaves;
    OPT to at most MAX. Given ranges that do not fit are an error.
    """
    bound = reading.max_total
    past = role_ranges.past if reading.has_kv_cache else NO_PAST
    tokens = role_ranges.tokens
    if bound is None or tokens.max + past.max <= bound.value:
        return role_ranges
    n = bound.value
    past_given = role_ranges.past_given and past != NO_PAST
    if role_ranges.tokens_given and not past_given:
        tokens_max, past_max = tokens.max, n - tokens.max
    elif past_given and not role_ranges.tokens_given:
        tokens_max, past_max = n - past.max, past.max
    elif not past_given:
        tokens_max = min(tokens.max, max(tokens.min, n // 2 if past.max else n))
        past_max = min(past.max, n - tokens_max)
    else:
        tokens_max, past_max = -1, -1
    if tokens_max < tokens.min or past_max < past.min:
        raise OptionError(
            "tokens",
            f"profile {role_ranges.name!r}: {past.max} past + {tokens.max} new tokens at MAX exceed what the model "
            f"holds ({bound.reason}); give ",
            Choice("tokens"),
            " and ",
            Choice("past"),
            f" whose MAX add up to at most {n}",
        )
    return RoleRanges(
        role_ranges.name,
        DimRange(tokens.min, min(tokens.opt, tokens_max), tokens_max),
        DimRange(past.min, min(past.opt, past_max), past_max),
        role_ranges.tokens_given,
        role_ranges.past_given,
    )


def _ranges_from_shapes(reading: ModelDims, shapes: Mapping[str, ShapeRange]) -> dict[DimRole, DimRange]:
    """The role ranges given shapes set: an axis that is one symbol of a role (`input_ids [batch_size,
    sequence_length]`) gives that role its sizes in every profile, so the other inputs follow. Two shapes that give
    one role different sizes are refused."""
    found: dict[DimRole, tuple[DimRange, str]] = {}
    for name, shape in shapes.items():
        for axis, expression in enumerate(reading.expressions[name]):
            symbol = expression.symbol if expression is not None else None
            role = reading.roles.get(symbol) if symbol is not None else None
            if role is None:
                continue
            given = DimRange(shape.min[axis], shape.opt[axis], shape.max[axis])
            where = f"{name} dim {axis} ({symbol!r})"
            if role in found and found[role][0] != given:
                seen, seen_where = found[role]
                raise OptionError(
                    "shape",
                    Choice("shape"),
                    f" gives {where} {given} and {seen_where} {seen}: both are the {role.value} of one call; "
                    "give sizes that agree",
                )
            found.setdefault(role, (given, where))
    return {role: given for role, (given, _where) in found.items()}


def _with_given(requested: RoleRanges, given: Mapping[DimRole, DimRange]) -> RoleRanges:
    """`requested` with the tokens and past the given shapes set (a total with the tokens sets the past); a range
    taken from a shape counts as given, so the position limit is not cut into it."""
    tokens = given.get(DimRole.TOKENS, requested.tokens)
    past = given.get(DimRole.PAST, requested.past)
    total = given.get(DimRole.TOTAL)
    if total is not None and DimRole.PAST not in given:
        past = DimRange(total.min - tokens.min, total.opt - tokens.opt, total.max - tokens.max)
        if not 0 <= past.min <= past.opt <= past.max:
            raise OptionError(
                "shape",
                Choice("shape"),
                f" gives the total length (past + tokens) {total}, and profile {requested.name!r} has tokens "
                f"{tokens}: that leaves a past of {past}, not a range of sizes; give the tokens' input a shape too",
            )
    return RoleRanges(
        requested.name,
        tokens,
        past,
        requested.tokens_given or DimRole.TOKENS in given,
        requested.past_given or DimRole.PAST in given or total is not None,
    )


def _check_given_shapes(
    request: ProfileRequest,
    reading: ModelDims,
    ranges: Mapping[DimRole, DimRange],
    profile: str,
) -> None:
    """Every given shape must be what its dims are at the profile's ranges, on each axis whose symbols the model
    gives a role or a value (`attention_mask [batch, past + sequence]` against the tokens and past of the other
    inputs): a profile TensorRT would refuse at build time is refused here, in one line."""
    for name, given in request.shapes.items():
        for axis, expression in enumerate(reading.expressions[name]):
            if expression is None or not expression.symbols <= (reading.roles.keys() | reading.fixed.keys()):
                continue
            derived = _symbolic_range(name, axis, reading, ranges)
            wanted = DimRange(given.min[axis], given.opt[axis], given.max[axis])
            if derived != wanted:
                others = ", ".join(
                    f"{role.value} {ranges[role]}" for role in (DimRole.BATCH, DimRole.TOKENS, DimRole.PAST)
                )
                raise OptionError(
                    "shape",
                    Choice("shape"),
                    f" {name} gives dim {axis} ({expression.text!r}) {wanted}, but profile {profile!r} has {others}, "
                    f"which make it {derived}; give the related inputs' shapes too, or sizes that agree",
                )


def derive_profiles(model: onnx.ModelProto, request: ProfileRequest) -> list[Profile]:
    """One Profile per requested RoleRanges, covering every graph input; raises naming the input and dim at fault."""
    reading = model_dims(model)
    inputs = list(reading.inputs)
    known = {value.name for value in inputs}
    for name in request.shapes:
        if name not in known:
            inputs = ", ".join(sorted(known))
            raise OptionError("shape", Choice("shape"), f" {name}: the model has no such input (inputs: {inputs})")
    for value in inputs:
        if value.name in request.shapes:
            _check_override(value, request.shapes[value.name])
        elif not value.type.tensor_type.HasField("shape"):
            raise OptionError(
                "shape", f"input {value.name!r} has no static rank; give its shape with ", Choice("shape")
            )
    _check_flags(reading, request)
    given = _ranges_from_shapes(reading, request.shapes)
    batch = given.get(DimRole.BATCH) or _batch_range(reading, request)
    profiles = []
    for role_ranges in _role_ranges(reading, request):
        ranges = {
            DimRole.BATCH: batch,
            DimRole.TOKENS: role_ranges.tokens,
            DimRole.PAST: role_ranges.past,
            DimRole.TOTAL: role_ranges.past + role_ranges.tokens,
        }
        shapes = {}
        for value in inputs:
            if value.name in request.shapes:
                shapes[value.name] = request.shapes[value.name]
                continue
            dims = [
                _dim_range(value.name, axis, dim, reading, ranges)
                for axis, dim in enumerate(value.type.tensor_type.shape.dim)
            ]
            shapes[value.name] = ShapeRange(
                tuple(d.min for d in dims), tuple(d.opt for d in dims), tuple(d.max for d in dims)
            )
        _check_given_shapes(request, reading, ranges, role_ranges.name)
        profiles.append(Profile(role_ranges.name, shapes, _length_values(reading, shapes, ranges)))
    return profiles


def _length_values(
    reading: ModelDims, shapes: Mapping[str, ShapeRange], ranges: Mapping[DimRole, DimRange]
) -> dict[str, ShapeRange]:
    """The value ranges of length inputs whose shape is the same in the whole profile."""
    values = {}
    for name, role in reading.length_inputs.items():
        shape = shapes[name]
        if shape.min != shape.max:
            continue
        length = ranges[role]
        if name.lower().startswith("seqlens_k"):
            length = DimRange(max(length.min - 1, 0), max(length.opt - 1, 0), max(length.max - 1, 0))
        elements = math.prod(shape.min)
        values[name] = ShapeRange((length.min,) * elements, (length.opt,) * elements, (length.max,) * elements)
    return values


def profile_for_feed(profiles: Sequence[Profile], feed: Mapping[str, np.ndarray]) -> int:
    """The first profile whose ranges hold every fed shape; raises naming an input that no profile holds."""
    if not profiles:
        return 0
    for index, profile in enumerate(profiles):
        if profile_holds(profile, feed):
            return index
    outside = [name for name, array in feed.items() if not any(_shape_fits(p, name, array.shape) for p in profiles)]
    # When every shape fits some profile but no profile fits them all, the first input is as good a culprit as any.
    name = outside[0] if outside else next(iter(feed))
    shape = "x".join(str(dim) for dim in feed[name].shape)
    ranges = "; ".join(f"{p.name}: {p.shapes[name]}" for p in profiles if name in p.shapes)
    raise OptionError(
        "shape",
        f"input '{name}' of shape {shape} fits no optimisation profile of the engine together with the other inputs "
        f"({ranges}); pick shapes inside one profile with ",
        Choice("shape"),
        "/",
        Choice("dim"),
    )


def profile_holds(profile: Profile, feed: Mapping[str, np.ndarray]) -> bool:
    """Whether every fed shape lies in the profile's ranges."""
    return all(_shape_fits(profile, name, array.shape) for name, array in feed.items())


def _shape_fits(profile: Profile, name: str, shape: tuple[int, ...]) -> bool:
    if name not in profile.shapes:
        return True
    ranges = profile.shapes[name]
    return len(shape) == len(ranges.min) and all(
        low <= dim <= high for dim, low, high in zip(shape, ranges.min, ranges.max, strict=True)
    )
