"""`check` judges a rotation's product stages where their quantizers read (docs/cli.md, "Each fused node"): the
node's own products, quantized by the original's QuantizeLinears on the products, must give the node's product
codes bit for bit, each at most one step from the original's codes, and the rotated output must be within the two
products' differences plus one ulp of the original's. ModelOpt's Qwen3 fixtures compute their norms in float16, so
the node's y may differ from the graph's in its last bit and a product's code may move one step: they pass. A wrong
product stage fails, naming the node."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from trtfuse import contract
from trtfuse.cli.options import EXIT_MISMATCH
from trtfuse.pipeline import fuse_file

from support.cli import run_cli
from support.paths import TOOL_FIXTURES

FP8_KV = TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"
INT8 = TOOL_FIXTURES / "qwen3-modelopt-int8-fp16.onnx"
_PRODUCT_FIELDS = ("quant_dtype", "quant_scale", "quant_saturate", "dequant_dtype")


@pytest.fixture(scope="module")
def fused(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, Path]:
    folder = tmp_path_factory.mktemp("rotation_products")
    return {
        original: fuse_file(original, folder / f"{original.stem}.fused.onnx").output_path for original in (FP8_KV, INT8)
    }


def _attributes(node: onnx.NodeProto) -> dict[str, onnx.AttributeProto]:
    return {attribute.name: attribute for attribute in node.attribute}


def _scaled(field: str, factor: float) -> Callable[[onnx.NodeProto], None]:
    def tamper(node: onnx.NodeProto) -> None:
        _attributes(node)[field].f *= factor

    return tamper


def _copied(pairs: list[tuple[str, str]]) -> Callable[[onnx.NodeProto], None]:
    """Each (to, from) pair of stages: `to`'s product fields given `from`'s values (all read before any is set)."""

    def tamper(node: onnx.NodeProto) -> None:
        attributes = _attributes(node)
        values = {
            (to, field): onnx.AttributeProto.FromString(attributes[f"{source}_{field}"].SerializeToString())
            for to, source in pairs
            for field in _PRODUCT_FIELDS
        }
        for (to, field), value in values.items():
            value.name = f"{to}_{field}"
            attributes[f"{to}_{field}"].CopyFrom(value)

    return tamper


def _int8_codes(node: onnx.NodeProto) -> None:
    _attributes(node)["q_cos_product_quant_dtype"].i = onnx.TensorProto.INT8


# What each wrong rotary node changes, and the original's tensor whose verdict must fail first.
TAMPERED = {
    "q-cos-product-scale-x1.1": (_scaled("q_cos_product_quant_scale", 1.1), "mul_186_QuantizeLinear_Output"),
    "q-cos-and-sin-stages-swapped": (
        _copied([("q_cos_product", "q_sin_product"), ("q_sin_product", "q_cos_product")]),
        "mul_186_QuantizeLinear_Output",
    ),
    "q-stages-applied-to-k": (
        _copied([("k_cos_product", "q_cos_product"), ("k_sin_product", "q_sin_product")]),
        "mul_209_QuantizeLinear_Output",
    ),
    "q-cos-product-int8-codes": (_int8_codes, "mul_186_QuantizeLinear_Output"),
}


def _report(original: Path, candidate: Path, *options: str) -> dict:
    result = run_cli("check", original, candidate, "--json", *options)
    report = json.loads(result.stdout)
    report["exit_code"] = result.exit_code
    return report


@pytest.mark.parametrize("original", [FP8_KV, INT8], ids=["fp8-kv", "int8"])
def test_modelopt_s_rotations_fuse_and_pass_where_their_products_are_quantized(original: Path, fused) -> None:
    report = _report(original, fused[original])
    assert report["exit_code"] == 0, report
    for step in report["steps"]:
        products = [
            entry for entry in step["nodes"] if entry["codes"] and entry["codes"]["steps_from_original"] is not None
        ]
        sums = [entry for entry in step["nodes"] if entry["sum_bound"] is not None]
        # Two rotary nodes, each with q's and k's two products and their two sums.
        assert len(products) == 8 and len(sums) == 4
        assert all(entry["passed"] for entry in step["nodes"])
        assert all(entry["codes"]["steps_from_original"] <= 1 for entry in products)


def test_a_rotated_int8_output_moved_through_a_transpose_is_judged_in_the_original_s_layout(fused) -> None:
    """q's rotated INT8 codes go through the graph's Transpose after the node: its value is compared with the
    original's rotation (2x2x5x64) in that layout, not in the node's (2x5x2x64)."""
    [step] = _report(INT8, fused[INT8])["steps"]
    entry = next(entry for entry in step["nodes"] if entry["output"] == "add_269_QuantizeLinear_Output")
    assert entry["passed"] and entry["note"] == "", entry["text"]
    assert entry["sum_bound"]["elements"] == 2 * 2 * 5 * 64


@pytest.mark.parametrize("case", sorted(TAMPERED))
def test_a_wrong_product_stage_fails_where_it_stands(case: str, fused, tmp_path: Path) -> None:
    tamper, failing = TAMPERED[case]
    model = onnx.load(str(fused[FP8_KV]))
    node = next(node for node in model.graph.node if node.op_type == contract.QK_NORM_ROPE_QUANT_OP)
    tamper(node)
    tampered = tmp_path / "tampered.onnx"
    onnx.save(model, str(tampered))
    report = _report(FP8_KV, tampered)
    assert report["exit_code"] == EXIT_MISMATCH
    failed = [entry for step in report["steps"] for entry in step["nodes"] if not entry["passed"]]
    assert failed and failed[0]["node"] == node.name and failed[0]["output"] == failing, failed[0]["text"]
