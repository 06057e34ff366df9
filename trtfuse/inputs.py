"""Random inputs for a model: the same feed goes to every runtime that is compared."""

from __future__ import annotations

import ast
import operator
from collections.abc import Mapping, Sequence

import numpy as np
import onnx
from onnx import helper

from trtfuse.errors import TrtfuseError

# Symbolic dims get these values unless overridden; batch 2 so that a batch-mixing bug shows, other dims small.
DEFAULT_BATCH = 2
DEFAULT_DIM = 5
_ARITHMETIC = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv}


def make_feed(
    model: onnx.ModelProto,
    seed: int,
    shapes: Mapping[str, Sequence[int]] | None = None,
    dims: Mapping[str, int] | None = None,
) -> dict[str, np.ndarray]:
    """One random array per graph input.

    `shapes` fixes whole input shapes by input name; `dims` fixes symbolic dims by name (otherwise a dim named like a
    batch gets `DEFAULT_BATCH`, any other `DEFAULT_DIM`, and an expression such as `past + 1` is evaluated). Token ids
    stay below the vocabulary size of the embedding Gather they feed; masks are all ones; position ids count up.
    """
    shapes = dict(shapes or {})
    dims = dict(dims or {})
    initializers = {tensor.name for tensor in model.graph.initializer}
    graph_inputs = [value for value in model.graph.input if value.name not in initializers]
    unknown = sorted(set(shapes) - {value.name for value in graph_inputs})
    if unknown:
        raise TrtfuseError(f"--shape names no graph input: {', '.join(unknown)}")
    unknown = sorted(set(dims) - _symbols(graph_inputs))
    if unknown:
        raise TrtfuseError(f"--dim names no symbolic dim of a graph input: {', '.join(unknown)}")
    rng = np.random.default_rng(seed)
    index_bounds = _gather_index_bounds(model)
    feed = {}
    for value in graph_inputs:
        shape = tuple(shapes[value.name]) if value.name in shapes else _resolve_shape(value, dims)
        dtype = _numpy_dtype(value)
        feed[value.name] = _random_array(value.name, shape, dtype, index_bounds.get(value.name), rng)
    return feed


def _numpy_dtype(value: onnx.ValueInfoProto) -> np.dtype:
    if not value.type.HasField("tensor_type"):
        raise TrtfuseError(f"graph input '{value.name}' is not a tensor; cannot generate it")
    return np.dtype(helper.tensor_dtype_to_np_dtype(value.type.tensor_type.elem_type))


def _symbols(graph_inputs: list[onnx.ValueInfoProto]) -> set[str]:
    """Every symbol in the inputs' dims, also those inside expressions such as `past + 1`."""
    symbols = set()
    for value in graph_inputs:
        for dim in value.type.tensor_type.shape.dim:
            if dim.HasField("dim_param"):
                symbols.add(dim.dim_param)
                try:
                    tree = ast.parse(dim.dim_param, mode="eval")
                except SyntaxError:
                    continue
                symbols.update(node.id for node in ast.walk(tree) if isinstance(node, ast.Name))
    return symbols


def _resolve_shape(value: onnx.ValueInfoProto, dims: dict[str, int]) -> tuple[int, ...]:
    shape = []
    for dim in value.type.tensor_type.shape.dim:
        if dim.HasField("dim_value"):
            shape.append(dim.dim_value)
        elif dim.HasField("dim_param"):
            shape.append(_symbol_value(dim.dim_param, dims, value.name))
        else:
            shape.append(DEFAULT_DIM)
    return tuple(shape)


def _symbol_value(symbol: str, dims: dict[str, int], input_name: str) -> int:
    if symbol in dims:
        return dims[symbol]
    try:
        expression = ast.parse(symbol, mode="eval").body
    except SyntaxError:
        raise TrtfuseError(f"input '{input_name}': cannot read symbolic dim '{symbol}'") from None
    if isinstance(expression, ast.Name):
        dims[symbol] = DEFAULT_BATCH if "batch" in symbol.lower() else DEFAULT_DIM
        return dims[symbol]
    return _evaluate(expression, dims, input_name, symbol)


def _evaluate(node: ast.expr, dims: dict[str, int], input_name: str, symbol: str) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return _symbol_value(node.id, dims, input_name)
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        left = _evaluate(node.left, dims, input_name, symbol)
        right = _evaluate(node.right, dims, input_name, symbol)
        return _ARITHMETIC[type(node.op)](left, right)
    raise TrtfuseError(f"input '{input_name}': cannot evaluate symbolic dim '{symbol}'; give it with --dim")


def _gather_index_bounds(model: onnx.ModelProto) -> dict[str, int]:
    """Graph inputs used as Gather indices into a constant table, with the table's length along the gathered axis."""
    tables = {tensor.name: list(tensor.dims) for tensor in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            tables[node.output[0]] = list(node.attribute[0].t.dims)
    bounds: dict[str, int] = {}
    for node in model.graph.node:
        if node.op_type != "Gather" or len(node.input) < 2 or node.input[0] not in tables:
            continue
        axis = next((attribute.i for attribute in node.attribute if attribute.name == "axis"), 0)
        table_dims = tables[node.input[0]]
        if -len(table_dims) <= axis < len(table_dims):
            length = table_dims[axis]
            bounds[node.input[1]] = min(bounds.get(node.input[1], length), length)
    return bounds


def _random_array(
    name: str, shape: tuple[int, ...], dtype: np.dtype, index_bound: int | None, rng: np.random.Generator
) -> np.ndarray:
    lowered = name.lower()
    if dtype == np.bool_:
        return np.ones(shape, dtype=dtype)
    if np.issubdtype(dtype, np.integer):
        if index_bound is not None:
            return rng.integers(0, index_bound, size=shape).astype(dtype)
        if "mask" in lowered:
            return np.ones(shape, dtype=dtype)
        if "position" in lowered and shape:
            return np.broadcast_to(np.arange(shape[-1]), shape).astype(dtype)
        return rng.integers(0, 2, size=shape).astype(dtype)
    if dtype.kind == "f" or dtype.name == "bfloat16":
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype)
    raise TrtfuseError(f"input '{name}': cannot generate values of dtype {dtype.name}")
