"""Dims read off the model and the feeds built from them: KV-cache exports by each tool, prefill and decode steps,
and every bad size a user can ask for."""

from __future__ import annotations

import contextlib
import random

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.engine.profiles import DimRange, derive_profiles, request_from_options
from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.model.dims import DEFAULT_BATCH, DimRole, model_dims
from trtfuse.model.feeds import DECODE, DEFAULT_DIM, PREFILL, SINGLE, Step, default_feeds, make_feed

from support.cli import run_cli
from support.kv_models import HEAD_SIZE, KV_HEADS, POSITIONS, genai_model, optimum_model, windowed_genai_model
from support.paths import FIXTURES, TOOL_FIXTURES


def _run(model: onnx.ModelProto, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    options = onnxruntime.SessionOptions()
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feed), strict=True))


def _inputs_model(inputs: list[onnx.ValueInfoProto], nodes: list[onnx.NodeProto] = (), opset: int = 17):
    outputs = [helper.make_tensor_value_info(f"{v.name}_out", v.type.tensor_type.elem_type, None) for v in inputs]
    identities = [helper.make_node("Identity", [v.name], [f"{v.name}_out"]) for v in inputs]
    graph = helper.make_graph([*identities, *nodes], "inputs", inputs, outputs)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def test_genai_cache_head_size_comes_from_group_query_attention():
    for packed in (True, False):
        dims = model_dims(genai_model(packed=packed))
        assert dims.fixed["kv_cache_dim"].value == HEAD_SIZE
        assert "GroupQueryAttention" in dims.fixed["kv_cache_dim"].reason
        assert dims.roles["total_sequence_length"] is DimRole.TOTAL
        assert dims.max_total.value == POSITIONS
        assert dims.has_kv_cache


def test_cache_head_size_from_the_concat_with_the_new_keys():
    model = optimum_model(cache_head_size="kv_cache_dim")
    dims = model_dims(model)
    assert dims.fixed["kv_cache_dim"].value == HEAD_SIZE
    assert "head size Concat" in dims.fixed["kv_cache_dim"].reason
    for step in default_feeds(model, seed=0):
        _run(model, step.feed)


def test_genai_export_runs_prefill_and_decode_by_default():
    model = genai_model()
    prefill, decode = default_feeds(model, seed=0)
    assert (prefill.step, decode.step) == ("prefill", "decode")
    assert prefill.feed["past_key_values.0.key"].shape == (DEFAULT_BATCH, KV_HEADS, 0, HEAD_SIZE)
    assert prefill.feed["attention_mask"].shape == (DEFAULT_BATCH, PREFILL.tokens)
    assert decode.feed["input_ids"].shape == (DEFAULT_BATCH, 1)
    assert decode.feed["past_key_values.0.key"].shape == (DEFAULT_BATCH, KV_HEADS, DECODE.past, HEAD_SIZE)
    assert decode.feed["attention_mask"].shape == (DEFAULT_BATCH, DECODE.past + 1)
    assert decode.dims["total_sequence_length"] == DECODE.past + 1
    for step in (prefill, decode):
        outputs = _run(model, step.feed)
        total = step.dims["total_sequence_length"]
        assert outputs["present.0.key"].shape == (DEFAULT_BATCH, KV_HEADS, total, HEAD_SIZE)


def test_optimum_export_positions_and_mask_follow_the_past():
    model = optimum_model()
    prefill, decode = default_feeds(model, seed=3)
    assert prefill.feed["past_key_values.0.value"].shape == (DEFAULT_BATCH, KV_HEADS, 0, HEAD_SIZE)
    np.testing.assert_array_equal(prefill.feed["position_ids"][1], np.arange(PREFILL.tokens))
    np.testing.assert_array_equal(decode.feed["position_ids"], [[DECODE.past]] * DEFAULT_BATCH)
    assert decode.feed["attention_mask"].shape == (DEFAULT_BATCH, DECODE.past + 1)
    assert np.all(decode.feed["attention_mask"] == 1)
    outputs = _run(model, decode.feed)
    assert outputs["present.0.key"].shape == (DEFAULT_BATCH, KV_HEADS, DECODE.past + 1, HEAD_SIZE)


def test_given_past_means_one_step_of_exactly_those_sizes():
    (step,) = default_feeds(optimum_model(), seed=0, dims={"past_sequence_length": 3, "sequence_length": 2})
    assert step.step == SINGLE.name
    assert step.feed["attention_mask"].shape == (DEFAULT_BATCH, 5)
    np.testing.assert_array_equal(step.feed["position_ids"][0], [3, 4])
    cache_shape = (1, KV_HEADS, 7, HEAD_SIZE)
    (step,) = default_feeds(optimum_model(), seed=0, shapes={"past_key_values.0.key": cache_shape})
    assert step.dims == {"batch_size": 1, "past_sequence_length": 7, "sequence_length": DEFAULT_DIM}
    assert step.feed["past_key_values.0.value"].shape == cache_shape
    assert step.feed["attention_mask"].shape == (1, 7 + DEFAULT_DIM)


