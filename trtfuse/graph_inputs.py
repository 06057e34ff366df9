"""The graph inputs a caller feeds: every graph input but the initializers old exporters list as inputs too."""

from __future__ import annotations

import onnx


def fed_inputs(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    """The main graph's inputs that are not initializers, in the graph's order."""
    initializers = {tensor.name for tensor in model.graph.initializer}
    return [value for value in model.graph.input if value.name not in initializers]
