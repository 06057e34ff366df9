"""What each symbolic dim of a model's inputs means, read off the model itself.

A symbolic dim either has a role from its name (batch, tokens of this call, past tokens in the KV cache, total =
past + tokens) or a value the graph requires: the head count and head size of a KV cache, from the attention op that
reads it (genai writes the cache's head size as `kv_cache_dim`). The model may also bound the batch onnxruntime can
run (opset-23 `RotaryEmbedding`) and the total length (rotary cos/sin tables, position-embedding tables).
`trtfuse.model.feeds` (feeds) and `trtfuse.engine.profiles` (TensorRT profiles) both size inputs from this one reading.
"""

from __future__ import annotations

import ast
import enum
import operator
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import onnx
from onnx import numpy_helper, shape_inference

from trtfuse.errors import TrtfuseError
from trtfuse.model.interface import fed_inputs

# The metadata key under which an export records the positions its model was trained for: Hugging Face's config
# name, written by models/export.py --cache.
POSITIONS_METADATA_KEY = "max_position_embeddings"
# Why a model's trained positions are what they are when its user states them (`stated_positions`).
STATED_POSITIONS = "as stated for it"
# The batch of generated inputs and the OPT/MAX batch of derived profiles, unless the model allows only another:
# 2 rather than 1, so that a batch-mixing bug shows.
DEFAULT_BATCH = 2


class DimRole(enum.Enum):
    BATCH = "batch"
    TOKENS = "tokens"
    PAST = "past"
    TOTAL = "total"


# Checked in order: "past_sequence_length" is past and "total_sequence_length" total, not tokens.
_ROLE_PATTERNS = (
    (DimRole.BATCH, re.compile(r"batch")),
    (DimRole.PAST, re.compile(r"past")),
    (DimRole.TOTAL, re.compile(r"total|kv_len|kv_seq")),
    (DimRole.TOKENS, re.compile(r"seq|token|length|^len$")),
)
_CACHE_NAME = re.compile(r"past|cache")
_ARITHMETIC = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv,
    ast.Div: operator.floordiv,
}


def dim_role(symbol: str) -> DimRole | None:
    """The role a symbol's name gives it, or None (`s17`, `kv_cache_dim`)."""
    lowered = symbol.lower()
    for role, pattern in _ROLE_PATTERNS:
        if pattern.search(lowered):
            return role
    return None


class DimExpressionError(ValueError):
    """A dim expression that cannot be evaluated; the message says why, naming neither the input nor the text."""


@dataclass(frozen=True)
class DimExpression:
    """A `dim_param`: one symbol (`sequence_length`) or arithmetic on symbols (`past_sequence_length + 1`)."""

    text: str
    tree: ast.expr
    symbols: frozenset[str]

    @staticmethod
    def parse(text: str) -> DimExpression:
        try:
            tree = ast.parse(text.strip(), mode="eval").body
        except (SyntaxError, ValueError, RecursionError):
            # Not an expression (`batch size`, `2*`, a NUL byte, thousands of brackets): one symbol, the whole text.
            return DimExpression(text, ast.Name(id=text), frozenset({text}))
        return DimExpression(text, tree, frozenset(node.id for node in ast.walk(tree) if isinstance(node, ast.Name)))

    @property
    def symbol(self) -> str | None:
        """The symbol when the expression is a single one."""
        return self.tree.id if isinstance(self.tree, ast.Name) else None

    def evaluate(self, values: Mapping[str, int]) -> int:
        """The value for these symbol values; raises DimExpressionError for an unknown symbol or bad arithmetic."""
        try:
            return _evaluate(self.tree, values)
        except RecursionError:
            raise DimExpressionError("it is nested too deeply") from None


