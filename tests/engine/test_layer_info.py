"""The reader of TensorRT's layer information (`trtfuse.engine.layer_info`) on the shapes TensorRT 8.x, 10.x and 11.x
write (tests/engine/layer_info/README.md) and on what it must refuse in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtfuse.engine.layer_info import (
    FP8,
    INT8,
    base_name,
    metadata_nodes,
    name_nodes,
    parse_layer_information,
    profile_of,
    read_layer_information,
    tensor_dtype,
)
from trtfuse.errors import TrtfuseError

from support.layer_info import LAYER_INFO, refusal


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("Half", "float16"),
        ("Float", "float32"),
        ("BFloat16", "bfloat16"),
        ("Row major linear BFloat16 format", "bfloat16"),
        ("FP8", FP8),
        ("Row major linear FP8 format", FP8),
        ("Int8", INT8),
        ("Row major Int8 format", INT8),
        ("Four wide channel vectorized row major Int8 format", INT8),
        ("Thirty-two wide channel vectorized row major INT8 format.", INT8),
        ("UInt8", "uint8"),
        ("Row major linear FP32", "float32"),
        ("Row major linear FP16 format", "float16"),
        ("Channel major FP16 format where channel % 8 == 0", "float16"),
        ("Row major linear FP4 format (kLINEAR)", "fp4"),
        ("Int32", "int32"),
        ("Int64", "int64"),
        ("Bool", "bool"),
        ("N/A", None),
        ("", None),
    ],
)
def test_every_spelling_of_a_tensor_type_is_read(text: str, dtype: str | None) -> None:
    assert tensor_dtype(text) == dtype


def test_metadata_entries_split_on_both_separators_and_where_they_were_lost() -> None:
    assert metadata_nodes("[ONNX Layer: node_conv2d]\x1e[ONNX Layer: node_relu]") == ("node_conv2d", "node_relu")
    assert metadata_nodes("[ONNX Layer: node_linear]\x1f[ONNX Layer: node_relu_2]") == ("node_linear", "node_relu_2")
    assert metadata_nodes("[ONNX Layer: a/b.0][ONNX Layer: c]") == ("a/b.0", "c"), "ONELINE text loses them"
    assert metadata_nodes("") == ()
    assert metadata_nodes("something else") == ()


@pytest.mark.parametrize(
    ("name", "nodes"),
    [
        (
            "features.0.0.weight + QuantizeLinear_8 + Conv_12 + PWN(Clip_16)",
            ("features.0.0.weight", "QuantizeLinear_8", "Conv_12", "Clip_16"),
        ),
        ("PWN(PWN(relu_1), add_1)", ("relu_1", "add_1")),
        ("QuantizeLinear_2", ("QuantizeLinear_2",)),
        ("TrtfuseRmsNorm/y [profile 1]", ("TrtfuseRmsNorm/y",)),
        ("node_linear_myl4_0", ()),
        ("__myl_MulSum_myl4_1", ()),
        ("{ForeignNode[ReduceMean_4492...Mul_4557]}", ()),
        ("Reformatting CopyNode for Input Tensor 0 to node_conv2d_1 + node_relu_1", ()),
        ("copied_squeeze_after_(Unnamed Layer* 850) [ElementWise]", ()),
    ],
)
def test_a_layer_without_metadata_is_read_by_its_name(name: str, nodes: tuple[str, ...]) -> None:
    assert name_nodes(name) == nodes


def test_profile_marks_are_read_where_tensorrt_puts_them() -> None:
    assert profile_of("node_linear [profile 1]_myl11_2") == 1
    assert profile_of("x [profile 12]") == 12
    assert profile_of("node_linear_myl5_2") == 0
    assert base_name("node_linear [profile 1]_myl11_2") == "node_linear_myl11_2"


def _info(layers: list, **top: object) -> str:
    return json.dumps({"Layers": layers, **top})


def test_a_tensorrt_10_file_is_read_key_by_key() -> None:
    info = read_layer_information(LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json")
    assert info.io_key == "Bindings" and "input_ids" in info.io_tensors and "logits" in info.io_tensors
    assert info.profiles == (0,)
    plugin = next(layer for layer in info.layers if layer.name == "TrtfuseRmsNormQuant/mul_110")
    assert plugin.layer_type == "PluginV3" and plugin.onnx_nodes == ("TrtfuseRmsNormQuant/mul_110",)
    assert plugin.onnx_from == "metadata" and plugin.tactic == "0x0000000000000000"
    assert plugin.outputs[0].dtype == FP8 and plugin.outputs[0].location == "Device"
    gemm = next(layer for layer in info.layers if layer.name.startswith("node_linear+node_linear_1+node_linear_2_myl"))
    assert gemm.layer_type == "gemm" and gemm.tactic_value is None and gemm.tactic.startswith("sm90_xmma_gemm_e4m3")
    assert gemm.onnx_nodes == ("node_linear", "node_linear_1", "node_linear_2")
    assert gemm.inputs[0].location is None, "Myelin layers have no Location"
    shape_call = info.layers[0]
    assert shape_call.layer_type == "shape_call" and shape_call.inputs == () and shape_call.tactic is None


def test_a_tensorrt_11_file_is_read_alike() -> None:
    ten = read_layer_information(LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json")
    eleven = read_layer_information(LAYER_INFO / "qwen3-fp8.trt11.layers.json")
    assert eleven.io_key == "I/O Tensors" and eleven.io_tensors == ten.io_tensors
    assert [layer.name for layer in eleven.layers] == [layer.name for layer in ten.layers]
    for old, new in zip(ten.layers, eleven.layers, strict=True):
        assert [tensor.dtype for tensor in new.inputs + new.outputs] == [t.dtype for t in old.inputs + old.outputs]
    assert "Constants" in next(layer for layer in eleven.layers if layer.layer_type == "gemm").fields


@pytest.mark.parametrize("type_key", ["Datatype", "DataType"])
def test_the_split_type_and_format_keys_of_tensorrt_11_are_read(type_key: str) -> None:
    tensor = {"Name": "y", "Location": "Device", "Dimensions": [-1, 64], type_key: "FP8", "Format": "kLINEAR"}
    info = parse_layer_information(_info([{"Name": "p", "LayerType": "PluginV3", "Inputs": [], "Outputs": [tensor]}]))
    output = info.layers[0].outputs[0]
    assert output.dtype == FP8 and output.format == "FP8; kLINEAR" and output.dims == (-1, 64)


def test_unknown_keys_and_layer_types_are_kept() -> None:
    layer = {"Name": "n", "LayerType": "SomeFutureRunner", "Inputs": [], "Outputs": [], "NewKey": {"a": 1}}
    info = parse_layer_information(_info([layer], **{"Some New Section": []}))
    assert info.layers[0].layer_type == "SomeFutureRunner" and info.layers[0].fields["NewKey"] == {"a": 1}
    assert info.io_key is None and info.io_tensors == ()


def test_a_tensorrt_8_file_without_metadata_names_its_nodes_by_layer_name() -> None:
    layer = {
        "Name": "features.0.0.weight + QuantizeLinear_8 + Conv_12 + PWN(Clip_16)",
        "LayerType": "CaskConvolution",
        "Inputs": [
            {"Name": "317", "Location": "Device", "Dimensions": [1, 3], "Format/Datatype": "Row major Int8 format"}
        ],
        "Outputs": [],
        "ParameterType": "Convolution",
        "TacticValue": "0x10d7116a3fad9b7a",
    }
    read = parse_layer_information(_info([layer])).layers[0]
    assert read.onnx_from == "name" and "Conv_12" in read.onnx_nodes and read.kind == "Convolution"
    with_metadata = parse_layer_information(_info([{**layer, "Metadata": ""}])).layers[0]
    assert with_metadata.onnx_nodes == () and with_metadata.onnx_from == "none", "a 10.x reformat's empty Metadata"


def test_a_names_only_file_says_how_to_rebuild(tmp_path: Path) -> None:
    with pytest.raises(TrtfuseError) as raised:
        read_layer_information(LAYER_INFO / "qwen3-fp8.names-only.layers.json")
    message = str(raised.value)
    assert "names the layers only" in message and "--profilingVerbosity=detailed" in message and "\n" not in message


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", 'no "Layers" list'),
        ('{"Layers": {}}', 'no "Layers" list'),
        ('{"Layers": [{"LayerType": "gemm"}]}', 'layer 0 has no "Name"'),
        ('{"Layers": [3]}', "layer 0 is int"),
        ('{"Layers": [{"Name": "a", "Inputs": [{"Dimensions": []}]}]}', "Inputs[0]: not a tensor"),
        ('{"Layers": [{"Name": "a", "Metadata": 5}]}', '"Metadata" is int'),
        ('{"Layers": [], "Bindings": [1]}', '"Bindings" must list tensor names'),
    ],
)
def test_what_is_not_layer_information_is_one_line_naming_the_file(tmp_path: Path, content: str, says: str) -> None:
    assert says in refusal(read_layer_information, tmp_path / "layers.json", content)


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(TrtfuseError, match="no such layer information file"):
        read_layer_information(tmp_path / "absent.json")
