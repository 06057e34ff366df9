"""stdout as the docs promise it (docs/cli.md, "Options every command has" and "Exit statuses"): a stdout that cannot
be written ends the call in one line and exit 2, never a traceback; `--json` writes one whole object, even when the
call is interrupted while it prints."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import click
import onnx
import pytest

from trtfuse.cli import options
from trtfuse.cli.options import EXIT_BAD_INPUT

from support.cli import run_cli
from support.graphs import Builder, NormSpec, rms_norm
from support.paths import FIXTURES, REPO_ROOT

EXIT_SIGINT = 128 + signal.SIGINT
KV_FIXTURE = FIXTURES / "kv" / "qwen3-dynamo-fp32-kv.onnx"


@pytest.fixture
def kv_path() -> Path:
    return KV_FIXTURE


def _to_full_disk(*args: object) -> subprocess.CompletedProcess:
    """`trtfuse ARGS...` with stdout on /dev/full, where every write fails with ENOSPC."""
    with open("/dev/full", "w") as full:
        return subprocess.run(
            [sys.executable, "-c", "from trtfuse.cli.main import main; main()", *map(str, args)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO_ROOT,
            check=False,
        )


@pytest.mark.parametrize(
    "command",
    [
        ("generate", "{kv}", "--steps", "2", "--json"),
        ("generate", "{kv}", "--steps", "2"),
        ("check", "{kv}", "{kv}", "--generate", "2", "--json"),
        ("inspect", "{kv}"),
        ("triton-config", "{missing}", "--json"),
    ],
    ids=["generate-json", "generate-text", "check-generate-json", "inspect", "triton-config-refusal-json"],
)
def test_a_full_stdout_ends_in_one_line(command: tuple[str, ...], kv_path: Path, tmp_path: Path) -> None:
    args = [part.format(kv=kv_path, missing=tmp_path / "none.engine") for part in command]
    completed = _to_full_disk(*args)
    assert completed.returncode == EXIT_BAD_INPUT, completed.stderr
    assert "Traceback" not in completed.stderr
    assert completed.stderr.splitlines()[-1] == "trtfuse: error: cannot write to stdout: No space left on device"


def test_a_full_stdout_keeps_no_saved_inputs(kv_path: Path, tmp_path: Path) -> None:
    """The result was not delivered, so the call failed: what it wrote is removed, as after a full disk for a file."""
    saved = tmp_path / "inputs.npz"
    completed = _to_full_disk("check", kv_path, kv_path, "--save-inputs", saved, "--json")
    assert completed.returncode == EXIT_BAD_INPUT, completed.stderr
    assert not saved.exists()


def test_an_interruption_while_the_json_prints_leaves_one_whole_object(kv_path: Path, monkeypatch) -> None:
    """SIGINT arriving halfway through the object: the object is finished, then the call ends as interrupted."""
    echo = click.echo

    def interrupted_halfway(text: str, **kwargs: object) -> None:
        echo(text[: len(text) // 2], nl=False)
        signal.raise_signal(signal.SIGINT)
        echo(text[len(text) // 2 :], **kwargs)

    monkeypatch.setattr(options.click, "echo", interrupted_halfway)
    result = run_cli("inspect", kv_path, "--json")
    monkeypatch.undo()
    assert result.exit_code == EXIT_SIGINT
    assert "rms_norms" in json.loads(result.stdout)


def _many_norms(path: Path, norms: int) -> Path:
    """A chain of `norms` RMSNorms: its fusion report is far larger than a pipe holds (64 KiB)."""
    b = Builder()
    x = b.input("x", [2, 3, 64])
    for _ in range(norms):
        x = rms_norm(b, x, NormSpec())
    b.output(x)
    onnx.save(b.model(), str(path))
    return path


def test_an_interruption_while_a_slow_reader_takes_the_json_leaves_one_whole_object(tmp_path: Path) -> None:
    """`fuse --json` piped to a reader that does not read, SIGINT while the object waits in the pipe: the whole
    object comes out, then exit 130. A write to a pipe that a signal interrupts returns short, and Python's buffered
    stdout dropped the rest: the first 64 KiB of a 170 kB object came out, and no error object either."""
    model = _many_norms(tmp_path / "many.onnx", norms=300)
    process = subprocess.Popen(
        [sys.executable, "-c", "from trtfuse.cli.main import main; main()", "fuse", str(model), "-o",
         str(tmp_path / "fused.onnx"), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
        bufsize=0,
    )  # fmt: skip
    # The object has begun (one byte read, no more); the pipe fills up, and the writer waits inside the write.
    first = process.stdout.read(1)
    process.send_signal(signal.SIGINT)
    rest, stderr = process.communicate(timeout=300)
    assert process.returncode == EXIT_SIGINT, stderr
    report = json.loads(first + rest)
    assert len(first + rest) > 1 << 17 and len(report["fused"]) == 300


def test_onnx_graphsurgeon_never_prints_on_stdout(kv_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its logger prints with print(): while the pass runs, its errors go to stderr and its warnings nowhere, so
    `--json` stdout stays the one object (a tensor name used twice once put ~50 warning lines there)."""
    from onnx_graphsurgeon.logger import G_LOGGER

    from trtfuse.fusion import fuse

    search = fuse.find_norms

    def logging_search(*args: object, **kwargs: object) -> object:
        G_LOGGER.warning("a warning of graphsurgeon's")
        G_LOGGER.error("an error of graphsurgeon's")
        return search(*args, **kwargs)

    monkeypatch.setattr(fuse, "find_norms", logging_search)
    result = run_cli("inspect", kv_path, "--json")
    assert result.exit_code == 0, result.output
    assert "rms_norms" in json.loads(result.stdout)
    assert "an error of graphsurgeon's" in result.stderr and "a warning of graphsurgeon's" not in result.output
