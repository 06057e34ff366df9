"""load_model / save_model: validation of bad input, external data kept on disk, atomic writes."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import helper

from trtfuse.errors import TrtfuseError
from trtfuse.files import write_json_atomic
from trtfuse.model.onnx_file import external_tensors, load_model, save_model

from support.cli import run_cli
from support.models import LARGE_SHAPE, OUT, projection_model, save_external, tiny_lm


def _tensor_names(model: onnx.ModelProto) -> set[str]:
    return {tensor.name for tensor in external_tensors(model)}


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TrtfuseError, match=r"missing\.onnx: no such file"):
        load_model(tmp_path / "missing.onnx")


def test_folder_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(TrtfuseError, match="not a file"):
        load_model(tmp_path)


@pytest.mark.parametrize("content", [b"hello, this is text\n", bytes(range(256)) * 4, b""])
def test_not_an_onnx_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "junk.onnx"
    path.write_bytes(content)
    with pytest.raises(TrtfuseError, match=r"junk\.onnx: not an ONNX model"):
        load_model(path)


@pytest.mark.parametrize(
    ("name", "content"),
    [
        ("config.json", '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}'),
        ("m.fusion.json", '{"fused_norm_calls": 3}'),
        ("m.textproto", "ir_version: 8\n"),
        ("m.onnxtxt", "<ir_version: 8>\nagraph () => () {}\n"),
    ],
)
@pytest.mark.parametrize("command", ["inspect", "fuse", "compile", "check-original", "check-fused", "compare"])
def test_json_and_text_files_are_not_onnx_models_on_every_command(
    tmp_path: Path, name: str, content: str, command: str
) -> None:
    # onnx picks a JSON or text parser by the extension; its ParseError ended in exit 4.
    path = tmp_path / name
    path.write_text(content)
    fixture = tmp_path / "model.onnx"
    onnx.save_model(tiny_lm(np.float32, fused=False), str(fixture))
    arguments = {
        "inspect": ["inspect", path],
        "fuse": ["fuse", path, "-o", tmp_path / "out.onnx"],
        "compile": ["compile", path],
        "check-original": ["check", path, fixture],
        "check-fused": ["check", fixture, path],
        "compare": ["compare", path, tmp_path / "m.engine"],
    }[command]
    result = run_cli(*arguments)
    assert result.exit_code == 2, result.output
    assert f"{path}: not an ONNX model" in result.output
    assert ("models/export.py --cache --checkpoint" in result.output) is (name == "config.json")
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted([name, "model.onnx"])


def test_a_checkpoint_folder_points_at_the_export(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    result = run_cli("inspect", tmp_path)
    assert result.exit_code == 2, result.output
    assert f"{tmp_path}: is a Hugging Face checkpoint folder, not an ONNX model" in result.output
    assert f"python models/export.py --cache --checkpoint {tmp_path} --out OUT" in result.output


@pytest.mark.parametrize("opset", [11, 24])
def test_unsupported_opset(write_model, opset: int) -> None:
    path = write_model(projection_model(opset=opset))
    with pytest.raises(TrtfuseError, match=rf"unsupported opset {opset} \(supported: 13-23\)"):
        load_model(path)


def test_graph_failing_the_checker(write_model) -> None:
    model = projection_model()
    model.graph.node[1].input[0] = "undefined_tensor"
    path = write_model(model)
    with pytest.raises(TrtfuseError, match=r"fails the ONNX checker.*undefined_tensor"):
        load_model(path)


def _simplified_layer_norm_model(op_type: str) -> onnx.ModelProto:
    x = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["n", 8])
    y = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, ["n", 8])
    weight = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "w")
    node = helper.make_node(op_type, ["x", "w"], ["y"], axis=-1, epsilon=1e-6)
    graph = helper.make_graph([node], "g", [x], [y], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_onnxruntime_contrib_op_in_the_default_domain_loads(write_model, tmp_path: Path) -> None:
    # onnxruntime's optimizer writes SimplifiedLayerNormalization into the default domain, where the checker has no
    # schema for it; such a model must still load, and nothing may be left beside it.
    path = write_model(_simplified_layer_norm_model("SimplifiedLayerNormalization"))
    loaded = load_model(path)
    assert loaded.model.graph.node[0].domain == ""
    assert sorted(os.listdir(tmp_path)) == ["model.onnx"]


def test_unknown_op_in_the_default_domain_fails_the_checker(write_model) -> None:
    path = write_model(_simplified_layer_norm_model("SimplifiedLayerNormalisation"))
    with pytest.raises(TrtfuseError, match=r"fails the ONNX checker.*SimplifiedLayerNormalisation"):
        load_model(path)


def test_missing_external_data(external_model: Path) -> None:
    (external_model.parent / "weights.data").unlink()
    with pytest.raises(TrtfuseError, match=r"external data file 'weights\.data' of tensor 'W' is missing"):
        load_model(external_model)


@pytest.mark.parametrize("location", ["../weights.data", "sub/../../weights.data"])
def test_external_data_outside_the_folder(external_model: Path, location: str) -> None:
    model = onnx.load(str(external_model), load_external_data=False)
    for tensor in model.graph.initializer:
        tensor.external_data[0].value = location
    (external_model.parent.parent / "weights.data").write_bytes((external_model.parent / "weights.data").read_bytes())
    onnx.save_model(model, str(external_model))
    with pytest.raises(TrtfuseError, match="tensor 'W' points outside the model's folder"):
        load_model(external_model)


def test_external_data_symlinked_out_of_the_folder(external_model: Path, tmp_path: Path) -> None:
    data = external_model.parent / "weights.data"
    outside = tmp_path / "elsewhere.data"
    data.rename(outside)
    data.symlink_to(outside)
    with pytest.raises(TrtfuseError, match="tensor 'W' points outside the model's folder"):
        load_model(external_model)


def test_absolute_external_path(external_model: Path) -> None:
    model = onnx.load(str(external_model), load_external_data=False)
    model.graph.initializer[0].external_data[0].value = str(external_model.parent / "weights.data")
    onnx.save_model(model, str(external_model))
    with pytest.raises(TrtfuseError, match="points outside the model's folder"):
        load_model(external_model)


def test_truncated_external_data(external_model: Path) -> None:
    data = external_model.parent / "weights.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(TrtfuseError, match=r"'W' reads bytes 0-2097152 of 'weights\.data', which holds only 1000"):
        load_model(external_model)


def test_load_reads_small_external_tensors_only(external_model: Path) -> None:
    loaded = load_model(external_model)
    assert _tensor_names(loaded.model) == {"W"}
    scale = next(tensor for tensor in loaded.model.graph.initializer if tensor.name == "scale")
    expected = onnx.numpy_helper.to_array(next(t for t in projection_model().graph.initializer if t.name == "scale"))
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(scale), expected)
    weight = next(tensor for tensor in loaded.model.graph.initializer if tensor.name == "W")
    assert not weight.raw_data


def test_a_large_external_tensor_of_length_0_is_read_as_its_shape_needs(external_model: Path, tmp_path: Path) -> None:
    # onnxruntime reads a length of 0 as the size the shape needs; the large tensor stays external, with that length.
    _with_external_field(external_model, "length", "0")
    loaded = load_model(external_model)
    (weight,) = external_tensors(loaded.model)
    assert {entry.key: entry.value for entry in weight.external_data}["length"] == str(4 * np.prod(LARGE_SHAPE))
    target = tmp_path / "out"
    target.mkdir()
    save_model(loaded.model, target / "saved.onnx", loaded)
    saved = onnx.load(str(target / "saved.onnx"))
    for before, after in zip(projection_model().graph.initializer, saved.graph.initializer, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(before), onnx.numpy_helper.to_array(after))


def test_external_tensor_without_a_length_field(external_model: Path) -> None:
    model = onnx.load(str(external_model), load_external_data=False)
    for tensor in model.graph.initializer:
        kept = [entry for entry in tensor.external_data if entry.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
    onnx.save_model(model, str(external_model))
    assert _tensor_names(load_model(external_model).model) == {"W"}
    data = external_model.parent / "weights.data"
    data.write_bytes(data.read_bytes()[:1000])
    with pytest.raises(TrtfuseError, match=r"'W' reads bytes 0-2097152"):
        load_model(external_model)


def test_save_into_the_same_folder_keeps_the_data_file(external_model: Path) -> None:
    data = external_model.parent / "weights.data"
    before = data.stat()
    save_model(load_model(external_model).model, external_model.parent / "copy.onnx", load_model(external_model))
    after = data.stat()
    assert (before.st_ino, before.st_size, before.st_mtime_ns) == (after.st_ino, after.st_size, after.st_mtime_ns)
    reloaded = load_model(external_model.parent / "copy.onnx")
    assert _tensor_names(reloaded.model) == {"W"}


def test_save_into_another_folder_copies_the_data_file(external_model: Path, tmp_path: Path) -> None:
    loaded = load_model(external_model)
    target = tmp_path / "out"
    target.mkdir()
    save_model(loaded.model, target / "fused.onnx", loaded)
    copied = target / "weights.data"
    assert copied.stat().st_nlink == 1
    assert copied.read_bytes() == (external_model.parent / "weights.data").read_bytes()
    original = onnx.load(str(external_model))
    saved = onnx.load(str(target / "fused.onnx"))
    for before, after in zip(original.graph.initializer, saved.graph.initializer, strict=True):
        np.testing.assert_array_equal(onnx.numpy_helper.to_array(before), onnx.numpy_helper.to_array(after))


def test_hard_linked_external_data_is_refused(external_model: Path, tmp_path: Path) -> None:
    os.link(external_model.parent / "weights.data", tmp_path / "elsewhere.data")
    with pytest.raises(TrtfuseError, match=r"fails the ONNX checker.*multiple hard links"):
        load_model(external_model)


def test_failed_save_leaves_nothing_behind(external_model: Path, tmp_path: Path) -> None:
    """A model the checker refuses is trtfuse's own bug (what it saves comes from checked inputs): not a TrtfuseError,
    which would blame the input, and nothing written."""
    loaded = load_model(external_model)
    loaded.model.graph.node[1].input[0] = "undefined_tensor"
    target = tmp_path / "out"
    target.mkdir()
    with pytest.raises(RuntimeError, match="the model written fails the ONNX checker"):
        save_model(loaded.model, target / "fused.onnx", loaded)
    assert list(target.iterdir()) == []


def test_failed_save_keeps_an_existing_output(write_model, tmp_path: Path) -> None:
    path = write_model(projection_model(), "fused.onnx")
    before = path.read_bytes()
    broken = projection_model()
    broken.graph.node[0].op_type = "NoSuchOp"
    with pytest.raises(RuntimeError):
        save_model(broken, path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fused.onnx"]


def test_save_into_a_missing_folder(tmp_path: Path) -> None:
    with pytest.raises(TrtfuseError, match="output folder does not exist"):
        save_model(projection_model(), tmp_path / "no" / "model.onnx")


def test_saved_file_has_the_usual_permissions(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    save_model(projection_model(), path)
    umask = os.umask(0)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~umask


def test_write_json_atomic(tmp_path: Path) -> None:
    write_json_atomic(tmp_path / "report.json", {"error": float("nan"), "max": [float("inf"), -float("inf"), 1.5]})
    assert json.loads((tmp_path / "report.json").read_text()) == {"error": "nan", "max": ["inf", "-inf", 1.5]}
    with pytest.raises(TrtfuseError, match="output folder does not exist"):
        write_json_atomic(tmp_path / "no" / "report.json", {})


def test_opset_from_the_ai_onnx_domain_alias(write_model) -> None:
    model = projection_model()
    del model.opset_import[:]
    model.opset_import.append(helper.make_opsetid("ai.onnx", 18))
    assert load_model(write_model(model)).model.graph.node[0].op_type == "MatMul"


def test_external_save_round_trip_helper(tmp_path: Path) -> None:
    path = save_external(projection_model(), tmp_path / "m.onnx", location="m.bin")
    assert _tensor_names(load_model(path).model) == {"W"}


def test_default_domain_simplified_layer_norm_loads_and_saves_without_a_temp_file(
    write_model, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # optimum --optimize O2 output: an unfused SimplifiedLayerNormalization in the default domain. Loading must not
    # write beside the model (its folder may be read-only), and trtfuse's output must pass trtfuse's own checker.
    path = write_model(_simplified_layer_norm_model("SimplifiedLayerNormalization"))
    monkeypatch.setattr("tempfile.mkstemp", _no_temp_files_beside(path.parent))
    loaded = load_model(path)
    out = tmp_path / "out"
    out.mkdir()
    save_model(loaded.model, out / "saved.onnx", loaded)
    assert load_model(out / "saved.onnx").model.graph.node[0].op_type == "SimplifiedLayerNormalization"


def _no_temp_files_beside(folder: Path):
    import tempfile

    real = tempfile.mkstemp

    def mkstemp(*args, **kwargs):
        if Path(kwargs.get("dir", "")).resolve() == folder.resolve():
            raise PermissionError(13, "Permission denied")
        return real(*args, **kwargs)

    return mkstemp


def _with_external_field(external_model: Path, key: str, value: str) -> Path:
    model = onnx.load(str(external_model), load_external_data=False)
    for tensor in model.graph.initializer:
        for entry in tensor.external_data:
            if entry.key == key:
                entry.value = value
    onnx.save_model(model, str(external_model))
    return external_model


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("length", "-4", "has a negative external data offset or length"),
        ("offset", "-4", "has a negative external data offset or length"),
        ("location", "weights.data\0.x", "has an external data location with a NUL byte"),
    ],
)
def test_malformed_external_data_fields(external_model: Path, key: str, value: str, message: str) -> None:
    with pytest.raises(TrtfuseError, match=message):
        load_model(_with_external_field(external_model, key, value))


def test_unknown_tensor_data_type(write_model) -> None:
    model = projection_model()
    model.graph.initializer[1].data_type = 99
    with pytest.raises(TrtfuseError, match="tensor 'scale' has an unknown data type 99"):
        load_model(write_model(model))


@pytest.mark.parametrize("text", [b"MatMul", b"rescale", b"the-exporter"])
def test_op_types_names_and_strings_that_are_not_utf8(tmp_path: Path, text: bytes) -> None:
    model = projection_model()
    model.producer_name = "the-exporter"
    data = model.SerializeToString().replace(text, text[:-1] + b"\xe1")
    path = tmp_path / "model.onnx"
    path.write_bytes(data)
    with pytest.raises(TrtfuseError, match="not valid UTF-8"):
        load_model(path)


def test_more_raw_bytes_than_the_shape_needs(write_model) -> None:
    model = projection_model()
    scale = model.graph.initializer[1]
    scale.raw_data = scale.raw_data + bytes(4)
    with pytest.raises(TrtfuseError, match="tensor 'scale' holds 4100 bytes; its shape and type need 4096"):
        load_model(write_model(model))


def _undeclared(case: str) -> onnx.ModelProto:
    model = tiny_lm(np.float32, fused=False)
    if case == "output without a shape":
        model.graph.output[0].type.tensor_type.ClearField("shape")
    elif case == "output without a type":
        model.graph.output[0].ClearField("type")
    elif case == "input without a shape":
        model.graph.input[0].type.tensor_type.ClearField("shape")
    return model


@pytest.mark.parametrize("case", ["output without a shape", "output without a type", "input without a shape"])
def test_what_onnxruntime_infers_may_be_undeclared_and_stays_so(tmp_path: Path, case: str) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(_undeclared(case), path)
    onnxruntime.InferenceSession(str(path))
    load_model(path)
    fused = tmp_path / "fused.onnx"
    assert run_cli("fuse", path, "-o", fused).exit_code == 0
    declared = {value.name: value.type for value in (*onnx.load(path).graph.input, *onnx.load(path).graph.output)}
    written = {value.name: value.type for value in (*onnx.load(fused).graph.input, *onnx.load(fused).graph.output)}
    assert written == declared
    checked = run_cli("check", path, fused)
    assert checked.exit_code == 0, checked.output


def test_an_input_without_a_type_is_refused_as_onnxruntime_refuses_it(tmp_path: Path) -> None:
    model = tiny_lm(np.float32, fused=False)
    model.graph.input[0].ClearField("type")
    onnx.save(model, tmp_path / "m.onnx")
    with pytest.raises(TrtfuseError, match=r"m\.onnx: fails the ONNX checker: Field 'type' of 'value_info'"):
        load_model(tmp_path / "m.onnx")


@pytest.mark.parametrize("length", [None, "0"])
@pytest.mark.parametrize("output", ["fused.onnx", "out/fused.onnx"])
def test_external_data_without_a_length_is_read_as_onnxruntime_reads_it(
    tmp_path: Path, output: str, length: str | None
) -> None:
    # No length: onnx would read each tensor to the end of the shared file, onnxruntime what the shape needs. A length
    # of 0 onnxruntime reads the same way, where onnx read no bytes (the result failed the checker: no value field).
    path = save_external(tiny_lm(np.float32, fused=False), tmp_path / "m.onnx", "m.data")
    model = onnx.load(path, load_external_data=False)
    for tensor in external_tensors(model):
        kept = [entry for entry in tensor.external_data if entry.key != "length"]
        del tensor.external_data[:]
        tensor.external_data.extend(kept)
        if length is not None:
            tensor.external_data.add(key="length", value=length)
    onnx.save(model, path)
    with (tmp_path / "m.data").open("ab") as data:
        data.write(b"\0" * 100)
    onnxruntime.InferenceSession(str(path))
    (tmp_path / "out").mkdir()
    fused = tmp_path / output
    result = run_cli("fuse", path, "-o", fused)
    assert result.exit_code == 0 and "1 TrtfuseRmsNorm" in result.output, result.output
    checked = run_cli("check", path, fused)
    assert checked.exit_code == 0, checked.output


def _sparse_bias_lm(folder: Path, external: str, count: int) -> Path:
    """tiny_lm with its logits biased by the first OUT entries of a sparse table of `count` values, joined with an
    empty tensor; the table's `external` parts ("values", "indices" or both) and the empty tensor (length 0) are in
    `m.data`. onnxruntime loads and runs it."""
    model = tiny_lm(np.float32, fused=False)
    graph = model.graph
    graph.node[-1].output[0] = "projected"
    values = onnx.numpy_helper.from_array(np.linspace(-1.0, 1.0, count, dtype=np.float32), "bias_table")
    indices = onnx.numpy_helper.from_array(np.arange(count, dtype=np.int64) * 3, "bias_table_indices")
    empty = onnx.numpy_helper.from_array(np.zeros(0, np.float32), "no_bias")
    data = b""
    for part, stored in ((values, "values" in external), (indices, "indices" in external), (empty, True)):
        if stored:
            onnx.external_data_helper.set_external_data(part, "m.data", offset=len(data), length=len(part.raw_data))
            data += part.raw_data
            part.ClearField("raw_data")
            part.data_location = onnx.TensorProto.EXTERNAL
    graph.sparse_initializer.append(helper.make_sparse_tensor(values, indices, [max(3 * count, OUT)]))
    graph.initializer.append(empty)
    graph.initializer.extend(
        onnx.numpy_helper.from_array(np.array([value], np.int64), name) for value, name in ((0, "zero"), (OUT, "out"))
    )
    graph.node.extend(
        [
            helper.make_node("Slice", ["bias_table", "zero", "out", "zero"], ["bias_head"], name="bias/slice"),
            helper.make_node("Concat", ["bias_head", "no_bias"], ["bias"], axis=0, name="bias/concat"),
            helper.make_node("Add", ["projected", "bias"], ["logits"], name="bias/add"),
        ]
    )
    (folder / "m.data").write_bytes(data)
    path = folder / "m.onnx"
    onnx.save(model, path)
    onnxruntime.InferenceSession(str(path)).run(None, {"input_ids": np.zeros((1, 3), np.int64)})
    return path


def _sparse_arrays(path: Path) -> list[np.ndarray]:
    """The values and indices of the model's sparse initializers, read from wherever they are stored."""
    model = onnx.load(path, load_external_data=False)
    parts = [part for sparse in model.graph.sparse_initializer for part in (sparse.values, sparse.indices)]
    for part in parts:
        if onnx.external_data_helper.uses_external_data(part):
            onnx.external_data_helper.load_external_data_for_tensor(part, str(path.parent))
    return [onnx.numpy_helper.to_array(part) for part in parts]


