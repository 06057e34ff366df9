"""The trtfuse command line: inspect, fuse and check, and one-line errors for bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from click.testing import CliRunner

from trtfuse import __version__, contract
from trtfuse.cli.main import cli
from trtfuse.cli.options import EXIT_BAD_INPUT, SizeType

from support.models import layer_norm_model, llama_norm_model, projection_model, save_external
from support.paths import REPO_ROOT


def _invoke(*args: str):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


@pytest.fixture
def llama_path(write_model) -> Path:
    return write_model(llama_norm_model(layers=2), "llama.onnx")


def test_version() -> None:
    result = _invoke("--version")
    assert result.exit_code == 0
    assert result.output.strip() == f"trtfuse, version {__version__}"


def test_inspect_lists_matches(llama_path: Path) -> None:
    result = _invoke("inspect", llama_path)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == f"{llama_path}: 2 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (2 norms), 0 rejected"
    assert len(lines) == 3
    assert lines[1].startswith("  rms_norm  ")
    assert "eps=1e-06 hidden=64 float16 weight=AFTER_CAST offset=0 tags=" in lines[1]


def test_inspect_explains_rejections(write_model) -> None:
    result = _invoke("inspect", write_model(layer_norm_model()))
    assert result.exit_code == 0, result.output
    assert "0 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (0 norms), 2 rejected" in result.output.splitlines()[0]
    assert "  rejected  ln/mean: LayerNorm" in result.output


def test_inspect_json(llama_path: Path) -> None:
    result = _invoke("inspect", llama_path, "--json")
    assert result.exit_code == 0, result.output
    found = json.loads(result.output)
    assert [match["hidden_size"] for match in found["rms_norms"]] == [64, 64]
    assert found["rms_norms"][0]["replaces"][0] == "layers.0.norm/Cast"
    assert found["qk_norm_pairs"] == []


def test_fuse_writes_model_and_report(llama_path: Path, tmp_path: Path) -> None:
    out, report_path = tmp_path / "fused.onnx", tmp_path / "report.json"
    result = _invoke("fuse", llama_path, "-o", out, "--report", report_path)
    assert result.exit_code == 0, result.output
    assert result.output.strip() == (
        f"{llama_path}: 2 TrtfuseRmsNorm and 0 TrtfuseQkNorm nodes (2 norms), 0 rejected -> {out}"
    )
    fused = onnx.load(str(out))
    assert [node.op_type for node in fused.graph.node].count(contract.RMS_NORM_OP) == 2
    report = json.loads(report_path.read_text())
    assert report["totals"]["norms"] == 2
    assert len(report["fused"]) == 2


def test_check_passes_and_fails(llama_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused.onnx"
    assert _invoke("fuse", llama_path, "-o", out).exit_code == 0
    result = _invoke("check", llama_path, out, "--seed", "4", "--dim", "sequence=3", "--shape", "x=1x3x64")
    assert result.exit_code == 0, result.output
    assert "all 1 outputs pass" in result.output
    fused = onnx.load(str(out))
    # The last norm: an earlier one's change of scale would be undone by the norm after it.
    last_norm = [node for node in fused.graph.node if node.op_type == contract.RMS_NORM_OP][-1]
    for attribute in last_norm.attribute:
        if attribute.name == contract.ATTR_EPSILON:
            attribute.f = 10.0
    onnx.save_model(fused, str(out))
    result = _invoke("check", llama_path, out)
    assert result.exit_code == 1
    assert "FAIL" in result.output
    assert "1 output(s) fail" in result.output


@pytest.mark.parametrize("bad_option", [["--shape", "x=1xfoo"], ["--dim", "sequence"]])
def test_check_rejects_malformed_options(llama_path: Path, bad_option: list[str]) -> None:
    result = _invoke("check", llama_path, llama_path, *bad_option)
    assert result.exit_code == 2
    assert "Invalid value" in result.output


def _bad_models(tmp_path: Path) -> dict[str, tuple[Path, str]]:
    """One model file per bad-input case of issue 2 item 9, with the message each must give."""
    cases = {}
    text = tmp_path / "notes.onnx"
    text.write_text("not a model\n")
    cases["not onnx"] = (text, f"{text}: not an ONNX model")
    cases["missing"] = (tmp_path / "absent.onnx", f"{tmp_path / 'absent.onnx'}: no such file")
    old = tmp_path / "old.onnx"
    onnx.save_model(projection_model(opset=9), str(old))
    cases["opset"] = (old, f"{old}: unsupported opset 9 (supported: 13-23)")
    broken = projection_model()
    broken.graph.node[0].input[1] = "nowhere"
    broken_path = tmp_path / "broken.onnx"
    onnx.save_model(broken, str(broken_path))
    cases["checker"] = (broken_path, f"{broken_path}: fails the ONNX checker")
    for name, location in (("missing_data", None), ("escape", "../weights.data")):
        folder = tmp_path / name
        folder.mkdir()
        path = save_external(projection_model(), folder / "model.onnx")
        if location is None:
            (folder / "weights.data").unlink()
            cases[name] = (path, "external data file 'weights.data' of tensor 'W' is missing")
        else:
            model = onnx.load(str(path), load_external_data=False)
            for tensor in model.graph.initializer:
                tensor.external_data[0].value = location
            onnx.save_model(model, str(path))
            cases[name] = (path, "points outside the model's folder to external data '../weights.data'")
    return cases


@pytest.mark.parametrize("case", ["not onnx", "missing", "opset", "checker", "missing_data", "escape"])
@pytest.mark.parametrize("command", ["inspect", "fuse"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, case: str, command: str) -> None:
    inputs = tmp_path / "inputs"
    inputs.mkdir()
    path, message = _bad_models(inputs)[case]
    out_folder = tmp_path / "out"
    out_folder.mkdir()
    extra = ["-o", out_folder / "fused.onnx", "--report", out_folder / "report.json"] if command == "fuse" else []
    result = _invoke(command, path, *extra)
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("trtfuse: error: ")
    assert message in lines[0]
    assert list(out_folder.iterdir()) == []


def test_fuse_into_a_missing_folder(llama_path: Path, tmp_path: Path) -> None:
    result = _invoke("fuse", llama_path, "-o", tmp_path / "no" / "fused.onnx")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "output folder does not exist" in result.stderr


def test_report_path_that_is_a_folder_writes_nothing(llama_path: Path, tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    result = _invoke("fuse", llama_path, "-o", tmp_path / "fused.onnx", "--report", tmp_path / "taken")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr == f"trtfuse: error: {tmp_path / 'taken'}: is a folder, not a file name\n"
    assert not (tmp_path / "fused.onnx").exists()


def test_console_entry_point_prints_no_traceback(tmp_path: Path) -> None:
    completed = subprocess.run(
        [
            sys.executable,
            "-c",
            "from trtfuse.cli.main import main; main()",
            "fuse",
            str(tmp_path / "x.onnx"),
            "-o",
            "y.onnx",
        ],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert completed.returncode == EXIT_BAD_INPUT
    assert completed.stderr == f"trtfuse: error: {tmp_path / 'x.onnx'}: no such file\n"
    assert "Traceback" not in completed.stdout + completed.stderr


@pytest.mark.parametrize("args", [["-h"], ["fuse", "-h"], ["compile", "-h"], ["bench", "kernels", "-h"], [], ["bench"]])
def test_short_help(args: list[str]) -> None:
    result = _invoke(*args)
    assert result.exit_code == 0
    assert result.output.startswith("Usage: ")


@pytest.mark.parametrize("command", ["inspect", "fuse", "compile"])
def test_no_fuse_quant_help_names_every_quantized_op(command: str) -> None:
    """It named TrtfuseRmsNormQuant and TrtfuseAddRmsNormQuant, not TrtfuseQkNormQuant, which it keeps out too."""
    from trtfuse.contract import QUANTIZED_OPS

    help_text = " ".join(_invoke(command, "-h").output.split())
    flag = help_text[help_text.index("--no-fuse-quant") :]
    assert all(op.name in flag[: flag.index("Quantized norms")] for op in QUANTIZED_OPS.values())


@pytest.mark.parametrize(
    "args",
    [
        ["fuse"],
        ["no-such-command"],
        ["inspect", "m.onnx", "--no-such-flag"],
        ["check", "a", "b", "--seed", "x"],
        ["compile", "m.onnx", "--opt-level", "9"],
        ["run", "m.engine", "--iterations", "0"],
        ["run", "m.engine", "--inputs", "in.npz", "--shape", "x=1x2"],
        ["check", "a", "b", "--shape", "x=1x2", "--shape", "x:[1,3]"],
    ],
)
def test_usage_errors_are_one_line(args: list[str]) -> None:
    result = _invoke(*args)
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stdout == ""
    assert len(result.stderr.splitlines()) == 1
    assert result.stderr.startswith("trtfuse: error: ") and "--help" in result.stderr


def test_quiet_and_verbose(llama_path: Path, tmp_path: Path) -> None:
    quiet = _invoke("fuse", llama_path, "-o", tmp_path / "fused.onnx", "-q")
    assert quiet.exit_code == 0 and quiet.output == ""
    both = _invoke("fuse", llama_path, "-o", tmp_path / "fused.onnx", "-q", "-v")
    assert both.exit_code == EXIT_BAD_INPUT
    assert "-v/--verbose and -q/--quiet cannot be used together" in both.stderr


@pytest.mark.parametrize("spelling", ["x=1x3x64", "x:1x3x64", "x:[1,3,64]", "x=[1, 3, 64]"])
def test_shape_spellings(llama_path: Path, tmp_path: Path, spelling: str) -> None:
    out = tmp_path / "fused.onnx"
    assert _invoke("fuse", llama_path, "-o", out).exit_code == 0
    result = _invoke("check", llama_path, out, "--shape", spelling)
    assert result.exit_code == 0, result.output
    assert "x=1x3x64" in result.output


def test_shape_range_spellings() -> None:
    from trtfuse.cli.options import ShapeRangeType, ShapeType
    from trtfuse.engine.profiles import ShapeRange

    assert ShapeType().convert("past_key_values.0.key:[1,8,0,64]", None, None) == (
        ("past_key_values.0.key", (1, 8, 0, 64)),
    )
    assert ShapeType().convert("a:b=2x3", None, None) == (("a:b", (2, 3)),)
    assert ShapeType().convert("a:2X3", None, None) == (("a", (2, 3)),), "trtexec takes X as well as x"
    # trtexec's list form, and Polygraphy's brackets inside it.
    assert ShapeType().convert("input_ids:2x5,attention_mask:2x5", None, None) == (
        ("input_ids", (2, 5)),
        ("attention_mask", (2, 5)),
    )
    assert ShapeType().convert("a:[1,2],b:[3,4]", None, None) == (("a", (1, 2)), ("b", (3, 4)))
    expected = ShapeRange((1, 1), (1, 64), (1, 512))
    for spelling in ("ids=1x1:1x64:1x512", "ids:1x1:1x64:1x512", "ids:[1,1]:[1,64]:[1,512]", "ids:1X1:1X64:1X512"):
        assert ShapeRangeType().convert(spelling, None, None) == (("ids", expected),)
    assert ShapeRangeType().convert("ids:1x1:1x64:1x512,mask:1x1:1x64:1x512", None, None) == (
        ("ids", expected),
        ("mask", expected),
    )


@pytest.mark.parametrize(
    ("type_name", "text"),
    [
        ("ShapeType", "a:2x3,b:[4]"),
        ("ShapeRangeType", "ids=1x1:1x2:1x4"),
        ("DimType", "batch=2"),
        ("PromptIdsType", "1,2"),
    ],
)
def test_a_converted_value_converts_to_itself(type_name: str, text: str) -> None:
    """Click's contract: `convert` takes its own result again (a default, a value passed on) and keeps it."""
    from trtfuse.cli.check_report import PromptIdsType
    from trtfuse.cli.options import DimType, ShapeRangeType, ShapeType

    types = {
        "ShapeType": ShapeType,
        "ShapeRangeType": ShapeRangeType,
        "DimType": DimType,
        "PromptIdsType": PromptIdsType,
    }
    converted = types[type_name]().convert(text, None, None)
    assert types[type_name]().convert(converted, None, None) == converted