def _evaluate(node: ast.expr, values: Mapping[str, int]) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.Name):
        if node.id not in values:
            raise DimExpressionError(f"symbol {node.id!r} has no value")
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _evaluate(node.left, values)
        right = _evaluate(node.right, values)
        if isinstance(node.op, ast.FloorDiv | ast.Div) and right == 0:
            raise DimExpressionError("it divides by zero")
        if isinstance(node.op, ast.Div) and left % right:
            raise DimExpressionError(f"{left} / {right} is not a whole number")
        return _ARITHMETIC[type(node.op)](left, right)
    raise DimExpressionError("it is not integer arithmetic (+, -, *, //, /) on symbols")


@dataclass(frozen=True)
class Bound:
    """A value the model requires or allows at most, and why (the node or tensor that says so)."""

    value: int
    reason: str


@dataclass(frozen=True)
class ModelDims:
    """What the model's inputs' dims mean. `fixed` holds symbols whose value the graph requires."""

    inputs: tuple[onnx.ValueInfoProto, ...]
    roles: Mapping[str, DimRole]
    fixed: Mapping[str, Bound]
    cache_inputs: tuple[str, ...]
    length_inputs: Mapping[str, DimRole]
    batch: Bound | None = None
    onnxruntime_batch: Bound | None = None
    max_total: Bound | None = None
    # The positions the model was trained for, where its export records them (`POSITIONS_METADATA_KEY`) or its user
    # states them (`stated_positions`): no limit of the graph, which computes its rotary angles for any position, so
    # going past it is warned about, not refused.
    declared_positions: Bound | None = None
    expressions: Mapping[str, tuple[DimExpression | None, ...]] = field(default_factory=dict)
    # Sequence dims of window-sized caches (GroupQueryAttention with sliding_window_cache=1): named like a past
    # (`past_sliding_length`) but a capacity the attention op requires at every step; also in `fixed`, in no role.
    window_capacities: Mapping[str, Bound] = field(default_factory=dict)

    @property
    def has_kv_cache(self) -> bool:
        """Whether the model reads a KV cache: an input dim or a length input with a past role, or a window cache
        (a model whose every layer is sliding still has a prefill and a decode step)."""
        return (
            DimRole.PAST in self.roles.values()
            or DimRole.PAST in self.length_inputs.values()
            or bool(self.window_capacities)
        )

    def total_length(self, values: Mapping[str, int]) -> int | None:
        """Past plus new tokens at a step whose symbols took `values`: the total dim, else past + tokens."""
        total = next((values[s] for s in self.symbols(DimRole.TOTAL) if s in values), None)
        if total is not None:
            return total
        tokens = next((values[s] for s in self.symbols(DimRole.TOKENS) if s in values), None)
        past = next((values[s] for s in self.symbols(DimRole.PAST) if s in values), 0)
        return None if tokens is None else past + tokens

    def symbols(self, role: DimRole) -> list[str]:
        return sorted(symbol for symbol, symbol_role in self.roles.items() if symbol_role is role)

    def default_batch(self) -> int:
        """The one batch rule: what the model requires, else what onnxruntime can run, else DEFAULT_BATCH."""
        if self.batch is not None:
            return self.batch.value
        if self.onnxruntime_batch is not None:
            return self.onnxruntime_batch.value
        return DEFAULT_BATCH


