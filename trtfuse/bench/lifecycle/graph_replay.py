"""Several plugins' enqueues captured into one CUDA graph, replayed with fresh inputs and checked after each replay."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from trtfuse.bench.lifecycle.cases import NormCase
from trtfuse.bench.lifecycle.outputs import OutputCheck, check_outputs
from trtfuse.bench.lifecycle.phases import build_phase, enqueue, runtime_phase, shape_change
from trtfuse.bench.lifecycle.tensors import device_tensors
from trtfuse.plugins.python.creators import CREATORS


@dataclass
class GraphReplay:
    """Outputs of every plugin after each replay of one captured CUDA graph, with fresh inputs before each."""

    checks: list[list[OutputCheck]]  # per replay, every output of every plugin
    guards_intact: bool

    @property
    def passed(self) -> bool:
        return self.guards_intact and all(c.passed for replay in self.checks for c in replay)


def graph_replay(cases: Sequence[NormCase], replays: int = 2, seed: int = 100) -> GraphReplay:
    """Capture one enqueue per case, in order, into a CUDA graph on a side stream, then replay it with new inputs.

    Where a case's first activation has the shape and dtype of the previous case's first output, it reads that
    output: the graph is a chain, as in a network. Each plugin is prepared as TensorRT prepares it before a
    capture (build phase, runtime re-creation, on_shape_change, one eager enqueue).
    """
    import torch

    stream = torch.cuda.Stream()
    steps = []
    for index, case in enumerate(cases):
        creator = CREATORS[case.config.op.name]()
        plugin, _clone = runtime_phase(creator, build_phase(creator, case))
        shapes = case.runs[0]
        tensors = device_tensors(case, shapes, seed + index)
        if steps:
            previous = steps[-1][2].outputs[0]
            if previous.shape == tensors.inputs[0].shape and previous.dtype == tensors.inputs[0].dtype:
                tensors.inputs[0] = previous
        descs = shape_change(plugin, case, shapes)
        torch.cuda.synchronize()  # the tensors were written on the default stream
        enqueue(plugin, descs, tensors, stream.cuda_stream)
        steps.append((plugin, descs, tensors, case))
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        capture_stream = torch.cuda.current_stream().cuda_stream
        for plugin, descs, tensors, _case in steps:
            enqueue(plugin, descs, tensors, capture_stream)
    generator = torch.Generator().manual_seed(seed)
    checks = []
    for _ in range(replays):
        for _plugin, _descs, tensors, _case in steps:
            tensors.refill(generator)
        torch.cuda.synchronize()
        graph.replay()
        torch.cuda.synchronize()
        checks.append([check for _p, _d, tensors, case in steps for check in check_outputs(case, tensors)])
    guards = all(tensors.guards_intact() for _p, _d, tensors, _c in steps)
    for plugin, *_rest in steps:
        plugin.destroy()
    return GraphReplay(checks, guards)
