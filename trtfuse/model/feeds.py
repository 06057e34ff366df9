"""Random inputs for a model: the same feed goes to every runtime that is compared.

Sizes come from `trtfuse.model.dims`: a dim with a role gets the step's value (batch, tokens, past, total = past +
tokens), a dim the graph requires (a cache's head count or head size, a window cache's capacity: the window at every
step, prefill included) gets that value, any other `DEFAULT_DIM`.
A KV-cache model is checked at two steps, a prefill (past 0) and a decode (one token after `DEFAULT_DIM` past ones).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper

from trtfuse.errors import Choice, OptionError, TrtfuseError
from trtfuse.model.dims import DEFAULT_BATCH, DimExpressionError, DimRole, ModelDims, dim_role, model_dims

__all__ = [
    "DECODE",
    "DEFAULT_BATCH",
    "DEFAULT_DIM",
    "PREFILL",
    "SINGLE",
    "Step",
    "StepFeed",
    "default_feeds",
    "make_feed",
]

# Tokens of a prefill step, past of a decode step, and every dim without a role or a required value.
DEFAULT_DIM = 5
# More than this in one feed is a typo in a dim, not a check anyone means to run on a CPU.
MAX_FEED_BYTES = 16 * 2**30
SEED_LIMIT = 2**64


@dataclass(frozen=True)
class Step:
    """One call of the model: how many new tokens, after how many in the KV cache."""

    name: str
    tokens: int
    past: int


PREFILL = Step("prefill", tokens=DEFAULT_DIM, past=0)
DECODE = Step("decode", tokens=1, past=DEFAULT_DIM)
# The one feed of a model without a KV cache (its past is 0 whatever this says); for a cached model, past 5, tokens 5.
SINGLE = Step("single", tokens=DEFAULT_DIM, past=DEFAULT_DIM)


@dataclass(frozen=True)
class StepFeed:
    """The feed of one step and the value every symbolic dim of the inputs took in it."""

    step: str
    dims: dict[str, int]
    feed: dict[str, np.ndarray]


def default_feeds(
    model: onnx.ModelProto,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> list[StepFeed]:
    """The feeds `check` and `compare` run by default: PREFILL then DECODE for a KV-cache model, else SINGLE.

    `dims` and `shapes` hold in every step. Where they fix the past (a past or total dim, a cache input's shape or a
    length input's shape), there is one step, SINGLE, of exactly those sizes.
    """
    shapes = dict(shapes or {})
    dims = dict(dims or {})
    reading = model_dims(model)
    past_symbols = {*reading.symbols(DimRole.PAST), *reading.symbols(DimRole.TOTAL)}
    past_given = bool(past_symbols & set(dims)) or bool(set(shapes) & {*reading.cache_inputs, *reading.length_inputs})
    steps = (PREFILL, DECODE) if reading.has_kv_cache and not past_given else (SINGLE,)
    return [_step_feed(model, reading, seed, shapes, dims, step) for step in steps]


def make_feed(
    model: onnx.ModelProto,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
    step: Step = SINGLE,
) -> dict[str, np.ndarray]:
    """One random array per graph input, at `step`'s sizes unless `dims` (symbol -> value) or `shapes` (input ->
    whole shape) say otherwise. Token ids stay below the vocabulary size of the embedding Gather they feed; masks
    are all ones; position ids count up from the past length; length inputs (`past_sequence_length`,
    `total_sequence_length`, `seqlens_k`) hold the step's lengths. Every problem is a one-line TrtfuseError naming the
    input, dim or option."""
    return _step_feed(model, model_dims(model), seed, dict(shapes or {}), dict(dims or {}), step).feed


def check_seed(seed: int) -> None:
    """A seed numpy's generators take: an integer from 0 to 2**64 - 1; else one line naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or not 0 <= seed < SEED_LIMIT:
        raise OptionError("seed", Choice("seed"), f" {seed}: must be an integer from 0 to {SEED_LIMIT - 1}")


