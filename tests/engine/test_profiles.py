"""Optimisation profiles from symbolic input dims: roles, presets, overrides and every bad spec."""

from collections.abc import Sequence

import click
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from trtfuse.cli.options import RangeType, ShapeRangeType
from trtfuse.engine.profiles import DimRange, Profile, ProfileRequest, ShapeRange, derive_profiles, request_from_options
from trtfuse.errors import OptionError, TrtfuseError
from trtfuse.model.dims import DEFAULT_BATCH, DimRole, dim_role

from support.kv_models import HEAD_SIZE, KV_HEADS, genai_model, optimum_model
from support.paths import TOOL_FIXTURES

B = DEFAULT_BATCH
# Positions enough for every default range: 4096 past + 4096 tokens.
LONG = 8192


def _request(
    presets: Sequence[str] = (),
    tokens: Sequence[str] = (),
    batch: str | None = None,
    past: str | None = None,
    shapes: Sequence[str] = (),
) -> ProfileRequest:
    """request_from_options on the command line's spellings, parsed by `trtfuse compile`'s own option types."""
    return request_from_options(
        presets=presets,
        tokens=[RangeType(minimum=1).convert(text, None, None) for text in tokens],
        batch=RangeType(minimum=1).convert(batch, None, None) if batch is not None else None,
        past=RangeType().convert(past, None, None) if past is not None else None,
        shapes=dict(pair for text in shapes for pair in ShapeRangeType().convert(text, None, None)),
    )


def _model(inputs: dict[str, list], initializer_as_input: bool = False) -> onnx.ModelProto:
    values = [helper.make_tensor_value_info(name, TensorProto.INT64, dims) for name, dims in inputs.items()]
    initializers = []
    if initializer_as_input:
        initializers.append(helper.make_tensor("weight", TensorProto.FLOAT, [2], [1.0, 2.0]))
        values.append(helper.make_tensor_value_info("weight", TensorProto.FLOAT, [2]))
    out = helper.make_tensor_value_info("y", TensorProto.INT64, None)
    first = next(iter(inputs))
    graph = helper.make_graph([helper.make_node("Identity", [first], ["y"])], "g", values, [out], initializers)
    return helper.make_model(graph)


LLAMA_WITH_CACHE = {
    "input_ids": ["batch_size", "sequence_length"],
    "attention_mask": ["batch_size", "past_sequence_length + sequence_length"],
    "past_key_values.0.key": ["batch_size", 4, "past_sequence_length", 16],
}


def test_roles_from_dim_names():
    assert dim_role("batch_size") is DimRole.BATCH
    assert dim_role("sequence_length") is DimRole.TOKENS
    assert dim_role("past_sequence_length") is DimRole.PAST
    assert dim_role("total_sequence_length") is DimRole.TOTAL
    assert dim_role("s17") is None


def test_default_profile_covers_tokens_1_256_4096_and_batch_1_to_the_feed_batch():
    (profile,) = derive_profiles(_model({"input_ids": ["batch", "sequence"]}), _request())
    assert profile.name == "default"
    assert profile.shapes == {"input_ids": ShapeRange((1, 1), (B, 256), (B, 4096))}


def test_kv_cache_model_total_is_past_plus_tokens():
    request = _request(presets=["decode", "prefill"], past="1:512:2048", batch="1:1:1")
    decode, prefill = derive_profiles(_model(LLAMA_WITH_CACHE), request)
    assert decode.name == "decode"
    assert decode.shapes["input_ids"] == ShapeRange((1, 1), (1, 1), (1, 1))
    assert decode.shapes["attention_mask"] == ShapeRange((1, 2), (1, 513), (1, 2049))
    assert decode.shapes["past_key_values.0.key"] == ShapeRange((1, 4, 1, 16), (1, 4, 512, 16), (1, 4, 2048, 16))
    # Prefill has no past whatever --past says: the cache is empty when a prompt is first processed.
    assert prefill.shapes["past_key_values.0.key"] == ShapeRange((1, 4, 0, 16), (1, 4, 0, 16), (1, 4, 0, 16))
    assert prefill.shapes["attention_mask"] == ShapeRange((1, 1), (1, 256), (1, 4096))


