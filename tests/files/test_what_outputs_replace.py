"""What an output may replace (docs/cli.md, "What a writing command will not do"; `trtfuse.files.OutputPlan`): never
an input, never an ONNX model trtfuse did not write (not even with --force), a file trtfuse wrote as that output
always (running a command again works), any other existing file only with --force. Every refusal is one line and
exit 2, with nothing touched."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnx
import pytest

from trtfuse.cli.options import EXIT_BAD_INPUT, EXIT_MISSING_DEPENDENCY
from trtfuse.engine.sidecar import is_engine_with_sidecar
from trtfuse.errors import OptionError
from trtfuse.files import OutputPlan, Overwrite
from trtfuse.model.feed_files import is_trtfuse_archive, write_arrays
from trtfuse.model.onnx_file import WRITTEN_BY_KEY, is_trtfuse_model

from support.cli import run_cli
from support.engines import engine_with_sidecar
from support.models import layer_norm_model, llama_norm_model, save_model_file
from support.paths import REPO_ROOT

USER_FILE = b"the user's own file"
# compile stops after the fused model without TensorRT (3) and builds with it (0): either way it wrote its files.
COMPILED = (0, EXIT_MISSING_DEPENDENCY)


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def original(write_model: Callable[[onnx.ModelProto, str], Path]) -> Path:
    """A user's export."""
    return write_model(llama_norm_model(), "orig.onnx")


@pytest.fixture
def fused(original: Path) -> Path:
    path = original.with_name("fused.onnx")
    result = run_cli("fuse", original, "-o", path)
    assert result.exit_code == 0, result.output
    return path


def _refused(result: object, path: Path, digest: str, reason: str) -> None:
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"trtfuse: error: {path}: ") and reason in line, line
    assert _digest(path) == digest


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_fuse_with_its_arguments_swapped_never_replaces_the_original(original: Path, fused: Path, force: bool) -> None:
    """`fuse FUSED -o ORIGINAL`: the output is the user's export, which nothing replaces; the input being a model
    the output would be, the message says the arguments look swapped."""
    before = _digest(original)
    result = run_cli("fuse", fused, "-o", original, *(["--force"] if force else []))
    _refused(result, original, before, "is an ONNX model, not a fused model trtfuse wrote")
    assert "not even with --force; the arguments look swapped" in result.stderr


@pytest.mark.parametrize("force", [False, True], ids=["plain", "force"])
def test_compile_never_replaces_a_users_model_where_its_fused_model_goes(original: Path, force: bool) -> None:
    users = original.with_name("orig.fused.onnx")
    users.write_bytes(original.read_bytes())
    before = _digest(users)
    result = run_cli("compile", original, *(["--force"] if force else []))
    _refused(result, users, before, "is an ONNX model, not a fused model trtfuse wrote")
    assert sorted(path.name for path in original.parent.iterdir()) == ["orig.fused.onnx", "orig.onnx"]


def test_the_timing_cache_may_not_be_a_model_either(original: Path) -> None:
    """The timing cache is read and written back whatever it holds, but for a model."""
    result = run_cli("compile", original, "--timing-cache", original.with_name("orig.onnx"))
    assert result.exit_code == EXIT_BAD_INPUT and "would overwrite the input" in result.stderr
    other = original.with_name("users.onnx")
    other.write_bytes(original.read_bytes())
    before = _digest(other)
    result = run_cli("compile", original, "--timing-cache", other, "--force")
    _refused(result, other, before, "is an ONNX model, not a timing cache trtfuse wrote")
    cache = original.with_name("cache.bin")
    cache.write_bytes(USER_FILE)
    assert run_cli("compile", original, "--timing-cache", cache).exit_code in COMPILED


