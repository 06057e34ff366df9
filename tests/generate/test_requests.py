"""Requests `generate` refuses before it runs anything (docs/cli.md, `trtfuse generate`): one line and exit 2 for a
prompt the token input's shape cannot take, an id its integer type cannot hold, a seed numpy cannot take, and a step
count past every profile of an engine, however large."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.engine.profiles import Profile, ShapeRange
from trtfuse.errors import OptionError
from trtfuse.generate.interface import generation_interface
from trtfuse.generate.runners import check_engine_holds

from support.cli import run_cli
from support.engines import engine_in_memory

VOCAB = 7


def _lm(token_dims: list[int | str], cache: bool = True, table: str = "initializer") -> onnx.ModelProto:
    """logits = embed[input_ids]; with `cache`, a one-layer cache that appends the ids (as floats) it is fed.
    `table`: the embedding table an initializer (the vocabulary is its row count) or a Constant node (unknown)."""
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, token_dims)]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [*token_dims, "vocab"])]
    embed = numpy_helper.from_array(np.eye(VOCAB, dtype=np.float32), "embed")
    nodes = [helper.make_node("Gather", ["embed", "input_ids"], ["logits"])]
    initializers = [embed]
    if table == "constant":
        nodes.insert(0, helper.make_node("Constant", [], ["embed"], value=embed))
        initializers = []
    if cache:
        inputs.append(
            helper.make_tensor_value_info(
                "past_key_values.0.key", TensorProto.FLOAT, ["batch_size", 1, "past_sequence_length", 1]
            )
        )
        outputs.append(
            helper.make_tensor_value_info(
                "present.0.key", TensorProto.FLOAT, ["batch_size", 1, "total_sequence_length", 1]
            )
        )
        initializers.append(numpy_helper.from_array(np.array([1, 3], np.int64), "axes"))
        nodes += [
            helper.make_node("Cast", ["input_ids"], ["ids_float"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["ids_float", "axes"], ["new_key"]),
            helper.make_node("Concat", ["past_key_values.0.key", "new_key"], ["present.0.key"], axis=2),
        ]
    graph = helper.make_graph(nodes, "lm", inputs, outputs, initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _generate(write_model, model: onnx.ModelProto, *args: object):
    return run_cli("generate", write_model(model), *args)


def test_the_model_generates(write_model):
    result = _generate(write_model, _lm(["batch_size", "sequence_length"]), "--prompt-ids", "1,2,3", "--steps", "3")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize(
    ("dims", "args", "message"),
    [
        (
            [1, 8],
            ("--prompt-ids", "1,2,3", "--no-cache"),
            "input 'input_ids' [1, 8] takes 8 token ids per step, but step 1 feeds the prompt's 3; give a prompt of "
            "8 ids with --prompt-ids",
        ),
        (
            ["batch_size", 1],
            ("--prompt-ids", "1,2,3"),
            "input 'input_ids' [batch_size, 1] takes 1 token id per step, but step 1 feeds the prompt's 3; give a "
            "prompt of 1 id with --prompt-ids",
        ),
        (
            [1, 3],
            ("--prompt-ids", "1,2,3", "--steps", "2", "--no-cache"),
            "input 'input_ids' [1, 3] takes 3 token ids per step, but step 2 feeds 4; ask for 1 step",
        ),
    ],
    ids=["static-prompt", "decode-only", "static-later-step"],
)
def test_a_prompt_the_token_shape_cannot_take_is_one_line(write_model, dims, args, message):
    model = _lm(dims, cache="--no-cache" not in args)
    result = _generate(write_model, model, *args)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_a_decode_only_export_takes_a_one_id_prompt(write_model):
    result = _generate(write_model, _lm(["batch_size", 1]), "--prompt-ids", "4", "--steps", "3", "--json")
    assert result.exit_code == 0, result.output


def test_an_id_past_the_token_inputs_integer_type_is_one_line(write_model):
    """With the vocabulary unknown (the table is no initializer), the id's bound is the input's int64."""
    model = _lm(["batch_size", "sequence_length"], table="constant")
    assert generation_interface(model, "m").vocabulary is None
    result = _generate(write_model, model, "--prompt-ids", str(2**63))
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert f"prompt id {2**63} does not fit input 'input_ids'" in result.stderr
    assert "int64 ids (-9223372036854775808 to 9223372036854775807)" in result.stderr


@pytest.mark.parametrize("seed", ["-1", str(2**64)])
def test_a_seed_numpy_cannot_take_is_refused_as_check_refuses_it(write_model, seed):
    model_path = write_model(_lm(["batch_size", "sequence_length"]))
    generated = run_cli("generate", model_path, "--seed", seed)
    checked = run_cli("check", model_path, model_path, "--seed", seed)
    assert generated.exit_code == checked.exit_code == EXIT_BAD_INPUT, generated.output
    assert f"--seed {seed}: must be an integer from 0 to {2**64 - 1}" in generated.stderr
    assert generated.stderr == checked.stderr


def _profile(name: str, tokens: tuple[int, int], past: tuple[int, int]) -> Profile:
    return Profile(
        name,
        {
            "input_ids": ShapeRange((1, tokens[0]), (1, tokens[1]), (1, tokens[1])),
            "past_key_values.0.key": ShapeRange((1, 1, past[0], 1), (1, 1, past[1], 1), (1, 1, past[1], 1)),
        },
    )


@pytest.mark.parametrize(
    ("profiles", "refused"),
    [
        ([_profile("prefill", (1, 8), (0, 0)), _profile("decode", (1, 1), (1, 16))], r"step 17 \(1 token after 17\)"),
        (
            [_profile("prefill", (1, 8), (0, 0)), _profile("short", (1, 1), (1, 6)), _profile("long", (1, 1), (8, 99))],
            r"step 7 \(1 token after 7\)",
        ),
    ],
    ids=["past-the-longest", "in-a-gap"],
)
def test_a_step_count_past_every_profile_is_refused_without_walking_it(tmp_path: Path, profiles, refused):
    """10**12 steps: the first step no profile holds is named, without making a shape for every step."""
    interface = generation_interface(_lm(["batch_size", "sequence_length"]), "m")
    engine = engine_in_memory(tmp_path / "m.engine", profiles)
    with pytest.raises(OptionError, match=refused + " fits none of the engine's optimisation profiles"):
        check_engine_holds(engine, interface, 2, 10**12, use_cache=True)
    check_engine_holds(engine, interface, 2, 6, use_cache=True)


def test_recompute_steps_are_held_by_the_token_range(tmp_path: Path):
    interface = generation_interface(_lm(["batch_size", "sequence_length"], cache=False), "m")
    engine = engine_in_memory(
        tmp_path / "m.engine", [Profile("all", {"input_ids": ShapeRange((1, 1), (1, 4), (1, 9))})]
    )
    check_engine_holds(engine, interface, 3, 7, use_cache=False)
    with pytest.raises(OptionError, match=r"step 8 \(10 tokens after 0\)"):
        check_engine_holds(engine, interface, 3, 10**12, use_cache=False)