@pytest.mark.parametrize("digits", ["١:٢:٣", "1:2:³", "1:2:8\u0663"])
def test_numbers_are_ascii_digits_or_one_line(digits: str, llama_path: Path) -> None:
    """Python's int() and str.isdigit() take other scripts' digits (and isdigit superscripts, which int() refuses):
    options take ASCII digits, and anything else is one line, exit 2."""
    for option in ("--tokens", "--batch", "--past"):
        result = _invoke("compile", llama_path, option, digits.encode().decode("unicode_escape"))
        assert result.exit_code == EXIT_BAD_INPUT, result.output
        assert f"Invalid value for '{option}'" in result.stderr and "Traceback" not in result.output


def test_trtexec_shape_lists_reach_the_feed(llama_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused.onnx"
    assert _invoke("fuse", llama_path, "-o", out).exit_code == 0
    listed = _invoke("check", llama_path, out, "--shape", "x:1X3X64")
    assert listed.exit_code == 0, listed.output
    assert "x=1x3x64" in listed.output
    twice = _invoke("check", llama_path, out, "--shape", "x:1x3x64,x:1x4x64")
    assert twice.exit_code == EXIT_BAD_INPUT and "input 'x' is given twice" in twice.stderr


@pytest.mark.parametrize(
    ("text", "size"), [("1024", 1024), ("4G", 4 << 30), ("512MiB", 512 << 20), ("2 kb", 2048), ("1t", 1 << 40)]
)
def test_sizes(text: str, size: int) -> None:
    assert SizeType().convert(text, None, None) == size


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tokens", "8:4:16"], "Invalid value for '--tokens': need MIN <= OPT <= MAX, got '8:4:16'"),
        (["--batch", "0:1:1"], "Invalid value for '--batch': MIN must be at least 1"),
        (["--past", "0:1"], "Invalid value for '--past': expected MIN:OPT:MAX"),
        (["--shape", "ids=1x4:1x2:1x8"], "Invalid value for '--shape': ids: dim 1 needs MIN <= OPT <= MAX, got 4:2:8"),
        (["--shape", "x=1:1:1", "--shape", "x=2:2:2"], "Invalid value for '--shape': input 'x' is given twice"),
        (["--workspace", "lots"], "Invalid value for '--workspace': expected a size such as 4G"),
        (["--workspace", "0G"], "Invalid value for '--workspace': must be positive"),
        (["--workspace", "1.5G"], "Invalid value for '--workspace': expected a size"),
    ],
)
def test_compile_specs_are_parsed_by_the_cli_and_name_the_flag(args: list[str], message: str) -> None:
    result = _invoke("compile", "m.onnx", *args)
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr.startswith(f"trtfuse: error: {message}"), result.stderr