def _step_feed(
    model: onnx.ModelProto,
    reading: ModelDims,
    seed: int,
    shapes: dict[str, Sequence[int]],
    dims: dict[str, int],
    step: Step,
) -> StepFeed:
    check_seed(seed)
    names = {value.name for value in reading.inputs}
    unknown = sorted(set(shapes) - names)
    if unknown:
        inputs = ", ".join(sorted(names))
        raise OptionError("shape", Choice("shape"), f" names no graph input: {', '.join(unknown)} (inputs: {inputs})")
    symbols = {s for parsed in reading.expressions.values() for e in parsed if e is not None for s in e.symbols}
    unknown = sorted(set(dims) - symbols)
    if unknown:
        known = ", ".join(sorted(symbols)) or "none"
        raise OptionError(
            "dim", Choice("dim"), f" names no symbolic dim of a graph input: {', '.join(unknown)} (dims: {known})"
        )
    for symbol, value in dims.items():
        if not isinstance(value, int | np.integer) or value < 0:
            raise OptionError("dim", Choice("dim"), f" {symbol}={value}: a dim is a non-negative integer")
        if value == 0 and dim_role(symbol) in _NEVER_EMPTY:
            raise OptionError("dim", Choice("dim"), f" {symbol}=0: {_EMPTY_CALL[dim_role(symbol)]}")
    values = _symbol_values(reading, shapes, dims, step)
    input_shapes = {value.name: _input_shape(value, reading, shapes, values) for value in reading.inputs}
    _check_relations(reading, shapes, dims, values, step)
    _check_not_empty(shapes, reading)
    _check_size(input_shapes, reading)
    tokens = _role_value(reading, values, DimRole.TOKENS)
    past = _past(reading, values, step.past if reading.has_kv_cache else 0)
    if reading.max_total is not None and tokens is not None and past + tokens > reading.max_total.value:
        raise OptionError(
            "dim",
            f"{step.name} step: {past} past + {tokens} new tokens exceed what the model holds "
            f"({reading.max_total.reason}); set smaller dims with ",
            Choice("dim"),
        )
    rng = np.random.default_rng(seed)
    index_bounds = _gather_index_bounds(model)
    feed = {}
    for value in reading.inputs:
        dtype = _numpy_dtype(value)
        shape = input_shapes[value.name]
        length_role = reading.length_inputs.get(value.name)
        if length_role is not None:
            feed[value.name] = _length_array(value.name, shape, dtype, length_role, past, tokens)
        else:
            bound = index_bounds.get(value.name)
            feed[value.name] = _random_array(value.name, shape, dtype, bound, past, rng)
    return StepFeed(step=step.name, dims=values, feed=feed)


def _symbol_values(
    reading: ModelDims, shapes: Mapping[str, Sequence[int]], dims: Mapping[str, int], step: Step
) -> dict[str, int]:
    """Every symbol's value: the dims given, then what a given shape binds, then what the model requires, then
    its role's."""
    values = dict(dims)
    bound_by: dict[str, str] = {}
    for name, shape in shapes.items():
        for axis, expression in enumerate(reading.expressions[name]):
            symbol = expression.symbol if expression is not None else None
            if symbol is None or symbol in dims or axis >= len(shape):
                continue
            if symbol in values and values[symbol] != shape[axis]:
                raise OptionError(
                    "shape",
                    Choice("shape"),
                    f" {name} gives dim {symbol!r} = {shape[axis]}, ",
                    Choice("shape"),
                    f" {bound_by[symbol]} gives {values[symbol]}; make them agree or set it with ",
                    Choice("dim"),
                    f" {symbol}=N",
                )
            values[symbol] = shape[axis]
            bound_by[symbol] = name
    for symbol, bound in reading.fixed.items():
        values.setdefault(symbol, bound.value)
    for role, default in (
        (DimRole.BATCH, reading.default_batch()),
        (DimRole.TOKENS, step.tokens),
        (DimRole.PAST, step.past),
    ):
        for symbol in reading.symbols(role):
            values.setdefault(symbol, default)
    past = _past(reading, values, step.past if reading.has_kv_cache else 0)
    tokens = _role_value(reading, values, DimRole.TOKENS)
    for symbol in reading.symbols(DimRole.TOTAL):
        values.setdefault(symbol, past + (step.tokens if tokens is None else tokens))
    for parsed in reading.expressions.values():
        for expression in parsed:
            for symbol in expression.symbols if expression is not None else ():
                values.setdefault(symbol, DEFAULT_DIM)
    return values