def test_one_profile_per_tokens_option_and_batch_everywhere():
    request = _request(tokens=["1:1:8", "16:512:8192"], batch="1:2:4")
    small, large = derive_profiles(_model({"input_ids": ["batch", "seq"]}), request)
    assert small.shapes["input_ids"] == ShapeRange((1, 1), (2, 1), (4, 8))
    assert large.shapes["input_ids"] == ShapeRange((1, 16), (2, 512), (4, 8192))
    assert small.name == "tokens 1:1:8"


def test_shape_override_replaces_derivation_and_resolves_unknown_dims():
    model = _model({"input_ids": ["s0", "s1"], "position_ids": ["batch", "sequence"]})
    request = _request(shapes=["input_ids=1x1:1x64:2x128"])
    (profile,) = derive_profiles(model, request)
    assert profile.shapes["input_ids"] == ShapeRange((1, 1), (1, 64), (2, 128))
    assert profile.shapes["position_ids"] == ShapeRange((1, 1), (B, 256), (B, 4096))


def test_initializers_listed_as_inputs_are_not_profiled():
    (profile,) = derive_profiles(_model({"input_ids": [1, "seq"]}, initializer_as_input=True), _request())
    assert set(profile.shapes) == {"input_ids"}


def test_profile_json_round_trip():
    profile = Profile("decode", {"x": ShapeRange((1, 1), (1, 2), (1, 3))})
    assert Profile.from_json(profile.to_json()) == profile
    assert profile.opt_shapes() == {"x": (1, 2)}


def test_unknown_symbolic_dim_names_input_and_dim():
    with pytest.raises(
        OptionError, match=r"input 'input_ids' dim 1 is symbolic dim 's1' with no known role.*shape input_ids="
    ):
        derive_profiles(_model({"input_ids": ["batch", "s1"]}), _request())


def test_unnamed_dynamic_dim_names_input_and_dim():
    model = _model({"input_ids": ["batch", "seq"]})
    model.graph.input[0].type.tensor_type.shape.dim[1].Clear()
    with pytest.raises(TrtfuseError, match=r"input 'input_ids' dim 1 is an unnamed dynamic dim"):
        derive_profiles(model, _request())


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1:256", r"expected MIN:OPT:MAX"),
        ("1:a:4", r"expected MIN:OPT:MAX"),
        ("8:4:16", r"need MIN <= OPT <= MAX"),
        ("0:1:4", r"MIN must be at least 1"),
        ("-1:1:4", r"expected MIN:OPT:MAX"),
    ],
)
def test_bad_tokens_ranges(text, message):
    with pytest.raises(click.BadParameter, match=message):
        _request(tokens=[text])


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1x1:1x2:1x3", r"is not NAME=MIN:OPT:MAX"),
        ("ids=1x1:1x2", r"is not NAME=MIN:OPT:MAX"),
        ("ids=1x1:1x2:1", r"ids: MIN, OPT and MAX have different ranks"),
        ("ids=1x1:1xq:1x3", r"is not NAME=MIN:OPT:MAX or a comma-separated list of them, shapes like 1x16"),
        ("ids=1x4:1x2:1x8", r"ids: dim 1 needs MIN <= OPT <= MAX, got 4:2:8"),
    ],
)
def test_bad_shape_specs(text, message):
    with pytest.raises(click.BadParameter, match=message):
        ShapeRangeType().convert(text, None, None)


def test_shape_for_missing_input_lists_the_inputs():
    with pytest.raises(OptionError, match=r"shape ids: the model has no such input \(inputs: input_ids\)"):
        derive_profiles(_model({"input_ids": ["batch", "seq"]}), _request(shapes=["ids=1:1:1"]))


def test_shape_with_wrong_rank_or_fixed_dim():
    model = _model({"input_ids": [1, "seq"]})
    with pytest.raises(OptionError, match=r"shape input_ids: the input has rank 2, the shapes have 1"):
        derive_profiles(model, _request(shapes=["input_ids=1:1:1"]))
    with pytest.raises(OptionError, match=r"shape input_ids: dim 0 is fixed at 1 in the model"):
        derive_profiles(model, _request(shapes=["input_ids=1x1:2x1:2x1"]))


def test_bad_presets_and_duplicates():
    with pytest.raises(TrtfuseError, match=r"unknown profile 'warmup'; choose from default, decode, prefill"):
        _request(presets=["warmup"])
    with pytest.raises(TrtfuseError, match=r"profile 'decode' is asked for twice"):
        _request(presets=["decode", "decode"])
    with pytest.raises(click.BadParameter, match=r"MIN must be at least 1"):
        _request(batch="0:1:1")


