"""The positions a graph holds where it holds a fixed table that positions index (`trtfuse.model.dims`): GPT-2's
position embedding indexed by the Range the graph counts positions with, and the rotary cos table exports of
transformers before 4.38 store (`cos_cached[:seq_len][position_ids]`) in the forms the TorchScript and dynamo
exporters write. A generation past the table is refused in one line before it runs (onnxruntime failed at the step
past it); Hugging Face's rotary embedding, computed from the positions, holds no table and bounds nothing."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.model.dims import model_dims

from support.cli import run_cli
from support.paths import FIXTURES, TOOL_FIXTURES

ROWS, WIDTH = 32, 8


def _rotary_model(form: str) -> onnx.ModelProto:
    """x * cos[position_ids], the cos table of ROWS rows cut to the sequence first, as each exporter writes it:
    `ts` Slice -> Gather, `ts-4d` a [1, 1, ROWS, WIDTH] table sliced on axis 2 and squeezed, `dynamo` Slice ->
    GatherND on the positions unsqueezed at -1."""
    angles = np.arange(ROWS, dtype=np.float32)[:, None] / (1 + np.arange(WIDTH, dtype=np.float32))
    table = np.cos(angles)
    row_axis = 0
    if form == "ts-4d":
        table, row_axis = table[None, None], 2
    constants = [
        numpy_helper.from_array(table, "cos_cached"),
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([1], np.int64), "one"),
        numpy_helper.from_array(np.array([2], np.int64), "two"),
        numpy_helper.from_array(np.array([row_axis], np.int64), "row_axis"),
        numpy_helper.from_array(np.array([-1], np.int64), "last"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["x_shape"]),
        helper.make_node("Slice", ["x_shape", "one", "two"], ["sequence"]),
        helper.make_node("Slice", ["cos_cached", "zero", "sequence", "row_axis"], ["cut"]),
    ]
    if form == "ts-4d":
        nodes += [
            helper.make_node("Squeeze", ["cut", "one"], ["cut_3d"]),
            helper.make_node("Squeeze", ["cut_3d", "zero"], ["rows"]),
        ]
    else:
        nodes.append(helper.make_node("Identity", ["cut"], ["rows"]))
    if form == "dynamo":
        nodes += [
            helper.make_node("Unsqueeze", ["position_ids", "last"], ["indices"]),
            helper.make_node("GatherND", ["rows", "indices"], ["cos"]),
        ]
    else:
        nodes.append(helper.make_node("Gather", ["rows", "position_ids"], ["cos"]))
    nodes.append(helper.make_node("Mul", ["x", "cos"], ["y"]))
    graph = helper.make_graph(
        nodes,
        form,
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "sequence", WIDTH]),
            helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "sequence"]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "sequence", WIDTH])],
        constants,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("form", ["ts", "ts-4d", "dynamo"])
def test_a_stored_rotary_table_bounds_the_positions(form):
    model = _rotary_model(form)
    onnx.checker.check_model(model, full_check=True)
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    positions = np.arange(5, dtype=np.int64)[None]
    (y,) = session.run(None, {"x": np.ones((1, 5, WIDTH), np.float32), "position_ids": positions})
    assert y.shape == (1, 5, WIDTH)
    bound = model_dims(model).max_total
    assert bound.value == ROWS
    assert bound.reason == f"the position table 'cos_cached' has {ROWS} rows"


def test_the_position_embedding_a_range_indexes_bounds_the_positions():
    bound = model_dims(onnx.load(str(FIXTURES / "gpt2-torchscript-fp16.onnx"))).max_total
    assert bound.value == 128
    assert bound.reason == "the position table 'model.transformer.wpe.weight' has 128 rows"


def test_generation_past_the_position_embedding_is_refused_before_it_runs():
    """It ran 128 steps and then failed in onnxruntime (`indices element out of data bounds, idx=128`)."""
    result = run_cli("generate", FIXTURES / "gpt2-torchscript-fp16.onnx", "--no-cache", "--steps", "130")
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.splitlines()
    assert "a prompt of 5 ids and 130 steps feed 134 positions, more than" in line
    assert "(the position table 'model.transformer.wpe.weight' has 128 rows)" in line


def test_a_range_indexing_an_activation_bounds_nothing():
    """`hidden[arange(batch)]` (the last token of each row) is a Range into a tensor of known shape, not a table."""
    graph = helper.make_graph(
        [
            helper.make_node("Shape", ["x"], ["x_shape"]),
            helper.make_node("Gather", ["x_shape", "zero"], ["batch"]),
            helper.make_node("Range", ["zero", "batch", "one"], ["rows"]),
            helper.make_node("Gather", ["x", "rows"], ["y"]),
        ],
        "last_token",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, WIDTH])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, WIDTH])],
        [
            numpy_helper.from_array(np.array(0, np.int64), "zero"),
            numpy_helper.from_array(np.array(1, np.int64), "one"),
        ],
    )
    assert model_dims(helper.make_model(graph)).max_total is None


@pytest.mark.parametrize(
    "path", [FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx", TOOL_FIXTURES / "qwen3-modelopt-fp8-kv.onnx"]
)
def test_rotary_angles_computed_from_the_positions_bound_nothing(path):
    assert model_dims(onnx.load(str(path))).max_total is None
