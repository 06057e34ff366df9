"""prepare_for_aot: a fused model's trtfuse nodes as TensorRT's ONNX parser must see them to build AOT plugins.

The file `trtfuse fuse` writes is unchanged; the copy made here for an AOT build differs in three ways
(docs/plugin-nodes.md, "AOT plugins"):

- every node's attributes are the lookup strings, then every field in the op's field order (tensorrt.plugin hands
  the fields to aot_impl by position);
- weight_mode NONE nodes get a placeholder weight per part (zeros of `[H]`, never read) after the activations (before
  a rotary op's cos and sin), since a QDP's input count is fixed by its signature;
- the parser's `aot` attribute is 1, which asks for the AOT implementation.

Imports onnx, not TensorRT: it runs before the parser, and its tests run anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtfuse import contract
from trtfuse.fusion.fused_nodes import PluginNode, plugin_nodes

PLACEHOLDER_PREFIX = "trtfuse_aot_placeholder_weight"


def prepare_for_aot(model: onnx.ModelProto, source: str | Path = "the fused model") -> onnx.ModelProto:
    """A copy of `model` whose trtfuse nodes TensorRT's ONNX parser builds as AOT plugins; `model` is not touched.

    The nodes are read as `trtfuse check` reads them (`fusion.fused_nodes.plugin_nodes`: fields, input counts,
    dtypes, hidden sizes), each problem one line naming `source` and the node."""
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    placeholders = _Placeholders(prepared.graph)
    plugins = iter(plugin_nodes(prepared, source))
    for node in prepared.graph.node:
        if node.domain == contract.ONNX_DOMAIN:
            _prepare_node(node, next(plugins), placeholders)
    return prepared


def _prepare_node(node: onnx.NodeProto, plugin: PluginNode, placeholders: _Placeholders) -> None:
    fields = plugin.fields
    if not fields.has_weight:
        weights = [placeholders.weight(hidden) for hidden in fields.hidden_sizes]
        inputs = [*plugin.activations, *weights, *plugin.tables]
        del node.input[:]
        node.input.extend(inputs)
    ordered = [helper.make_attribute(name, value) for name, value in fields.onnx_attributes().items()]
    placed = {*fields.onnx_attributes(), contract.ATTR_AOT}
    ordered += [_copied(attribute) for attribute in node.attribute if attribute.name not in placed]
    ordered.append(helper.make_attribute(contract.ATTR_AOT, 1))
    del node.attribute[:]
    node.attribute.extend(ordered)


def _copied(attribute: onnx.AttributeProto) -> onnx.AttributeProto:
    copy = onnx.AttributeProto()
    copy.CopyFrom(attribute)
    return copy


class _Placeholders:
    """One placeholder weight initializer per width, shared by every node that needs one of that width."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self._graph = graph
        self._by_width: dict[int, str] = {}
        self._taken = {
            *(tensor.name for tensor in graph.initializer),
            *(value.name for value in [*graph.input, *graph.output, *graph.value_info]),
            *(name for node in graph.node for name in [*node.input, *node.output]),
        }

    def weight(self, width: int) -> str:
        if width not in self._by_width:
            name = f"{PLACEHOLDER_PREFIX}_{width}"
            suffix = 0
            while name in self._taken:
                suffix += 1
                name = f"{PLACEHOLDER_PREFIX}_{width}_{suffix}"
            self._taken.add(name)
            zeros = np.zeros(width, dtype=np.dtype(contract.AOT_PLACEHOLDER_WEIGHT_DTYPE))
            self._graph.initializer.append(numpy_helper.from_array(zeros, name))
            self._by_width[width] = name
        return self._by_width[width]