def test_parse_range_accepts_spaces_and_zero_past():
    assert RangeType().convert(" 0:0:16 ", None, None) == DimRange(0, 0, 16)
    assert str(DimRange(1, 2, 3)) == "1:2:3"
    assert str(ShapeRange((1, 2), (1, 3), (1, 4))) == "1x2:1x3:1x4"


def test_optimum_with_past_decode_and_prefill_ranges_per_input():
    request = _request(presets=["decode", "prefill"])
    decode, prefill = derive_profiles(optimum_model(positions=LONG), request)
    one_token = ShapeRange((1, 1), (B, 1), (B, 1))
    assert decode.shapes["input_ids"] == one_token
    assert decode.shapes["position_ids"] == one_token
    assert decode.shapes["attention_mask"] == ShapeRange((1, 1), (B, 257), (B, 4097))
    for name in ("past_key_values.0.key", "past_key_values.0.value"):
        assert decode.shapes[name] == ShapeRange(
            (1, KV_HEADS, 0, HEAD_SIZE), (B, KV_HEADS, 256, HEAD_SIZE), (B, KV_HEADS, 4096, HEAD_SIZE)
        )
        assert prefill.shapes[name] == ShapeRange(
            (1, KV_HEADS, 0, HEAD_SIZE), (B, KV_HEADS, 0, HEAD_SIZE), (B, KV_HEADS, 0, HEAD_SIZE)
        )
    prompt = ShapeRange((1, 1), (B, 256), (B, 4096))
    assert prefill.shapes["input_ids"] == prefill.shapes["attention_mask"] == prompt


def test_genai_cache_head_size_total_mask_and_length_inputs():
    model = genai_model(positions=LONG)
    model.graph.input.extend(
        [
            helper.make_tensor_value_info("past_sequence_length", TensorProto.INT32, []),
            helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, [1]),
        ]
    )
    (decode,) = derive_profiles(model, _request(presets=["decode"], past="0:64:512", batch="1:1:4"))
    assert decode.shapes["input_ids"] == ShapeRange((1, 1), (1, 1), (4, 1))
    assert decode.shapes["attention_mask"] == ShapeRange((1, 1), (1, 65), (4, 513))
    assert decode.shapes["past_key_values.0.key"] == ShapeRange(
        (1, KV_HEADS, 0, HEAD_SIZE), (1, KV_HEADS, 64, HEAD_SIZE), (4, KV_HEADS, 512, HEAD_SIZE)
    )
    assert decode.shapes["past_sequence_length"] == ShapeRange((), (), ())
    assert decode.shapes["total_sequence_length"] == ShapeRange((1,), (1,), (1,))
    assert decode.values == {
        "past_sequence_length": ShapeRange((0,), (64,), (512,)),
        "total_sequence_length": ShapeRange((1,), (65,), (513,)),
    }
    assert Profile.from_json(decode.to_json()) == decode


def test_dynamo_opset_23_rotary_embedding_keeps_the_batch_at_one():
    model = _model({"input_ids": ["batch", "sequence_length"]})
    model.graph.node.append(helper.make_node("RotaryEmbedding", ["x", "cos", "sin"], ["rotated"], name="rope"))
    for name in ("cos", "sin"):
        model.graph.initializer.append(numpy_helper.from_array(np.ones((1, 4, 2), np.float32), name))
    (profile,) = derive_profiles(model, _request())
    assert profile.shapes["input_ids"] == ShapeRange((1, 1), (1, 256), (1, 4096))


def test_dim_arithmetic_is_evaluated_at_min_opt_and_max():
    (profile,) = derive_profiles(_model({"x": ["batch", "2 * sequence_length + 1"]}), _request())
    assert profile.shapes["x"] == ShapeRange((1, 3), (B, 513), (B, 8193))
    with pytest.raises(TrtfuseError, match=r"input 'x' dim 1 \('sequence_length - 10'\) spans -9:246:4086"):
        derive_profiles(_model({"x": ["batch", "sequence_length - 10"]}), _request())
    with pytest.raises(TrtfuseError, match=r"input 'x' dim 1 \('sequence_length // 0'\): it divides by zero"):
        derive_profiles(_model({"x": ["batch", "sequence_length // 0"]}), _request())