@pytest.mark.parametrize(
    ("external", "count"),
    [("values", 3), ("indices", 3), ("values+indices", 3), ("values+indices", 0), ("values+indices", 150_000)],
)
@pytest.mark.parametrize("output", ["fused.onnx", "out/fused.onnx"])
def test_sparse_and_zero_length_external_data_are_carried(
    tmp_path: Path, external: str, count: int, output: str
) -> None:
    # onnxruntime loads these. Sparse tensors' external data was never copied beside a model written elsewhere (the
    # result failed the checker), and external sparse indices failed onnx's path-based checker (exit 4).
    path = _sparse_bias_lm(tmp_path, external, count)
    (tmp_path / "out").mkdir()
    fused = tmp_path / output
    result = run_cli("fuse", path, "-o", fused)
    assert result.exit_code == 0 and "1 TrtfuseRmsNorm" in result.output, result.output
    for before, after in zip(_sparse_arrays(path), _sparse_arrays(fused), strict=True):
        np.testing.assert_array_equal(before, after)
    written = onnx.load(fused, load_external_data=False)
    (empty,) = [tensor for tensor in written.graph.initializer if tensor.name == "no_bias"]
    assert list(empty.dims) == [0]
    # A large table stays in its data file, which goes with the model.
    assert bool(external_tensors(written)) is (count == 150_000)
    checked = run_cli("check", path, fused)
    assert checked.exit_code == 0, checked.output
    # compile writes its fused model the same way (exit 3: fused, no engine, where TensorRT is missing).
    compiled = run_cli("compile", path, "-o", fused.parent / "m.engine", "--shape", "input_ids=1x1:1x4:1x8")
    assert compiled.exit_code in (0, 3) and "fails the ONNX checker" not in compiled.output, compiled.output
    assert run_cli("check", path, fused.parent / "m.fused.onnx").exit_code == 0


def test_sparse_external_data_outside_the_folder_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    path = _sparse_bias_lm(folder, "values", 3)
    (tmp_path / "m.data").write_bytes((folder / "m.data").read_bytes())
    model = onnx.load(path, load_external_data=False)
    model.graph.sparse_initializer[0].values.external_data[0].value = "../m.data"
    onnx.save(model, path)
    with pytest.raises(TrtfuseError, match="tensor 'bias_table' points outside the model's folder"):
        load_model(path)
