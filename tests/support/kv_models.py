"""KV-cache models laid out as the real exporters write them (input names, dims, dtypes, attention ops), small
enough for onnxruntime to run in a test."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

VOCAB, HIDDEN, HEADS, KV_HEADS, HEAD_SIZE, POSITIONS = 11, 32, 4, 2, 16, 16
COS_SIN = ("cos_cache", "sin_cache")


def _constant(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(array, name)


def genai_model(packed: bool = True, positions: int = POSITIONS) -> onnx.ModelProto:
    """onnxruntime-genai's builder layout: GroupQueryAttention on a packed QKV MatMul, a cache whose head size is the
    symbol `kv_cache_dim`, an attention mask of `total_sequence_length`, seqlens_k and the total length computed
    in the graph, rotary caches of `positions` rows."""
    rng = np.random.default_rng(0)
    cache_shape = ["batch_size", KV_HEADS, "past_sequence_length", "kv_cache_dim"]
    present_shape = ["batch_size", KV_HEADS, "total_sequence_length", "kv_cache_dim"]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache_shape),
        helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, cache_shape),
    ]
    outputs = [
        helper.make_tensor_value_info("attn", TensorProto.FLOAT, ["batch_size", "sequence_length", HEADS * HEAD_SIZE]),
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, present_shape),
        helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, present_shape),
    ]
    qkv_width = (HEADS + 2 * KV_HEADS) * HEAD_SIZE
    initializers = [
        _constant("embed", rng.standard_normal((VOCAB, HIDDEN)).astype(np.float32)),
        _constant("qkv_weight", rng.standard_normal((HIDDEN, qkv_width)).astype(np.float32)),
        _constant("cos_cache", np.cos(rng.standard_normal((positions, HEAD_SIZE // 2))).astype(np.float32)),
        _constant("sin_cache", np.sin(rng.standard_normal((positions, HEAD_SIZE // 2))).astype(np.float32)),
        _constant("one", np.array(1, np.int64)),
        _constant("axis_1", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["hidden"], name="embed_tokens"),
        helper.make_node("MatMul", ["hidden", "qkv_weight"], ["qkv"], name="qkv_proj"),
        helper.make_node("ReduceSum", ["attention_mask", "axis_1"], ["mask_sum"], keepdims=0),
        helper.make_node("Sub", ["mask_sum", "one"], ["mask_sum_1"]),
        helper.make_node("Cast", ["mask_sum_1"], ["seqlens_k"], to=TensorProto.INT32),
        helper.make_node("Shape", ["attention_mask"], ["mask_shape"]),
        helper.make_node("Gather", ["mask_shape", "one"], ["total_length"], axis=0),
        helper.make_node("Cast", ["total_length"], ["total_seq_len"], to=TensorProto.INT32),
    ]
    if packed:
        query, key, value = "qkv", "", ""
    else:
        nodes.append(
            helper.make_node(
                "Split",
                ["qkv", "split_sizes"],
                ["q", "k", "v"],
                axis=-1,
            )
        )
        sizes = [HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE, KV_HEADS * HEAD_SIZE]
        initializers.append(_constant("split_sizes", np.array(sizes, np.int64)))
        query, key, value = "q", "k", "v"
    nodes.append(
        helper.make_node(
            "GroupQueryAttention",
            [
                query,
                key,
                value,
                "past_key_values.0.key",
                "past_key_values.0.value",
                "seqlens_k",
                "total_seq_len",
                *COS_SIN,
            ],
            ["attn", "present.0.key", "present.0.value"],
            name="layers.0.attn.GroupQueryAttention",
            domain="com.microsoft",
            num_heads=HEADS,
            kv_num_heads=KV_HEADS,
            do_rotary=1,
        )
    )
    graph = helper.make_graph(nodes, "genai", inputs, outputs, initializers)
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def optimum_model(cache_head_size: int | str = HEAD_SIZE, positions: int = POSITIONS) -> onnx.ModelProto:
    """optimum's `text-generation-with-past` layout: caches `past_key_values.0.key/value`, an attention mask of
    `past_sequence_length + sequence_length`, position ids, `present.0.key/value` concatenating past and new.
    With `cache_head_size="kv_cache_dim"`, the caches' head size is symbolic as in genai's CPU fp16 export, whose
    attention concatenates the cache with the new keys in plain ops. Position ids index a table of `positions` rows."""
    rng = np.random.default_rng(1)
    cache = ["batch_size", KV_HEADS, "past_sequence_length", cache_head_size]
    present = ["batch_size", KV_HEADS, "past_sequence_length + sequence_length", cache_head_size]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info(
            "attention_mask", TensorProto.INT64, ["batch_size", "past_sequence_length + sequence_length"]
        ),
        helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache),
        helper.make_tensor_value_info("past_key_values.0.value", TensorProto.FLOAT, cache),
    ]
    outputs = [
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, present),
        helper.make_tensor_value_info("present.0.value", TensorProto.FLOAT, present),
        helper.make_tensor_value_info("positions", TensorProto.FLOAT, ["batch_size", "sequence_length", HIDDEN]),
        helper.make_tensor_value_info("mask_sum", TensorProto.INT64, ["batch_size"]),
    ]
    initializers = [
        _constant("embed", rng.standard_normal((VOCAB, KV_HEADS * HEAD_SIZE)).astype(np.float32)),
        _constant("position_table", rng.standard_normal((positions, HIDDEN)).astype(np.float32)),
        _constant("heads_shape", np.array([0, 0, KV_HEADS, HEAD_SIZE], np.int64)),
        _constant("axis_1", np.array([1], np.int64)),
    ]
    nodes = [
        helper.make_node("Gather", ["embed", "input_ids"], ["new"]),
        helper.make_node("Reshape", ["new", "heads_shape"], ["new_heads"]),
        helper.make_node("Transpose", ["new_heads"], ["new_kv"], perm=[0, 2, 1, 3]),
        helper.make_node("Concat", ["past_key_values.0.key", "new_kv"], ["present.0.key"], axis=2),
        helper.make_node("Concat", ["past_key_values.0.value", "new_kv"], ["present.0.value"], axis=2),
        helper.make_node("Gather", ["position_table", "position_ids"], ["positions"]),
        helper.make_node("ReduceSum", ["attention_mask", "axis_1"], ["mask_sum"], keepdims=0),
    ]
    return helper.make_model(helper.make_graph(nodes, "optimum", inputs, outputs, initializers))


def windowed_genai_model(window: int = 4, packed: bool = True) -> onnx.ModelProto:
    """onnxruntime-genai's sliding layer (Gemma3): genai_model with a window-sized cache. GroupQueryAttention has
    sliding_window_cache=1 and local_window_size=`window`, the cache's sequence dim is `past_sliding_length` and the
    present's `total_sliding_length` (both hold the window, whatever the step)."""
    model = genai_model(packed=packed)
    for value in (*model.graph.input, *model.graph.output):
        if value.name.startswith(("past_key_values.", "present.")):
            dim = value.type.tensor_type.shape.dim[2]
            dim.dim_param = "past_sliding_length" if value.name.startswith("past") else "total_sliding_length"
    attention = next(node for node in model.graph.node if node.op_type == "GroupQueryAttention")
    attention.attribute.extend(
        [helper.make_attribute("local_window_size", window), helper.make_attribute("sliding_window_cache", 1)]
    )
    return model
