"""Triton Inference Server's own core, to load the configs `trtfuse triton-config` writes: the `tritonserver` binary
(2.51.0, core r24.10) that the nvidia-pytriton 0.7.0 wheel bundles with its shared libraries, found without importing
pytriton (whose Python dependencies CI does not install).

One server per test module, on 127.0.0.1 only (gRPC; HTTP and metrics off), with its own model repository and log
file, in explicit model-control mode with auto-complete off, so that Triton reads each config exactly as written and
only when asked. The repository has no TensorRT backend: a config that passes the core's validation fails its load
on the missing backend library, and one the core refuses is refused while the repository is polled, with Triton's
reason in the server log (the load's gRPC answer says only that the poll failed).
"""

from __future__ import annotations

import importlib.util
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

PYTRITON = "nvidia-pytriton==0.7.0"
INSTALL = f"pip install --no-deps '{PYTRITON}'"
# How long the server may take to answer ready, a load to answer, and the server to exit once told to.
START_SECONDS = 30.0
LOAD_SECONDS = 30.0
STOP_SECONDS = 15.0


def missing_tensorrt_backend(model: str) -> str:
    """Triton's answer to a load whose config passed the core's validation, in a repository without the TensorRT
    backend (core `src/backend_model.cc`, `TritonModel::Create`: the backend library is looked up after the config
    was validated at poll time)."""
    return (
        f"load failed for model '{model}': version 1 is at UNAVAILABLE state: Invalid argument: unable to find "
        "backend library for backend 'tensorrt', try specifying runtime on the model configuration.;\n"
    )


def tritonserver_folder() -> Path | None:
    """The wheel's `pytriton/tritonserver` folder (bin/tritonserver and its backends), None where it is absent."""
    spec = importlib.util.find_spec("pytriton")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "tritonserver"
    return folder if (folder / "bin" / "tritonserver").is_file() else None


def why_no_tritonserver() -> str | None:
    """Why Triton's own server cannot validate configs here; None where it can."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return (
            f"needs Triton's tritonserver from {PYTRITON}, built for x86-64 Linux only (this is {sys.platform} "
            f"{platform.machine()})"
        )
    if tritonserver_folder() is None:
        return f"needs Triton's tritonserver (2.51.0) from {PYTRITON}: {INSTALL}"
    try:
        from tritonclient.grpc import InferenceServerClient  # noqa: F401
    except (ImportError, RuntimeError):
        return "needs tritonclient[grpc] to talk to tritonserver: pip install -e '.[triton]'"
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class ServerNotStarted(Exception):
    """tritonserver exited or did not answer ready in time; the message ends with its log's last lines."""


class TritonServer:
    """A tritonserver on 127.0.0.1 over the model repository `workdir/models`, logging to `workdir/tritonserver.log`;
    started on entering, always stopped on leaving."""

    def __init__(self, workdir: Path) -> None:
        self.repository = workdir / "models"
        self.log_path = workdir / "tritonserver.log"
        self.repository.mkdir(parents=True)
        self._process: subprocess.Popen | None = None
        self._client = None

    def __enter__(self) -> TritonServer:
        try:
            self._start()
        except BaseException:
            self._stop()
            raise
        return self

    def __exit__(self, kind: type | None, error: BaseException | None, trace: TracebackType | None) -> None:
        self._stop()

    def _start(self) -> None:
        from tritonclient.grpc import InferenceServerClient, InferenceServerException

        folder = tritonserver_folder()
        port = _free_port()
        command = [
            str(folder / "bin" / "tritonserver"),
            f"--model-repository={self.repository}",
            "--model-control-mode=explicit",
            "--disable-auto-complete-config",
            # The wheel's backends (Python only): a TensorRT backend installed elsewhere on the machine is never used.
            f"--backend-directory={folder / 'backends'}",
            "--allow-http=false",
            "--allow-metrics=false",
            "--grpc-address=127.0.0.1",
            f"--grpc-port={port}",
            "--exit-timeout-secs=5",
        ]
        with self.log_path.open("wb") as log:
            # Its own process group: stopping it stops whatever it started too.
            self._process = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._client = InferenceServerClient(f"127.0.0.1:{port}")
        deadline = time.monotonic() + START_SECONDS
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise ServerNotStarted(f"tritonserver exited with status {self._process.returncode}: {self.tail()}")
            try:
                if self._client.is_server_ready(client_timeout=1.0):
                    return
            except InferenceServerException:
                pass
            time.sleep(0.1)
        raise ServerNotStarted(f"tritonserver did not answer ready within {START_SECONDS:.0f} s: {self.tail()}")

    def _stop(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._process is None or self._process.poll() is not None:
            return
        os.killpg(self._process.pid, signal.SIGTERM)
        try:
            self._process.wait(timeout=STOP_SECONDS)
        except subprocess.TimeoutExpired:
            os.killpg(self._process.pid, signal.SIGKILL)
            self._process.wait(timeout=STOP_SECONDS)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def tail(self, lines: int = 5) -> str:
        return " | ".join(self.log().strip().splitlines()[-lines:])

    def add_model(self, folder_name: str, config_text: str, engine: Path) -> None:
        """The repository folder `folder_name` with `config_text` as its config.pbtxt and `engine` as version 1's
        model.plan."""
        folder = self.repository / folder_name
        (folder / "1").mkdir(parents=True)
        (folder / "config.pbtxt").write_text(config_text)
        shutil.copyfile(engine, folder / "1" / "model.plan")

    def load(self, folder_name: str) -> str:
        """Triton's refusal to load the model in `folder_name`: the load's error, or, where the config was refused
        while the repository was polled, the reason the server logged; empty where it loaded."""
        from tritonclient.grpc import InferenceServerException

        try:
            self._client.load_model(folder_name, client_timeout=LOAD_SECONDS)
        except InferenceServerException as error:
            if not error.message().endswith("failed to poll from model repository"):
                return error.message()
            return self._poll_refusal(folder_name) or error.message()
        return ""

    def _poll_refusal(self, folder_name: str) -> str | None:
        """The reason logged for `folder_name`'s failed poll (the line is written before the load answers)."""
        pattern = re.compile(rf"Poll failed for model directory '{re.escape(folder_name)}': (.*)\"$", re.MULTILINE)
        reasons = pattern.findall(self.log())
        return reasons[-1] if reasons else None
