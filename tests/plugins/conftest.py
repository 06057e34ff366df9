"""The plugin tests' kernels: a recorder in place of every kernel the plugins ask trtfuse.kernels for."""

from __future__ import annotations

from typing import Any

import pytest

from support.plugin_fields import RecordingKernel


@pytest.fixture
def kernels(monkeypatch: pytest.MonkeyPatch) -> list[RecordingKernel]:
    """Every kernel the plugins ask trtfuse.kernels for, in order; the specs are trtfuse.kernels' real classes."""
    import trtfuse.kernels

    made: list[RecordingKernel] = []

    def make(spec: Any) -> RecordingKernel:
        made.append(RecordingKernel(spec))
        return made[-1]

    monkeypatch.setattr(trtfuse.kernels, "get_rms_norm", make)
    monkeypatch.setattr(trtfuse.kernels, "get_qk_norm", make)
    monkeypatch.setattr(trtfuse.kernels, "get_add_rms_norm", make)
    return made