def model_dims(model: onnx.ModelProto) -> ModelDims:
    """Read every symbolic dim of the model's inputs: roles from names, fixed values and bounds from the graph."""
    inputs = fed_inputs(model)
    expressions: dict[str, tuple[DimExpression | None, ...]] = {}
    roles: dict[str, DimRole] = {}
    for value in inputs:
        if not value.type.HasField("tensor_type"):
            raise TrtfuseError(f"graph input {value.name!r} is not a tensor; trtfuse cannot size or generate it")
        parsed = []
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_value") and dim.dim_value < 0:
                raise TrtfuseError(f"input {value.name!r} has a negative dim {dim.dim_value} in the model")
            parsed.append(DimExpression.parse(dim.dim_param) if dim.HasField("dim_param") else None)
        expressions[value.name] = tuple(parsed)
        for expression in parsed:
            for symbol in expression.symbols if expression else ():
                role = dim_role(symbol)
                if role is not None:
                    roles[symbol] = role
    cache_inputs = tuple(
        value.name
        for value in inputs
        if _is_float(value) and len(expressions[value.name]) >= 3 and _CACHE_NAME.search(value.name.lower())
    )
    unread = any(
        expression is not None and expression.symbols - roles.keys()
        for name in cache_inputs
        for expression in expressions[name]
    )
    # Shape inference only where a cache dim needs it: it is the slow part on a real model.
    shapes = _static_shapes(model, infer=unread)
    fixed = _fixed_cache_dims(model, inputs, expressions, shapes, set(cache_inputs))
    # The past role from the name would give a window cache 0 rows at prefill, which the attention op refuses: its
    # sequence dim is the value the op requires, at every step.
    windows = _window_capacities(model, inputs, expressions, set(cache_inputs))
    for symbol in windows:
        roles.pop(symbol, None)
    fixed.update(windows)
    return ModelDims(
        inputs=tuple(inputs),
        roles=roles,
        fixed={symbol: bound for symbol, bound in fixed.items() if symbol not in roles},
        window_capacities=windows,
        cache_inputs=cache_inputs,
        length_inputs=_length_inputs(inputs),
        batch=_static_cache_batch(model, cache_inputs, expressions),
        onnxruntime_batch=_onnxruntime_batch(model),
        max_total=_max_total(model, shapes),
        declared_positions=declared_positions(model),
        expressions=expressions,
    )


def declared_positions(model: onnx.ModelProto) -> Bound | None:
    """The model's trained context length from its metadata (a positive integer), else None."""
    value = next((entry.value for entry in model.metadata_props if entry.key == POSITIONS_METADATA_KEY), "")
    if not value.isascii() or not value.isdigit() or int(value) == 0:
        return None
    return Bound(int(value), f"its metadata's {POSITIONS_METADATA_KEY} {int(value)}")


def stated_positions(reading: ModelDims, positions: int | None) -> ModelDims:
    """The reading with the positions the model was trained for stated by its user (`positions`, a model whose
    export records none, or records another), or as read where None."""
    if positions is None:
        return reading
    return replace(reading, declared_positions=Bound(positions, STATED_POSITIONS))


def position_warning(reading: ModelDims, positions: int, what: str) -> str:
    """'' while `positions` is within the model's declared positions; else one line saying `what` goes past them."""
    declared = reading.declared_positions
    if declared is None or positions <= declared.value:
        return ""
    return (
        f"{what} {positions} positions, past the {declared.value} the model was trained for ({declared.reason}); "
        "its outputs there are not what the checkpoint learned"
    )


def _is_float(value: onnx.ValueInfoProto) -> bool:
    elem_type = value.type.tensor_type.elem_type
    return elem_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16)


def _length_inputs(inputs: list[onnx.ValueInfoProto]) -> dict[str, DimRole]:
    """Integer inputs of rank 0 or 1 whose values (not shapes) are lengths: `past_sequence_length`, `seqlens_k`."""
    lengths = {}
    for value in inputs:
        if _is_float(value) or value.type.tensor_type.elem_type == onnx.TensorProto.BOOL:
            continue
        if len(value.type.tensor_type.shape.dim) > 1 or "mask" in value.name.lower():
            continue
        role = dim_role(value.name)
        if role in (DimRole.PAST, DimRole.TOTAL):
            lengths[value.name] = role
        elif value.name.lower().startswith("seqlens_k"):
            # GroupQueryAttention's seqlens_k: total length minus one, per batch entry.
            lengths[value.name] = DimRole.TOTAL
    return lengths