def _check_relations(
    reading: ModelDims,
    shapes: Mapping[str, Sequence[int]],
    dims: Mapping[str, int],
    values: Mapping[str, int],
    step: Step,
) -> None:
    """Every given shape must be what its dims say at the step's sizes, on each axis whose symbols all have a role, a
    required value or a `--dim` (`attention_mask [batch, past_sequence_length + sequence_length]` against the tokens
    of `input_ids` and the step's past): said up front, not as the runtime's failure deep inside the graph."""
    known = reading.roles.keys() | reading.fixed.keys() | dims.keys()
    for name, shape in shapes.items():
        for axis, (expression, size) in enumerate(zip(reading.expressions[name], shape, strict=False)):
            if expression is None or not expression.symbols or not expression.symbols <= known:
                continue
            try:
                expected = expression.evaluate(values)
            except DimExpressionError:
                continue
            if expected == size:
                continue
            sizes = ", ".join(f"{symbol}={values[symbol]}" for symbol in sorted(expression.symbols))
            given = "x".join(str(dim) for dim in shape)
            # A past the step chose, not the user: fixing it leaves one step of exactly the sizes given.
            past = [
                symbol
                for symbol in sorted(expression.symbols - dims.keys())
                if reading.roles.get(symbol) is DimRole.PAST
            ]
            raise OptionError(
                "shape",
                Choice("shape"),
                f" {name}={given}: dim {axis} is {expression.text!r}, which the {step.name} step's sizes make "
                f"{expected} ({sizes}), not {size}; make the shapes agree, or set the sizes with ",
                Choice("dim"),
                f" {past[0] if past else 'SYMBOL'}=N",
            )


def _role_value(reading: ModelDims, values: Mapping[str, int], role: DimRole) -> int | None:
    symbols = reading.symbols(role)
    return values[symbols[0]] if symbols and symbols[0] in values else None


def _past(reading: ModelDims, values: Mapping[str, int], default: int = 0) -> int:
    """The step's past length: a past dim's value, else total minus tokens, else `default` (0 without a cache)."""
    past = _role_value(reading, values, DimRole.PAST)
    if past is not None:
        return past
    total, tokens = _role_value(reading, values, DimRole.TOTAL), _role_value(reading, values, DimRole.TOKENS)
    if total is not None and tokens is not None:
        return max(total - tokens, 0)
    return default


def _input_shape(
    value: onnx.ValueInfoProto, reading: ModelDims, shapes: Mapping[str, Sequence[int]], values: Mapping[str, int]
) -> tuple[int, ...]:
    dims = value.type.tensor_type.shape.dim
    if value.name in shapes:
        shape = tuple(shapes[value.name])
        if value.type.tensor_type.HasField("shape") and len(shape) != len(dims):
            raise OptionError(
                "shape", Choice("shape"), f" {value.name}: the input has rank {len(dims)}, the shape has {len(shape)}"
            )
        for axis, (dim, size) in enumerate(zip(dims, shape, strict=False)):
            if dim.HasField("dim_value") and dim.dim_value != size:
                raise OptionError(
                    "shape", Choice("shape"), f" {value.name}: dim {axis} is fixed at {dim.dim_value} in the model"
                )
        if any(not isinstance(size, int | np.integer) or size < 0 for size in shape):
            raise OptionError("shape", Choice("shape"), f" {value.name}: dims are non-negative integers, got {shape}")
        return shape
    shape = []
    for axis, (dim, expression) in enumerate(zip(dims, reading.expressions[value.name], strict=True)):
        if dim.HasField("dim_value"):
            shape.append(dim.dim_value)
            continue
        if expression is None:
            shape.append(DEFAULT_DIM)
            continue
        hint = (
            "; set its symbols with ",
            Choice("dim"),
            " or give the shape with ",
            Choice("shape"),
            f" {value.name}=D0x...",
        )
        try:
            size = expression.evaluate(values)
        except DimExpressionError as error:
            raise OptionError(
                "dim",
                f"input {value.name!r}: cannot evaluate symbolic dim {expression.text!r} (dim {axis}): {error}",
                *hint,
            ) from None
        if size < 0:
            given = ", ".join(f"{s}={values[s]}" for s in sorted(expression.symbols))
            raise OptionError(
                "dim",
                f"input {value.name!r}: symbolic dim {expression.text!r} (dim {axis}) is {size} with {given}",
                *hint,
            )
        shape.append(size)
    return tuple(shape)


