"""The plugin-node contract shared by the fusion pass (writer) and the TensorRT plugins (reader).

docs/plugin-nodes.md is the prose version of this module; the two must agree. Each fused node's op_type is the
TensorRT plugin name, so TensorRT's ONNX parser maps it onto the creator registered under `PLUGIN_NAMESPACE`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

PLUGIN_NAMESPACE = "trtfuse"
PLUGIN_VERSION = "1"
# Fused nodes live in their own ONNX domain so onnx.checker accepts them; TensorRT's parser keys plugins on op_type.
ONNX_DOMAIN = "trtfuse"
ONNX_DOMAIN_VERSION = 1

RMS_NORM_OP = "TrtfuseRmsNorm"
QK_NORM_OP = "TrtfuseQkNorm"
FUSED_OPS = (RMS_NORM_OP, QK_NORM_OP)


class WeightMode(enum.IntEnum):
    """Where the weight multiply happens relative to the rounding of the normalised value.

    With r = rsqrt(mean(x², last axis) + eps) computed in fp32, w' = w + weight_offset in fp32, T the output dtype
    (`output_dtype`) and R the node's 16-bit dtype (x's dtype when x is 16-bit, else T; `rounding_dtype`):
    NONE         y = T(x·r)
    AFTER_CAST   y = T(R(x·r) · w')    Llama, Mistral, Qwen, Phi-3, DeepSeek, ONNX RMSNormalization: normalise, round,
                                       then scale.
    BEFORE_CAST  y = T(x·r · w')       Gemma (offset 1), OLMo2 (offset 0): scale in fp32, then round.
    When x and y are both fp32, R is fp32 and AFTER_CAST and BEFORE_CAST are the same function.
    """

    NONE = 0
    AFTER_CAST = 1
    BEFORE_CAST = 2


@dataclass(frozen=True)
class NormParams:
    """The formula's constants every fused node carries (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE).

    The match, the fused-node record, the plugin config, the kernel specs and the kernel math all embed this one
    value; epsilon and weight_offset are float32 values held exactly in Python floats."""

    epsilon: float
    weight_offset: float
    weight_mode: WeightMode

    def __post_init__(self) -> None:
        object.__setattr__(self, "epsilon", float(self.epsilon))
        object.__setattr__(self, "weight_offset", float(self.weight_offset))
        object.__setattr__(self, "weight_mode", WeightMode(self.weight_mode))


# Attribute names, in the order the plugins serialise them. Every attribute but `output_dtype` is required.
ATTR_NAMESPACE = "plugin_namespace"
ATTR_VERSION = "plugin_version"
ATTR_EPSILON = "epsilon"  # float32
ATTR_WEIGHT_OFFSET = "weight_offset"  # float32
ATTR_WEIGHT_MODE = "weight_mode"  # int, a WeightMode
ATTR_HIDDEN = "hidden_size"  # int, RMS_NORM_OP only: length of the normalised (last) axis
ATTR_Q_HIDDEN = "q_hidden_size"  # int, QK_NORM_OP only
ATTR_K_HIDDEN = "k_hidden_size"  # int, QK_NORM_OP only
# int, an ONNX TensorProto code (OUTPUT_DTYPE_CODES): the dtype of every output. The pass writes it on every
# node; a node without it (written before it existed) has outputs of its activations' dtype.
ATTR_OUTPUT_DTYPE = "output_dtype"

RMS_NORM_FIELDS = (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE, ATTR_HIDDEN)
QK_NORM_FIELDS = (ATTR_EPSILON, ATTR_WEIGHT_OFFSET, ATTR_WEIGHT_MODE, ATTR_Q_HIDDEN, ATTR_K_HIDDEN)
OPTIONAL_FIELDS = (ATTR_OUTPUT_DTYPE,)

# AOT plugins (tensorrt.plugin QDPs; trtfuse builds them with TensorRT >= 10.14, plugins/aot.py says why).
# `aot` (INT, 1) is the ONNX parser's node attribute that asks for a QDP's AOT implementation. tensorrt.plugin hands
# aot_impl every field by position, in registration order, so a node built as AOT carries all of AOT_FIELDS,
# `output_dtype` included; weight_mode NONE nodes get a never-read weight of [H] zeros in
# AOT_PLACEHOLDER_WEIGHT_DTYPE, as a QDP's input count is fixed.
ATTR_AOT = "aot"
AOT_FIELDS = {
    RMS_NORM_OP: (*RMS_NORM_FIELDS, *OPTIONAL_FIELDS),
    QK_NORM_OP: (*QK_NORM_FIELDS, *OPTIONAL_FIELDS),
}
AOT_PLACEHOLDER_WEIGHT_DTYPE = "float32"

# Inputs and outputs, by position.
#   TrtfuseRmsNorm: inputs (x, weight) — weight absent when weight_mode is NONE; outputs (y,)
#   TrtfuseQkNorm:  inputs (q, k, q_weight, k_weight) — weights absent when weight_mode is NONE; outputs (q_out, k_out)
ACTIVATION_DTYPES = ("float32", "float16", "bfloat16")
WEIGHT_DTYPES = ("float32", "float16", "bfloat16")
# ONNX TensorProto element types of the output dtypes (onnx.TensorProto.FLOAT, FLOAT16, BFLOAT16).
OUTPUT_DTYPE_CODES = {"float32": 1, "float16": 10, "bfloat16": 16}


def rounding_dtype(dtype: str, output_dtype: str) -> str:
    """R of the semantics: the dtype AFTER_CAST rounds the normalised value to, the node's 16-bit side."""
    return dtype if dtype != "float32" else output_dtype


def dtype_pair_problem(dtype: str, output_dtype: str) -> str | None:
    """Why an (input, output) dtype pair is outside the contract, or None when it is inside."""
    if dtype not in ACTIVATION_DTYPES:
        return f"input dtype {dtype} is not one of {', '.join(ACTIVATION_DTYPES)}"
    if output_dtype not in ACTIVATION_DTYPES:
        return f"output dtype {output_dtype} is not one of {', '.join(ACTIVATION_DTYPES)}"
    if "float32" not in (dtype, output_dtype) and dtype != output_dtype:
        return f"input dtype {dtype} and output dtype {output_dtype} are two different 16-bit dtypes"
    return None


class PluginKind(str, enum.Enum):
    """How an engine's trtfuse nodes run. AOT: TensorRT embeds the kernels and launches them itself, so the engine
    runs in any TensorRT runtime without Python. PYTHON: IPluginV3 plugins that call back into a Python process with
    trtfuse imported, registered before the engine is deserialised. Both kinds implement the nodes above under one
    name, namespace and version, so a process registers one kind."""

    AOT = "aot"
    PYTHON = "python"