def test_every_command_takes_json(llama_path: Path, tmp_path: Path) -> None:
    out = tmp_path / "fused.onnx"
    fused = _invoke("fuse", llama_path, "-o", out, "--json")
    assert fused.exit_code == 0, fused.output
    assert json.loads(fused.stdout)["totals"]["norms"] == 2
    checked = _invoke("check", llama_path, out, "--json")
    assert checked.exit_code == 0, checked.output
    json.loads(checked.stdout)
    compiled = _invoke("compile", llama_path, "-o", tmp_path / "m.engine", "--json", "-q")
    compiled_json = json.loads(compiled.stdout)
    assert compiled_json["fused_model"] == str(tmp_path / "m.fused.onnx")
    assert compiled_json["model"] == str(llama_path) and compiled_json["report"] == str(tmp_path / "m.fusion.json")
    assert set(compiled_json) == {
        "model",
        "fused_model",
        "report",
        "profiles",
        "engine",
        "build_seconds",
        "plugins",
        "error",
        "exit",
    }
    assert compiled_json["profiles"][0]["name"] == "default"
    assert compiled_json["plugins"] is None, "no engine built, so no plugin kind"
    assert compiled_json["exit"] == 3 and "fused, but no engine built" in compiled_json["error"], "and why not"
    for command in ("run", "compare", "bench", "bench kernels"):
        assert all(flag in _invoke(*command.split(), "-h").output for flag in ("--json", "--verbose", "--quiet"))


