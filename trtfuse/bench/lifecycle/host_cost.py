"""The host's cost of one enqueue, beside that of the bare kernel launch under it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trtfuse.bench.lifecycle.tensors import DeviceTensors
from trtfuse.plugins.python.base import NormPlugin


@dataclass(frozen=True)
class HostCost:
    """Median host time of one call, in µs: through the plugin's enqueue, and of the bare kernel launch under it."""

    enqueue_us: float
    launch_us: float


def host_cost(
    plugin: NormPlugin,
    descs: tuple[list[Any], list[Any]],
    tensors: DeviceTensors,
    stream: Any,
    calls: int = 400,
    synchronize: Callable[[], None] | None = None,
) -> HostCost:
    """Time `calls` enqueues one by one (synchronising every 100 so the launch queue never fills up). `synchronize`
    waits for the device (None: torch.cuda.synchronize)."""
    if synchronize is None:
        import torch

        synchronize = torch.cuda.synchronize
    handle = stream.cuda_stream
    inputs, outputs = tensors.input_ptrs, tensors.output_ptrs
    bare_args = plugin.launch_args(inputs, outputs, handle)
    kernel_launch = plugin.kernel.launch

    def median_us(call: Any) -> float:
        samples = []
        for i in range(calls):
            if i % 100 == 0:
                synchronize()
            start = time.perf_counter_ns()
            call()
            samples.append(time.perf_counter_ns() - start)
        synchronize()
        return statistics.median(samples) / 1000.0

    for _ in range(20):
        plugin.enqueue(descs[0], descs[1], inputs, outputs, 0, handle)
    return HostCost(
        enqueue_us=median_us(lambda: plugin.enqueue(descs[0], descs[1], inputs, outputs, 0, handle)),
        launch_us=median_us(lambda: kernel_launch(*bare_args)),
    )
