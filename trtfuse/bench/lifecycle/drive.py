"""One case's whole lifecycle on the GPU (or on the CPU with a stand-in kernel): build, runtime re-creation, attach and
clone, runs checked against the reference, host cost, destroy."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.cases import NormCase, Shape
from trtfuse.bench.lifecycle.host_cost import HostCost, host_cost
from trtfuse.bench.lifecycle.outputs import OutputCheck, check_outputs
from trtfuse.bench.lifecycle.phases import BuildPhase, build_phase, enqueue, runtime_phase, shape_change
from trtfuse.bench.lifecycle.tensors import device_tensors
from trtfuse.plugins.python.creators import CREATORS


@dataclass
class RunResult:
    shapes: tuple[Shape, ...]
    plugin: str  # which per-context plugin enqueued: "attached" or its "clone"
    checks: list[OutputCheck]
    guards_intact: bool


@dataclass
class LifecycleReport:
    case: NormCase
    build: BuildPhase
    runs: list[RunResult]
    host: HostCost

    @property
    def passed(self) -> bool:
        return all(run.guards_intact and all(c.passed for c in run.checks) for run in self.runs)


@dataclass(frozen=True)
class HostStream:
    """A CPU run's stream: a non-zero handle the plugin passes through to the (stand-in) kernel, nothing to wait for."""

    cuda_stream: int = 0x5EED

    def synchronize(self) -> None:
        return None


def drive(case: NormCase, seed: int = 0, device: str = "cuda") -> LifecycleReport:
    """The full documented order on the GPU: build phase, runtime re-creation, attach and clone, then per run
    on_shape_change and an enqueue on a side stream (runs alternate between the attached plugin and its clone),
    checked against the reference; host cost at the last run's shapes; destroy.

    `device="cpu"` runs the same order on host memory with a `HostStream`: for a stand-in kernel (the CPU tests) that
    reads and writes through the raw pointers enqueue hands it; the real kernels need the GPU."""
    if device == "cuda":
        import torch

        stream: Any = torch.cuda.Stream()
        synchronize: Callable[[], None] = torch.cuda.synchronize
    else:
        stream = HostStream()
        synchronize = stream.synchronize
    creator = CREATORS[case.config.op.name]()
    build = build_phase(creator, case)
    attached, clone = runtime_phase(creator, build)
    runs = []
    for index, shapes in enumerate(case.runs):
        role, plugin = (("attached", attached), ("clone", clone))[index % 2]
        tensors = device_tensors(case, shapes, seed + index, device)
        descs = shape_change(plugin, case, shapes)
        synchronize()
        enqueue(plugin, descs, tensors, stream.cuda_stream)
        stream.synchronize()
        runs.append(RunResult(shapes, role, check_outputs(case, tensors), tensors.guards_intact()))
    cost = host_cost(plugin, descs, tensors, stream, synchronize=synchronize)
    for plugin in (attached, clone, build.plugin):
        plugin.destroy()
    return LifecycleReport(case, build, runs, cost)
