"""The original with the input of every activation quantizer nudged: how far quantizer flips move its outputs.

A fused node rounds differently from the chain it replaces (in float32 and once to the 16-bit dtype, where the
original rounds after every op), so a value it computes can differ from the original's by a few units in the last
place: the dtype's tolerance (`verify.tolerances`). A QuantizeLinear that reads such a value rounds it to a step of
its own, and where the value lies within that tolerance of a rounding boundary the fused model's quantized value is
one step off the original's (FP8 E4M3: 6-12% of the value; INT8: one scale), which moves everything after it.

`nudged_model` gives the original graph one more input, `NUDGE_INPUT` (a float32 scalar d), and multiplies the input
of every QuantizeLinear on a computed value by 1 + d x rtol, in that value's dtype, rtol that of the dtype which
computed it (through Casts). With d = +1 and d = -1 every quantized value within the tolerance of a boundary flips,
up in one run and down in the other, and nothing else changes (a quantizer absorbs a move that crosses no boundary);
d = 0 multiplies by exactly 1: the original. Quantizers of constants (weights) are not nudged: a fusion changes no
weight. Nor is a quantization an op does on the fly (MatMulNBits, DynamicQuantizeLinear): its scale follows the
values, so a uniform nudge moves none of its steps.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse.model.interface import elem_type_name, value_types
from trtfuse.model.onnx_file import DEFAULT_DOMAINS, LoadedModel
from trtfuse.verify.onnxrt import CpuSession, StepFunction
from trtfuse.verify.tolerances import tolerance_for
from trtfuse.verify.verdict import computed_dtypes

NUDGE_INPUT = "trtfuse_quantizer_nudge"
# The runs a measurement makes: the original itself, then every quantizer input nudged up and down.
DIRECTIONS = (0.0, 1.0, -1.0)
_QUANTIZER_DOMAINS = (*DEFAULT_DOMAINS, "com.microsoft")


def activation_quantizers(model: onnx.ModelProto) -> list[int]:
    """The positions in the main graph of the QuantizeLinear nodes whose input is computed from the graph's inputs,
    not from constants alone."""
    constant = {tensor.name for tensor in model.graph.initializer} - {value.name for value in model.graph.input}
    quantizers = []
    for index, node in enumerate(model.graph.node):
        if node.op_type == "QuantizeLinear" and node.domain in _QUANTIZER_DOMAINS and node.input[0] not in constant:
            quantizers.append(index)
        if node.op_type == "Constant" or (node.input and all(not name or name in constant for name in node.input)):
            constant.update(node.output)
    return quantizers


def nudged_model(model: onnx.ModelProto) -> onnx.ModelProto | None:
    """A copy of `model` whose activation quantizers read their input times 1 + d x rtol, d fed as `NUDGE_INPUT`;
    None when it has none (or none whose input dtype is known)."""
    quantizers = activation_quantizers(model)
    _, types = value_types(model)
    computed = computed_dtypes(model, {model.graph.node[index].input[0] for index in quantizers})
    nudged = onnx.ModelProto()
    nudged.CopyFrom(model)
    factors: dict[tuple[int, str], str] = {}
    inputs: dict[str, str] = {}
    nodes: list[onnx.NodeProto] = []
    for index, node in enumerate(nudged.graph.node):
        value = node.input[0] if index in quantizers else ""
        if types.get(value) and value in computed:
            if value not in inputs:
                factor = _factor(factors, nudged, types[value], computed[value])
                inputs[value] = f"{value}/nudged"
                nodes.append(helper.make_node("Mul", [value, factor], [inputs[value]], name=f"{value}/nudge"))
            node.input[0] = inputs[value]
        nodes.append(node)
    if not inputs:
        return None
    del nudged.graph.node[:]
    nudged.graph.node.extend([*_factor_nodes(factors), *nodes])
    nudged.graph.input.append(helper.make_tensor_value_info(NUDGE_INPUT, TensorProto.FLOAT, []))
    return nudged


def _factor(factors: dict[tuple[int, str], str], model: onnx.ModelProto, elem_type: int, computed_in: str) -> str:
    """The name of 1 + d x rtol(`computed_in`) in `elem_type`, its rtol constant added to `model` the first time."""
    key = (elem_type, computed_in)
    if key not in factors:
        name = f"{NUDGE_INPUT}/{computed_in}_as_{elem_type_name(elem_type)}"
        rtol = np.asarray(tolerance_for(computed_in).rtol, dtype=np.float32)
        model.graph.initializer.append(numpy_helper.from_array(rtol, f"{name}/rtol"))
        factors[key] = name
    return factors[key]


def _factor_nodes(factors: dict[tuple[int, str], str]) -> list[onnx.NodeProto]:
    nodes = []
    one = f"{NUDGE_INPUT}/one"
    nodes.append(helper.make_node("Constant", [], [one], name=one, value=numpy_helper.from_array(np.float32(1.0))))
    for (elem_type, _), name in factors.items():
        nodes += [
            helper.make_node("Mul", [NUDGE_INPUT, f"{name}/rtol"], [f"{name}/step"], name=f"{name}/step"),
            helper.make_node("Add", [one, f"{name}/step"], [f"{name}/float32"], name=f"{name}/float32"),
            helper.make_node("Cast", [f"{name}/float32"], [name], name=name, to=elem_type),
        ]
    return nodes


def nudged_session(original: LoadedModel, evaluator: bool) -> CpuSession | None:
    """The nudged original (`nudged_model`), to run as the original runs (`evaluator`: in onnx's reference
    evaluator); None when the original has no activation quantizer."""
    nudged = nudged_model(original.model)
    if nudged is None:
        return None
    return CpuSession(LoadedModel(model=nudged, path=original.path), evaluator=evaluator)


def nudged_step(session: CpuSession, direction: float) -> StepFunction:
    """`session`'s step function with every quantizer input nudged in `direction` (one of `DIRECTIONS`)."""
    nudge = np.asarray(direction, dtype=np.float32)
    return lambda feed: session.run({**feed, NUDGE_INPUT: nudge})