def test_past_on_a_model_without_kv_cache_is_an_error():
    with pytest.raises(OptionError, match=r"past: the model has no KV cache"):
        derive_profiles(_model({"input_ids": ["batch", "seq"]}), _request(past="0:1:2"))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"tokens": ["1:1:8"], "shapes": ["input_ids=1x1:1x4:1x8"]},
            r"shape input_ids fixes dim 'sequence_length', ",
        ),
        (
            {"past": "0:1:8", "shapes": ["attention_mask=1x1:1x4:1x8"]},
            r"shape attention_mask fixes dim 'past_sequence_length \+ sequence_length', which past also sets",
        ),
        ({"batch": "1:1:2", "shapes": ["input_ids=1x1:1x4:1x8"]}, r"fixes dim 'batch_size', which batch also sets"),
    ],
)
def test_a_shape_that_contradicts_a_range_flag_is_an_error(options, message):
    with pytest.raises(OptionError, match=message) as raised:
        derive_profiles(optimum_model(positions=LONG), _request(**options))
    assert raised.value.choice == "shape"


def test_a_batch_the_model_does_not_allow():
    model = _model({"input_ids": ["batch_size", "seq"], "past_key": [1, 2, "past_sequence_length", 4]})
    model.graph.input[1].type.tensor_type.elem_type = TensorProto.FLOAT
    (profile,) = derive_profiles(model, _request())
    assert profile.shapes["input_ids"] == ShapeRange((1, 1), (1, 256), (1, 4096))
    with pytest.raises(OptionError, match=r"batch 1:2:2: the model allows only batch 1 \(the batch dim of cache"):
        derive_profiles(model, _request(batch="1:2:2"))


def test_default_ranges_are_cut_to_the_positions_the_model_holds():
    request = _request(presets=["default", "decode", "prefill"])
    default, decode, prefill = derive_profiles(genai_model(), request)
    cache = ("past_key_values.0.key", (1, KV_HEADS, 0, HEAD_SIZE))
    assert default.shapes["input_ids"] == ShapeRange((1, 1), (B, 8), (B, 8))
    assert default.shapes[cache[0]] == ShapeRange(cache[1], (B, KV_HEADS, 8, HEAD_SIZE), (B, KV_HEADS, 8, HEAD_SIZE))
    assert decode.shapes["attention_mask"] == ShapeRange((1, 1), (B, 16), (B, 16))
    assert decode.shapes[cache[0]] == ShapeRange(cache[1], (B, KV_HEADS, 15, HEAD_SIZE), (B, KV_HEADS, 15, HEAD_SIZE))
    assert prefill.shapes["input_ids"] == ShapeRange((1, 1), (B, 16), (B, 16))
    with pytest.raises(
        TrtfuseError,
        match=r"profile 'decode': 100 past \+ 1 new tokens at MAX exceed .*cos cache of GroupQueryAttention",
    ):
        derive_profiles(genai_model(), _request(presets=["decode"], past="0:8:100"))


def _caches(model: onnx.ModelProto) -> list[str]:
    return [value.name for value in model.graph.input if value.name.startswith("past_key_values.")]


@pytest.mark.parametrize(
    "name", ["qwen3-optimum-fp16.onnx", "qwen3-optimum-fp16-slim.onnx", "llama-optimum-fp16-O2.onnx"]
)
def test_optimum_fixture_decode_and_prefill(name):
    model = onnx.load(TOOL_FIXTURES / name)
    decode, prefill = derive_profiles(model, _request(presets=["decode", "prefill"]))
    assert set(decode.shapes) == {"input_ids", "attention_mask", "position_ids", *_caches(model)}
    assert decode.shapes["input_ids"] == decode.shapes["position_ids"] == ShapeRange((1, 1), (B, 1), (B, 1))
    assert decode.shapes["attention_mask"] == ShapeRange((1, 1), (B, 257), (B, 4097))
    assert prefill.shapes["input_ids"] == prefill.shapes["attention_mask"] == ShapeRange((1, 1), (B, 256), (B, 4096))
    for cache in _caches(model):
        assert decode.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 256, 64), (B, 1, 4096, 64))
        assert prefill.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 0, 64), (B, 1, 0, 64))