@pytest.mark.parametrize("nothing_to_fuse", [False, True], ids=["fused", "nothing-fused"])
def test_running_fuse_again_replaces_what_it_wrote(tmp_path: Path, nothing_to_fuse: bool) -> None:
    """A fused model is known by its trtfuse opset; one with nothing fused by trtfuse's metadata entry."""
    model = save_model_file(layer_norm_model() if nothing_to_fuse else llama_norm_model(), tmp_path / "in.onnx")
    out, report = tmp_path / "out.onnx", tmp_path / "report.json"
    for _ in range(2):
        result = run_cli("fuse", model, "-o", out, "--report", report)
        assert result.exit_code == 0, result.output
    written = onnx.load(str(out))
    stamped = [entry.value for entry in written.metadata_props if entry.key == WRITTEN_BY_KEY]
    assert len(stamped) == (1 if nothing_to_fuse else 0)
    assert is_trtfuse_model(out) and not is_trtfuse_model(model)


def test_running_compile_again_replaces_what_it_wrote(original: Path) -> None:
    for _ in range(2):
        result = run_cli("compile", original, "--timing-cache", original.with_name("cache.bin"))
        assert result.exit_code in COMPILED, result.output
    assert {"orig.fused.onnx", "orig.fusion.json"} <= {path.name for path in original.parent.iterdir()}


def test_saved_inputs_trtfuse_wrote_are_replaced(original: Path, fused: Path) -> None:
    saved = original.with_name("inputs.npz")
    for _ in range(2):
        result = run_cli("check", original, fused, "--save-inputs", saved)
        assert result.exit_code == 0, result.output
    assert is_trtfuse_archive(saved)


def _another_file(original: Path, fused: Path, command: str) -> tuple[list[object], Path]:
    """A call of `command` whose output (returned) is a file the user made."""
    folder = original.parent
    outputs = {
        "fuse": (["fuse", original, "-o", folder / "out.onnx"], folder / "out.onnx"),
        "fuse --report": (
            ["fuse", original, "-o", folder / "out.onnx", "--report", folder / "r.json"],
            folder / "r.json",
        ),
        "compile": (["compile", original, "-o", folder / "x.engine"], folder / "x.engine"),
        "compile sidecar": (["compile", original, "-o", folder / "y.engine"], folder / "y.engine.json"),
        "check --save-inputs": (["check", original, fused, "--save-inputs", folder / "s.npz"], folder / "s.npz"),
        "compare --report": (["compare", original, fused, "--report", folder / "c.json"], folder / "c.json"),
        "run --save-outputs": (
            ["run", engine_with_sidecar(folder), "--save-outputs", folder / "o.npz"],
            folder / "o.npz",
        ),
        "bench kernels --report": (["bench", "kernels", "--report", folder / "b.json"], folder / "b.json"),
    }
    args, path = outputs[command]
    path.write_bytes(USER_FILE)
    return args, path


COMMANDS = [
    "fuse",
    "fuse --report",
    "compile",
    "compile sidecar",
    "check --save-inputs",
    "compare --report",
    "run --save-outputs",
    "bench kernels --report",
]


@pytest.mark.parametrize("command", COMMANDS)
def test_any_other_existing_file_needs_force(original: Path, fused: Path, command: str) -> None:
    args, path = _another_file(original, fused, command)
    result = run_cli(*args)
    _refused(result, path, _digest(path), "exists and is not")
    assert "trtfuse wrote; write the " in result.stderr and "elsewhere, or give --force to replace it" in result.stderr


@pytest.mark.parametrize("command", ["fuse", "fuse --report", "check --save-inputs"])
def test_force_lets_an_output_replace_another_file(original: Path, fused: Path, command: str) -> None:
    args, path = _another_file(original, fused, command)
    result = run_cli(*args, "--force")
    assert result.exit_code == 0, result.output
    assert path.read_bytes() != USER_FILE


def test_a_refusal_under_json_is_the_one_object_on_stdout(original: Path, fused: Path) -> None:
    result = run_cli("fuse", fused, "-o", original, "--json")
    assert json.loads(result.stdout)["exit"] == EXIT_BAD_INPUT


