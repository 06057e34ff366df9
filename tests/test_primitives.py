"""The small shared primitives have one owner each: NormParams, the fused nodes' fields (the codec), the dtype
mappings, the fed graph inputs, the trtfuse opset import."""

from __future__ import annotations

import ast

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse import contract
from trtfuse.model.interface import fed_inputs

from support.paths import PACKAGE_ROOT

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
    assert declaring == {"contract/nodes.py": ["NormParams"]}


def test_norm_params_holds_floats_and_a_weight_mode() -> None:
    params = contract.NormParams(0, 1, 2)
    assert params.weight_mode is contract.WeightMode.BEFORE_CAST
    assert (type(params.epsilon), type(params.weight_offset)) == (float, float)
    with pytest.raises(ValueError):
        contract.NormParams(1e-6, 0.0, 7)


def test_only_rewrite_writes_the_trtfuse_opset_import() -> None:
    """The rewrite writes the domain's version; fused_nodes, the one reader of fused models, refuses another one."""
    users = sorted(name for name, tree in _sources().items() if "ONNX_DOMAIN_VERSION" in ast.unparse(tree))
    assert users == ["contract/__init__.py", "contract/nodes.py", "fusion/fused_nodes.py", "fusion/rewrite.py"]


def _modules_mentioning(text: str) -> list[str]:
    return sorted(name for name, tree in _sources().items() if text in ast.unparse(tree))


def test_one_codec_reads_the_fused_nodes_attributes() -> None:
    """Every reader of a node's fields (check, the lowering, the AOT form, both plugin kinds) goes through the codec:
    no other runtime module reads ONNX attribute values or decodes field bytes itself."""
    readers = [name for name in _modules_mentioning("get_attribute_value") if not name.startswith("bench/")]
    assert readers == ["contract/codec.py"]
    decoders = [name for name in _modules_mentioning("frombuffer") if not name.startswith("bench/")]
    assert decoders == ["contract/codec.py"]


def test_each_dtype_mapping_has_one_owner() -> None:
    """ONNX codes <-> contract dtypes in contract/nodes.py (inverted once), TensorRT DataType <-> contract dtypes in
    plugins/trt_module.py."""
    inverted = [name for name in _modules_mentioning("OUTPUT_DTYPE_CODES.items()") if not name.startswith("bench/")]
    assert inverted == ["contract/codec.py", "contract/nodes.py"]  # the codec only spells the codes in messages
    assert [name for name in _modules_mentioning("DataType.BF16") if not name.startswith("bench/")] == [
        "plugins/trt_module.py"
    ]


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
