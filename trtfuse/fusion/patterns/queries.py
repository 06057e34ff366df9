"""Read-only questions about an onnx-graphsurgeon graph: producers, consumers, dtypes and small constant values."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import onnx
import onnx.numpy_helper
import onnx_graphsurgeon as gs
from onnx_graphsurgeon.ir.tensor import LazyValues, SparseValues

from trtfuse.model.qdq import QdqOperand, pair_difference

# A constant larger than this is never loaded: scalars and axes lists are all the matcher reads.
MAX_READ_ELEMENTS = 64

NUMPY_DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}

# Casts the matcher may look through: converting the key to any of its values loses nothing.
LOSSLESS_CASTS = {
    "float16": ("float16", "float32", "float64"),
    "bfloat16": ("bfloat16", "float32", "float64"),
    "float32": ("float32", "float64"),
}


def dtype_name(tensor: gs.Tensor) -> str | None:
    """The tensor's element type as a NumPy-style name ("float16", "bfloat16", ...), or None when unknown."""
    dtype = tensor.dtype
    if dtype is None:
        return None
    if isinstance(dtype, int):
        return onnx.helper.tensor_dtype_to_np_dtype(dtype).name if dtype else None
    return np.dtype(dtype).name


# Both spellings of the default domain: a node of any other domain is not the ONNX op, whatever its op_type.
ONNX_DOMAINS = ("", "ai.onnx")


def onnx_op(node: gs.Node | None) -> str | None:
    """The node's op_type when it is an ONNX operator, None for another domain's op (or no node)."""
    if node is None or (node.domain or "") not in ONNX_DOMAINS:
        return None
    return node.op


def cast_target(node: gs.Node) -> str:
    return onnx.helper.tensor_dtype_to_np_dtype(node.attrs["to"]).name


def producer(tensor: gs.Tensor) -> gs.Node | None:
    return tensor.inputs[0] if tensor.inputs else None


def producer_op(tensor: gs.Tensor) -> str | None:
    return onnx_op(producer(tensor))


def only_consumer(tensor: gs.Tensor, graph_outputs: set[str]) -> gs.Node | None:
    """The one node reading `tensor`, or None when it has several readers, none, or is a graph output."""
    if tensor.name in graph_outputs or len(tensor.outputs) != 1:
        return None
    return tensor.outputs[0]


def describe(node: gs.Node) -> str:
    """A node's name, or for an unnamed node its op and first output, so messages always point somewhere."""
    if node.name:
        return node.name
    first_output = node.outputs[0].name if node.outputs else "?"
    return f"<{node.op} -> {first_output}>"


def other_input(node: gs.Node, tensor: gs.Tensor) -> gs.Tensor | None:
    """For a two-input node, the input that is not `tensor` (the second one when both are `tensor`)."""
    if len(node.inputs) != 2:
        return None
    first, second = node.inputs
    return second if first is tensor else first


def is_constant(tensor: gs.Tensor) -> bool:
    """A stored constant: an initializer or a `Constant` node's output (whose values `constant_shape` and the
    readers below can read). Whether an operand is constant at all is `is_constant_value`'s question."""
    return isinstance(tensor, gs.Constant) or producer_op(tensor) == "Constant"


# Ops that read no input yet are not constant: each run draws other values.
_RANDOM_OPS = ("RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli")
# How far `is_constant_value` follows ops back from a tensor: a bias is a stored constant a few casts away.
MAX_FOLD_DEPTH = 8


def is_constant_value(tensor: gs.Tensor, depth: int = MAX_FOLD_DEPTH) -> bool:
    """Whether `tensor` is fixed before the model runs: a stored constant (`is_constant`), or what an ONNX op that
    draws no random values makes of constant values alone (`Cast(const)`, `Identity(const)`, `Reshape(const,
    const)`: what constant folding would fold). The one rule for "this operand is a constant" (a bias, not an
    activation), however the exporter spelled it."""
    if is_constant(tensor):
        return True
    node = producer(tensor)
    operands = [operand for operand in node.inputs if operand.name] if node is not None else []
    if depth == 0 or onnx_op(node) in (None, *_RANDOM_OPS) or not operands:
        return False
    return all(is_constant_value(operand, depth - 1) for operand in operands)


def is_sparse_constant(tensor: gs.Tensor) -> bool:
    """A sparse initializer, or the output of a `Constant` holding `sparse_value`: graphsurgeon imports the latter
    with no attribute at all (it skips sparse ones), so its values cannot be read here."""
    if isinstance(tensor, gs.Constant):
        return isinstance(tensor._values, SparseValues)
    node = producer(tensor)
    return onnx_op(node) == "Constant" and not node.attrs


def constant_shape(tensor: gs.Tensor) -> tuple[int, ...] | None:
    """Shape of a constant without loading its values (initializer or Constant-node output), else None."""
    if isinstance(tensor, gs.Constant):
        return tuple(int(dim) for dim in tensor.shape)
    node = producer(tensor)
    if onnx_op(node) != "Constant":
        return None
    if "value" in node.attrs:
        return tuple(int(dim) for dim in node.attrs["value"].shape)
    for key in ("value_float", "value_int"):
        if key in node.attrs:
            return ()
    for key in ("value_floats", "value_ints"):
        if key in node.attrs:
            return (len(node.attrs[key]),)
    return None


