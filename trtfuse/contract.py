"""The plugin-node contract shared by the fusion pass (writer) and the TensorRT plugins (reader).

docs/plugin-nodes.md is the prose version of this module; the two must agree. Each fused node's op_type is the
TensorRT plugin name, so TensorRT's ONNX parser maps it onto the creator registered under `PLUGIN_NAMESPACE`.
"""

from __future__ import annotations

import enum

PLUGIN_NAMESPACE = "trtfuse"
PLUGIN_VERSION = "1"
# Fused nodes live in their own ONNX domain so onnx.checker accepts them; TensorRT's parser keys plugins on op_type.
ONNX_DOMAIN = "trtfuse"
ONNX_DOMAIN_VERSION = 1

RMS_NORM_OP = "TrtfuseRmsNorm"
QK_NORM_OP = "TrtfuseQkNorm"
FUSED_OPS = (RMS_NORM_OP, QK_NORM_OP)


class WeightMode(enum.IntEnum):
    """Where the weight multiply happens relative to the cast back to the activation dtype T.

    With r = rsqrt(mean(x², last axis) + eps) computed in fp32 and w' = w + weight_offset in fp32:
    NONE         y = T(x·r)
    AFTER_CAST   y = T(T(x·r) · w')    Llama, Mistral, Qwen, Phi-3, DeepSeek: normalise, cast back, then scale.
    BEFORE_CAST  y = T(x·r · w')       Gemma (offset 1), OLMo2 (offset 0): scale in fp32, then cast back.
    For fp32 activations AFTER_CAST and BEFORE_CAST are the same function.
    """

    NONE = 0
    AFTER_CAST = 1
    BEFORE_CAST = 2


# Attribute names, in the order the plugins serialise them. Every attribute is required on a fused node.
ATTR_NAMESPACE = "plugin_namespace"
ATTR_VERSION = "plugin_version"
ATTR_EPSILON = "epsilon"  # float32
ATTR_WEIGHT_OFFSET = "weight_offset"  # float32
ATTR_WEIGHT_MODE = "weight_mode"  # int, a WeightMode
ATTR_HIDDEN = "hidden_size"  # int, RMS_NORM_OP only: length of the normalised (last) axis
ATTR_Q_HIDDEN = "q_hidden_size"  # int, QK_NORM_OP only
ATTR_K_HIDDEN = "k_hidden_size"  # int, QK_NORM_OP only

RMS_NORM_FIELDS = (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE, ATTR_HIDDEN)
QK_NORM_FIELDS = (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE, ATTR_Q_HIDDEN, ATTR_K_HIDDEN)

# Inputs and outputs, by position.
#   TrtfuseRmsNorm: inputs (x, weight) — weight absent when weight_mode is NONE; outputs (y,)
#   TrtfuseQkNorm:  inputs (q, k, q_weight, k_weight) — weights absent when weight_mode is NONE; outputs (q_out, k_out)
ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