def _static_shapes(model: onnx.ModelProto, infer: bool) -> dict[str, tuple[int | None, ...]]:
    """Every tensor's shape where value_info, an initializer or (with `infer`) shape inference knows it."""
    graph = model.graph
    if infer:
        try:
            graph = shape_inference.infer_shapes(model).graph
        except Exception:
            # onnx's shape inference raises on graphs it cannot follow; value_info as written still helps.
            graph = model.graph
    shapes: dict[str, tuple[int | None, ...]] = {}
    for value in (*graph.value_info, *graph.input, *graph.output):
        if value.type.HasField("tensor_type") and value.type.tensor_type.HasField("shape"):
            shapes[value.name] = tuple(
                d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim
            )
    for tensor in graph.initializer:
        shapes[tensor.name] = tuple(tensor.dims)
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            shapes[node.output[0]] = tuple(node.attribute[0].t.dims)
    return shapes


def _producers(model: onnx.ModelProto) -> dict[str, onnx.NodeProto]:
    return {output: node for node in model.graph.node for output in node.output if output}


def _last_dim(name: str, shapes: Mapping, producers: Mapping[str, onnx.NodeProto], depth: int = 0) -> int | None:
    """The static last dim of a tensor, from its shape or its producer (MatMul weight, MatMulNBits' N, bias Add)."""
    shape = shapes.get(name)
    if shape and shape[-1] is not None:
        return shape[-1]
    node = producers.get(name)
    if node is None or depth > 8:
        return None
    if node.op_type == "MatMulNBits":
        return next((a.i for a in node.attribute if a.name == "N"), None)
    if node.op_type == "MatMul" and len(node.input) == 2:
        weight = shapes.get(node.input[1])
        return weight[-1] if weight and weight[-1] is not None else None
    if node.op_type in ("Add", "Cast", "Identity", "Mul", "QuantizeLinear", "DequantizeLinear"):
        found = (_last_dim(i, shapes, producers, depth + 1) for i in node.input[:2] if i)
        return next((dim for dim in found if dim is not None), None)
    return None


def _consumers(model: onnx.ModelProto, name: str) -> list[tuple[onnx.NodeProto, int]]:
    """The nodes reading `name`, through Cast/Identity, with the index of the input they read it at."""
    found = []
    for node in model.graph.node:
        for index, input_name in enumerate(node.input):
            if input_name != name:
                continue
            if node.op_type in ("Cast", "Identity") and node.output:
                found.extend(_consumers(model, node.output[0]))
            else:
                found.append((node, index))
    return found


def _cache_layout(
    node: onnx.NodeProto, index: int, shapes: Mapping, producers: Mapping[str, onnx.NodeProto]
) -> dict[int, int]:
    """The cache dims (axis -> value) an attention op requires of the cache it reads at input `index`."""
    attributes = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}

    def per_head(tensor_index: int, heads: int) -> int | None:
        if tensor_index >= len(node.input) or not node.input[tensor_index] or not heads:
            return None
        hidden = _last_dim(node.input[tensor_index], shapes, producers)
        return hidden // heads if hidden and hidden % heads == 0 else None

    if node.domain in ("", "ai.onnx") and node.op_type == "Concat":
        # The cache and the new keys or values, joined along the sequence: every other axis must agree.
        axis = attributes.get("axis", 0)
        others = [shapes.get(name) for position, name in enumerate(node.input) if position != index and name]
        rank = max((len(shape) for shape in others if shape), default=0)
        return {
            a: shape[a]
            for shape in others
            if shape and len(shape) == rank
            for a in range(rank)
            if a != axis % rank and shape[a] is not None
        }
    if node.domain == "com.microsoft" and node.op_type == "GroupQueryAttention" and index in (3, 4):
        heads, kv_heads = attributes.get("num_heads", 0), attributes.get("kv_num_heads", 0)
        packed = len(node.input) < 2 or not node.input[1]
        head_size = per_head(0, heads + 2 * kv_heads if packed else heads)
        return {1: kv_heads, **({3: head_size} if head_size else {})}
    if node.domain == "com.microsoft" and node.op_type == "MultiHeadAttention" and index in (6, 7):
        heads = attributes.get("num_heads", 0)
        head_size = per_head(0, heads)
        return {1: heads, **({3: head_size} if head_size else {})}
    if node.domain in ("", "ai.onnx") and node.op_type == "Attention" and index in (4, 5):
        kv_heads = attributes.get("kv_num_heads", 0)
        source = 1 if index == 4 else 2
        source_shape = shapes.get(node.input[source], ()) if source < len(node.input) else ()
        # K and V are [batch, kv_heads, sequence, head_size] or [batch, sequence, kv_heads * head_size].
        head_size = source_shape[3] if len(source_shape) == 4 else per_head(source, kv_heads)
        return {1: kv_heads, **({3: head_size} if head_size else {})}
    return {}