def test_genai_fixture_cache_head_size_and_rotary_positions():
    model = onnx.load(TOOL_FIXTURES / "qwen3-genai-cpu-int4.onnx")
    decode, prefill = derive_profiles(model, _request(presets=["decode", "prefill"]))
    assert set(decode.shapes) == {"input_ids", "attention_mask", *_caches(model)}
    # 128 rows of rotary cos cache: decode holds at most 127 past tokens, prefill at most 128 new ones.
    assert decode.shapes["input_ids"] == ShapeRange((1, 1), (B, 1), (B, 1))
    assert decode.shapes["attention_mask"] == ShapeRange((1, 1), (B, 128), (B, 128))
    assert prefill.shapes["input_ids"] == prefill.shapes["attention_mask"] == ShapeRange((1, 1), (B, 128), (B, 128))
    for cache in _caches(model):
        assert decode.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 127, 64), (B, 1, 127, 64))
        assert prefill.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 0, 64), (B, 1, 0, 64))
    (explicit,) = derive_profiles(model, _request(presets=["decode"], past="0:32:100", batch="1:1:1"))
    assert explicit.shapes[_caches(model)[0]] == ShapeRange((1, 1, 0, 64), (1, 1, 32, 64), (1, 1, 100, 64))


@pytest.mark.parametrize("name", ["olmo2-dynamo23-bf16.onnx", "qwen3-modelopt-int8-fp16.onnx"])
def test_fixtures_without_cache_have_token_profiles_and_refuse_past(name):
    model = onnx.load(TOOL_FIXTURES / name)
    (profile,) = derive_profiles(model, _request())
    assert profile.shapes == {"input_ids": ShapeRange((1, 1), (B, 256), (B, 4096))}
    with pytest.raises(OptionError, match=r"past: the model has no KV cache"):
        derive_profiles(model, _request(past="0:1:2"))


def test_a_decode_profile_of_a_model_without_cache_is_one_warning_and_still_derived():
    from trtfuse.engine.profiles import profile_warnings

    logits_only = onnx.load(TOOL_FIXTURES / "olmo2-dynamo23-bf16.onnx")
    request = _request(presets=["decode", "prefill"])
    (warning,) = profile_warnings(logits_only, request)
    assert warning.startswith("profile 'decode': the model has no KV cache (no past_key_values inputs)")
    assert "models/export.py --cache" in warning and "text-generation-with-past" in warning
    assert "\n" not in warning
    assert [p.name for p in derive_profiles(logits_only, request)] == ["decode", "prefill"]
    assert profile_warnings(onnx.load(TOOL_FIXTURES / "qwen3-optimum-fp16.onnx"), request) == []
    assert profile_warnings(logits_only, _request(presets=["prefill"])) == []


def test_compile_warns_of_a_decode_profile_without_cache_and_goes_on(tmp_path):
    from support.cli import run_cli

    result = run_cli(
        "compile", TOOL_FIXTURES / "olmo2-dynamo23-bf16.onnx", "-o", tmp_path / "m.engine", "--profile", "decode"
    )
    # Fused and written, then no TensorRT here: exit 3, after the warning.
    assert result.exit_code == 3, result.output
    warnings = [line for line in result.stderr.splitlines() if line.startswith("trtfuse: warning:")]
    assert len(warnings) == 1 and "profile 'decode': the model has no KV cache" in warnings[0]
    assert (tmp_path / "m.fused.onnx").exists()
    quiet = run_cli(
        "compile", TOOL_FIXTURES / "olmo2-dynamo23-bf16.onnx", "-o", tmp_path / "q.engine", "--profile", "decode", "-q"
    )
    assert quiet.exit_code == 3 and "warning" not in quiet.stderr