def _array_of(constant: gs.Constant) -> np.ndarray | None:
    # Never touch `.values` of a lazily loaded constant: it would replace the stored tensor with a NumPy copy,
    # which for bfloat16 changes the exported dtype. Read the TensorProto instead.
    stored = constant._values
    if isinstance(stored, SparseValues):
        return None
    if isinstance(stored, LazyValues):
        try:
            return onnx.numpy_helper.to_array(stored.tensor)
        except Exception:
            return None
    return np.asarray(stored)


def small_constant(tensor: gs.Tensor) -> np.ndarray | None:
    """The float64 values of a constant of at most MAX_READ_ELEMENTS elements, else None (never loads big ones)."""
    shape = constant_shape(tensor)
    if shape is None or math.prod(shape) > MAX_READ_ELEMENTS:
        return None
    if isinstance(tensor, gs.Constant):
        values = _array_of(tensor)
    else:
        attrs = producer(tensor).attrs
        if "value" in attrs:
            values = _array_of(attrs["value"])
        else:
            key = next(key for key in ("value_float", "value_int", "value_floats", "value_ints") if key in attrs)
            values = np.asarray(attrs[key])
    if values is None:
        return None
    try:
        return np.asarray(values, dtype=np.float64).reshape(shape)
    except (TypeError, ValueError):
        return None


def scalar_constant(tensor: gs.Tensor) -> float | None:
    """The value of a one-element constant, also seen through a Cast (as the cast computes it), else None."""
    cast = producer(tensor)
    if onnx_op(cast) == "Cast":
        value = scalar_constant(cast.inputs[0])
        if value is None:
            return None
        with np.errstate(over="ignore"):  # a cast beyond the target's range gives inf, as the Cast computes it
            return float(np.asarray(value).astype(NUMPY_DTYPES.get(cast_target(cast), np.float64)))
    values = small_constant(tensor)
    if values is None or values.size != 1:
        return None
    return float(values.reshape(()))


def _operand(node: gs.Node, index: int) -> gs.Tensor | None:
    """The node's input at `index`, None when absent or left empty (an optional input)."""
    if index >= len(node.inputs) or not node.inputs[index].name:
        return None
    return node.inputs[index]


def _qdq_operand(node: gs.Node, index: int) -> QdqOperand:
    tensor = _operand(node, index)
    if tensor is None:
        return QdqOperand("")
    return QdqOperand(tensor.name, dtype_name(tensor), small_constant(tensor))


def qdq_mismatch(quantize: gs.Node, dequantize: gs.Node) -> str | None:
    """None when `dequantize` (reading `quantize`'s output) undoes its rounding exactly (`model.qdq`) and gives back
    `quantize`'s input dtype. Otherwise what differs: such a pair rescales or shifts the value, which is arithmetic,
    not a rounding."""
    difference = pair_difference(
        (_qdq_operand(quantize, 1), _qdq_operand(dequantize, 1)),
        (_qdq_operand(quantize, 2), _qdq_operand(dequantize, 2)),
        (quantize.attrs, dequantize.attrs),
    )
    if difference in ("scale", "zero point"):
        return f"the {difference} of {describe(dequantize)} is not provably {describe(quantize)}'s"
    if difference is not None:
        return f"the {difference} of {describe(dequantize)} is not {describe(quantize)}'s"
    if dtype_name(dequantize.outputs[0]) != dtype_name(quantize.inputs[0]):
        return f"{describe(dequantize)} changes the dtype"
    return None


def constant_rank(tensor: gs.Tensor) -> int | None:
    """The rank of a constant, also seen through Casts (which keep the shape), else None."""
    while onnx_op(producer(tensor)) == "Cast":
        tensor = producer(tensor).inputs[0]
    shape = constant_shape(tensor)
    return None if shape is None else len(shape)


def look_through_lossless_casts(tensor: gs.Tensor) -> gs.Tensor:
    """Walk up through Identity nodes and widening Casts to the tensor they merely convert."""
    while True:
        node = producer(tensor)
        if node is None or not node.inputs:
            return tensor
        source = node.inputs[0]
        if onnx_op(node) == "Identity":
            tensor = source
            continue
        if onnx_op(node) != "Cast" or dtype_name(tensor) not in LOSSLESS_CASTS.get(dtype_name(source), ()):
            return tensor
        tensor = source


def exclusively_consumed(candidates: list[gs.Node], removed: set[int], graph_outputs: set[str]) -> list[gs.Node]:
    """The candidates whose outputs are read only by each other or by `removed` (node ids): those that can go too."""
    chosen = {id(node) for node in candidates}
    changed = True
    while changed:
        changed = False
        for node in candidates:
            if id(node) not in chosen:
                continue
            for tensor in node.outputs:
                outside = any(id(reader) not in chosen and id(reader) not in removed for reader in tensor.outputs)
                if outside or tensor.name in graph_outputs:
                    chosen.discard(id(node))
                    changed = True
                    break
    return [node for node in candidates if id(node) in chosen]


def unique(nodes: list[gs.Node]) -> list[gs.Node]:
    seen: dict[int, gs.Node] = {}
    for node in nodes:
        seen.setdefault(id(node), node)
    return list(seen.values())
