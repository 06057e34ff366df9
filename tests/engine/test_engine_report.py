"""The analysis of an engine's layer information against the fused model it was built from (`engine_report.analyse`):
each trtfuse node's layers and neighbours, the fold verdict of every DequantizeLinear after a quantized node, the
times, the report's JSON; and the attribution of layers to norm sites in an engine of the original export
(`site_times`). The layer information is the committed fixtures (tests/engine/layer_info/README.md), the fused models
the real fusion pass's output on ModelOpt's exports."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trtfuse.engine.engine_report import FEEDS_NO_GEMM, FOLDED, NOT_FOLDED, NOT_FOUND, EngineReport, analyse
from trtfuse.engine.layer_info import parse_layer_information, read_layer_information
from trtfuse.engine.layer_profile import LayerTimes, parse_profile, profile_text, read_profile
from trtfuse.engine.site_times import SHARE_RULE, attribute_sites, node_sites, norm_sites, report_sites
from trtfuse.errors import TrtfuseError
from trtfuse.fusion.fuse import fuse_model
from trtfuse.fusion.options import FusionOptions
from trtfuse.model.onnx_file import LoadedModel, load_model
from trtfuse.pipeline import fuse_file

from support.layer_info import LAYER_INFO, edited, fused_export, fused_model, layer_named
from support.paths import FIXTURES

FP8_NODES = (
    "TrtfuseRmsNormQuant/mul_110",
    "TrtfuseAddRmsNormQuant/mul_382",
    "TrtfuseAddRmsNormQuant/mul_418",
    "TrtfuseAddRmsNormQuant/mul_690",
    "TrtfuseAddRmsNormQuant/mul_726",
)


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fused")


@pytest.fixture(scope="module")
def fp8(models: Path) -> LoadedModel:
    return fused_model("qwen3-fp8", models)


def _report(name: str, model: LoadedModel, profile: str | None = None, **options: Any) -> EngineReport:
    timing = read_profile(LAYER_INFO / profile) if profile else None
    return analyse(read_layer_information(LAYER_INFO / name), model, timing, **options)


def _node(report: EngineReport, name: str):
    return next(node for node in report.nodes if node.name == name)


def _verdicts(report: EngineReport) -> dict[str, list[str]]:
    return {node.name: [fold.verdict for fold in node.folds] for node in report.nodes if node.folds}


def test_every_dequantize_after_an_fp8_node_folded_into_an_fp8_gemm(fp8: LoadedModel) -> None:
    report = _report("qwen3-fp8.folded.trt10.layers.json", fp8)
    assert report.passed and report.unfolded_nodes == () and report.not_found == ()
    assert _verdicts(report) == {name: [FOLDED] for name in FP8_NODES}
    first = _node(report, "TrtfuseRmsNormQuant/mul_110")
    assert [item.layer.layer_type for item in first.layers] == ["PluginV3"]
    fold = first.folds[0]
    assert fold.tensor == "mul_110_QuantizeLinear_Output" and fold.dtype == "float8_e4m3fn"
    assert fold.dequantize.node == "mul_110_DequantizeLinear"
    assert fold.dequantize.gemms == ("node_linear", "node_linear_1", "node_linear_2")
    assert [layer.layer_type for layer in fold.gemm_layers] == ["gemm"] and fold.tactic_agrees is True
    assert all(not node.folds for node in report.nodes if node.op == "TrtfuseQkNorm")
    assert report.verdict_line() == "5 of 5 dequantizes after quantized nodes folded into their GEMMs"


def test_a_dequantize_or_reformat_left_standing_fails_naming_the_node(fp8: LoadedModel) -> None:
    report = _report("qwen3-fp8.unfolded.trt10.layers.json", fp8)
    assert not report.passed
    assert report.unfolded_nodes == ("TrtfuseAddRmsNormQuant/mul_382", "TrtfuseAddRmsNormQuant/mul_726")
    kgen = _node(report, "TrtfuseAddRmsNormQuant/mul_382").folds[0]
    assert kgen.verdict == NOT_FOLDED and kgen.standing[0].layer.layer_type == "kgen"
    assert kgen.standing[0].role == "dequantize" and kgen.standing[0].gemms[0].tactic.startswith(
        "sm90_xmma_gemm_f16f16"
    )
    copy = _node(report, "TrtfuseAddRmsNormQuant/mul_726").folds[0]
    assert copy.verdict == NOT_FOLDED and copy.standing[0].role == "reformat"
    assert copy.standing[0].layer.name.startswith("Reformatting CopyNode for Input Tensor 0 to {ForeignNode[")
    assert [item.role for item in _node(report, "TrtfuseAddRmsNormQuant/mul_726").neighbours] == ["reformat"]
    line = report.verdict_line()
    assert line.startswith("2 quantized nodes reach a GEMM through a dequantize or reformat left standing: ")
    assert "TrtfuseAddRmsNormQuant/mul_382 (mul_382_DequantizeLinear)" in line and "mul_726" in line


def test_int8_reformats_and_standing_dequantizes_next_to_the_plugins(models: Path) -> None:
    report = _report("qwen3-int8.trt10-context.layers.json", fused_model("qwen3-int8", models))
    assert report.unfolded_nodes == ("TrtfuseAddRmsNormQuant/mul_616",)
    first = _node(report, "TrtfuseRmsNormQuant/mul_92")
    assert [(item.side, item.role, item.tensor) for item in first.neighbours] == [
        ("input", "reformat", "Reformatted Input Tensor 0 to TrtfuseRmsNormQuant/mul_92")
    ]
    assert first.neighbours[0].layer.inputs[0].name == "embedding"
    assert first.folds[0].verdict == FOLDED and first.folds[0].dtype == "int8" and first.folds[0].tactic_agrees
    residual = _node(report, "TrtfuseAddRmsNormQuant/mul_336")
    assert [(item.side, item.role, item.layer.layer_type) for item in residual.neighbours] == [
        ("input", "dequantize", "Scale")
    ], "the residual input's DQ stands as a Scale layer before the plugin"
    standing = _node(report, "TrtfuseAddRmsNormQuant/mul_616")
    assert standing.folds[0].standing[0].layer.origin == "QDQ" and standing.folds[0].engine_dtype == "int8"


def test_a_dequantize_that_feeds_no_gemm_is_no_failure(models: Path) -> None:
    report = _report("gemma3-int8.aot.trt10.layers.json", fused_model("gemma3-int8", models))
    assert report.passed and report.not_found == ()
    qk = _node(report, "TrtfuseQkNormQuant/mul_225")
    assert [fold.verdict for fold in qk.folds] == [FEEDS_NO_GEMM, FEEDS_NO_GEMM]
    assert qk.folds[0].dequantize.feeds == ("Slice node_slice_1", "Slice node_slice_2", "Mul node_mul_267")
    post = _node(report, "TrtfuseRmsNormQuant/mul_435")
    assert post.folds[0].verdict == FEEDS_NO_GEMM
    assert post.folds[0].dequantize.feeds == ("TrtfuseAddRmsNormQuant TrtfuseAddRmsNormQuant/mul_458",)
    assert report.verdict_line() == ("5 of 5 dequantizes after quantized nodes folded into their GEMMs, 8 feed no GEMM")


@pytest.mark.parametrize("layer_type", ["PluginV3", "PluginV2", "pluginV3", "AotPluginOfTensorRT12", ""])
def test_plugin_layers_are_found_whatever_their_type(fp8: LoadedModel, layer_type: str) -> None:
    """Neither a Python plugin's nor an AOT plugin's layer type has been seen in a real file: the node is found by
    its name in the Metadata, whatever the type."""

    def retype(data: dict) -> None:
        for name in FP8_NODES:
            layer_named(data, name)["LayerType"] = layer_type

    report = analyse(edited("qwen3-fp8.unfolded.trt10.layers.json", retype), fp8)
    assert report.unfolded_nodes == ("TrtfuseAddRmsNormQuant/mul_382", "TrtfuseAddRmsNormQuant/mul_726")
    assert {item.layer.layer_type for node in report.nodes if node.quantized for item in node.layers} == {layer_type}


def test_a_plugin_layer_without_metadata_is_found_by_its_name(fp8: LoadedModel) -> None:
    def strip(data: dict) -> None:
        for layer in data["Layers"]:
            if layer["LayerType"] == "PluginV3":
                del layer["Metadata"]

    report = analyse(edited("qwen3-fp8.folded.trt10.layers.json", strip), fp8)
    assert report.passed and report.not_found == () and _verdicts(report) == {name: [FOLDED] for name in FP8_NODES}


def test_a_tensorrt_11_file_gives_the_tensorrt_10_verdicts(fp8: LoadedModel) -> None:
    ten = _report("qwen3-fp8.folded.trt10.layers.json", fp8)
    eleven = _report("qwen3-fp8.trt11.layers.json", fp8)
    assert _verdicts(eleven) == _verdicts(ten)
    assert json.dumps(eleven.to_json()["nodes"]) == json.dumps(ten.to_json()["nodes"])


def test_the_profile_picks_the_engine_profile_and_times_its_layers(fp8: LoadedModel) -> None:
    report = _report("qwen3-fp8.two-profiles.trt10.layers.json", fp8, "qwen3-fp8.two-profiles.profile1.json")
    assert report.engine_profile == 1 and report.passed and report.untimed_records == 0
    node = _node(report, "TrtfuseRmsNormQuant/mul_110")
    assert node.layers[0].layer.name == "TrtfuseRmsNormQuant/mul_110 [profile 1]"
    profile = json.loads((LAYER_INFO / "qwen3-fp8.two-profiles.profile1.json").read_text())
    record = next(entry for entry in profile if entry.get("name") == "TrtfuseRmsNormQuant/mul_110 [profile 1]")
    assert node.average_ms == record["averageMs"]
    assert node.folds[0].gemm_layers[0].name.endswith("[profile 1]_myl9_3")
    untimed = _report("qwen3-fp8.two-profiles.trt10.layers.json", fp8, engine_profile=0)
    assert untimed.engine_profile == 0 and untimed.nodes[0].layers[0].layer.name == "TrtfuseRmsNormQuant/mul_110"
    assert untimed.nodes[0].average_ms is None


def test_a_profile_the_file_does_not_hold_is_one_line(fp8: LoadedModel) -> None:
    with pytest.raises(TrtfuseError, match=r"holds no layer of optimisation profile 1 \(profiles: 0\)"):
        _report("qwen3-fp8.folded.trt10.layers.json", fp8, engine_profile=1)
    other = parse_profile(profile_text([LayerTimes("node_conv2d + node_relu", (0.5,))]), "other.profile.json")
    with pytest.raises(TrtfuseError, match=r"other\.profile\.json: times none of the layers"):
        analyse(read_layer_information(LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json"), fp8, other)


def test_node_and_neighbour_times_come_from_the_profile(fp8: LoadedModel) -> None:
    info = read_layer_information(LAYER_INFO / "qwen3-fp8.unfolded.trt10.layers.json")
    # One time per layer, 1/64 ms times its position (exact in float32), and one record naming no layer.
    times = [LayerTimes(layer.name, ((layer.index + 1) / 64,)) for layer in info.layers]
    profile = parse_profile(profile_text([*times, LayerTimes("a layer of another engine", (1.0,))]), "p.json")
    report = analyse(info, fp8, profile)
    assert report.untimed_records == 1
    node = _node(report, "TrtfuseAddRmsNormQuant/mul_382")
    plugin = node.layers[0].layer
    assert node.average_ms == (plugin.index + 1) / 64
    kgen = node.neighbours[0].layer
    assert kgen.name == "__myl_Dequ_myl3_1" and node.neighbour_ms == (kgen.index + 1) / 64
    assert "    output dequantize: kgen '__myl_Dequ_myl3_1' " + f"{(kgen.index + 1) / 64:.4f} ms" in report.lines()
    assert report.lines()[-1] == "  1 profile record(s) name no layer of this profile"


def test_a_node_missing_from_the_engine_is_not_found_and_no_failure(fp8: LoadedModel) -> None:
    def drop(data: dict) -> None:
        data["Layers"].remove(layer_named(data, "TrtfuseAddRmsNormQuant/mul_382"))

    report = analyse(edited("qwen3-fp8.folded.trt10.layers.json", drop), fp8)
    assert report.not_found == ("TrtfuseAddRmsNormQuant/mul_382",) and report.passed
    assert _node(report, "TrtfuseAddRmsNormQuant/mul_382").folds[0].verdict == NOT_FOUND
    assert "1 not found in the engine" in report.verdict_line()


def test_layer_information_of_another_model_is_one_line(fp8: LoadedModel, models: Path) -> None:
    with pytest.raises(TrtfuseError, match="names none of the 7 trtfuse nodes"):
        _report("qwen3-int8.trt10-context.layers.json", fp8)
    original = load_model(FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx")
    with pytest.raises(TrtfuseError, match="holds no trtfuse node"):
        _report("qwen3-fp8.folded.trt10.layers.json", original)


def test_a_quantized_output_the_engine_holds_as_float_is_not_folded(fp8: LoadedModel) -> None:
    def widen(data: dict) -> None:
        for layer in data["Layers"]:
            for tensor in layer["Inputs"] + layer["Outputs"]:
                if tensor["Name"] == "mul_110_QuantizeLinear_Output":
                    tensor["Format/Datatype"] = "Half"

    report = analyse(edited("qwen3-fp8.folded.trt10.layers.json", widen), fp8)
    fold = _node(report, "TrtfuseRmsNormQuant/mul_110").folds[0]
    assert fold.verdict == NOT_FOLDED and fold.engine_dtype == "float16"
    assert "the engine holds mul_110_QuantizeLinear_Output as float16" in fold.line()


def test_a_gemm_tactic_naming_float_operands_is_said(fp8: LoadedModel) -> None:
    def retactic(data: dict) -> None:
        gemm = next(layer for layer in data["Layers"] if layer["Name"].startswith("node_linear+node_linear_1+"))
        gemm["TacticName"] = "sm90_xmma_gemm_f16f16_f16f16_f16_tn_n_tilesize64x64x64_cgasize1x1x1_beta0"

    fold = _node(analyse(edited("qwen3-fp8.folded.trt10.layers.json", retactic), fp8), FP8_NODES[0]).folds[0]
    assert fold.verdict == FOLDED and fold.tactic_agrees is False and "its tactic names float operands" in fold.line()


def test_the_report_json_holds_every_verdict(fp8: LoadedModel) -> None:
    report = _report("qwen3-fp8.unfolded.trt10.layers.json", fp8, "qwen3-fp8.folded.trt10.profile.json")
    data = json.loads(json.dumps(report.to_json()))
    assert data["passed"] is False and data["unfolded"] == list(report.unfolded_nodes)
    assert data["engine_profile"] == 0 and data["share_rule"] == SHARE_RULE and data["not_found"] == []
    node = next(entry for entry in data["nodes"] if entry["name"] == "TrtfuseAddRmsNormQuant/mul_382")
    assert set(node) == {"name", "op", "found", "layers", "neighbours", "outputs", "average_ms", "neighbour_ms"}
    output = node["outputs"][0]
    assert output["verdict"] == NOT_FOLDED and output["dequantize"] == "mul_382_DequantizeLinear"
    assert output["gemm_nodes"] == ["node_linear_4", "node_linear_5"]
    assert output["standing_layers"][0]["role"] == "dequantize" and output["standing_layers"][0]["gemm_layers"]
    assert node["layers"][0]["type"] == "PluginV3" and node["layers"][0]["average_ms"] > 0


def test_the_summary_names_layers_neighbours_and_verdicts(fp8: LoadedModel) -> None:
    lines = _report("qwen3-fp8.unfolded.trt10.layers.json", fp8).lines()
    assert lines[0].endswith(
        "qwen3-fp8.unfolded.trt10.layers.json: engine profile 0, 63 layers; 7 of 7 trtfuse nodes found"
    )
    assert (
        "  TrtfuseAddRmsNormQuant/mul_382: PluginV3 'TrtfuseAddRmsNormQuant/mul_382', tactic 0x0000000000000000"
        in lines
    )
    assert "    output dequantize: kgen '__myl_Dequ_myl3_1'" in lines
    assert any(
        line.startswith("    output mul_382_QuantizeLinear_Output float8_e4m3fn: mul_382_DequantizeLinear NOT folded")
        for line in lines
    )


@pytest.fixture(scope="module")
def sites(models: Path) -> dict[str, tuple[str, ...]]:
    return report_sites(json.loads(fused_export("qwen3-fp8", models)[1].read_text()))


def test_the_sites_of_a_fusion_report_and_of_its_records_agree(sites: dict[str, tuple[str, ...]]) -> None:
    # The fusion the layer information files name (support.layer_info.fused_export): the rotations left.
    original = load_model(FIXTURES / "tools" / "qwen3-modelopt-fp8-kv.onnx").model
    records = fuse_model(original, FusionOptions(fuse_rope=False)).fused
    assert norm_sites(records) == sites
    assert "mul_382_QuantizeLinear" in sites["TrtfuseAddRmsNormQuant/mul_382"], (
        "an add-norm's output Q, which its `replaced` leaves out, is the site's"
    )


def test_the_original_engine_is_attributed_to_norm_sites_by_the_share_rule(sites: dict[str, tuple[str, ...]]) -> None:
    info = read_layer_information(LAYER_INFO / "qwen3-fp8.original.trt10.layers.json")
    profile = read_profile(LAYER_INFO / "qwen3-fp8.original.trt10.profile.json")
    attributed = {site.site: site for site in attribute_sites(info, sites, profile)}
    assert set(attributed) == set(sites) and all(site.layers for site in attributed.values())
    records = {
        entry["name"]: entry["averageMs"] for entry in json.loads(Path(profile.source).read_text()) if "name" in entry
    }
    for site in attributed.values():
        expected = 0.0
        for item in site.layers:
            named = set(item.layer.onnx_nodes)
            share = len(named & set(site.nodes)) / len(named)
            assert item.share == share and item.shared == (share < 1)
            expected += records[item.layer.name] * share
        assert site.average_ms == pytest.approx(expected)
    shared = [item for site in attributed.values() for item in site.layers if item.shared]
    assert shared and all(0 < item.average_ms < item.time.average_ms for item in shared)


def test_the_trtfuse_engine_is_attributed_by_the_same_site_names(sites: dict[str, tuple[str, ...]]) -> None:
    info = read_layer_information(LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json")
    profile = read_profile(LAYER_INFO / "qwen3-fp8.folded.trt10.profile.json")
    attributed = attribute_sites(info, node_sites(sites), profile)
    assert [site.site for site in attributed] == list(sites)
    for site in attributed:
        assert [item.layer.name for item in site.layers] == [site.site] and not site.layers[0].shared
        assert site.average_ms == site.layers[0].time.average_ms
    untimed = attribute_sites(info, node_sites(sites))
    assert all(site.average_ms is None for site in untimed)


def test_a_kernel_that_also_computes_is_no_standalone_dequantize(fp8: LoadedModel) -> None:
    """A kgen reading the FP8 tensor that also runs a Mul of the model is a fused kernel, not a dequantize left
    standing; it still stands between the tensor and the GEMM."""

    def fuse_more(data: dict) -> None:
        layer_named(data, "__myl_Dequ_myl3_1")["Metadata"] += "\x1f[ONNX Layer: node_silu]"

    node = _node(analyse(edited("qwen3-fp8.unfolded.trt10.layers.json", fuse_more), fp8), FP8_NODES[1])
    assert node.neighbours == ()
    assert node.folds[0].verdict == NOT_FOLDED and node.folds[0].standing[0].role == "kgen"


def test_a_model_without_quantized_outputs_has_nothing_to_fold(tmp_path: Path) -> None:
    fused = tmp_path / "llama.fused.onnx"
    fuse_file(FIXTURES / "llama-torchscript-fp16.onnx", fused)
    model = load_model(fused)
    names = [node.name for node in model.model.graph.node if node.domain == "trtfuse"]
    layers = [{"Name": name, "LayerType": "PluginV3", "Inputs": [], "Outputs": []} for name in names]
    report = analyse(parse_layer_information(json.dumps({"Layers": layers})), model)
    assert report.passed and all(node.found and not node.folds for node in report.nodes)
    assert report.verdict_line() == "no trtfuse node outputs FP8 or INT8: nothing to fold"
