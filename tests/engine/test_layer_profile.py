"""trtexec's per-layer profile: read (`parse_profile`), gathered from IProfiler callbacks (`LayerTimeCollector`) and
written in trtexec's own layout (`profile_text`), which trtfuse's reader and a TensorRT Engine Explorer-style reader
read back; and the layer information written as is."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from trtfuse.engine.layer_info import read_layer_information
from trtfuse.engine.layer_profile import (
    LayerTimeCollector,
    LayerTimes,
    parse_profile,
    profile_text,
    read_profile,
    write_layer_information,
    write_profile,
)
from trtfuse.errors import TrtfuseError

from support.layer_info import LAYER_INFO, refusal

# Times exact in float32, so the numbers trtexec prints are known by hand: totals 1.5, 0 and 0.5 of 2.
EXACT = [
    LayerTimes("node_linear_myl0_1", (0.5, 0.25, 0.75)),
    LayerTimes("copied_squeeze_after_(Unnamed Layer* 850) [ElementWise]", (0.0, 0.0, 0.0)),
    LayerTimes("TrtfuseRmsNorm/y", (0.125, 0.125, 0.25)),
]
EXACT_TEXT = (
    "[\n"
    '  { "count" : 3 }\n'
    ', { "name" : "node_linear_myl0_1", "timeMs" : 1.5, "averageMs" : 0.5, "medianMs" : 0.5, "percentage" : 75 }\n'
    ', { "name" : "copied_squeeze_after_(Unnamed Layer* 850) [ElementWise]", "timeMs" : 0, "averageMs" : 0, '
    '"medianMs" : 0, "percentage" : 0 }\n'
    ', { "name" : "TrtfuseRmsNorm/y", "timeMs" : 0.5, "averageMs" : 0.166667, "medianMs" : 0.125, '
    '"percentage" : 25 }\n'
    "]\n"
)


def test_the_profile_is_written_as_trtexec_writes_it() -> None:
    assert profile_text(EXACT, count=3) == EXACT_TEXT


def test_small_times_print_as_cpp_ostream_prints_them() -> None:
    tiny = 2.0**-15
    text = profile_text([LayerTimes("a", (tiny, tiny, tiny, tiny))])
    assert '"timeMs" : 0.00012207, "averageMs" : 3.05176e-05, "medianMs" : 3.05176e-05, "percentage" : 100' in text
    assert text.startswith('[\n  { "count" : 4 }\n'), "the count defaults to the most times a layer has"


def test_an_even_count_takes_the_mean_of_the_middle_two_as_median() -> None:
    text = profile_text([LayerTimes("a", (0.25, 1.0, 0.5, 0.125))])
    assert '"medianMs" : 0.375' in text


def _trex_read(text: str) -> tuple[list[dict], dict[str, dict]]:
    """What TensorRT Engine Explorer does with a profile (trex/parser.py `read_profiling_file`, TensorRT 10.16):
    json.load, keep the records of 4 or 5 keys; its plan joins them to layers by name."""
    records = [record for record in json.loads(text) if len(record) in (4, 5)]
    return records, {record["name"]: record for record in records}


def test_what_trtfuse_writes_reads_back_with_trtfuse_and_with_trex(tmp_path: Path) -> None:
    path = tmp_path / "model.profile.json"
    write_profile(path, EXACT, count=3)
    profile = read_profile(path)
    assert profile.count == 3 and [record.name for record in profile.layers] == [layer.name for layer in EXACT]
    assert [record.time_ms for record in profile.layers] == [1.5, 0.0, 0.5]
    assert [record.median_ms for record in profile.layers] == [0.5, 0.0, 0.125]
    records, by_name = _trex_read(path.read_text())
    assert len(records) == 3 and by_name["TrtfuseRmsNorm/y"]["averageMs"] == pytest.approx(0.5 / 3, rel=1e-5)
    assert sum(record["percentage"] for record in records) == 100


def test_a_committed_profile_joins_its_layer_information_by_name() -> None:
    info = read_layer_information(LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json")
    profile = read_profile(LAYER_INFO / "qwen3-fp8.folded.trt10.profile.json")
    times = profile.times_of(info.layers)
    assert len(times) == len(info.layers) == len(profile.layers)
    _, by_name = _trex_read((LAYER_INFO / "qwen3-fp8.folded.trt10.profile.json").read_text())
    assert set(by_name) == {layer.name for layer in info.layers}


def test_profile_1_names_say_which_profile_was_timed() -> None:
    profile = read_profile(LAYER_INFO / "qwen3-fp8.two-profiles.profile1.json")
    assert profile.engine_profile == 1
    assert read_profile(LAYER_INFO / "qwen3-fp8.folded.trt10.profile.json").engine_profile == 0


def test_the_collector_gathers_iterations_as_trtexec_does() -> None:
    collector = LayerTimeCollector()
    for iteration in range(3):
        for name, ms in (("a", 1.0), ("b", 2.0), ("b", 0.5), ("c", float(iteration))):
            collector.report(name, ms)
    assert collector.count == 3
    assert collector.layer_times() == (
        LayerTimes("a", (1.0, 1.0, 1.0)),
        LayerTimes("b", (2.0, 2.0, 2.0)),
        LayerTimes("b", (0.5, 0.5, 0.5)),
        LayerTimes("c", (0.0, 1.0, 2.0)),
    ), "a name that repeats inside an iteration (but the first layer's) is a layer of its own"
    text = profile_text(collector.layer_times(), collector.count)
    assert text.count('"name" : "b"') == 2 and '"count" : 3' in text


def test_repeated_names_join_in_order() -> None:
    text = profile_text([LayerTimes("a", (1.0,)), LayerTimes("a", (2.0,))])
    info = parse_profile(text)
    assert [record.time_ms for record in info.layers] == [1.0, 2.0]


def test_a_name_trtexec_would_write_as_broken_json_is_escaped() -> None:
    text = profile_text([LayerTimes('odd "name" \\ here', (1.0,))])
    assert parse_profile(text).layers[0].name == 'odd "name" \\ here'


def test_an_older_profile_without_medians_is_read() -> None:
    text = '[\n  { "count" : 2 }\n, { "name" : "a", "timeMs" : 2, "averageMs" : 1, "percentage" : 100 }\n]\n'
    record = parse_profile(text).layers[0]
    assert record.median_ms is None and record.average_ms == 1.0


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("{", "not JSON"),
        ('{"count": 1}', "not a JSON list"),
        ('[{"count": 1}]', "no record with a layer's name"),
        ('[{"startEnqMs": 1, "endEnqMs": 2}]', "no record with a layer's name"),
        ('[{"name": "a", "timeMs": "x", "averageMs": 1}]', "layer 'a': \"timeMs\" is 'x'"),
        ('[{"count": -1}, {"name": "a", "timeMs": 1, "averageMs": 1}]', '"count" is -1'),
    ],
)
def test_what_is_no_profile_is_one_line_naming_the_file(tmp_path: Path, content: str, says: str) -> None:
    assert says in refusal(read_profile, tmp_path / "profile.json", content)


@pytest.mark.parametrize("times", [(), (float("nan"),), (-1.0,)])
def test_times_that_are_no_profile_are_refused(times: tuple[float, ...]) -> None:
    with pytest.raises(TrtfuseError, match="layer 'a'"):
        profile_text([LayerTimes("a", times)])


def test_the_layer_information_is_written_as_the_inspector_gave_it(tmp_path: Path) -> None:
    text = (LAYER_INFO / "qwen3-fp8.folded.trt10.layers.json").read_text(encoding="utf-8")
    path = tmp_path / "model.layers.json"
    write_layer_information(path, text)
    assert path.read_bytes() == text.encode("utf-8")
    assert len(read_layer_information(path).layers) == len(json.loads(text)["Layers"])
