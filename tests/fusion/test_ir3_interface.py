"""An IR-3 model lists every initializer as a graph input: the fused model keeps that interface (docs/cli.md: the
fused model takes the inputs the original takes), even for the inputs of a norm the fusion replaced."""

from __future__ import annotations

import onnx
from onnx import helper

from trtfuse.fusion.fuse import fuse_model

from support.models import llama_norm_model


def test_an_ir3_models_initializer_inputs_stay_in_its_order() -> None:
    model = llama_norm_model(layers=1)
    model.ir_version = 3
    model.opset_import[0].version = 13
    for tensor in model.graph.initializer:
        model.graph.input.append(helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    fused = fuse_model(model).model
    assert [value.name for value in fused.graph.input] == [value.name for value in model.graph.input]
    assert {tensor.name for tensor in fused.graph.initializer} >= {t.name for t in model.graph.initializer}
    onnx.checker.check_model(fused)