def test_model_without_cache_has_one_step_with_positions_from_zero():
    model = _inputs_model([helper.make_tensor_value_info("position_ids", TensorProto.INT64, ["batch", "seq"])])
    (step,) = default_feeds(model, seed=0)
    assert step.step == SINGLE.name
    np.testing.assert_array_equal(step.feed["position_ids"][0], np.arange(DEFAULT_DIM))


def test_length_inputs_hold_the_step_lengths():
    model = _inputs_model(
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("past_sequence_length", TensorProto.INT32, []),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1]),
            helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, ["batch_size"]),
        ]
    )
    assert model_dims(model).has_kv_cache
    prefill, decode = default_feeds(model, seed=0)
    assert prefill.feed["past_sequence_length"] == 0
    assert decode.feed["past_sequence_length"].shape == ()
    assert decode.feed["past_sequence_length"] == DECODE.past
    np.testing.assert_array_equal(decode.feed["total_sequence_length"], [DECODE.past + 1])
    np.testing.assert_array_equal(decode.feed["seqlens_k"], [DECODE.past] * DEFAULT_BATCH)


def test_opset_23_rotary_embedding_limits_the_batch_to_one():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", DEFAULT_DIM, 8])
    rotary = helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["rotated"], name="rope", num_heads=2)
    model = _inputs_model([x], [rotary], opset=23)
    for name in ("cos", "sin"):
        model.graph.initializer.append(numpy_helper.from_array(np.ones((1, DEFAULT_DIM, 2), np.float32), name))
    dims = model_dims(model)
    assert "RotaryEmbedding 'rope'" in dims.onnxruntime_batch.reason
    assert dims.default_batch() == 1
    assert make_feed(model, 0)["x"].shape == (1, DEFAULT_DIM, 8)
    # Caches fed as graph inputs follow the feed's batch: no limit.
    caches = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", DEFAULT_DIM, 2]) for n in ("cos", "sin")]
    assert model_dims(_inputs_model([x, *caches], [rotary], opset=23)).default_batch() == DEFAULT_BATCH


def test_static_cache_batch_fixes_the_batch():
    model = _inputs_model(
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "sequence_length"]),
            helper.make_tensor_value_info("past_key", TensorProto.FLOAT, [1, 2, "past_sequence_length", 4]),
        ]
    )
    assert make_feed(model, 0)["input_ids"].shape == (1, DEFAULT_DIM)


def test_too_many_positions_for_the_rotary_cache_or_position_table_names_it():
    with pytest.raises(TrtfuseError, match=r"decode step: 20 past \+ 1 new tokens exceed .*GroupQueryAttention"):
        make_feed(genai_model(), 0, step=Step("decode", tokens=1, past=20))
    with pytest.raises(
        TrtfuseError, match=r"single step: 18 past \+ 2 new tokens exceed .*'position_table' has 16 rows"
    ):
        make_feed(optimum_model(), 0, dims={"past_sequence_length": 18, "sequence_length": 2})


def _one_input(dims: list) -> onnx.ModelProto:
    return _inputs_model([helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)])


@pytest.mark.parametrize(
    ("dims", "given", "message"),
    [
        (
            ["seq // 0"],
            {},
            r"input 'x': cannot evaluate symbolic dim 'seq // 0' \(dim 0\): it divides by zero; .*dim",
        ),
        (
            ["seq - 10"],
            {},
            r"input 'x': symbolic dim 'seq - 10' \(dim 0\) is -5 with seq=5; set its symbols with dim",
        ),
        (["seq ** 2"], {}, r"'seq \*\* 2' \(dim 0\): it is not integer arithmetic"),
        (["seq / 2"], {}, r"'seq / 2' \(dim 0\): 5 / 2 is not a whole number"),
        (["seq", "hidden"], {"seq": 10**6, "hidden": 10**6}, r"input 'x' of shape 1000000x1000000 makes the feed"),
        (["seq"], {"seq": -3}, r"dim seq=-3: a dim is a non-negative integer"),
        (["seq"], {"sequence": 3}, r"dim names no symbolic dim of a graph input: sequence \(dims: seq\)"),
    ],
)
def test_bad_dims_are_one_line_naming_input_and_dim(dims, given, message):
    with pytest.raises(OptionError, match=message):
        make_feed(_one_input(dims), 0, dims=given)


def test_negative_dim_in_the_model_names_the_input():
    model = _one_input([3])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = -1
    with pytest.raises(TrtfuseError, match=r"input 'x' has a negative dim -1 in the model"):
        make_feed(model, 0)


