"""RMSNorms an exporter or optimiser already fused into one node.

RMSNormalization (ONNX opset 23) casts the normalised value back to T before scaling: AFTER_CAST.
onnxruntime's SimplifiedLayerNormalization and SkipSimplifiedLayerNormalization scale in float32 and cast last:
BEFORE_CAST. The residual sum of the skip variant becomes a plain Add in front of the fused node.
"""

from __future__ import annotations

import onnx_graphsurgeon as gs

from trtfuse.contract import ACTIVATION_DTYPES, WeightMode
from trtfuse.patterns.decomposed import epsilon_float32
from trtfuse.patterns.epilogue import trace_weight
from trtfuse.patterns.matches import Rejected, RmsNormMatch
from trtfuse.patterns.queries import describe, dtype_name, exclusively_consumed, rank, static_last_dim

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
FLOAT32_STASH = 1
SKIP_SUM_OUTPUT = 3


def is_fused_norm(node: gs.Node) -> bool:
    return (node.op, node.domain or "") in FUSED_NORM_OPS


def _used(tensor: gs.Tensor, graph_outputs: set[str]) -> bool:
    return bool(tensor.name) and (bool(tensor.outputs) or tensor.name in graph_outputs)


def match_fused(node: gs.Node, graph_outputs: set[str]) -> RmsNormMatch:
    """Turn an already-fused norm node into a match, or raise Rejected with the failed condition."""
    skip = node.op == "SkipSimplifiedLayerNormalization"
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
        x_rank = rank(x)
        if axis != -1 and (x_rank is None or axis != x_rank - 1):
            raise Rejected(node, f"it normalises from axis {axis}, not over the last axis only")
    dtype = dtype_name(x)
    if dtype not in ACTIVATION_DTYPES:
        raise Rejected(node, f"input {x.name} has dtype {dtype}")
    if node.attrs.get("stash_type", FLOAT32_STASH) != FLOAT32_STASH:
        raise Rejected(node, "stash_type is not float32: the kernels reduce in float32")
    y = node.outputs[0]
    # These ops give Y the scale's dtype; onnx's shape inference does not know onnxruntime's, so check both.
    for tensor in (y, scale):
        if dtype_name(tensor) not in (None, dtype):
            raise Rejected(node, f"{tensor.name} has dtype {dtype_name(tensor)}, the input {dtype}")
    hidden = static_last_dim(x)
    if hidden is None:
        raise Rejected(node, f"the normalised axis of {x.name} has no static length")
    weight = trace_weight(scale, hidden, node)
    if isinstance(weight, str):
        raise Rejected(node, f"scale: {weight}")
    mode = WeightMode.AFTER_CAST if node.op == "RMSNormalization" else WeightMode.BEFORE_CAST
    skip_inputs = tuple(tensor for tensor in (node.inputs[1], *node.inputs[3:4]) if skip and tensor.name)
    skip_sum = None
    if skip and len(node.outputs) > SKIP_SUM_OUTPUT and _used(node.outputs[SKIP_SUM_OUTPUT], graph_outputs):
        skip_sum = node.outputs[SKIP_SUM_OUTPUT]
    return RmsNormMatch(
        nodes=[*exclusively_consumed(list(weight.nodes), {id(node)}, graph_outputs), node],
        x=x,
        y=y,
        weight=weight.weight,
        epsilon=epsilon_float32(node.attrs.get("epsilon", DEFAULT_EPSILON[node.op])),
        weight_offset=weight.offset,
        weight_mode=mode,
        hidden_size=hidden,
        tags=(FUSED_NORM_OPS[(node.op, node.domain or "")],),
        name=describe(node),
        skip_inputs=skip_inputs,
        skip_sum=skip_sum,
    )
