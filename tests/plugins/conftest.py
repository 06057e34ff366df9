"""The plugin tests' kernels: a recorder in place of every kernel the plugins ask trtfuse.kernels for."""

from __future__ import annotations

from typing import Any

import pytest

from support.host_kernels import HOST_KERNELS, HostKernel
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
    monkeypatch.setattr(trtfuse.kernels, "get_qk_norm_rope", make)
    return made


@pytest.fixture
def host_kernels(monkeypatch: pytest.MonkeyPatch) -> list[HostKernel]:
    """Every kernel the plugins ask trtfuse.kernels for, as a CPU stand-in that computes through the raw pointers."""
    import trtfuse.kernels

    made: list[HostKernel] = []
    for factory, kind in HOST_KERNELS.items():

        def make(spec: Any, kind: type[HostKernel] = kind) -> HostKernel:
            made.append(kind(spec))
            return made[-1]

        monkeypatch.setattr(trtfuse.kernels, factory, make)
    return made