@pytest.mark.parametrize("module", ["torch", "cutlass"])
def test_bench_kernels_without_its_modules_says_how_to_install_them(module: str) -> None:
    """It said which module was missing and nothing of how to get it, unlike every other exit 3. In a process of
    its own: this one may hold the kernel modules already."""
    blocked = f"import sys; sys.modules[{module!r}] = None; from trtfuse.cli.main import main; main()"
    result = subprocess.run(
        [sys.executable, "-c", blocked, "bench", "kernels"], capture_output=True, text=True, check=False, cwd=REPO_ROOT
    )
    assert result.returncode == 3, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("trtfuse: the kernel benchmark needs torch and nvidia-cutlass-dsl (")
    assert line.endswith(
        "; install them with `pip install -e '.[gpu]'` in a trtfuse checkout, on a machine with an NVIDIA GPU"
    )


def test_compare_without_polygraphy_says_how_to_install_it(llama_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "polygraphy", None)
    result = _invoke("compare", llama_path, llama_path)
    assert result.exit_code == 3
    assert result.stderr.splitlines() == [
        "trtfuse: `trtfuse compare` needs Polygraphy; install it with `pip install -e '.[compare]'` in a trtfuse "
        "checkout, or `pip install polygraphy`"
    ]


@pytest.mark.parametrize("command", [["run"], ["generate"], ["triton-config"], ["compare", "ORIGINAL"]])
def test_a_missing_engine_is_no_such_engine_file(command: list[str], tmp_path: Path, llama_path: Path) -> None:
    """compare said `no such file` where the others say `no such engine file`."""
    args = [llama_path if arg == "ORIGINAL" else arg for arg in command]
    result = _invoke(*args, tmp_path / "missing.engine")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr == f"trtfuse: error: {tmp_path / 'missing.engine'}: no such engine file\n"


