"""Small ONNX models the tests build by hand: a projection with one large weight, Llama-style norm stacks, a
LayerNorm negative, and a tiny LM (embedding, RMSNorm, projection) with its norm decomposed or fused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract

# 512 x 1024 fp32 = 2 MiB: above trtfuse.model.onnx_file.SMALL_TENSOR_BYTES, so it stays external after loading.
LARGE_SHAPE = (512, 1024)


def projection_model(opset: int = 18) -> onnx.ModelProto:
    """y = (x @ W) * scale: one large weight, one small one, a symbolic batch dim."""
    rng = np.random.default_rng(0)
    weight = numpy_helper.from_array(rng.standard_normal(LARGE_SHAPE).astype(np.float32), "W")
    scale = numpy_helper.from_array(rng.standard_normal(LARGE_SHAPE[1]).astype(np.float32), "scale")
    nodes = [
        helper.make_node("MatMul", ["x", "W"], ["h"], name="project"),
        helper.make_node("Mul", ["h", "scale"], ["y"], name="rescale"),
    ]
    graph = helper.make_graph(
        nodes,
        "projection",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", LARGE_SHAPE[0]])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", LARGE_SHAPE[1]])],
        [weight, scale],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def save_external(model: onnx.ModelProto, path: Path, location: str = "weights.data") -> Path:
    """Save with every tensor in one external data file next to the model."""
    onnx.save_model(
        model, str(path), save_as_external_data=True, all_tensors_to_one_file=True, location=location, size_threshold=0
    )
    return path


def llama_norm_model(
    dtype: int = TensorProto.FLOAT16, hidden: int = 64, opset: int = 18, epsilon: float = 1e-6, layers: int = 1
) -> onnx.ModelProto:
    """A stack of Llama-style RMSNorms (upcast, Pow, ReduceMean, Add, Sqrt, Div(1, .), Mul, cast back, weight) with a
    MatMul between them, so the norms are separate; as HF's LlamaRMSNorm exports."""
    rng = np.random.default_rng(0)
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    initializers = [
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(epsilon, np.float32), "epsilon"),
    ]
    if opset >= 18:
        initializers.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    nodes = []
    current = "x"
    for layer in range(layers):
        name = f"layers.{layer}.norm"
        weight = rng.normal(1.0, 0.5, hidden).astype(np_dtype)
        projection = (rng.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np_dtype)
        initializers += [
            numpy_helper.from_array(weight, f"{name}.weight"),
            numpy_helper.from_array(projection, f"layers.{layer}.proj"),
        ]
        mean_inputs = [f"{name}/pow", "axes"] if opset >= 18 else [f"{name}/pow"]
        mean_attrs = {"keepdims": 1} if opset >= 18 else {"keepdims": 1, "axes": [-1]}
        nodes += [
            helper.make_node("Cast", [current], [f"{name}/x32"], name=f"{name}/Cast", to=TensorProto.FLOAT),
            helper.make_node("Pow", [f"{name}/x32", "two"], [f"{name}/pow"], name=f"{name}/Pow"),
            helper.make_node("ReduceMean", mean_inputs, [f"{name}/mean"], name=f"{name}/ReduceMean", **mean_attrs),
            helper.make_node("Add", [f"{name}/mean", "epsilon"], [f"{name}/var"], name=f"{name}/Add"),
            helper.make_node("Sqrt", [f"{name}/var"], [f"{name}/sqrt"], name=f"{name}/Sqrt"),
            helper.make_node("Div", ["one", f"{name}/sqrt"], [f"{name}/rsqrt"], name=f"{name}/Div"),
            helper.make_node("Mul", [f"{name}/x32", f"{name}/rsqrt"], [f"{name}/normed32"], name=f"{name}/Mul"),
            helper.make_node("Cast", [f"{name}/normed32"], [f"{name}/normed"], name=f"{name}/Cast_1", to=dtype),
            helper.make_node("Mul", [f"{name}.weight", f"{name}/normed"], [f"{name}/y"], name=f"{name}/Mul_1"),
            helper.make_node(
                "MatMul", [f"{name}/y", f"layers.{layer}.proj"], [f"layers.{layer}/out"], name=f"layers.{layer}/proj"
            ),
        ]
        current = f"layers.{layer}/out"
    nodes.append(helper.make_node("Identity", [current], ["y"], name="output"))
    graph = helper.make_graph(
        nodes,
        "llama_norms",
        [helper.make_tensor_value_info("x", dtype, ["batch", "sequence", hidden])],
        [helper.make_tensor_value_info("y", dtype, ["batch", "sequence", hidden])],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.producer_name = "trtfuse-tests"
    model.metadata_props.append(onnx.StringStringEntryProto(key="origin", value="conftest"))
    return model


def layer_norm_model() -> onnx.ModelProto:
    """A mean-subtracting LayerNorm, decomposed: must stay as it is."""
    hidden = 16
    initializers = [
        numpy_helper.from_array(np.array([-1], np.int64), "axes"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
        numpy_helper.from_array(np.array(1e-5, np.float32), "epsilon"),
        numpy_helper.from_array(np.ones(hidden, np.float32), "weight"),
    ]
    nodes = [
        helper.make_node("ReduceMean", ["x", "axes"], ["mu"], name="ln/mean_x"),
        helper.make_node("Sub", ["x", "mu"], ["centred"], name="ln/sub"),
        helper.make_node("Pow", ["centred", "two"], ["square"], name="ln/pow"),
        helper.make_node("ReduceMean", ["square", "axes"], ["variance"], name="ln/mean"),
        helper.make_node("Add", ["variance", "epsilon"], ["shifted"], name="ln/add"),
        helper.make_node("Sqrt", ["shifted"], ["root"], name="ln/sqrt"),
        helper.make_node("Div", ["centred", "root"], ["normalised"], name="ln/div"),
        helper.make_node("Mul", ["normalised", "weight"], ["y"], name="ln/scale"),
    ]
    graph = helper.make_graph(
        nodes,
        "layer_norm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, hidden])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, hidden])],
        initializers,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


VOCAB, HIDDEN, OUT = 32, 16, 8
EPSILON = 1e-6


def tiny_lm(dtype: np.dtype, fused: bool, epsilon: float = EPSILON) -> onnx.ModelProto:
    """Embedding -> RMSNorm (Llama form: normalise in fp32, cast back, scale) -> projection.

    `fused` writes the norm as the plugin node the fusion pass would produce, so these tests need only the contract.
    """
    rng = np.random.default_rng(7)
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    initializers = [
        numpy_helper.from_array(rng.standard_normal((VOCAB, HIDDEN)).astype(dtype), "embedding"),
        numpy_helper.from_array((1.0 + 0.5 * rng.standard_normal(HIDDEN)).astype(dtype), "norm.weight"),
        numpy_helper.from_array(rng.standard_normal((HIDDEN, OUT)).astype(dtype), "lm_head"),
    ]
    nodes = [helper.make_node("Gather", ["embedding", "input_ids"], ["hidden"], name="embed")]
    if fused:
        nodes.append(
            helper.make_node(
                contract.RMS_NORM_OP,
                ["hidden", "norm.weight"],
                ["normed"],
                name="norm",
                domain=contract.ONNX_DOMAIN,
                **{
                    contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
                    contract.ATTR_VERSION: contract.PLUGIN_VERSION,
                    contract.ATTR_EPSILON: epsilon,
                    contract.ATTR_WEIGHT_OFFSET: 0.0,
                    contract.ATTR_WEIGHT_MODE: int(contract.WeightMode.AFTER_CAST),
                    contract.ATTR_HIDDEN: HIDDEN,
                    contract.ATTR_OUTPUT_DTYPE: elem,
                },
            )
        )
    else:
        initializers += [
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(epsilon, np.float32), "eps"),
        ]
        nodes += [
            helper.make_node("Cast", ["hidden"], ["x32"], to=TensorProto.FLOAT, name="norm/cast"),
            helper.make_node("Pow", ["x32", "two"], ["square"], name="norm/pow"),
            helper.make_node("ReduceMean", ["square"], ["mean"], axes=[-1], keepdims=1, name="norm/mean"),
            helper.make_node("Add", ["mean", "eps"], ["variance"], name="norm/add"),
            helper.make_node("Sqrt", ["variance"], ["root"], name="norm/sqrt"),
            helper.make_node("Reciprocal", ["root"], ["inverse"], name="norm/reciprocal"),
            helper.make_node("Mul", ["x32", "inverse"], ["normalised"], name="norm/mul"),
            helper.make_node("Cast", ["normalised"], ["rounded"], to=elem, name="norm/cast_back"),
            helper.make_node("Mul", ["rounded", "norm.weight"], ["normed"], name="norm/scale"),
        ]
    nodes.append(helper.make_node("MatMul", ["normed", "lm_head"], ["logits"], name="lm_head"))
    graph = helper.make_graph(
        nodes,
        "tiny_lm",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "sequence"])],
        [helper.make_tensor_value_info("logits", elem, ["batch", "sequence", OUT])],
        initializers,
        # Shape inference cannot see through a plugin node; the fusion pass records its output type like this.
        value_info=[helper.make_tensor_value_info("normed", elem, ["batch", "sequence", HIDDEN])] if fused else None,
    )
    opsets = [helper.make_opsetid("", 17)]
    if fused:
        opsets.append(helper.make_opsetid(contract.ONNX_DOMAIN, contract.ONNX_DOMAIN_VERSION))
    return helper.make_model(graph, opset_imports=opsets)


def save_model_file(model: onnx.ModelProto, path: Path) -> Path:
    onnx.save(model, str(path))
    return path
