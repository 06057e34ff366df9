"""The small shared primitives have one owner each: NormParams, the fed graph inputs, the trtfuse opset import."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.graph_inputs import fed_inputs

PACKAGE_ROOT = Path(__file__).resolve().parent.parent / "trtfuse"
NORM_FIELDS = {"epsilon", "weight_offset", "weight_mode"}


def _sources() -> dict[str, ast.Module]:
    return {str(path.relative_to(PACKAGE_ROOT)): ast.parse(path.read_text()) for path in PACKAGE_ROOT.rglob("*.py")}


def _classes_declaring_the_constants(tree: ast.Module) -> list[str]:
    """Classes that declare two or more of the three constants as annotated attributes (dataclass fields)."""
    return [
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and len(
            NORM_FIELDS
            & {
                statement.target.id
                for statement in node.body
                if isinstance(statement, ast.AnnAssign) and isinstance(statement.target, ast.Name)
            }
        )
        >= 2
    ]


def test_the_norm_constants_are_declared_only_by_norm_params() -> None:
    declaring = {
        name: classes for name, tree in _sources().items() if (classes := _classes_declaring_the_constants(tree))
    }
    assert declaring == {"contract.py": ["NormParams"]}


def test_norm_params_holds_floats_and_a_weight_mode() -> None:
    params = contract.NormParams(0, 1, 2)
    assert params.weight_mode is contract.WeightMode.BEFORE_CAST
    assert (type(params.epsilon), type(params.weight_offset)) == (float, float)
    with pytest.raises(ValueError):
        contract.NormParams(1e-6, 0.0, 7)


def test_only_rewrite_writes_the_trtfuse_opset_import() -> None:
    writers = sorted(name for name, tree in _sources().items() if "ONNX_DOMAIN_VERSION" in ast.unparse(tree))
    assert writers == ["contract.py", "rewrite.py"]


def test_fed_inputs_leave_out_initializers_listed_as_inputs() -> None:
    inputs = [
        helper.make_tensor_value_info("x", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("w", TensorProto.FLOAT, [2]),
        helper.make_tensor_value_info("mask", TensorProto.FLOAT, [2]),
    ]
    node = helper.make_node("Mul", ["x", "w"], ["y"])
    graph = helper.make_graph(
        [node],
        "g",
        inputs,
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [numpy_helper.from_array(np.ones(2, np.float32), "w")],
    )
    assert [value.name for value in fed_inputs(helper.make_model(graph))] == ["x", "mask"]