@pytest.mark.parametrize("seed", [-1, 2**64, 1.5, True])
def test_seed_out_of_range(seed):
    with pytest.raises(OptionError, match=rf"seed {seed}: must be an integer from 0 to {2**64 - 1}"):
        make_feed(_one_input([2]), seed)
    assert make_feed(_one_input([2]), np.int64(2**62))["x"].shape == (2,)


def test_empty_gather_table_names_input_and_table():
    ids = helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])
    model = _inputs_model([ids], [helper.make_node("Gather", ["table", "input_ids"], ["rows"])])
    model.graph.initializer.append(numpy_helper.from_array(np.zeros((0, 4), np.float32), "table"))
    with pytest.raises(TrtfuseError, match=r"input 'input_ids' indexes Gather table 'table', which is empty"):
        make_feed(model, 0)


def test_shapes_that_disagree_on_a_dim_and_shapes_of_the_wrong_rank():
    model = optimum_model()
    shapes = {"input_ids": (1, 3), "position_ids": (1, 4)}
    with pytest.raises(OptionError, match=r"shape position_ids gives dim 'sequence_length' = 4, shape input_ids"):
        make_feed(model, 0, shapes=shapes)
    with pytest.raises(OptionError, match=r"shape input_ids: the input has rank 2, the shape has 3"):
        make_feed(model, 0, shapes={"input_ids": (1, 3, 1)})
    with pytest.raises(OptionError, match=r"shape past_key_values.0.key: dim 1 is fixed at 2 in the model"):
        make_feed(model, 0, shapes={"past_key_values.0.key": (1, 3, 1, HEAD_SIZE)})


def _identity_model(dims: list) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, dims)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, dims)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "identity", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_cli_bad_feed_and_profile_flags_are_one_line_and_exit_2(tmp_path):
    model_path = tmp_path / "m.onnx"
    onnx.save(_identity_model(["batch", "seq - 10"]), model_path)
    result = run_cli("check", model_path, model_path)
    assert result.exit_code == 2
    assert "symbolic dim 'seq - 10' (dim 1) is -5 with seq=5" in result.output
    assert len(result.output.strip().splitlines()) == 1
    onnx.save(_identity_model(["batch", "seq"]), model_path)
    result = run_cli("check", model_path, model_path, "--seed", -1)
    assert result.exit_code == 2
    assert "--seed -1: must be an integer from 0" in result.output
    result = run_cli("compile", model_path, "--past", "0:1:2")
    assert result.exit_code == 2
    assert "--past: the model has no KV cache" in result.output
    assert sorted(path.name for path in tmp_path.iterdir()) == ["m.onnx"]


def test_random_dims_give_a_feed_or_one_trtfuse_error():
    rng = random.Random(0)
    atoms = ["batch_size", "sequence_length", "past_sequence_length", "total", "s1", "kv_cache_dim", "0", "7", "10**9"]
    operators = [" + ", " - ", " * ", " // ", " / ", " ** ", "(", ")", "", "\x00"]
    elem_types = [TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL, TensorProto.STRING, 0]
    names = ["input_ids", "attention_mask", "position_ids", "past_key_values.0.key", "past_sequence_length", "x"]

    def random_dim() -> int | str | None:
        if rng.random() < 0.3:
            return rng.choice([None, 0, 1, 3])
        return "".join(rng.choice(atoms) + rng.choice(operators) for _ in range(rng.randint(1, 3))).strip()

    for _ in range(300):
        inputs = [
            helper.make_tensor_value_info(
                f"{rng.choice(names)}{i}", rng.choice(elem_types), [random_dim() for _ in range(rng.randint(0, 4))]
            )
            for i in range(rng.randint(1, 3))
        ]
        model = helper.make_model(helper.make_graph([], "random", inputs, []))
        dims = {rng.choice(atoms): rng.randint(0, 9)} if rng.random() < 0.3 else {}
        request = request_from_options(
            past=rng.choice([None, DimRange(0, 1, 2)]), tokens=rng.choice([[], [DimRange(1, 2, 3)]])
        )
        with contextlib.suppress(TrtfuseError):
            default_feeds(model, 0, dims=dims)
        with contextlib.suppress(TrtfuseError):
            derive_profiles(model, request)


