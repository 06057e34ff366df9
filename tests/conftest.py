"""Shared fixtures: small ONNX models written to a temp folder, with and without external data.

The tests' helpers live in tests/support (model and graph builders, engines on disk, markers, the CLI) and their
TensorRT stand-ins in tests/fakes; this folder is on sys.path, so tests import them as `support.x` and `fakes.x`."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

from support.models import projection_model, save_external

# Kernels compiled by the tests go to a throwaway cache, not the user's; .ci/gpu sets its own to share with the bench.
os.environ.setdefault("TRTFUSE_KERNEL_CACHE", tempfile.mkdtemp(prefix="trtfuse-test-kernel-cache-"))


@pytest.fixture
def external_model(tmp_path: Path) -> Path:
    """The projection model with all weights in `weights.data`, in its own folder."""
    folder = tmp_path / "source"
    folder.mkdir()
    return save_external(projection_model(), folder / "model.onnx")


@pytest.fixture
def write_model(tmp_path: Path) -> Callable[[onnx.ModelProto, str], Path]:
    """Write a model (weights inline) into the test's temp folder."""

    def write(model: onnx.ModelProto, name: str = "model.onnx") -> Path:
        path = tmp_path / name
        onnx.save_model(model, str(path))
        return path

    return write


@pytest.fixture(autouse=True)
def _default_verbosity() -> None:
    """Every test starts at the default verbosity: an earlier in-process call's -q or -v stays set in
    `trtfuse.cli.options.VERBOSITY`, which the `trtfuse` group resets when it starts but a command invoked alone
    does not."""
    from trtfuse.cli.options import VERBOSITY

    VERBOSITY.level = 0