def _fixed_cache_dims(
    model: onnx.ModelProto,
    inputs: list[onnx.ValueInfoProto],
    expressions: Mapping[str, tuple[DimExpression | None, ...]],
    shapes: Mapping,
    cache_inputs: set[str],
) -> dict[str, Bound]:
    """Symbolic head counts and head sizes of cache inputs, from the attention ops reading them."""
    producers = _producers(model)
    fixed: dict[str, Bound] = {}
    for value in inputs:
        if value.name not in cache_inputs:
            continue
        for node, index in _consumers(model, value.name):
            for axis, required in _cache_layout(node, index, shapes, producers).items():
                expression = expressions[value.name][axis] if axis < len(expressions[value.name]) else None
                if expression is None or expression.symbol is None or not required:
                    continue
                what = {1: "head count", 3: "head size"}.get(axis, f"dim {axis}")
                fixed.setdefault(expression.symbol, Bound(required, f"the {what} {node.op_type} {node.name!r} reads"))
    return fixed


def _sliding_window(node: onnx.NodeProto) -> int | None:
    """The window W of a GroupQueryAttention that keeps a window-sized cache (sliding_window_cache=1,
    local_window_size=W > 0), else None."""
    if node.domain != "com.microsoft" or node.op_type != "GroupQueryAttention":
        return None
    attributes = {a.name: a.i for a in node.attribute if a.type == onnx.AttributeProto.INT}
    window = attributes.get("local_window_size", -1)
    return window if attributes.get("sliding_window_cache", 0) == 1 and window > 0 else None


def _window_capacities(
    model: onnx.ModelProto,
    inputs: list[onnx.ValueInfoProto],
    expressions: Mapping[str, tuple[DimExpression | None, ...]],
    cache_inputs: set[str],
) -> dict[str, Bound]:
    """Sequence-dim symbols of the caches a windowed GroupQueryAttention reads (past_key, past_value: inputs 3 and 4,
    BNSH), each with its window. onnxruntime requires that dim, the capacity C, to be at least local_window_size at
    every step, the prefill included (CUDA: equal to it), and takes the past length from seqlens_k and
    total_sequence_length, never from C; onnxruntime-genai sizes C to the window (`sliding_window.window_size`,
    `cache_slack` 0)."""
    capacities: dict[str, Bound] = {}
    for value in inputs:
        parsed = expressions.get(value.name, ())
        if value.name not in cache_inputs or len(parsed) != 4 or parsed[2] is None or parsed[2].symbol is None:
            continue
        for node, index in _consumers(model, value.name):
            window = _sliding_window(node)
            if window is None or index not in (3, 4):
                continue
            reason = (
                f"the window cache capacity of {node.op_type} {node.name!r} (sliding_window_cache=1: at least "
                f"local_window_size={window} at every step)"
            )
            known = capacities.get(parsed[2].symbol)
            if known is None or window > known.value:
                capacities[parsed[2].symbol] = Bound(window, reason)
    return capacities


