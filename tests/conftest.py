"""Shared fixtures: small ONNX models written to a temp folder, with and without external data."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

# Kernels compiled by the tests go to a throwaway cache, not the user's; .ci/gpu sets its own to share with the bench.
os.environ.setdefault("TRTFUSE_KERNEL_CACHE", tempfile.mkdtemp(prefix="trtfuse-test-kernel-cache-"))

# 512 x 1024 fp32 = 2 MiB: above trtfuse.model_io.SMALL_TENSOR_BYTES, so it stays external after loading.
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


@pytest.fixture
def external_model(tmp_path: Path) -> Path:
    """The projection model with all weights in `weights.data`, in its own folder."""
    folder = tmp_path / "source"
    folder.mkdir()
    return save_external(projection_model(), folder / "model.onnx")


@pytest.fixture
def write_model(tmp_path: Path) -> Callable[[onnx.ModelProto, str], Path]:
    """Write a model (weights inline) into the test's temp folder."""

    def write(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        onnx.save_model(model, str(path))
        return path

    return write


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
