"""RMSNorms an exporter or optimiser already fused into one node.

RMSNormalization (ONNX opset 23) casts the normalised value back to X's dtype before scaling: AFTER_CAST (which
rounds to the 16-bit side of the node, see contract.WeightMode); with X float32 and a 16-bit scale and Y the multiply
is in float32 and Y rounds once: BEFORE_CAST. onnxruntime's SimplifiedLayerNormalization and
SkipSimplifiedLayerNormalization scale in float32 and cast last: BEFORE_CAST. Y has the scale's dtype, which may
differ from X's. The residual sum of the skip variant becomes a plain Add in front of the fused node. The scale's
length is the hidden size when X's last dim is unknown: every op requires it to equal (or broadcast to, when 1) the
normalised length.
"""

from __future__ import annotations

import math

import onnx
import onnx_graphsurgeon as gs

from trtfuse.contract import ACTIVATION_DTYPES, NormParams, WeightMode
from trtfuse.fusion.patterns.decomposed import epsilon_float32, supported_dtypes
from trtfuse.fusion.patterns.epilogue import trace_weight
from trtfuse.fusion.patterns.matches import Rejected, RmsNormMatch
from trtfuse.fusion.patterns.queries import (
    ONNX_DOMAINS,
    cast_target,
    constant_shape,
    describe,
    dtype_name,
    exclusively_consumed,
    only_consumer,
    onnx_op,
)
from trtfuse.fusion.patterns.shapes import Shapes

FUSED_NORM_OPS = {
    ("RMSNormalization", ""): "onnx-rms-normalization",
    ("SimplifiedLayerNormalization", ""): "ort-simplified-layer-norm",
    ("SimplifiedLayerNormalization", "com.microsoft"): "ort-simplified-layer-norm",
    ("SkipSimplifiedLayerNormalization", "com.microsoft"): "ort-skip-simplified-layer-norm",
}
# Epsilon when the node has no attribute: ONNX's RMSNormalization and onnxruntime's SimplifiedLayerNormalization
# default to 1e-5, onnxruntime's SkipSimplifiedLayerNormalization to 1e-12 (its skip-layer-norm default).
DEFAULT_EPSILON = {
    "RMSNormalization": 1e-5,
    "SimplifiedLayerNormalization": 1e-5,
    "SkipSimplifiedLayerNormalization": 1e-12,
}
# The attributes each op defines (ONNX's and onnxruntime's schemas): any other one means something the contract may not
# compute, so the node is not fused.
KNOWN_ATTRIBUTES = {
    "RMSNormalization": ("axis", "epsilon", "stash_type"),
    "SimplifiedLayerNormalization": ("axis", "epsilon", "stash_type"),
    "SkipSimplifiedLayerNormalization": ("epsilon",),
}
FLOAT32_STASH = onnx.TensorProto.FLOAT
# A 16-bit stash reduces in that dtype; the kernels reduce in float32, which is at least as precise (tagged).
NARROW_STASHES = {onnx.TensorProto.FLOAT16: "stash-float16", onnx.TensorProto.BFLOAT16: "stash-bfloat16"}
SKIP_SUM_OUTPUT = 3


def _key(node: gs.Node) -> tuple[str, str]:
    domain = node.domain or ""
    return node.op, "" if domain in ONNX_DOMAINS else domain


def is_fused_norm(node: gs.Node) -> bool:
    return _key(node) in FUSED_NORM_OPS


def _check_attributes(node: gs.Node) -> None:
    """Every attribute is one the op defines, of the type its schema gives it."""
    known = KNOWN_ATTRIBUTES[node.op]
    for name, value in node.attrs.items():
        if name not in known:
            raise Rejected(
                node, f"attribute {name!r} is not one of {node.op}'s ({', '.join(known)}): its meaning is unknown"
            )
        wanted = float if name == "epsilon" else int
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise Rejected(
                node, f"attribute {name!r} is {value!r}, not a{'' if wanted is int else ' float'} {wanted.__name__}"
            )


def _epsilon(node: gs.Node) -> float:
    """The epsilon as the fused node's float32 attribute holds it; NaN, infinite or negative is no norm the contract
    computes (onnxruntime runs a negative one, taking the root of whatever results)."""
    epsilon = epsilon_float32(node.attrs.get("epsilon", DEFAULT_EPSILON[node.op]))
    if not math.isfinite(epsilon) or epsilon < 0:
        raise Rejected(node, f"epsilon {epsilon:g} is negative or not finite")
    return epsilon


def _stash_tags(node: gs.Node) -> tuple[str, ...]:
    stash = node.attrs.get("stash_type", FLOAT32_STASH)
    if stash == FLOAT32_STASH:
        return ()
    if stash in NARROW_STASHES:
        return (NARROW_STASHES[stash],)
    raise Rejected(node, f"stash_type {stash} is not float32: the kernels reduce in float32")


def _weight_mode(node: gs.Node, x_dtype: str, y_dtype: str) -> WeightMode:
    if node.op != "RMSNormalization" or (x_dtype == "float32" and y_dtype != "float32"):
        return WeightMode.BEFORE_CAST
    return WeightMode.AFTER_CAST


def _cast_back(y: gs.Tensor, x_dtype: str, graph_outputs: set[str]) -> gs.Node | None:
    """The Cast from a float32 Y down to a 16-bit dtype the fused node can write for X, when it is Y's only reader."""
    cast = only_consumer(y, graph_outputs)
    if onnx_op(cast) != "Cast" or dtype_name(y) != "float32":
        return None
    target = cast_target(cast)
    if target == "float32" or dtype_name(cast.outputs[0]) != target or not supported_dtypes(x_dtype, target):
        return None
    return cast


