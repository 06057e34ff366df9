"""The engine sidecar: written and read back as the build writes it, and every damaged, tampered or misplaced
sidecar refused in one line naming the sidecar and the key, before anything is opened through it."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.contract import PluginKind
from trtfuse.engine import build
from trtfuse.engine.build import plugins_used
from trtfuse.engine.build_options import BuildOptions
from trtfuse.engine.engine_file import EngineFile
from trtfuse.engine.profiles import Profile, ShapeRange
from trtfuse.engine.sidecar import make_sidecar, read_sidecar, sidecar_path_for
from trtfuse.errors import TrtfuseError

from support.cli import run_cli
from support.engines import engine_with_sidecar, write_engine_files
from support.models import save_model_file, tiny_lm

PROFILE = Profile("default", {"input_ids": ShapeRange((1, 1), (1, 256), (1, 4096))})


def test_sidecar_round_trip(tmp_path):
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "m.fused.onnx")
    engine = tmp_path / "m.engine"
    options = BuildOptions(profiles=(PROFILE,), optimization_level=2, workspace_bytes=1 << 30, plugins=PluginKind.AOT)
    sidecar = make_sidecar(
        engine_path=engine,
        fused_model_path=fused,
        versions=build.tool_versions("10.99"),
        gpu="NVIDIA H200",
        plugins=plugins_used(tiny_lm(np.float16, fused=True)),
        profiles=options.profiles,
        build={**options.to_json(), "ptx_isa": ["8.8"]},
        shape_tensor_inputs=(),
    )
    sidecar_path = write_engine_files(engine, b"engine bytes", sidecar)
    assert engine.read_bytes() == b"engine bytes"
    assert sidecar_path == tmp_path / "m.engine.json"
    loaded = read_sidecar(engine)
    assert loaded.data == json.loads(json.dumps(sidecar))
    assert loaded.fused_model == Path("m.fused.onnx")
    assert loaded.versions["tensorrt"] == "10.99" and loaded.versions["nvidia-cutlass-dsl"] != ""
    assert loaded.data["build"] == {
        "strongly_typed": True,
        "optimization_level": 2,
        "workspace_bytes": 1 << 30,
        "timing_cache": None,
        "allow_tf32": False,
        "plugins": "aot",
        "ptx_isa": ["8.8"],
    }
    assert loaded.profiles == (PROFILE,)
    assert loaded.ptx_isa == ("8.8",)
    assert loaded.data["plugins"][0]["nodes"] == 1
    assert EngineFile.open(engine).plugin_kind is PluginKind.AOT
    assert EngineFile.open(engine).fused_model_path == fused


def test_a_fused_model_outside_the_engine_folder_is_refused_when_writing(tmp_path):
    (tmp_path / "elsewhere").mkdir()
    fused = save_model_file(tiny_lm(np.float16, fused=True), tmp_path / "elsewhere" / "m.fused.onnx")
    (tmp_path / "engines").mkdir()
    with pytest.raises(TrtfuseError, match=r"the fused model must be in the engine's folder"):
        make_sidecar(
            engine_path=tmp_path / "engines" / "m.engine",
            fused_model_path=fused,
            versions={},
            gpu="none",
            plugins=[],
            profiles=(PROFILE,),
            build=BuildOptions(profiles=(PROFILE,)).to_json(),
            shape_tensor_inputs=(),
        )


def test_unreadable_and_foreign_sidecars(tmp_path):
    engine = tmp_path / "m.engine"
    assert read_sidecar(engine) is None
    (tmp_path / "m.engine.json").write_text("{not json")
    with pytest.raises(TrtfuseError, match=r"m\.engine\.json: unreadable engine sidecar"):
        read_sidecar(engine)
    (tmp_path / "m.engine.json").write_text('{"format": "other"}')
    with pytest.raises(TrtfuseError, match=r"not a trtfuse engine sidecar"):
        read_sidecar(engine)
    (tmp_path / "m.engine.json").write_bytes(b"\xff\xfe not utf-8")
    with pytest.raises(TrtfuseError, match=r"unreadable engine sidecar"):
        read_sidecar(engine)


def test_a_sidecar_that_is_no_regular_file_is_refused_without_opening_it(tmp_path):
    engine = engine_with_sidecar(tmp_path)
    sidecar = sidecar_path_for(engine)
    sidecar.unlink()
    os.mkfifo(sidecar)  # opening a FIFO for reading would block until a writer came
    with pytest.raises(TrtfuseError, match=r"m\.engine\.json: the engine's sidecar is not a regular file"):
        EngineFile.open(engine)
    sidecar.unlink()
    sidecar.mkdir()
    with pytest.raises(TrtfuseError, match=r"not a regular file"):
        EngineFile.open(engine)
    sidecar.rmdir()
    sidecar.symlink_to(sidecar)
    with pytest.raises(TrtfuseError, match=r"not a regular file"):
        EngineFile.open(engine)


def _edit(engine: Path, edit) -> None:
    path = sidecar_path_for(engine)
    data = json.loads(path.read_text())
    edit(data)
    path.write_text(json.dumps(data))


def _drop(key: str):
    return lambda data: data.pop(key)


def _set(key: str, value):
    return lambda data: data.__setitem__(key, value)


def _profile(edit):
    return lambda data: edit(data["profiles"][0])


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_drop("profiles"), "'profiles' must be a non-empty list of optimisation profiles"),
        (_set("profiles", []), "'profiles' must be a non-empty list"),
        (_set("profiles", {"a": 1}), "'profiles' must be a non-empty list"),
        (_drop("fused_model"), "'fused_model' must be the fused model's path relative to the engine's folder"),
        (_set("fused_model", 7), "'fused_model' must be the fused model's path"),
        (_set("fused_model", "/etc/passwd"), "'fused_model' is '/etc/passwd', outside the engine's folder"),
        (_set("fused_model", "../other/m.fused.onnx"), "outside the engine's folder"),
        (_set("fused_model", "a/../../m.onnx"), "outside the engine's folder"),
        (_drop("build"), "'build' is missing or not an object"),
        (_set("build", "fast"), "'build' is missing or not an object"),
        (_drop("versions"), "'versions' is missing or not an object"),
        (_set("versions", {"tensorrt": 10}), "'versions' must map each tool to its version string"),
        (_drop("gpu"), "'gpu' must be the GPU's name"),
        (_profile(lambda p: p.pop("shapes")), "'profiles[0].shapes' must map input names to min/opt/max shapes"),
        (_profile(lambda p: p.update(shapes={})), "'profiles[0].shapes' must give at least one input's shape range"),
        (_profile(lambda p: p.pop("name")), "'profiles[0]' must be an object with a name"),
        (_profile(lambda p: p["shapes"]["input_ids"].pop("opt")), "'profiles[0].shapes.input_ids.opt' must be a list"),
        (_profile(lambda p: p["shapes"]["input_ids"].update(opt="1x5")), "'profiles[0].shapes.input_ids.opt' must"),
        (_profile(lambda p: p["shapes"]["input_ids"].update(opt=[1, -5])), "must be a list of non-negative integers"),
        (_profile(lambda p: p["shapes"]["input_ids"].update(opt=[1, 2.5])), "must be a list of non-negative integers"),
        (_profile(lambda p: p["shapes"]["input_ids"].update(opt=[1])), "not min <= opt <= max of one rank"),
        (_profile(lambda p: p["shapes"]["input_ids"].update(opt=[9, 9])), "not min <= opt <= max of one rank"),
        (_profile(lambda p: p["shapes"].update(input_ids=[1, 2])), "'profiles[0].shapes.input_ids' must hold min"),
        (_profile(lambda p: p.update(values=[1])), "'profiles[0].values' must map input names"),
        (_drop("shape_tensor_inputs"), "'shape_tensor_inputs' must list the input names TensorRT takes as shape"),
        (_set("shape_tensor_inputs", "input_ids"), "'shape_tensor_inputs' must list the input names"),
        (_set("shape_tensor_inputs", [3]), "'shape_tensor_inputs' must list the input names"),
        (
            _set("shape_tensor_inputs", ["input_ids"]),
            "'shape_tensor_inputs' names 'input_ids', whose values profile 'decode' gives no range for",
        ),
    ],
)
def test_a_damaged_or_tampered_sidecar_is_one_line_naming_it_and_the_key(tmp_path, edit, message):
    engine = engine_with_sidecar(tmp_path)
    _edit(engine, edit)
    with pytest.raises(TrtfuseError) as raised:
        EngineFile.open(engine)
    assert str(raised.value).startswith(f"{sidecar_path_for(engine)}: ") and message in str(raised.value)
    assert "\n" not in str(raised.value)


def test_an_aot_sidecar_must_say_which_ptx_it_embeds(tmp_path):
    engine = engine_with_sidecar(tmp_path, plugins=PluginKind.AOT)
    _edit(engine, lambda data: data["build"].pop("ptx_isa"))
    with pytest.raises(TrtfuseError, match=r"'build\.ptx_isa' is missing: an AOT engine's sidecar records"):
        EngineFile.open(engine)
    _edit(engine, lambda data: data["build"].update(ptx_isa="8.8"))
    with pytest.raises(TrtfuseError, match=r"'build\.ptx_isa' must be a list of PTX ISA versions"):
        EngineFile.open(engine)


def test_a_format_1_sidecar_is_read_with_its_shape_tensor_inputs_unknown(tmp_path):
    """Sidecars written before format 2 recorded no shape-tensor inputs: still read (run, compare), with the field
    None rather than a guess; a format 2 sidecar says which (here none)."""
    engine = engine_with_sidecar(tmp_path)
    assert EngineFile.open(engine).sidecar.shape_tensor_inputs == frozenset()

    def format_1(data):
        data["format"] = "trtfuse-engine/1"
        data.pop("shape_tensor_inputs")

    _edit(engine, format_1)
    sidecar = EngineFile.open(engine).sidecar
    assert sidecar.shape_tensor_inputs is None
    assert sidecar.profiles[0].name == "decode"


def test_a_fused_model_symlinked_out_of_the_engine_folder_is_refused(tmp_path):
    """The sidecar's relative name stays in the folder, but a symlink there may lead anywhere: held to the engine's
    folder as external data is to its model's, before the model is read."""
    folder = tmp_path / "engine"
    folder.mkdir()
    engine = engine_with_sidecar(folder)
    fused = folder / "m.fused.onnx"
    elsewhere = tmp_path / "elsewhere.onnx"
    fused.rename(elsewhere)
    fused.symlink_to(elsewhere)
    with pytest.raises(TrtfuseError) as raised:
        EngineFile.open(engine)
    message = str(raised.value)
    assert message.startswith(f"{sidecar_path_for(engine)}: 'fused_model' is 'm.fused.onnx', a symlink that leads ")
    assert f"outside the engine's folder to {elsewhere}" in message
    result = run_cli("triton-config", engine)
    assert result.exit_code == EXIT_BAD_INPUT and "outside the engine's folder" in result.output


def test_a_fused_model_symlinked_inside_the_engine_folder_is_read(tmp_path):
    engine = engine_with_sidecar(tmp_path)
    (tmp_path / "models").mkdir()
    fused = tmp_path / "m.fused.onnx"
    fused.rename(tmp_path / "models" / "m.fused.onnx")
    fused.symlink_to(Path("models") / "m.fused.onnx")
    assert EngineFile.open(engine).fused_model_path == fused
