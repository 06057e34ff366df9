"""Fused models written by hand, node by node, as a foreign or hand-edited file may hold them (any attribute may be
left out or wrong); and fused models as the pass writes them, one per kind of norm."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.contract import WeightMode

from support.graphs import AttentionSpec, NormSpec, attention_block, single_norm

HIDDEN = 64


def fused_node(
    op: str,
    inputs: list[str],
    outputs: list[str],
    mode: WeightMode,
    hidden: tuple[int, ...],
    output_dtype: int | None = 10,
    name: str = "norm",
    **extra: object,
) -> onnx.NodeProto:
    hidden_names = contract.OPS[op].hidden_fields
    attributes: dict[str, object] = {
        contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
        contract.ATTR_VERSION: contract.PLUGIN_VERSION,
        contract.ATTR_EPSILON: 1e-6,
        contract.ATTR_WEIGHT_OFFSET: 0.0,
        contract.ATTR_WEIGHT_MODE: int(mode),
        **dict(zip(hidden_names, hidden, strict=True)),
    }
    if output_dtype is not None:
        attributes[contract.ATTR_OUTPUT_DTYPE] = output_dtype
    attributes.update(extra)
    return helper.make_node(op, inputs, outputs, name=name, domain=contract.ONNX_DOMAIN, **attributes)


def fused_model(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, tuple[int, list]],
    outputs: dict[str, tuple[int, list]],
    initializers: list[onnx.TensorProto] = (),
) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes,
        "fused",
        [helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in inputs.items()],
        [helper.make_tensor_value_info(name, dtype, shape) for name, (dtype, shape) in outputs.items()],
        list(initializers),
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def rms_model(
    mode: WeightMode = WeightMode.AFTER_CAST, output_dtype: int | None = 10, **extra: object
) -> onnx.ModelProto:
    weighted = mode is not WeightMode.NONE
    weights = [numpy_helper.from_array(np.ones(HIDDEN, np.float16), "w")] if weighted else []
    node = fused_node(
        contract.RMS_NORM_OP, ["x", "w"] if weighted else ["x"], ["y"], mode, (HIDDEN,), output_dtype, **extra
    )
    shape = ["tokens", HIDDEN]
    return fused_model([node], {"x": (TensorProto.FLOAT16, shape)}, {"y": (TensorProto.FLOAT16, shape)}, weights)


def attributes_of(node: onnx.NodeProto) -> dict[str, object]:
    return {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}


def trtfuse_nodes(model: onnx.ModelProto) -> list[onnx.NodeProto]:
    return [node for node in model.graph.node if node.domain == contract.ONNX_DOMAIN]


def aot_attribute_names(op: str) -> list[str]:
    return [contract.ATTR_NAMESPACE, contract.ATTR_VERSION, *contract.OPS[op].fields, contract.ATTR_AOT]


FUSED_MODELS = {
    "rms-fp16-llama": lambda: single_norm(NormSpec(dtype="float16")),
    "rms-bf16-gemma": lambda: single_norm(NormSpec(dtype="bfloat16", weight="before-cast", offset="add-one-last")),
    "rms-fp32-no-weight": lambda: single_norm(NormSpec(weight="none")),
    "qk-fp16-qwen3": lambda: attention_block(AttentionSpec("qk-head-dim", dtype="float16")),
    "qk-bf16-mla": lambda: attention_block(AttentionSpec("mla-latent", dtype="bfloat16")),
}
