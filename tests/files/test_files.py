"""No data loss: outputs checked before any work, external data never clobbered, failures and signals leave nothing."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import onnx
import pytest
from click.testing import CliRunner

import trtfuse.files
from trtfuse.cli.main import EXIT_SIGINT, EXIT_SIGTERM, cli
from trtfuse.cli.options import EXIT_BAD_INPUT
from trtfuse.errors import TrtfuseError
from trtfuse.files import OutputPlan, Transaction, copy_sparse, write_bytes_atomic

from support.models import llama_norm_model, projection_model, save_external
from support.paths import REPO_ROOT


def _invoke(*args: object):
    return CliRunner().invoke(cli, [str(arg) for arg in args])


def _listing(folder: Path) -> list[str]:
    return sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))


@pytest.fixture
def external_llama(tmp_path: Path) -> Path:
    """A model with all its weights in `weights.data` (one large one, which stays there), in its own folder."""
    folder = tmp_path / "model"
    folder.mkdir()
    return save_external(projection_model(), folder / "llama.onnx")


def _same_file_cases(model: Path, tmp_path: Path) -> dict[str, Path]:
    symlink = tmp_path / "link.onnx"
    symlink.symlink_to(model)
    hard_link = tmp_path / "hard.onnx"
    os.link(model, hard_link)
    return {"itself": model, "a symlink to it": symlink, "a hard link to it": hard_link}


@pytest.mark.parametrize("case", ["itself", "a symlink to it", "a hard link to it"])
def test_fuse_refuses_to_overwrite_its_input(external_llama: Path, tmp_path: Path, case: str) -> None:
    output = _same_file_cases(external_llama, tmp_path)[case]
    before = external_llama.read_bytes()
    result = _invoke("fuse", external_llama, "-o", output)
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "would overwrite the input" in result.stderr
    assert external_llama.read_bytes() == before


@pytest.mark.parametrize("option", ["-o", "--report"])
def test_fuse_refuses_to_overwrite_the_external_data(external_llama: Path, option: str) -> None:
    data = external_llama.parent / "weights.data"
    before = data.read_bytes()
    other = {"-o": ["--report", external_llama.parent / "r.json"], "--report": ["-o", external_llama.parent / "f.onnx"]}
    result = _invoke("fuse", external_llama, option, data, *other[option])
    assert result.exit_code == EXIT_BAD_INPUT
    assert f"would overwrite the input {data}" in result.stderr
    assert data.read_bytes() == before
    assert _listing(external_llama.parent) == ["llama.onnx", "weights.data"]


def test_two_outputs_of_one_call_may_not_be_one_file(external_llama: Path, tmp_path: Path) -> None:
    result = _invoke("fuse", external_llama, "-o", tmp_path / "same", "--report", tmp_path / "same")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "the fusion report and the fused model" in result.stderr
    assert not (tmp_path / "same").exists()


@pytest.mark.parametrize("target", ["/dev/null", "/dev/stdout", "fifo", "folder"])
def test_outputs_that_are_not_regular_files_are_refused(external_llama: Path, tmp_path: Path, target: str) -> None:
    if target == "fifo":
        os.mkfifo(tmp_path / "fifo")
    if target == "folder":
        (tmp_path / "folder").mkdir()
    path = tmp_path / target if not target.startswith("/") else Path(target)
    result = _invoke("fuse", external_llama, "-o", tmp_path / "f.onnx", "--report", path)
    assert result.exit_code == EXIT_BAD_INPUT
    assert "not a regular file" in result.stderr or "is a folder" in result.stderr
    assert not (tmp_path / "f.onnx").exists()


def test_another_models_data_file_of_the_same_name_is_never_overwritten(external_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights.data").write_bytes(b"another model's weights")
    result = _invoke("fuse", external_llama, "-o", out / "fused.onnx")
    assert result.exit_code == EXIT_BAD_INPUT
    assert "is not a copy of the external data" in result.stderr
    assert (out / "weights.data").read_bytes() == b"another model's weights"
    assert _listing(out) == ["weights.data"]


def test_fusing_again_into_the_same_folder_reuses_its_copy(external_llama: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    first = _invoke("fuse", external_llama, "-o", out / "fused.onnx")
    assert first.exit_code == 0, first.output
    assert "copying external data" in first.stderr
    inode = (out / "weights.data").stat().st_ino
    second = _invoke("fuse", external_llama, "-o", out / "fused.onnx")
    assert second.exit_code == 0, second.output
    assert (out / "weights.data").stat().st_ino == inode


def test_a_failure_after_writing_removes_what_the_call_wrote(
    external_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    (out / "fused.onnx").write_bytes(b"the user's previous output")

    def fail(*_args: object) -> None:
        raise TrtfuseError("report: disk full")

    monkeypatch.setattr("trtfuse.pipeline.write_json_atomic", fail)
    # --force: the user's file is no model trtfuse wrote, and without it nothing would be written at all.
    result = _invoke("fuse", external_llama, "-o", out / "fused.onnx", "--report", out / "report.json", "--force")
    assert result.exit_code == EXIT_BAD_INPUT
    assert _listing(out) == ["fused.onnx"]
    assert (out / "fused.onnx").read_bytes() == b"the user's previous output"


def test_folders_the_call_created_are_removed_too(tmp_path: Path) -> None:
    source = tmp_path / "source"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "w.data").write_bytes(b"weights")
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(RuntimeError), Transaction():
        trtfuse.files.make_folders(out / "sub" / "deeper")
        copy_sparse(source / "sub" / "w.data", out / "sub" / "deeper" / "w.data")
        raise RuntimeError("later failure")
    assert _listing(out) == []


@pytest.mark.parametrize(("signal_number", "status"), [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)])
def test_a_signal_during_the_data_copy_leaves_no_temp_file(
    external_llama: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, signal_number: int, status: int
) -> None:
    out = tmp_path / "out"
    out.mkdir()
    real_write = trtfuse.files.atomic_file

    def interrupted_copy(source: Path, target: Path, notify: object = None) -> None:
        with real_write(target) as temp:
            temp.write_bytes(source.read_bytes()[:100])
            assert _listing(out) == [temp.name]
            os.kill(os.getpid(), signal_number)

    monkeypatch.setattr("trtfuse.model.onnx_file.copy_sparse", interrupted_copy)
    result = _invoke("fuse", external_llama, "-o", out / "fused.onnx")
    assert result.exit_code == status
    assert result.stderr.count("\n") == 1
    assert _listing(out) == []


def test_copies_stay_sparse_and_report_progress(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = tmp_path / "sparse.data"
    with source.open("wb") as file:
        file.truncate(256 << 20)
        file.seek(100 << 20)
        file.write(b"payload")
    monkeypatch.setattr(trtfuse.files, "PROGRESS_BYTES", 1 << 20)
    lines: list[str] = []
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "sparse.data"
    copy_sparse(source, target, lines.append)
    assert target.stat().st_size == source.stat().st_size
    assert target.stat().st_blocks * 512 < (16 << 20)
    with target.open("rb") as file:
        file.seek(100 << 20)
        assert file.read(7) == b"payload"
    assert lines[0] == f"copying external data {source} (268.4 MB) to {target.parent}"
    assert lines[-1].endswith("(100%)")
    assert len(lines) == 11


def test_a_copy_holds_only_the_data_regions_the_filesystem_reports(tmp_path: Path) -> None:
    """65 regions of 8 KiB spread over 66 MiB: the copy holds them and nothing more (the chunks of 8 MiB around each
    region were written whole, 520 MB on disk for 0.5 MB of data in a 13.5 GB file)."""
    source = tmp_path / "sparse.data"
    region = 8 << 10
    with source.open("wb") as file:
        file.truncate(66 << 20)
        for index in range(65):
            file.seek((index << 20) + (256 << 10))
            file.write(bytes([index + 1]) * region)
    with source.open("rb") as file:
        first_data = os.lseek(file.fileno(), 0, os.SEEK_DATA) if hasattr(os, "SEEK_DATA") else 0
    if first_data == 0 or source.stat().st_blocks * 512 > 4 << 20:
        pytest.skip("this filesystem reports no holes (SEEK_DATA finds data at 0), so nothing can stay sparse")
    (tmp_path / "out").mkdir()
    target = tmp_path / "out" / "sparse.data"
    copy_sparse(source, target)
    assert target.read_bytes() == source.read_bytes()
    assert target.stat().st_blocks * 512 <= 2 * 65 * region


def test_the_atomic_writer_restores_a_replaced_file_on_rollback(tmp_path: Path) -> None:
    path = tmp_path / "engine"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), Transaction():
        write_bytes_atomic(path, b"new")
        assert path.read_bytes() == b"new"
        raise RuntimeError("the build failed later")
    assert path.read_bytes() == b"old"
    assert _listing(tmp_path) == ["engine"]


def test_plan_names_both_files(tmp_path: Path) -> None:
    model = tmp_path / "m.onnx"
    onnx.save_model(llama_norm_model(), str(model))
    with pytest.raises(TrtfuseError, match=r"m\.onnx: the engine would overwrite the input .*m\.onnx; choose another"):
        OutputPlan().read(model).write("engine", tmp_path / "." / "m.onnx").check()


def _model_with_large_external_data(folder: Path, size: int) -> Path:
    folder.mkdir()
    with (folder / "weights.data").open("wb") as file:
        chunk = b"\x01" * (8 << 20)
        for _ in range(size // len(chunk)):
            file.write(chunk)
    weight = onnx.TensorProto(name="W", data_type=onnx.TensorProto.UINT8, dims=[size])
    weight.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", "weights.data"), ("offset", "0"), ("length", str(size))):
        weight.external_data.append(onnx.StringStringEntryProto(key=key, value=value))
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["W"], ["y"])],
        "big",
        [],
        [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.UINT8, [size])],
        [weight],
    )
    path = folder / "big.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)]), str(path))
    return path


@pytest.mark.slow
@pytest.mark.parametrize(("signal_number", "status"), [(signal.SIGINT, EXIT_SIGINT), (signal.SIGTERM, EXIT_SIGTERM)])
def test_a_real_signal_during_a_large_copy(tmp_path: Path, signal_number: int, status: int) -> None:
    import subprocess
    import sys
    import time

    model = _model_with_large_external_data(tmp_path / "model", 256 << 20)
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "trtfuse.cli.main", "fuse", str(model), "-o", str(out / "fused.onnx"), "-q"],
        cwd=REPO_ROOT,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not any(name.endswith(".tmp") for name in os.listdir(out)) and time.monotonic() < deadline:
        assert process.poll() is None, "the copy ended before it could be interrupted"
        time.sleep(0.001)
    process.send_signal(signal_number)
    _, stderr = process.communicate(timeout=60)
    assert process.returncode == status, stderr
    assert stderr == f"trtfuse: stopped by {signal.Signals(signal_number).name}\n"
    assert _listing(out) == []


def test_an_inner_transaction_is_undone_with_the_outer_one(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), Transaction():
        with Transaction():
            write_bytes_atomic(tmp_path / "inner", b"written by an inner transaction")
        raise RuntimeError("the outer call fails later")
    assert _listing(tmp_path) == []


def test_a_second_signal_waits_for_the_cleanup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "engine"
    path.write_bytes(b"old")
    real_unlink = Path.unlink

    def unlink_then_interrupt(self: Path, missing_ok: bool = False) -> None:
        real_unlink(self, missing_ok)
        os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(KeyboardInterrupt), Transaction():
        write_bytes_atomic(path, b"new")
        write_bytes_atomic(tmp_path / "sidecar", b"new")
        monkeypatch.setattr(Path, "unlink", unlink_then_interrupt)
        raise RuntimeError("the build failed")
    monkeypatch.undo()
    assert _listing(tmp_path) == ["engine"]
    assert path.read_bytes() == b"old"


def test_a_replaced_symlink_comes_back_as_the_symlink(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    target.write_bytes(b"unrelated")
    link = tmp_path / "engine"
    link.symlink_to(target)
    with pytest.raises(RuntimeError), Transaction():
        write_bytes_atomic(link, b"new")
        raise RuntimeError("the build failed")
    assert link.is_symlink()
    assert target.read_bytes() == b"unrelated"
    assert target.stat().st_nlink == 1


def test_writing_into_a_symlinked_alias_of_the_input_folder_reuses_its_data(
    external_llama: Path, tmp_path: Path
) -> None:
    alias = tmp_path / "alias"
    alias.symlink_to(external_llama.parent)
    result = _invoke("fuse", external_llama, "-o", alias / "fused.onnx")
    assert result.exit_code == 0, result.output
    assert "copying" not in result.stderr
    assert _listing(external_llama.parent) == ["fused.onnx", "llama.onnx", "weights.data"]


def test_external_data_in_a_subfolder_is_copied_into_a_subfolder_made_inside_the_output_folder(tmp_path: Path) -> None:
    """docs/cli.md: external data copied into another folder keeps its location there (`sub/dir/table.bin`); the
    folders it needs are made inside the output folder, and removed again if the call fails."""
    source = tmp_path / "model"
    (source / "sub" / "dir").mkdir(parents=True)
    model = save_external(projection_model(), source / "m.onnx", location="sub/dir/table.bin")
    out = tmp_path / "out"
    out.mkdir()
    result = _invoke("fuse", model, "-o", out / "fused.onnx")
    assert result.exit_code == 0, result.output
    assert _listing(out) == ["fused.onnx", "sub", "sub/dir", "sub/dir/table.bin"]
    assert (out / "sub" / "dir" / "table.bin").read_bytes() == (source / "sub" / "dir" / "table.bin").read_bytes()
    checked = _invoke("check", model, out / "fused.onnx")
    assert checked.exit_code == 0, checked.output


def test_a_subfolder_for_external_data_is_never_made_outside_the_output_folder(tmp_path: Path) -> None:
    """A symlink in the output folder that leads elsewhere: the missing folders would be made there, so the plan
    refuses before anything is written."""
    source = tmp_path / "model"
    (source / "sub" / "dir").mkdir(parents=True)
    model = save_external(projection_model(), source / "m.onnx", location="sub/dir/table.bin")
    out, elsewhere = tmp_path / "out", tmp_path / "elsewhere"
    out.mkdir()
    elsewhere.mkdir()
    (out / "sub").symlink_to(elsewhere)
    result = _invoke("fuse", model, "-o", out / "fused.onnx")
    assert result.exit_code == EXIT_BAD_INPUT
    assert result.stderr == f"trtfuse: error: {out / 'sub' / 'dir' / 'table.bin'}: output folder does not exist\n"
    assert _listing(out) == ["sub"] and _listing(elsewhere) == []
