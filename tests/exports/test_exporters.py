"""The per-tool fixtures in models/fixtures/tools (optimum, onnxruntime-optimized optimum, onnxruntime-genai,
ModelOpt int8, and fp8 with a KV cache, dynamo at opset 23, onnxslim): each fuses into exactly as many norms as its
torch model calls, with every q/k pair paired, every residual Add in front of a norm fused with it (or kept out with
the reason), and no norm left partly fused, and the fused model passes `check` against the original."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

from trtfuse import contract
from trtfuse.fusion.fuse import FuseResult, fuse_model
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.verify.check import check_fused

from support.paths import TOOL_FIXTURES, fixture_models

FIXTURES = TOOL_FIXTURES
EXPECTED: dict[str, dict] = json.loads((FIXTURES / "expected.json").read_text())["files"]
NAMES = sorted(EXPECTED)
# Each tool's graphs differ in a way the others' do not: one fixture per tool, well under 1 MB each.
TOOLS = {"optimum", "genai", "modelopt", "dynamo23", "onnxslim"}
# Residual Adds that stay outside the norm after them without the quantizers taken in (--no-fuse-quant): ModelOpt
# quantizes the sum each layer's norm reads (a QuantizeLinear -> DequantizeLinear pair between them); only the final
# norm reads the sum itself. By default the pair is the add-norm's input quantizer and no Add stays out.
KEPT_OUT_WITHOUT_QUANT = {
    "qwen3-modelopt-int8-fp16.onnx": 3,
    "qwen3-modelopt-fp8-kv.onnx": 3,
    "gemma3-modelopt-int8-fp16.onnx": 3,
}
# The nodes a q/k pair fuses into: with or without the rotation after it, with or without its outputs' Qs.
PAIR_OPS = (contract.QK_NORM_OP, contract.QK_NORM_QUANT_OP, contract.QK_NORM_ROPE_OP, contract.QK_NORM_ROPE_QUANT_OP)
# Rotations that stay outside the q/k pair's node, one per layer (docs/patterns.md, "Rotary embedding"): Gemma3's
# INT8 export quantizes the norms' outputs before the rotation, genai's builder rotates inside GroupQueryAttention.
# (ModelOpt's Qwen3 exports quantize each product of the rotation: the node takes those pairs in as product stages.)
ROTATIONS_KEPT_OUT = {"qwen3-genai-cpu-int4.onnx": 2}


def _fused(name: str) -> tuple[LoadedModel, FuseResult]:
    original = load_model(FIXTURES / name)
    return original, fuse_model(original.model)


def test_manifest_lists_exactly_the_committed_tool_fixtures() -> None:
    on_disk = {path.name: path.stat().st_size for path in fixture_models(FIXTURES)}
    assert on_disk == {name: entry["bytes"] for name, entry in EXPECTED.items()}
    assert all(size < 2**20 for size in on_disk.values())
    assert {entry["tool"] for entry in EXPECTED.values()} == TOOLS
    assert all(entry["uses_rms_norm"] and entry["norm_calls"] > 0 for entry in EXPECTED.values())


@pytest.mark.parametrize("name", NAMES)
def test_tool_fixture_fuses_every_norm_call_and_nothing_else(name: str) -> None:
    entry = EXPECTED[name]
    _, result = _fused(name)
    kinds = Counter(node.kind for node in result.fused)
    assert sum(contract.OPS[op].norm_calls * count for op, count in kinds.items()) == entry["norm_calls"]
    # Each norm that reads a residual sum takes its Add (through the pair on the sum, for ModelOpt's exports).
    assert result.search.residual_near_misses == [], result.report()["residual_near_misses"]
    add_norms = kinds[contract.ADD_RMS_NORM_OP] + kinds[contract.ADD_RMS_NORM_QUANT_OP]
    assert add_norms == entry["add_norm_calls"]
    without_quant = fuse_model(load_model(FIXTURES / name).model, FusionOptions(fuse_quant=False))
    kept_out = without_quant.search.residual_near_misses
    assert len(kept_out) == KEPT_OUT_WITHOUT_QUANT.get(name, 0), without_quant.report()["residual_near_misses"]
    plugin_nodes = Counter(node.op_type for node in result.model.graph.node if node.domain == contract.ONNX_DOMAIN)
    assert plugin_nodes == kinds


@pytest.mark.parametrize("name", [name for name in NAMES if EXPECTED[name]["qk_norm_calls"]])
def test_tool_fixture_pairs_every_qk_norm(name: str) -> None:
    """The q and k norms of every layer have one epsilon, dtype and weight mode: numerics allow pairing each (into a
    TrtfuseQkNormQuant where their outputs' Qs are taken in)."""
    _, result = _fused(name)
    kinds = Counter(node.kind for node in result.fused)
    pairs = sum(kinds[op] for op in PAIR_OPS)
    assert 2 * pairs == EXPECTED[name]["qk_norm_calls"], result.report()["near_misses"]


@pytest.mark.parametrize("name", [name for name in NAMES if EXPECTED[name]["qk_norm_calls"]])
def test_tool_fixture_fuses_every_rotation_one_node_computes(name: str) -> None:
    """Each layer's q/k norms are rotated right after: the pair and its rotation are one TrtfuseQkNormRope (a
    TrtfuseQkNormRopeQuant where ModelOpt quantizes the norms' inputs, inverse roots or outputs, or each product), but
    where the tool moved it into the attention op (genai), which stays, with its reason."""
    _, result = _fused(name)
    kinds = Counter(node.kind for node in result.fused)
    kept_out = ROTATIONS_KEPT_OUT.get(name, 0)
    rotated = kinds[contract.QK_NORM_ROPE_OP] + kinds[contract.QK_NORM_ROPE_QUANT_OP]
    assert 2 * rotated == EXPECTED[name]["qk_norm_calls"] - 2 * kept_out
    assert len(result.search.rope_near_misses) == kept_out, result.report()["rope_near_misses"]


@pytest.mark.parametrize("name", NAMES)
def test_tool_fixture_leaves_no_norm_partly_fused(name: str) -> None:
    """Every norm of these families multiplies by a weight; a fused node without one left the multiply (and the cast
    before it) in the graph."""
    entry = EXPECTED[name]
    _, result = _fused(name)
    assert [node.name for node in result.fused if node.params.weight_mode is contract.WeightMode.NONE] == []
    # The epsilon as the graph holds it: float32, or fp16 where the tool converted the constant (ModelOpt).
    stored = {float(np.float32(entry["epsilon"])), float(np.float16(entry["epsilon"]))}
    assert [node.as_dict() for node in result.fused if node.params.epsilon not in stored] == []


@pytest.mark.parametrize("name", NAMES)
def test_fused_tool_fixture_passes_check(name: str) -> None:
    original, result = _fused(name)
    verdict = check_fused(original, LoadedModel(model=result.model, path=original.path))
    assert verdict.passed, verdict.to_json()