def window_cache_outputs(model: onnx.ModelProto) -> dict[str, int]:
    """Graph outputs that are the present key/value (outputs 1 and 2) of a windowed GroupQueryAttention, and the
    window of each. After a step of T tokens in all, rows [0, min(T, C)) of such a buffer of capacity C (the window)
    hold the most recent positions; rows past them are unspecified (uninitialised memory on the CPU)."""
    graph_outputs = {value.name for value in model.graph.output}
    windows = {}
    for node in model.graph.node:
        window = _sliding_window(node)
        for name in node.output[1:3] if window is not None else ():
            if name in graph_outputs:
                windows[name] = window
    return windows


def _static_cache_batch(
    model: onnx.ModelProto, cache_inputs: tuple[str, ...], expressions: Mapping[str, tuple[DimExpression | None, ...]]
) -> Bound | None:
    """A cache input exported with a fixed batch fixes the batch of every input."""
    by_name = {value.name: value for value in model.graph.input}
    for name in cache_inputs:
        first = by_name[name].type.tensor_type.shape.dim[0]
        if expressions[name][0] is None and first.HasField("dim_value"):
            return Bound(first.dim_value, f"the batch dim of cache input {name!r} is fixed")
    return None


def _onnxruntime_batch(model: onnx.ModelProto) -> Bound | None:
    """Dynamo's opset-23 RotaryEmbedding gets cos/sin caches computed in the graph at the exporter's batch of 1;
    onnxruntime refuses them beside an input of another batch. Caches fed as graph inputs follow the batch."""
    graph_inputs = {value.name for value in model.graph.input}
    for node in model.graph.node:
        if node.op_type != "RotaryEmbedding" or node.domain not in ("", "ai.onnx") or len(node.input) < 2:
            continue
        if node.input[1] not in graph_inputs:
            return Bound(1, f"onnxruntime runs opset-23 RotaryEmbedding {node.name!r} only at batch 1")
    return None


def _max_total(model: onnx.ModelProto, shapes: Mapping) -> Bound | None:
    """The most positions the model holds: rows of a 2-D rotary cos cache, or of a fixed table that positions index
    (a position-embedding table, a cos/sin table computed once at export: `_PositionTables`)."""
    bounds = []
    tables = _PositionTables(model, shapes)
    for node in model.graph.node:
        if node.op_type in ("Gather", "GatherND") and len(node.input) == 2:
            bounds.extend(filter(None, [tables.bound(node)]))
            continue
        cos_index = None
        if node.op_type == "RotaryEmbedding":
            cos_index = 2 if node.domain == "com.microsoft" else 1
        elif node.op_type == "GroupQueryAttention" and node.domain == "com.microsoft":
            cos_index = 7
        if cos_index is None or cos_index >= len(node.input) or not node.input[cos_index]:
            continue
        cos_shape = shapes.get(node.input[cos_index])
        if cos_shape and len(cos_shape) == 2 and cos_shape[0]:
            bounds.append(Bound(cos_shape[0], f"the cos cache of {node.op_type} {node.name!r} has {cos_shape[0]} rows"))
    return min(bounds, key=lambda bound: bound.value, default=None)


# Ops through which an index still holds the positions it was made of (a position input's or a Range's values).
_POSITION_CARRIERS = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Flatten", "Expand"})
# Ops through which a table's axis keeps at most the rows it had (Slice cuts rows, the others keep them).
_ROW_KEEPERS = frozenset({"Cast", "Identity", "Slice"})


