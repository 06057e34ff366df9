"""prepare_for_aot: a fused model's trtfuse nodes as TensorRT's ONNX parser must see them to build AOT plugins.

The file `trtfuse fuse` writes is unchanged; the copy made here for an AOT build differs in three ways
(docs/plugin-nodes.md, "AOT plugins"):

- every node carries every field its QDP registers (`contract.AOT_FIELDS`), `output_dtype` filled from the
  activation's dtype where a model written before that attribute lacks it: tensorrt.plugin hands the fields to
  aot_impl by position, so a missing one would shift the rest into the wrong parameters;
- weight_mode NONE nodes get a placeholder weight per activation (zeros of `[H]`, never read), since a QDP's input
  count is fixed by its signature;
- the parser's `aot` attribute is 1, which asks for the AOT implementation.

Imports onnx, not TensorRT: it runs before the parser, and its tests run anywhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from trtfuse import contract
from trtfuse.errors import TrtfuseError
from trtfuse.fused_checks import check_fused_nodes, dtype_name
from trtfuse.model_io import LoadedModel

_ACTIVATION_COUNTS = {contract.RMS_NORM_OP: 1, contract.QK_NORM_OP: 2}
_HIDDEN_FIELDS = {
    contract.RMS_NORM_OP: (contract.ATTR_HIDDEN,),
    contract.QK_NORM_OP: (contract.ATTR_Q_HIDDEN, contract.ATTR_K_HIDDEN),
}
_LOOKUP_ATTRIBUTES = {
    contract.ATTR_NAMESPACE: contract.PLUGIN_NAMESPACE,
    contract.ATTR_VERSION: contract.PLUGIN_VERSION,
}
_DTYPE_BY_CODE = {code: name for name, code in contract.OUTPUT_DTYPE_CODES.items()}
PLACEHOLDER_PREFIX = "trtfuse_aot_placeholder_weight"


def prepare_for_aot(model: onnx.ModelProto, source: str | Path = "the fused model") -> onnx.ModelProto:
    """A copy of `model` whose trtfuse nodes TensorRT's ONNX parser builds as AOT plugins; `model` is not touched.

    Nodes are checked as `trtfuse check` checks them (fused_checks.check_fused_nodes), plus what AOT needs: the input
    count that weight_mode implies, the lookup attributes naming trtfuse, and a dtype pair inside the contract. Each
    problem is a TrtfuseError of one line naming `source` and the node.
    """
    check_fused_nodes(LoadedModel(model, Path(source)))
    prepared = onnx.ModelProto()
    prepared.CopyFrom(model)
    dtypes = _ElemTypes(prepared)
    placeholders = _Placeholders(prepared.graph)
    for node in prepared.graph.node:
        if node.domain == contract.ONNX_DOMAIN:
            _prepare_node(node, f"{source}: node '{_label(node)}'", dtypes, placeholders)
    return prepared


def _label(node: onnx.NodeProto) -> str:
    return node.name or (node.output[0] if node.output else "")


def _prepare_node(node: onnx.NodeProto, where: str, dtypes: _ElemTypes, placeholders: _Placeholders) -> None:
    values = {attribute.name: helper.get_attribute_value(attribute) for attribute in node.attribute}
    for name, expected in _LOOKUP_ATTRIBUTES.items():
        given = values.get(name, expected.encode())
        if given != expected.encode():
            shown = given.decode(errors="replace") if isinstance(given, bytes) else given
            raise TrtfuseError(f"{where}: attribute {name} is {shown!r}, not the string {expected!r}")
    mode = contract.WeightMode(values[contract.ATTR_WEIGHT_MODE])
    activations = _ACTIVATION_COUNTS[node.op_type]
    inputs = activations if mode is contract.WeightMode.NONE else 2 * activations
    if len(node.input) != inputs:
        raise TrtfuseError(
            f"{where}: {node.op_type} with weight_mode {mode.name} takes {inputs} input(s), not {len(node.input)}"
        )
    output_code = values.get(contract.ATTR_OUTPUT_DTYPE)
    activation_dtype = _activation_dtype(node, where, dtypes, activations)
    if output_code is None:
        if activation_dtype is None:
            raise TrtfuseError(
                f"{where}: has no {contract.ATTR_OUTPUT_DTYPE} attribute and the dtype of its input "
                f"'{node.input[0]}' is unknown"
            )
        output_code = contract.OUTPUT_DTYPE_CODES[activation_dtype]
    elif activation_dtype is not None:
        problem = contract.dtype_pair_problem(activation_dtype, _DTYPE_BY_CODE[output_code])
        if problem is not None:
            raise TrtfuseError(f"{where}: {problem}")
    if mode is contract.WeightMode.NONE:
        node.input.extend(placeholders.weight(values[name]) for name in _HIDDEN_FIELDS[node.op_type])
    _order_attributes(node, output_code)


def _activation_dtype(node: onnx.NodeProto, where: str, dtypes: _ElemTypes, activations: int) -> str | None:
    """The activations' one dtype (None when unknown); q and k must share it, and it must be a contract dtype."""
    known = {name: dtype for name in node.input[:activations] if (dtype := dtypes.of(name)) is not None}
    for name, dtype in known.items():
        if dtype not in contract.ACTIVATION_DTYPES:
            raise TrtfuseError(
                f"{where}: input '{name}' is {dtype}, not one of {', '.join(contract.ACTIVATION_DTYPES)}"
            )
    if len(set(known.values())) > 1:
        described = ", ".join(f"'{name}' {dtype}" for name, dtype in known.items())
        raise TrtfuseError(f"{where}: its activations must share one dtype, got {described}")
    return known.get(node.input[0])


