"""The greedy loop and the generation interface: what each step is fed, what is carried to the next, and the one-line
refusals (empty prompt, ids outside the vocabulary, too many positions, no logits, no cache)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Mapping

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.generate.interface import generation_interface
from trtfuse.generate.loop import Generation, StepRecord, default_prompt, greedy_generate, logits_along, repeated
from trtfuse.generate.runners import LOWERED_RUNNER, ORIGINAL_RUNNER, generate_file
from trtfuse.pipeline import fuse_file

from support.paths import FIXTURES, TOOL_FIXTURES

KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
GENAI_FIXTURE = TOOL_FIXTURES / "qwen3-genai-cpu-int4.onnx"
LOGITS_ONLY = FIXTURES / "llama-torchscript-fp16.onnx"
VOCAB, KV_HEADS, HEAD = 7, 1, 2


def _genai_lengths_model(vocab: int = VOCAB) -> onnx.ModelProto:
    """The interface of genai's older builds (seqlens_k and total_sequence_length as inputs); only its interface is
    read, the steps are run by `_fake_step`."""
    cache = ["batch_size", KV_HEADS, "past_sequence_length", HEAD]
    present = ["batch_size", KV_HEADS, "total_sequence_length", HEAD]
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
        helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch_size", "total_sequence_length"]),
        helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch_size"]),
        helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, []),
        helper.make_tensor_value_info("past_key_values.0.key", TensorProto.FLOAT, cache),
    ]
    outputs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch_size", "sequence_length", vocab]),
        helper.make_tensor_value_info("present.0.key", TensorProto.FLOAT, present),
    ]
    table = numpy_helper.from_array(np.zeros((vocab, 4), np.float32), "embed")
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["logits"])]
    return helper.make_model(helper.make_graph(nodes, "lengths", inputs, outputs, [table]))


def _fake_step(vocab: int, seen: list[dict[str, np.ndarray]], interface_presents: Mapping[str, str]):
    """A step function standing in for a model: the next token is (last token + 1) mod vocab, the present is the past
    with one row per new token appended."""

    def run(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append({name: np.array(array) for name, array in feed.items()})
        tokens = feed["input_ids"]
        logits = np.zeros((1, tokens.shape[1], vocab), np.float32)
        logits[0, -1, (int(tokens[0, -1]) + 1) % vocab] = 1.0
        outputs = {"logits": logits}
        for past, present in interface_presents.items():
            rows = np.full((1, KV_HEADS, tokens.shape[1], HEAD), float(tokens[0, -1]), np.float32)
            outputs[present] = np.concatenate([feed[past], rows], axis=2)
        return outputs

    return run


def test_each_step_is_fed_the_last_token_after_the_cache_it_returned():
    model = _genai_lengths_model()
    interface = generation_interface(model, "lengths.onnx")
    assert interface.caches[0].present == "present.0.key"
    seen: list[dict[str, np.ndarray]] = []
    presents = {pair.past: pair.present for pair in interface.caches}
    generation = greedy_generate(_fake_step(VOCAB, seen, presents), interface, [3, 5], steps=4)
    assert generation.tokens == [6, 0, 1, 2]
    assert [feed["input_ids"].tolist() for feed in seen] == [[[3, 5]], [[6]], [[0]], [[1]]]
    assert [feed["attention_mask"].shape for feed in seen] == [(1, 2), (1, 3), (1, 4), (1, 5)]
    # genai's seqlens_k is the total length minus one, total_sequence_length the total.
    assert [int(feed["seqlens_k"][0]) for feed in seen] == [1, 2, 3, 4]
    assert [int(feed["total_sequence_length"]) for feed in seen] == [2, 3, 4, 5]
    assert [feed["past_key_values.0.key"].shape[2] for feed in seen] == [0, 2, 3, 4]
    assert seen[2]["past_key_values.0.key"][0, 0, :, 0].tolist() == [5.0, 5.0, 6.0]


def test_recompute_mode_feeds_the_whole_sequence_with_an_empty_cache():
    model = _genai_lengths_model()
    interface = generation_interface(model, "lengths.onnx")
    seen: list[dict[str, np.ndarray]] = []
    presents = {pair.past: pair.present for pair in interface.caches}
    generation = greedy_generate(_fake_step(VOCAB, seen, presents), interface, [3], steps=3, use_cache=False)
    assert generation.tokens == [4, 5, 6]
    assert [feed["input_ids"].tolist() for feed in seen] == [[[3]], [[3, 4]], [[3, 4, 5]]]
    assert all(feed["past_key_values.0.key"].shape[2] == 0 for feed in seen)


@pytest.mark.parametrize("use_cache", [True, False])
def test_logits_along_feeds_the_given_tokens_and_returns_every_steps_logits(use_cache):
    interface = generation_interface(_genai_lengths_model(), "lengths.onnx")
    seen: list[dict[str, np.ndarray]] = []
    presents = {pair.past: pair.present for pair in interface.caches}
    rows = logits_along(_fake_step(VOCAB, seen, presents), interface, [3, 5], [1, 4], use_cache=use_cache)
    # The model would choose 6 after 5; it is fed 1, then 4, and each row is the last position's.
    fed = [[[3, 5]], [[1]], [[4]]] if use_cache else [[[3, 5]], [[3, 5, 1]], [[3, 5, 1, 4]]]
    assert [feed["input_ids"].tolist() for feed in seen] == fed
    assert [int(np.argmax(row)) for row in rows] == [6, 2, 5]


def test_the_kv_fixture_generates_what_transformers_generated(tmp_path):
    """The export script ran transformers' `generate(do_sample=False)` on two prompts (seed 3) and recorded the
    tokens; the original and the fused model both give them, with the cache and in recompute mode."""
    expected = json.loads((KV_FIXTURE.parent / "expected.json").read_text())["files"][KV_FIXTURE.name]
    prompts = [[106, 24, 121, 3, 56, 72], [0, 21, 125, 19, 74, 107]]
    fused = fuse_file(KV_FIXTURE, tmp_path / "fused.onnx").output_path
    for prompt, tokens in zip(prompts, expected["greedy_tokens"]["torch"], strict=True):
        original = generate_file(KV_FIXTURE, len(tokens), prompt)
        assert original.runner == ORIGINAL_RUNNER
        assert original.generation.tokens == tokens
        lowered = generate_file(fused, len(tokens), prompt)
        assert lowered.runner == LOWERED_RUNNER
        assert lowered.generation.tokens == tokens
        assert generate_file(KV_FIXTURE, len(tokens), prompt, use_cache=False).generation.tokens == tokens


def test_genai_group_query_attention_with_the_cache_matches_recompute_mode():
    prompt = [5, 17, 101, 3]
    cached = generate_file(GENAI_FIXTURE, 12, prompt).generation
    assert cached.cache
    assert cached.tokens == generate_file(GENAI_FIXTURE, 12, prompt, use_cache=False).generation.tokens


def test_default_prompt_is_inside_the_vocabulary_and_follows_the_seed():
    interface = generation_interface(onnx.load(str(GENAI_FIXTURE)), "genai")
    assert interface.vocabulary is not None and interface.vocabulary.value == 160
    first = default_prompt(interface, seed=0)
    assert len(first) == 5 and all(0 <= token < 160 for token in first)
    assert default_prompt(interface, seed=0) == first != default_prompt(interface, seed=1)


@pytest.mark.parametrize(
    ("prompt", "steps", "message"),
    [
        ([], 4, "the prompt is empty; give token ids with prompt-ids"),
        ([1, 160], 4, "prompt id 160 is outside the vocabulary of .*160 ids .*'model.embed_tokens.weight'.*0 to 159"),
        ([-1], 4, "prompt id -1 is outside the vocabulary"),
        ([1, 2, 3, 4, 5], 125, "a prompt of 5 ids and 125 steps feed 129 positions, more than .* holds \\(the cos"),
        ([1], 0, "0 steps: generation takes at least 1 step"),
    ],
)
def test_requests_the_model_cannot_take_are_one_line(prompt, steps, message):
    with pytest.raises(OptionError, match=message):
        generate_file(GENAI_FIXTURE, steps, prompt)


def test_the_position_limit_counts_the_positions_fed():
    # 5 + 124 - 1 = 128 positions: the last token is not fed back, so it fits the 128-row cos cache.
    assert len(generate_file(GENAI_FIXTURE, 124, [1, 2, 3, 4, 5]).generation.tokens) == 124


def test_a_model_without_a_cache_needs_recompute_mode(tmp_path):
    with pytest.raises(OptionError, match=r"has no KV cache .*run it with no-cache .*models/export.py --cache"):
        generate_file(LOGITS_ONLY, 3, [1, 2])
    run = generate_file(LOGITS_ONLY, 3, [1, 2], use_cache=False)
    assert len(run.generation.tokens) == 3 and not run.generation.cache
    assert "recompute mode" in run.notes[0]


def test_a_model_without_logits_is_one_line(tmp_path):
    from support.kv_models import optimum_model

    path = tmp_path / "no_logits.onnx"
    model = optimum_model()
    model.opset_import[0].version = 17
    onnx.save(model, str(path))
    with pytest.raises(TrtfuseError, match=r"no logits output \(outputs: present.0.key, .*\); generation needs"):
        generate_file(path, 3, [1])


def test_an_input_generation_cannot_fill_is_named(tmp_path):
    model = _genai_lengths_model()
    model.graph.input.append(helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, [1, 3]))
    with pytest.raises(TrtfuseError, match="input 'pixel_values' is none of token ids"):
        generation_interface(model, "m.onnx")


def test_timings_are_medians_over_repeated_runs():
    steps = (StepRecord(1, 0.004, 1.0, 1.0), StepRecord(2, 0.001, 1.0, 1.0), StepRecord(3, 0.003, 1.0, 1.0))
    runs = iter([0.002, 0.006])

    def again() -> Generation:
        first = next(runs)
        return Generation((0,), (StepRecord(1, first, 1.0, 1.0), *steps[1:]), cache=True)

    generation = repeated(again, 2)
    assert generation.tokens == [1, 2, 3]
    assert generation.first_token_ms == pytest.approx(4.0)
    assert generation.per_token_ms == pytest.approx(2.0)
    assert generation.to_json()["runs"] == 2


def test_token_lines_are_at_most_one_a_second_plus_the_first_and_the_last():
    # Each step takes 0.3 s of a fake clock: a line per token would be ten lines, most in the same second.
    model = _genai_lengths_model()
    interface = generation_interface(model, "lengths.onnx")
    presents = {pair.past: pair.present for pair in interface.caches}
    now = [0.0]
    step = _fake_step(VOCAB, [], presents)

    def slow_step(feed: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        now[0] += 0.3
        return step(feed)

    lines: list[str] = []
    generation = greedy_generate(slow_step, interface, [3], steps=10, clock=lambda: now[0], notify=lines.append)
    assert lines == ["token 1 of 10", "token 5 of 10", "token 9 of 10", "token 10 of 10"]
    assert [round(record.seconds, 6) for record in generation.steps] == [0.3] * 10
    single: list[str] = []
    greedy_generate(slow_step, interface, [3], steps=1, clock=lambda: now[0], notify=single.append)
    assert single == ["token 1 of 1"]


@pytest.mark.parametrize("name", ["model.onnxtxt", "MODEL.ONNX"])
def test_generate_runs_what_compare_takes_for_an_onnx_model_on_the_cpu(tmp_path, name):
    # One rule names an engine (`engine.engine_file.is_onnx_model_path`): `generate` took a .onnxtxt for an engine.
    model = tmp_path / name
    shutil.copy(KV_FIXTURE, model)
    run = generate_file(model, 2, [1, 2, 3])
    assert run.runner == ORIGINAL_RUNNER
    assert run.generation.tokens == generate_file(KV_FIXTURE, 2, [1, 2, 3]).generation.tokens
