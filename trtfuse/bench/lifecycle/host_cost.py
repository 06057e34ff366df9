"""The host's cost of one enqueue, beside that of the bare kernel launch under it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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
    bare_args = launch_args(plugin, inputs, outputs, handle)
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


def launch_args(plugin: NormPlugin, inputs: Sequence[int], outputs: Sequence[int], stream: int) -> tuple[int, ...]:
    """The kernel-launch arguments enqueue passes, for any op: the activations, one weight per part (0 each without
    weights), the outputs, one row count per part (its first activation's: the others have its shape), the stream.
    RMSNorm: (x, w, y, rows, stream); QK-norm: (q, k, q_w, k_w, q_out, k_out, q_rows, k_rows, stream); add-norm:
    (x, residual, w, y, h, rows, stream)."""
    op = plugin.OP
    activations, parts = len(op.activations), len(op.weights)
    weights = tuple(inputs[activations:]) if len(inputs) > activations else (0,) * parts
    rows = tuple(plugin.rows[op.activation_parts.index(part)] for part in range(parts))
    return (*inputs[:activations], *weights, *outputs, *rows, stream)
