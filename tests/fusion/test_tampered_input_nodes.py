"""A model that already holds trtfuse nodes is read as `check` reads it (docs/cli.md: bad input is one line, exit 2,
nothing written): `fuse`, `compile` and `inspect` refuse a broken node of any of the three ops (a negative epsilon, a
missing input, a hidden size its input does not have) before anything is written, as `check` and `generate` do."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

from trtfuse import contract
from trtfuse.contract import WeightMode
from trtfuse.contract.codec import NodeFields
from trtfuse.fusion.fuse import fuse_model

from support.cli import run_cli
from support.fused_models import HIDDEN, fused_model, fused_node

F16 = TensorProto.FLOAT16
HEAD = 16


ROTARY = contract.RotaryParams(HEAD, HEAD, contract.Rotation.HALF_SPLIT, contract.HeadLayout.TOKEN_MAJOR)


def _rotary_fields(op: str) -> dict[str, object]:
    if not contract.OPS[op].rotary:
        return {}
    return dict(zip(contract.ROTARY_FIELDS, ROTARY.numbers(), strict=True))


def _quant_fields(op: str) -> dict[str, object]:
    fused = contract.OPS[op]
    if not fused.quantized:
        return {}
    if fused.base in (contract.QK_NORM_OP, contract.QK_NORM_ROPE_OP):
        # The QK-norm's stages are its outputs': k_out in INT8 (`_model` declares it so).
        quant, hidden = contract.QuantParams(k_output=contract.Quantizer("int8", 0.5)), (HEAD, HEAD)
    else:
        quant, hidden = contract.QuantParams(input=contract.Quantizer("int8", 0.5, True, "float16")), (HIDDEN,)
    rotary = ROTARY if fused.rotary else None
    params = contract.NormParams(1e-6, 0.0, WeightMode.AFTER_CAST)
    fields = NodeFields(fused, params, hidden, "float16", quant, rotary)
    plain = contract.OPS[fused.base].fields
    return {name: value for name, value in fields.numbers().items() if name not in plain}


def _model(op: str, broken: str) -> onnx.ModelProto:
    """One node of `op`, as the pass writes it (a quantized op with an INT8 input stage, the QK-norm's with k_out in
    INT8, a rotary one with its cos and sin tables), then broken as `broken` says."""
    plain = contract.OPS[op].base or op
    shape = ["tokens", HIDDEN]
    weight = numpy_helper.from_array(np.ones(HIDDEN, np.float16), "w")
    tables = {}
    if plain in (contract.QK_NORM_OP, contract.QK_NORM_ROPE_OP):
        shape = ["batch", "tokens", 2, HEAD]
        weight = numpy_helper.from_array(np.ones(HEAD, np.float16), "w")
        inputs, outputs, hidden = ["q", "k", "w", "w"], ["q_out", "k_out"], (HEAD, HEAD)
        if contract.OPS[op].rotary:
            tables = {name: (F16, [1, "tokens", HEAD]) for name in ("cos", "sin")}
            inputs += list(tables)
    elif plain == contract.ADD_RMS_NORM_OP:
        inputs, outputs, hidden = ["q", "k", "w"], ["y", "h"], (HIDDEN,)
    else:
        inputs, outputs, hidden = ["q", "w"], ["y"], (HIDDEN,)
    extra: dict[str, object] = {**_rotary_fields(op), **_quant_fields(op)}
    if broken == "epsilon":
        extra[contract.ATTR_EPSILON] = -1e-6
    elif broken == "missing-input":
        inputs = inputs[:-1]
    elif broken == "hidden":
        hidden = tuple(size + 1 for size in hidden)
    node = fused_node(op, inputs, outputs, WeightMode.AFTER_CAST, hidden, **extra)
    activations = {**{name: (F16, shape) for name in ("q", "k") if name in inputs}, **tables}
    out_types = {name: (TensorProto.INT8 if name == "k_out" and op != plain else F16, shape) for name in outputs}
    return fused_model([node], activations, out_types, [weight])


CASES = [(op, broken) for op in contract.FUSED_OPS for broken in ("epsilon", "missing-input", "hidden")]


def test_each_unbroken_node_is_read_and_counted_as_already_there():
    for op in contract.FUSED_OPS:
        counts = fuse_model(_model(op, "none")).counts()
        assert counts.already[op] == counts.nodes[op] == 1


@pytest.mark.parametrize(("op", "broken"), CASES, ids=[f"{op}-{broken}" for op, broken in CASES])
def test_fuse_compile_and_inspect_refuse_a_broken_node_writing_nothing(tmp_path: Path, op: str, broken: str):
    path = tmp_path / "m.onnx"
    onnx.save(_model(op, broken), path)
    checked = run_cli("check", path, path)
    assert checked.exit_code == 2, checked.output
    for command in (
        ("fuse", path, "-o", tmp_path / "out.onnx", "--report", tmp_path / "out.json"),
        ("compile", path, "-o", tmp_path / "m2.engine"),
        ("inspect", path),
    ):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr.startswith(f"trtfuse: error: {path}: node 'norm': "), result.stderr
        assert result.stderr.count("\n") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx"]


@pytest.mark.parametrize("version", [2, 0])
def test_a_trtfuse_domain_of_another_version_is_refused(tmp_path: Path, version: int):
    model = _model(contract.RMS_NORM_OP, "none")
    next(opset for opset in model.opset_import if opset.domain == contract.ONNX_DOMAIN).version = version
    path, original = tmp_path / "m.onnx", tmp_path / "original.onnx"
    onnx.save(model, path)
    unfused = onnx.ModelProto()
    unfused.CopyFrom(model)
    del unfused.graph.node[:]
    unfused.graph.node.append(onnx.helper.make_node("Identity", ["q"], ["y"]))
    del unfused.opset_import[1:]
    onnx.save(unfused, original)
    message = (
        f"trtfuse: error: {path}: imports the trtfuse domain at version {version}; this trtfuse reads version "
        f"{contract.ONNX_DOMAIN_VERSION} only\n"
    )
    for command in (("check", original, path), ("fuse", path, "-o", tmp_path / "out.onnx"), ("inspect", path)):
        result = run_cli(*command)
        assert result.exit_code == 2, (command, result.output)
        assert result.stderr == message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "original.onnx"]
