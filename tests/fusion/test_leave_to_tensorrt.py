"""`--no-fuse-qk` and `--no-fuse-norm` (`FusionOptions.fuse_qk`, `fuse_norm`): the kinds of node `compile
--never-slower` can leave to TensorRT; the norms they leave stay exactly as the graph computes them."""

from __future__ import annotations

import json

import onnx
import pytest

from trtfuse import contract
from trtfuse.fusion.fuse import fuse_model
from trtfuse.fusion.fused_nodes import plugin_node_counts
from trtfuse.fusion.options import FusionOptions
from trtfuse.fusion.patterns.search import LEFT_NORM, LEFT_QK

from support.cli import run_cli
from support.paths import FIXTURES

QWEN3 = FIXTURES / "qwen3-torchscript-fp16.onnx"


def _counts(options: FusionOptions) -> dict[str, int]:
    return {op: n for op, n in plugin_node_counts(fuse_model(onnx.load(QWEN3), options).model).items() if n}


def test_the_full_fusion_of_the_qwen3_fixture():
    assert _counts(FusionOptions()) == {
        contract.RMS_NORM_OP: 1,
        contract.QK_NORM_ROPE_OP: 2,
        contract.ADD_RMS_NORM_OP: 4,
    }


def test_no_fuse_qk_leaves_both_norms_of_each_pair_unfused():
    result = fuse_model(onnx.load(QWEN3), FusionOptions(fuse_qk=False))
    assert {op: n for op, n in plugin_node_counts(result.model).items() if n} == {
        contract.RMS_NORM_OP: 1,
        contract.ADD_RMS_NORM_OP: 4,
    }
    left = [miss for miss in result.search.near_misses if miss.reason == LEFT_QK]
    assert len(left) == 4, "two pairs, both norms of each"
    original_ops = [node.op_type for node in onnx.load(QWEN3).graph.node]
    assert [node.op_type for node in result.model.graph.node].count("ReduceMean") == 4
    assert original_ops.count("ReduceMean") == 9


def test_no_fuse_norm_leaves_the_norms_fused_alone():
    result = fuse_model(onnx.load(QWEN3), FusionOptions(fuse_norm=False))
    assert {op: n for op, n in plugin_node_counts(result.model).items() if n} == {
        contract.QK_NORM_ROPE_OP: 2,
        contract.ADD_RMS_NORM_OP: 4,
    }
    assert [miss.reason for miss in result.search.near_misses].count(LEFT_NORM) == 1


def test_with_no_fuse_residual_the_add_norms_become_norms_fused_alone_and_no_fuse_norm_leaves_them_too():
    assert _counts(FusionOptions(fuse_residual=False, fuse_norm=False)) == {contract.QK_NORM_ROPE_OP: 2}


@pytest.mark.parametrize(("flag", "left"), [("--no-fuse-qk", 4), ("--no-fuse-norm", 1)])
def test_inspect_names_what_each_flag_leaves(flag, left):
    result = run_cli("inspect", QWEN3, flag, "--json")
    assert result.exit_code == 0, result.output
    reasons = [miss["reason"] for miss in json.loads(result.stdout)["near_misses"]]
    assert sum(flag in reason for reason in reasons) == left
