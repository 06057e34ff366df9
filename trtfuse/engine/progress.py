"""TensorRT's build progress as indented lines: one when a phase starts, one when it ends."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import ModuleType


class BuildProgress:
    """Turns TensorRT's progress callbacks into indented lines: one when a phase starts, one when it ends.

    TensorRT calls these from its own threads, hence the lock.
    """

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._lock = threading.Lock()
        self._depth: dict[str, int] = {}
        self._started: dict[str, float] = {}

    def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
        with self._lock:
            depth = self._depth.get(parent_phase, -1) + 1 if parent_phase else 0
            self._depth[phase_name] = depth
            self._started[phase_name] = time.monotonic()
            self._emit(f"{'  ' * depth}{phase_name} ({num_steps} steps)")

    def step_complete(self, phase_name: str, step: int) -> bool:
        # True lets the build go on; False would cancel it.
        return True

    def phase_finish(self, phase_name: str) -> None:
        with self._lock:
            depth = self._depth.pop(phase_name, 0)
            seconds = time.monotonic() - self._started.pop(phase_name, time.monotonic())
            self._emit(f"{'  ' * depth}{phase_name} done in {seconds:.1f} s")


def progress_monitor(trt: ModuleType, progress: BuildProgress) -> object:
    class ProgressMonitor(trt.IProgressMonitor):
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            progress.phase_start(phase_name, parent_phase, num_steps)

        def step_complete(self, phase_name: str, step: int) -> bool:
            return progress.step_complete(phase_name, step)

        def phase_finish(self, phase_name: str) -> None:
            progress.phase_finish(phase_name)

    return ProgressMonitor()
