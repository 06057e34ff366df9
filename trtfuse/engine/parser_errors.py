"""TensorRT's ONNX parser errors as one line: the first error, the node it names, and, for a trtfuse node, what
the plugin itself said (the parser only says "Could not create the plugin")."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx

from trtfuse import contract

# What onnx-tensorrt's FallbackPluginImporter says when no creator has the node's name, version and namespace.
PLUGIN_NOT_FOUND = "Plugin not found"


@dataclass(frozen=True)
class ParserIssue:
    """One error of TensorRT's ONNX parser, read off its IParserError."""

    node_index: int
    node_name: str
    op_type: str
    description: str


def parser_error_line(
    model_path: Path, issues: Sequence[ParserIssue], model: onnx.ModelProto, plugin_errors: Sequence[str] = ()
) -> str:
    """One line for a failed parse: the first error, the node it names, and how many more there were.

    `plugin_errors` are the messages of trtfuse plugin creations that failed during the parse: TensorRT's parser
    says only "Could not create the plugin", the plugin knows which field is wrong.
    """
    if not issues:
        return f"{model_path}: TensorRT's ONNX parser rejected the model without saying why"
    first = issues[0]
    name, op_type = first.node_name, first.op_type
    if not name and 0 <= first.node_index < len(model.graph.node):
        node = model.graph.node[first.node_index]
        name, op_type = node.name, op_type or node.op_type
    if name:
        where = f"node '{name}' ({op_type})" if op_type else f"node '{name}'"
    elif first.node_index >= 0:
        where = f"node #{first.node_index}"
    else:
        where = "the graph"
    description = first.description.strip().splitlines()[0] if first.description.strip() else "no description"
    hint = ""
    if op_type in contract.FUSED_OPS:
        if PLUGIN_NOT_FOUND in description:
            hint = f"; is the '{op_type}' plugin registered in namespace '{contract.PLUGIN_NAMESPACE}'?"
        elif plugin_errors:
            hint = f"; the plugin said: {plugin_errors[0]}"
        else:
            hint = "; the plugin's own message is in TensorRT's log above"
    more = f" (and {len(issues) - 1} more parser errors)" if len(issues) > 1 else ""
    return f"{model_path}: TensorRT's ONNX parser failed at {where}: {description}{hint}{more}"