class _PositionTables:
    """Gathers that index a table by positions, and the rows that table holds.

    The positions are a graph input named like `position_ids`, or a Range the graph counts them with (GPT-2's
    `arange(past, past + tokens)`), carried through casts and reshapes. A table indexed by a position input bounds
    the positions wherever its rows are known; one indexed by a Range only where it is a constant of rank 2 or more
    (an initializer or Constant, reached through Cast, Slice, Squeeze and Unsqueeze: `cos_cached[:seq][position_ids]`
    of the exports that store their rotary table), since a Range also indexes activations (the last token of each
    batch row). Cos/sin computed from the positions and the inverse frequencies, as Hugging Face's rotary embedding
    does, index no table: they bound nothing, and nothing is read."""

    def __init__(self, model: onnx.ModelProto, shapes: Mapping) -> None:
        self.shapes = shapes
        self.producers = _producers(model)
        self.graph_inputs = {value.name for value in model.graph.input}
        self.constants = {tensor.name: tensor for tensor in model.graph.initializer}
        for node in model.graph.node:
            if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                self.constants[node.output[0]] = node.attribute[0].t

    def bound(self, gather: onnx.NodeProto) -> Bound | None:
        """The rows of the table a Gather (or a GatherND on positions with a last axis of 1, as dynamo writes
        `table[position_ids]`) indexes by positions, else None."""
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        if gather.op_type == "GatherND":
            batch_dims = next((a.i for a in gather.attribute if a.name == "batch_dims"), 0)
            indices = self.producers.get(gather.input[1])
            if batch_dims or indices is None or indices.op_type != "Unsqueeze" or self._axes(indices) != [-1]:
                return None
        source = self._positions(gather.input[1])
        if source is None or axis < 0:
            return None
        table, rows = gather.input[0], None
        if source in self.graph_inputs:
            shape = self.shapes.get(table)
            rows = shape[axis] if shape and axis < len(shape) and shape[axis] else None
        if rows is None:
            table, rows = self._constant_rows(table, axis) or (table, None)
        if not rows:
            return None
        return Bound(rows, f"the position table {table!r} has {rows} rows")

    def _positions(self, name: str, depth: int = 0) -> str | None:
        """The position input or Range output `name` carries, or None."""
        if name in self.graph_inputs:
            return name if "position" in name.lower() else None
        node = self.producers.get(name)
        if node is None or depth > 8:
            return None
        if node.op_type == "Range":
            return name
        if node.op_type in _POSITION_CARRIERS and node.input:
            return self._positions(node.input[0], depth + 1)
        return None

    def _constant_rows(self, name: str, axis: int, depth: int = 0) -> tuple[str, int] | None:
        """The constant of rank 2 or more whose `axis` becomes `axis` of `name`, and its size there."""
        if name in self.constants:
            dims = tuple(self.constants[name].dims)
            return (name, dims[axis]) if len(dims) >= 2 and axis < len(dims) else None
        node = self.producers.get(name)
        if node is None or depth > 8 or not node.input:
            return None
        if node.op_type in _ROW_KEEPERS:
            return self._constant_rows(node.input[0], axis, depth + 1)
        if node.op_type in ("Squeeze", "Unsqueeze"):
            axes = self._axes(node)
            if not axes or any(a < 0 for a in axes) or (axis in axes and node.op_type == "Unsqueeze"):
                return None
            if node.op_type == "Unsqueeze":
                source_axis = axis - sum(a < axis for a in axes)
            else:
                source_axis = axis
                for squeezed in sorted(axes):
                    source_axis += squeezed <= source_axis
            return self._constant_rows(node.input[0], source_axis, depth + 1)
        return None

    def _axes(self, node: onnx.NodeProto) -> list[int] | None:
        """A Squeeze's or Unsqueeze's axes where they are constants (an attribute before opset 13)."""
        axes = next((list(a.ints) for a in node.attribute if a.name == "axes"), None)
        stored = self.constants.get(node.input[1]) if axes is None and len(node.input) > 1 else None
        # An axes tensor left in external data (a model read without it) is not read here.
        if stored is not None and stored.data_location != onnx.TensorProto.EXTERNAL:
            axes = [int(a) for a in numpy_helper.to_array(stored).reshape(-1)]
        return axes
