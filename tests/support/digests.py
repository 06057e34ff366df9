"""Digests of what the fusion pass wrote and reported, recorded by an earlier commit's package: the tests that hold an
option's output to what the pass wrote before that option's feature existed (tests/fusion/test_no_fuse_*.py)."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
from pathlib import Path

import pytest

# The bytes depend on these packages too: a recording holds only where their versions are the recorded ones.
PACKAGES = ("onnx", "onnx_graphsurgeon", "protobuf")


def environment() -> dict[str, str]:
    return {package: importlib.metadata.version(package) for package in PACKAGES}


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def outcome(result: object) -> dict[str, str]:
    """A fusion's fused model and JSON report (keys sorted), as SHA-256, and its summary line."""
    report = json.dumps(result.report(), sort_keys=True)
    return {
        "model": sha256(result.model.SerializeToString()),
        "report": sha256(report.encode()),
        "line": result.counts().line(),
    }


def recorded(path: Path) -> dict:
    """The outcomes recorded in `path`; the test skips where the packages are not the recorded versions."""
    recording = json.loads(path.read_text())
    if recording["environment"] != environment():
        pytest.skip(f"recorded with {recording['environment']}, this is {environment()}")
    return recording["outcomes"]


def write_outcomes(out: Path, outcomes: dict) -> None:
    out.write_text(json.dumps({"environment": environment(), "outcomes": outcomes}, indent=1, sort_keys=True) + "\n")