# A batch, a token count or a total length of 0 is an empty call, which no runtime takes; a past of 0 is a prefill.
_EMPTY_CALL = {
    DimRole.BATCH: "a batch of 0 sequences is an empty call",
    DimRole.TOKENS: "a step of 0 new tokens is an empty call",
    DimRole.TOTAL: "a total length of 0 leaves no token to run",
}
_NEVER_EMPTY = frozenset(_EMPTY_CALL)


def _check_not_empty(shapes: Mapping[str, Sequence[int]], reading: ModelDims) -> None:
    """A given shape must not set a batch, tokens or total dim to 0 (the runtime's own refusal is a page long)."""
    for name, shape in shapes.items():
        for axis, (size, expression) in enumerate(zip(shape, reading.expressions[name], strict=False)):
            role = dim_role(expression.symbol) if expression is not None and expression.symbol else None
            if size == 0 and role in _NEVER_EMPTY:
                text = "x".join(map(str, shape))
                raise OptionError(
                    "shape",
                    Choice("shape"),
                    f" {name}={text}: dim {axis} ({expression.symbol}) is 0: {_EMPTY_CALL[role]}",
                )


def _check_size(input_shapes: Mapping[str, tuple[int, ...]], reading: ModelDims) -> None:
    sizes = {
        value.name: int(np.prod(input_shapes[value.name], dtype=object)) * _numpy_dtype(value).itemsize
        for value in reading.inputs
    }
    if sum(sizes.values()) > MAX_FEED_BYTES:
        largest = max(sizes, key=sizes.__getitem__)
        shape = "x".join(map(str, input_shapes[largest]))
        raise OptionError(
            "dim",
            f"input {largest!r} of shape {shape} makes the feed {sum(sizes.values()) / 2**30:.3g} GiB, more than "
            f"{MAX_FEED_BYTES // 2**30} GiB; give smaller dims with ",
            Choice("dim"),
            " or ",
            Choice("shape"),
        )


def _numpy_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))
    except (KeyError, ValueError, TypeError):
        raise TrtfuseError(f"graph input {value.name!r} has no numeric dtype; cannot generate it") from None


def _gather_index_bounds(model: onnx.ModelProto) -> dict[str, tuple[int, str]]:
    """Graph inputs used as Gather indices into a constant table: the table's length along the axis, and its name."""
    tables = {tensor.name: list(tensor.dims) for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tables[node.output[0]] = list(node.attribute[0].t.dims)
    bounds: dict[str, tuple[int, str]] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in tables:
            continue
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
        table_dims = tables[node.input[0]]
        if -len(table_dims) <= axis < len(table_dims):
            length = table_dims[axis]
            if node.input[1] not in bounds or length < bounds[node.input[1]][0]:
                bounds[node.input[1]] = (length, node.input[0])
    return bounds


def _length_array(
    name: str, shape: tuple[int, ...], dtype: np.dtype, role: DimRole, past: int, tokens: int | None
) -> np.ndarray:
    if tokens is None:
        raise OptionError(
            "shape",
            f"input {name!r} holds a length but no input dim says how many tokens; give it with ",
            Choice("shape"),
        )
    total = past + tokens
    value = past if role is DimRole.PAST else total
    if name.lower().startswith("seqlens_k"):
        value = total - 1
    return np.full(shape, value, dtype=dtype)


def _random_array(
    name: str,
    shape: tuple[int, ...],
    dtype: np.dtype,
    index_bound: tuple[int, str] | None,
    past: int,
    rng: np.random.Generator,
) -> np.ndarray:
    lowered = name.lower()
    if dtype == np.bool_:
        return np.ones(shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        if "mask" in lowered:
            return np.ones(shape, dtype=dtype)
        if "position" in lowered and shape:
            return np.broadcast_to(np.arange(past, past + shape[-1]), shape).astype(dtype)
        if index_bound is not None:
            if index_bound[0] <= 0 and int(np.prod(shape)) > 0:
                raise TrtfuseError(
                    f"input {name!r} indexes Gather table {index_bound[1]!r}, which is empty; no index is valid"
                )
            return rng.integers(0, max(index_bound[0], 1), size=shape).astype(dtype)
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    raise TrtfuseError(f"input {name!r}: cannot generate values of dtype {dtype.name}")