def test_an_engine_is_trtfuse_s_when_its_sidecar_names_it(tmp_path: Path) -> None:
    engine = engine_with_sidecar(tmp_path)
    assert is_engine_with_sidecar(engine)
    renamed = tmp_path / "other.engine"
    renamed.write_bytes(engine.read_bytes())
    renamed.with_name("other.engine.json").write_bytes(engine.with_name("m.engine.json").read_bytes())
    assert not is_engine_with_sidecar(renamed)


def test_an_npz_is_trtfuse_s_by_its_zip_comment(tmp_path: Path) -> None:
    ours, users = tmp_path / "ours.npz", tmp_path / "users.npz"
    write_arrays(ours, {"a": np.arange(3)})
    np.savez(users, a=np.arange(3))
    assert is_trtfuse_archive(ours) and not is_trtfuse_archive(users)
    assert np.load(ours)["a"].tolist() == [0, 1, 2]


def test_external_data_copies_are_left_to_the_save(tmp_path: Path) -> None:
    """An existing copy is compared byte for byte when the model is saved (reused or refused there), never
    replaced: the plan lets it through whatever it holds."""
    copy = tmp_path / "weights.data"
    copy.write_bytes(USER_FILE)
    OutputPlan().write("external data copy", copy, overwrite=Overwrite.IDENTICAL).check()
    with pytest.raises(OptionError):
        OutputPlan().write("external data copy", copy).check()


def _models_extras() -> object:
    sys.path.insert(0, str(REPO_ROOT / "models"))
    try:
        import extras
    finally:
        sys.path.remove(str(REPO_ROOT / "models"))
    return extras


def _check_exports(folder: Path, name: str, force: bool) -> int:
    try:
        _models_extras().check_exports(folder, [name], force)
    except SystemExit as exit_status:
        return int(exit_status.code)
    return 0


def test_an_export_script_replaces_only_what_its_manifest_lists(tmp_path: Path) -> None:
    """models/extras.check_exports: the rule for the export scripts, their own files being those the folder's
    expected.json lists."""
    save_model_file(llama_norm_model(), tmp_path / "listed.onnx")
    save_model_file(llama_norm_model(), tmp_path / "users.onnx")
    (tmp_path / "notes.txt").write_bytes(USER_FILE)
    (tmp_path / "expected.json").write_text(json.dumps({"files": {"listed.onnx": {}}, "failures": {}}))
    assert _check_exports(tmp_path, "listed.onnx", force=False) == 0
    assert _check_exports(tmp_path, "listed.onnx.data", force=False) == 0
    assert _check_exports(tmp_path, "users.onnx", force=True) == EXIT_BAD_INPUT
    assert _check_exports(tmp_path, "notes.txt", force=False) == EXIT_BAD_INPUT
    assert _check_exports(tmp_path, "notes.txt", force=True) == 0
    (tmp_path / "expected.json").write_bytes(USER_FILE)
    assert _check_exports(tmp_path, "new.onnx", force=False) == EXIT_BAD_INPUT


@pytest.mark.skipif(
    any(__import__("importlib").util.find_spec(name) is None for name in ("torch", "transformers")),
    reason="the export script needs torch and transformers (pip install -e '.[export]')",
)
def test_the_export_script_never_replaces_a_users_model_in_its_out_folder(tmp_path: Path) -> None:
    users = save_model_file(llama_norm_model(), tmp_path / "llama-torchscript-fp16.onnx")
    before = _digest(users)
    command = [sys.executable, "models/export.py", "--out", tmp_path, "--arch", "llama", "--exporter", "torchscript"]
    completed = subprocess.run(
        [*map(str, command), "--dtype", "float16", "--force"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert completed.returncode == EXIT_BAD_INPUT, completed.stdout + completed.stderr
    (line,) = completed.stderr.splitlines()
    assert line.startswith(f"export.py: error: {users}: is an ONNX model, not an export trtfuse wrote")
    assert _digest(users) == before and sorted(path.name for path in tmp_path.iterdir()) == [users.name]