@pytest.mark.parametrize("layout", ["4d", "3d"])
def test_opset_23_attention_gives_the_cache_head_count_and_size(layout):
    heads, kv_heads, head_size = 4, 2, 16
    if layout == "4d":
        q, kv = ["batch", heads, "seq", head_size], ["batch", kv_heads, "seq", head_size]
    else:
        q, kv = ["batch", "seq", heads * head_size], ["batch", "seq", kv_heads * head_size]
    cache = ["batch", "kv_heads", "past_sequence_length", "head"]
    inputs = [
        helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)
        for name, shape in (("q", q), ("k", kv), ("v", kv), ("past_key", cache), ("past_value", cache))
    ]
    attention = helper.make_node(
        "Attention", ["q", "k", "v", "", "past_key", "past_value"], ["y"], q_num_heads=heads, kv_num_heads=kv_heads
    )
    dims = model_dims(_inputs_model(inputs, [attention], opset=23))
    assert {symbol: bound.value for symbol, bound in dims.fixed.items()} == {"kv_heads": kv_heads, "head": head_size}


@pytest.mark.parametrize(
    ("name", "steps"),
    [
        ("qwen3-optimum-fp16.onnx", ["prefill", "decode"]),
        ("llama-optimum-fp16-O2.onnx", ["prefill", "decode"]),
        ("qwen3-genai-cpu-int4.onnx", ["prefill", "decode"]),
        ("qwen3-modelopt-int8-fp16.onnx", ["single"]),
    ],
)
def test_fixture_exports_run_in_onnxruntime_at_every_default_step(name, steps):
    model = onnx.load(TOOL_FIXTURES / name)
    feeds = default_feeds(model, seed=0)
    assert [feed.step for feed in feeds] == steps
    for feed in feeds:
        outputs = _run(model, feed.feed)
        assert all(np.isfinite(array).all() for array in outputs.values() if array.dtype.kind == "f")


@pytest.mark.parametrize("window", [4, 8])
def test_a_window_cache_holds_its_window_at_every_step(window: int) -> None:
    # onnxruntime refuses a windowed cache below local_window_size ("KV cache capacity (0) must be at least
    # local_window_size"): the name says past, but the dim is a capacity the op requires, at prefill too.
    model = windowed_genai_model(window)
    dims = model_dims(model)
    assert "past_sliding_length" not in dims.roles and dims.fixed["past_sliding_length"].value == window
    assert "sliding_window_cache=1" in dims.fixed["past_sliding_length"].reason
    # Every layer sliding: no past role is left, and the model still gets a prefill and a decode step.
    assert dims.has_kv_cache
    steps = default_feeds(model, seed=0)
    assert [step.step for step in steps] == ["prefill", "decode"]
    for step, total in zip(steps, (PREFILL.tokens, DECODE.past + DECODE.tokens), strict=True):
        assert step.feed["past_key_values.0.key"].shape[2] == window
        assert step.feed["attention_mask"].shape[1] == total and dims.total_length(step.dims) == total
        _run(model, step.feed)


def test_full_caches_beside_a_window_cache_still_follow_the_step() -> None:
    model = windowed_genai_model(4)
    full = helper.make_tensor_value_info(
        "past_key_values.1.key", TensorProto.FLOAT, ["batch_size", KV_HEADS, "past_sequence_length", "kv_cache_dim"]
    )
    model.graph.input.append(full)
    model.graph.output.append(helper.make_tensor_value_info("past_key_values.1.key", TensorProto.FLOAT, None))
    prefill, decode = default_feeds(model, seed=0)
    assert prefill.feed["past_key_values.1.key"].shape[2] == 0 and decode.feed["past_key_values.1.key"].shape[2] == 5
    assert prefill.feed["past_key_values.0.key"].shape[2] == decode.feed["past_key_values.0.key"].shape[2] == 4


def test_a_mask_that_is_not_past_plus_tokens_is_said_up_front(tmp_path):
    # The KV fixture's mask is [batch_size, past_sequence_length + sequence_length]: onnxruntime's own failure is a
    # GatherND index deep in the graph, with no word on the sizes.
    kv = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"
    model = onnx.load(str(kv))
    with pytest.raises(OptionError, match=r"attention_mask=1x9: dim 1 is 'past_sequence_length \+ sequence_length'"):
        default_feeds(model, 0, shapes={"input_ids": (1, 7), "attention_mask": (1, 9)})
    fused = tmp_path / "kv.fused.onnx"
    assert run_cli("fuse", kv, "-o", fused).exit_code == 0
    result = run_cli("check", kv, fused, "--shape", "input_ids=1x7", "--shape", "attention_mask=1x9")
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        "trtfuse: error: --shape attention_mask=1x9: dim 1 is 'past_sequence_length + sequence_length', which the "
        "prefill step's sizes make 7 (past_sequence_length=0, sequence_length=7), not 9; make the shapes agree, or "
        "set the sizes with --dim past_sequence_length=N"
    ]
    (step,) = default_feeds(
        model, 0, shapes={"input_ids": (1, 7), "attention_mask": (1, 9)}, dims={"past_sequence_length": 2}
    )
    assert step.feed["past_key_values.0.key"].shape == (1, 1, 2, 64)