def test_a_given_range_is_kept_and_the_default_one_beside_it_cut_to_the_positions():
    model = onnx.load(TOOL_FIXTURES / "qwen3-genai-cpu-int4.onnx")
    cache = _caches(model)[0]
    # --past given: the prefill preset's default 4096 tokens are cut to the 128 positions, the decode past kept.
    prefill, decode = derive_profiles(model, _request(presets=["prefill", "decode"], past="0:64:120"))
    assert prefill.shapes["input_ids"] == ShapeRange((1, 1), (B, 128), (B, 128))
    assert decode.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 64, 64), (B, 1, 120, 64))
    # --tokens given: its past (the default 0:256:4096) is cut to what the tokens leave.
    (tokens,) = derive_profiles(model, _request(tokens=["1:16:100"]))
    assert tokens.shapes["input_ids"] == ShapeRange((1, 1), (B, 16), (B, 100))
    assert tokens.shapes[cache] == ShapeRange((1, 1, 0, 64), (B, 1, 28, 64), (B, 1, 28, 64))
    with pytest.raises(OptionError, match=r"profile 'tokens 1:16:100': 64 past \+ 100 new tokens at MAX exceed"):
        derive_profiles(model, _request(tokens=["1:16:100"], past="0:8:64"))


def _kv_fixture() -> onnx.ModelProto:
    from support.paths import FIXTURES

    return onnx.load(str(FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"))


def test_a_given_shape_carries_its_sizes_to_the_related_inputs():
    # compile's own help form: input_ids' batch and tokens hold for the mask, the positions and the cache too.
    (profile,) = derive_profiles(_kv_fixture(), _request(shapes=["input_ids=1x1:1x64:1x512"]))
    assert profile.shapes["input_ids"] == ShapeRange((1, 1), (1, 64), (1, 512))
    assert profile.shapes["position_ids"] == ShapeRange((1, 1), (1, 64), (1, 512))
    assert profile.shapes["attention_mask"] == ShapeRange((1, 1), (1, 64 + 256), (1, 512 + 4096))
    assert profile.shapes["past_key_values.0.key"] == ShapeRange((1, 1, 0, 64), (1, 1, 256, 64), (1, 1, 4096, 64))
    prefill, decode = derive_profiles(
        _kv_fixture(), _request(presets=["prefill", "decode"], shapes=["input_ids=1x1:1x64:1x512"])
    )
    assert prefill.shapes["attention_mask"] == ShapeRange((1, 1), (1, 64), (1, 512))
    assert {shape.opt[0] for profile in (prefill, decode) for shape in profile.shapes.values()} == {1}


def test_a_total_length_with_the_tokens_sets_the_past():
    model = _model(
        {
            "input_ids": ["batch_size", "sequence_length"],
            "attention_mask": ["batch_size", "total_sequence_length"],
            "past_key_values.0.key": ["batch_size", 4, "past_sequence_length", 16],
        }
    )
    request = _request(shapes=["input_ids=1x1:1x8:1x64", "attention_mask=1x1:1x100:1x1000"])
    (profile,) = derive_profiles(model, request)
    assert profile.shapes["past_key_values.0.key"] == ShapeRange((1, 4, 0, 16), (1, 4, 92, 16), (1, 4, 936, 16))
    with pytest.raises(OptionError, match=r"total length \(past \+ tokens\) 1:4:8.*tokens 1:8:64.*not a range"):
        derive_profiles(model, _request(shapes=["input_ids=1x1:1x8:1x64", "attention_mask=1x1:1x4:1x8"]))


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        (
            ["input_ids=1x1:1x64:1x512", "position_ids=1x1:1x32:1x512"],
            r"shape gives position_ids dim 1 \('sequence_length'\) 1:32:512 and input_ids dim 1 "
            r"\('sequence_length'\) 1:64:512: both are the tokens of one call",
        ),
        (
            ["input_ids=1x1:1x64:1x512", "attention_mask=1x1:1x64:1x512"],
            r"shape attention_mask gives dim 1 \('past_sequence_length \+ sequence_length'\) 1:64:512, but profile "
            r"'default' has batch 1:1:1, tokens 1:64:512, past 0:256:4096, which make it 1:320:4608",
        ),
    ],
)
def test_given_shapes_that_contradict_each_other_are_one_line(shapes, message):
    with pytest.raises(OptionError, match=message) as raised:
        derive_profiles(_kv_fixture(), _request(shapes=shapes))
    assert "\n" not in str(raised.value)


def test_given_shapes_that_agree_are_kept():
    shapes = ["input_ids=1x1:1x64:1x512", "attention_mask=1x1:1x320:1x4608"]
    (profile,) = derive_profiles(_kv_fixture(), _request(shapes=shapes))
    assert profile.shapes["attention_mask"] == ShapeRange((1, 1), (1, 320), (1, 4608))