def _hidden_size(node: gs.Node, x: gs.Tensor, scale: gs.Tensor, shapes: Shapes) -> int:
    """X's static last dim, or the scale's length: each op requires the two to agree (a length-1 scale proves none)."""
    hidden = shapes.last_dim(x)
    scale_shape = constant_shape(scale) or shapes.of(scale)
    scale_length = math.prod(scale_shape) if scale_shape and all(isinstance(dim, int) for dim in scale_shape) else None
    if hidden is None and scale_length is not None and scale_length > 1:
        return scale_length
    if hidden is None:
        raise Rejected(node, f"the normalised axis of {x.name} has no static length the graph proves")
    return hidden


def _used(tensor: gs.Tensor, graph_outputs: set[str]) -> bool:
    return bool(tensor.name) and (bool(tensor.outputs) or tensor.name in graph_outputs)


def match_fused(node: gs.Node, graph_outputs: set[str], shapes: Shapes) -> RmsNormMatch:
    """Turn an already-fused norm node into a match, or raise Rejected with the failed condition."""
    skip = node.op == "SkipSimplifiedLayerNormalization"
    _check_attributes(node)
    epsilon = _epsilon(node)
    x = node.inputs[0]
    scale_index = 2 if skip else 1
    if len(node.inputs) <= scale_index or not node.inputs[scale_index].name:
        raise Rejected(node, "the node has no scale input")
    scale = node.inputs[scale_index]
    extra_outputs = [
        tensor for index, tensor in enumerate(node.outputs[1:], start=1) if not (skip and index == SKIP_SUM_OUTPUT)
    ]
    for tensor in extra_outputs:
        if _used(tensor, graph_outputs):
            raise Rejected(node, f"its statistics output {tensor.name} is used")
    if not skip:
        axis = node.attrs.get("axis", -1)
        x_rank = shapes.rank(x)
        if axis != -1 and (x_rank is None or axis != x_rank - 1):
            raise Rejected(node, f"it normalises from axis {axis}, not over the last axis only")
    dtype = dtype_name(x)
    if dtype not in ACTIVATION_DTYPES:
        raise Rejected(node, f"input {x.name} has dtype {dtype}")
    stash_tags = _stash_tags(node)
    y = node.outputs[0]
    # These ops give Y the scale's dtype, which may differ from X's; onnx's shape inference does not know
    # onnxruntime's ops, so a Y of unknown dtype is only taken when it cannot differ from X's.
    y_dtype, scale_dtype = dtype_name(y), dtype_name(scale)
    if y_dtype is None and scale_dtype != dtype:
        raise Rejected(node, f"{scale.name} has dtype {scale_dtype}, the input {dtype}, and {y.name} no known dtype")
    y_dtype = y_dtype or dtype
    if y_dtype != scale_dtype or (skip and y_dtype != dtype):
        types = f"{dtype}, the scale {scale_dtype}, Y {y_dtype}"
        raise Rejected(node, f"its types do not fit its schema: X {types}" + (" (all one dtype)" if skip else ""))
    if not supported_dtypes(dtype, y_dtype):
        raise Rejected(node, f"{dtype} in, {y_dtype} out is no pair a fused node takes")
    hidden = _hidden_size(node, x, scale, shapes)
    x_rank = shapes.rank(x)
    weight = trace_weight(scale, hidden, 1 if x_rank is None else x_rank, dtype_name(scale))
    if isinstance(weight, str):
        raise Rejected(node, f"scale: {weight}")
    mode = _weight_mode(node, dtype, y_dtype)
    cast_back = _cast_back(y, dtype, graph_outputs)
    if cast_back is not None:
        # Y is float32: either never rounded (float32 X) or rounded to X's 16-bit dtype before the scale, which is
        # the cast's dtype too; after the cast the first rounds once (BEFORE_CAST), the second is AFTER_CAST still.
        rounded_to_x = mode == WeightMode.AFTER_CAST and dtype != "float32"
        mode = WeightMode.AFTER_CAST if rounded_to_x else WeightMode.BEFORE_CAST
        y = cast_back.outputs[0]
    skip_inputs = tuple(tensor for tensor in (node.inputs[1], *node.inputs[3:4]) if skip and tensor.name)
    skip_sum = None
    if skip and len(node.outputs) > SKIP_SUM_OUTPUT and _used(node.outputs[SKIP_SUM_OUTPUT], graph_outputs):
        skip_sum = node.outputs[SKIP_SUM_OUTPUT]
    weight_nodes = exclusively_consumed(list(weight.nodes), {id(node)}, graph_outputs)
    return RmsNormMatch(
        nodes=[*weight_nodes, node, *([cast_back] if cast_back is not None else [])],
        x=x,
        y=y,
        weight=weight.weight,
        params=NormParams(epsilon, weight.offset, mode),
        hidden_size=hidden,
        tags=(FUSED_NORM_OPS[_key(node)], *stash_tags),
        name=describe(node),
        skip_inputs=skip_inputs,
        skip_sum=skip_sum,
        # onnxruntime's kernel widens input, skip and bias to float32 and adds there, whatever T is (measured on the
        # CPU provider: the norm reads the unrounded sum, the sum output is it rounded once to T).
        skip_dtype="float32" if skip else None,
    )