def _order_attributes(node: onnx.NodeProto, output_code: int) -> None:
    """The lookup attributes, then every registered field in registration order, then any others, then `aot`."""
    given = {attribute.name: _copied(attribute) for attribute in node.attribute}
    for name, value in _LOOKUP_ATTRIBUTES.items():
        given.setdefault(name, helper.make_attribute(name, value))
    given.setdefault(contract.ATTR_OUTPUT_DTYPE, helper.make_attribute(contract.ATTR_OUTPUT_DTYPE, output_code))
    fields = contract.AOT_FIELDS[node.op_type]
    ordered = [given[name] for name in (*_LOOKUP_ATTRIBUTES, *fields)]
    placed = {*_LOOKUP_ATTRIBUTES, *fields, contract.ATTR_AOT}
    ordered += [attribute for name, attribute in given.items() if name not in placed]
    ordered.append(helper.make_attribute(contract.ATTR_AOT, 1))
    del node.attribute[:]
    node.attribute.extend(ordered)


def _copied(attribute: onnx.AttributeProto) -> onnx.AttributeProto:
    copy = onnx.AttributeProto()
    copy.CopyFrom(attribute)
    return copy


class _ElemTypes:
    """Element types of the graph's tensors: those declared, then (once, only if asked for one that is not) those
    ONNX shape inference finds; shape inference skips the trtfuse ops, whose outputs are declared anyway."""

    def __init__(self, model: onnx.ModelProto) -> None:
        self._model = model
        self._types = _declared_types(model.graph)
        self._inferred = False

    def of(self, tensor: str) -> str | None:
        if tensor not in self._types and not self._inferred:
            self._inferred = True
            try:
                inferred = onnx.shape_inference.infer_shapes(self._model)
            except (onnx.shape_inference.InferenceError, onnx.checker.ValidationError, ValueError):
                return None
            self._types = {**_declared_types(inferred.graph), **self._types}
        code = self._types.get(tensor)
        return dtype_name(code) if code else None


def _declared_types(graph: onnx.GraphProto) -> dict[str, int]:
    types = {
        value.name: value.type.tensor_type.elem_type
        for value in [*graph.value_info, *graph.input, *graph.output]
        if value.type.HasField("tensor_type") and value.type.tensor_type.elem_type
    }
    types.update({tensor.name: tensor.data_type for tensor in graph.initializer})
    return types


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