def test_node_names_are_escaped_on_the_terminal(write_model) -> None:
    model = llama_norm_model()
    for node in model.graph.node:
        node.name = "\x1b[2J" + node.name + "\n"
    result = _invoke("inspect", write_model(model))
    assert result.exit_code == 0, result.output
    assert "\x1b" not in result.output
    assert "\\x1b[2J" in result.output
    assert len(result.output.splitlines()) == 2


def test_an_internal_error_is_one_line(llama_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(*_args: object) -> None:
        raise RuntimeError("boom\nsecond line")

    monkeypatch.setattr("trtfuse.fusion.fuse.fuse_model", crash)
    result = _invoke("inspect", llama_path)
    assert result.exit_code == 4
    assert result.stderr.splitlines() == [
        "trtfuse: internal error: RuntimeError: boom (a bug in trtfuse; please report it with the command line)"
    ]


def _ir3_model() -> onnx.ModelProto:
    model = llama_norm_model(dtype=onnx.TensorProto.FLOAT)
    for tensor in model.graph.initializer:
        model.graph.input.append(onnx.helper.make_tensor_value_info(tensor.name, tensor.data_type, list(tensor.dims)))
    model.ir_version = 3
    return model


def _sparse_constant_model() -> onnx.ModelProto:
    helper = onnx.helper
    values = onnx.numpy_helper.from_array(np.array([1.5], np.float32), "values")
    indices = onnx.numpy_helper.from_array(np.array([2], np.int64), "indices")
    nodes = [
        helper.make_node(
            "Constant", [], ["c"], name="sparse", sparse_value=helper.make_sparse_tensor(values, indices, [4])
        ),
        helper.make_node("Add", ["x", "c"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "sparse",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("make", [_ir3_model, _sparse_constant_model], ids=["ir3-initializers-as-inputs", "sparse"])
def test_unusual_valid_models_fuse_and_check(write_model, tmp_path: Path, make) -> None:
    model_path = write_model(make())
    out = tmp_path / "fused.onnx"
    fused = _invoke("fuse", model_path, "-o", out)
    assert fused.exit_code == 0, fused.output
    checked = _invoke("check", model_path, out)
    assert checked.exit_code == 0, checked.output


def test_library_warnings_only_with_verbose(llama_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import warnings

    import trtfuse.model.onnx_file

    real_load = trtfuse.model.onnx_file.load_model

    def noisy_load(path: Path):
        warnings.warn("invalid value encountered in subtract", RuntimeWarning, stacklevel=1)
        return real_load(path)

    monkeypatch.setattr(trtfuse.model.onnx_file, "load_model", noisy_load)
    assert _invoke("inspect", llama_path).stderr == ""
    assert "invalid value encountered" in _invoke("inspect", llama_path, "-v").stderr


def test_an_unfused_default_domain_simplified_layer_norm_is_written(write_model, tmp_path: Path) -> None:
    # optimum --optimize O2 writes onnxruntime's SimplifiedLayerNormalization into the default domain; one the
    # matcher rejects (here: it normalises the first axis) stays in the output, which must pass trtfuse's own checks.
    helper = onnx.helper
    node = helper.make_node("SimplifiedLayerNormalization", ["x", "w"], ["y"], name="sln", axis=0, epsilon=1e-6)
    weight = onnx.numpy_helper.from_array(np.linspace(0.5, 1.5, 8, dtype=np.float32), "w")
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [8, 8])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [8, 8])],
        [weight],
    )
    model_path = write_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    out = tmp_path / "out"
    out.mkdir()
    result = _invoke("fuse", model_path, "-o", out / "fused.onnx")
    assert result.exit_code == 0, result.output
    assert "1 rejected" in result.output
    assert _invoke("inspect", out / "fused.onnx").exit_code == 0
