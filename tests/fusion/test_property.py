"""Property test: on randomly built graphs the pass never crashes, fuses exactly the real RMSNorms, and never changes
the numerics (onnxruntime: original against fused-then-lowered).

A graph is a random prefix chain, then segments, each a real RMSNorm in a random spelling, a near miss (one condition
broken), or a random chain of elementwise ops and reductions. Ops after the first norm are well conditioned (no
division by a variable, no root, no fp16 round trip), so the last-place differences a fused norm may introduce stay
within the dtype's tolerance; anything the pass does not fuse must come out within that same tolerance, which a
wrongly fused near miss does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from trtfuse.fusion.fuse import fuse_model
from trtfuse.model.onnx_file import LoadedModel
from trtfuse.verify.check import CheckInputs, check_fused

OPSET = 18
BATCH, TOKENS = 2, 3
ANY_OPS = ("Pow", "Mul", "Add", "Sub", "Div", "Sqrt", "Reciprocal", "ReduceMean", "ReduceSum", "Cast")
WELL_CONDITIONED_OPS = ("Pow", "Mul", "Add", "Sub", "Div", "ReduceMean", "ReduceSum")
LINEAR_OPS = ("Mul", "Add", "Sub", "Div")
NEAR_MISSES = (
    "exponent_3",
    "numerator_2",
    "epsilon_outside_root",
    "reduce_non_last_axis",
    "layer_norm",
    "layer_norm_sum_mean",
    "intermediate_is_output",
    "variable_weight",
)
# A near miss whose broken part follows a complete weightless RMSNorm, which is fused on its own.
NEAR_MISSES_WITH_A_NORM_INSIDE = {"variable_weight"}


@dataclass
class GraphBuilder:
    """Accumulates nodes and constants; every op gets a fresh output name."""

    hidden: int
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    initializers: list[onnx.TensorProto] = field(default_factory=list)
    extra_outputs: list[onnx.ValueInfoProto] = field(default_factory=list)
    count: int = 0

    def name(self, stem: str) -> str:
        self.count += 1
        return f"{stem}_{self.count}"

    def const(self, value: float | np.ndarray, dtype: type = np.float32) -> str:
        name = self.name("c")
        self.initializers.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: object) -> str:
        output = self.name(op_type.lower())
        self.nodes.append(helper.make_node(op_type, inputs, [output], name=output, **attrs))
        return output

    def cast(self, tensor: str, to: int) -> str:
        return self.op("Cast", [tensor], to=to)

    def reduce(self, op_type: str, tensor: str, axis: int = -1) -> str:
        return self.op(op_type, [tensor, self.const([axis], np.int64)], keepdims=1)

    def mark_output(self, tensor: str, elem_type: int, last_dim: int) -> None:
        shape = [BATCH, TOKENS, last_dim]
        self.extra_outputs.append(helper.make_tensor_value_info(tensor, elem_type, shape))


@st.composite
def constants(draw: st.DrawFn) -> float:
    magnitude = draw(st.floats(0.5, 2.0))
    return magnitude if draw(st.booleans()) else -magnitude


@st.composite
def random_chain(draw: st.DrawFn, builder: GraphBuilder, tensor: str, ops: tuple[str, ...]) -> str:
    """1-3 random fp32 ops; a reduction is broadcast back onto its input so the shape stays [batch, tokens, hidden]."""
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from(ops))
        if op == "Pow":
            exponent = draw(st.sampled_from((2.0, 3.0) if "Sqrt" not in ops else (2.0, 3.0, 0.5, -0.5)))
            tensor = builder.op("Pow", [tensor, builder.const(exponent)])
        elif op in ("Sqrt", "Reciprocal"):
            tensor = builder.op(op, [tensor])
        elif op == "Cast":
            tensor = builder.cast(builder.cast(tensor, TensorProto.FLOAT16), TensorProto.FLOAT)
        elif op in ("ReduceMean", "ReduceSum"):
            reduced = builder.reduce(op, tensor, axis=draw(st.sampled_from((-1, 1))))
            tensor = builder.op(draw(st.sampled_from(("Mul", "Add"))), [tensor, reduced])
        elif op == "Mul" and draw(st.booleans()):
            tensor = builder.op("Mul", [tensor, tensor])
        else:
            constant = builder.const(draw(constants()))
            divides_by_variable = op == "Div" and "Reciprocal" in ops and draw(st.booleans())
            swap = op == "Sub" and draw(st.booleans())
            tensor = builder.op(op, [constant, tensor] if divides_by_variable or swap else [tensor, constant])
    return tensor


@st.composite
def rms_norm(draw: st.DrawFn, builder: GraphBuilder, x: str, fp16: bool, near_miss: str | None) -> str:
    """An RMSNorm in a random spelling over the last axis of x; `near_miss` breaks one condition of the pattern."""
    hidden = builder.hidden
    x32 = builder.cast(x, TensorProto.FLOAT) if fp16 else x
    base = x32
    if near_miss == "layer_norm":
        base = builder.op("Sub", [x32, builder.reduce("ReduceMean", x32)])
    elif near_miss == "layer_norm_sum_mean":
        base = builder.op(
            "Sub", [x32, builder.op("Mul", [builder.reduce("ReduceSum", x32), builder.const(1.0 / hidden)])]
        )
    exponent = 3.0 if near_miss == "exponent_3" else 2.0
    if exponent == 2.0 and draw(st.booleans()):
        square = builder.op("Mul", [base, base])
    else:
        square = builder.op("Pow", [base, builder.const(exponent)])
    axis = 1 if near_miss == "reduce_non_last_axis" else draw(st.sampled_from((-1, 2)))
    if draw(st.booleans()):
        mean = builder.reduce("ReduceMean", square, axis)
    elif draw(st.booleans()):
        mean = builder.op("Mul", [builder.reduce("ReduceSum", square, axis), builder.const(1.0 / hidden)])
    else:
        mean = builder.op("Div", [builder.reduce("ReduceSum", square, axis), builder.const(float(hidden))])
    if near_miss == "intermediate_is_output":
        builder.mark_output(mean, TensorProto.FLOAT, 1)
    epsilon = builder.const(draw(st.sampled_from((1e-5, 1e-6, 1e-3))))
    numerator = builder.const(2.0 if near_miss == "numerator_2" else 1.0)
    if near_miss == "epsilon_outside_root":
        normalised = builder.op("Div", [base, builder.op("Add", [builder.op("Sqrt", [mean]), epsilon])])
    else:
        variance = builder.op("Add", [mean, epsilon] if draw(st.booleans()) else [epsilon, mean])
        form = draw(st.sampled_from(("div", "reciprocal", "pow", "div_x")))
        if form == "div_x" and near_miss != "numerator_2":
            normalised = builder.op("Div", [base, builder.op("Sqrt", [variance])])
        else:
            if form == "pow" and near_miss != "numerator_2":
                inverse_root = builder.op("Pow", [variance, builder.const(-0.5)])
            elif form == "reciprocal" and near_miss != "numerator_2":
                inverse_root = builder.op("Reciprocal", [builder.op("Sqrt", [variance])])
            else:
                inverse_root = builder.op("Div", [numerator, builder.op("Sqrt", [variance])])
            operands = [base, inverse_root]
            normalised = builder.op("Mul", operands if draw(st.booleans()) else operands[::-1])
    if near_miss == "variable_weight":
        gate = builder.op("Mul", [x32, builder.const(0.5)])
        normalised = builder.op("Mul", [normalised, gate])
        return builder.cast(normalised, TensorProto.FLOAT16) if fp16 else normalised
    return _weight_epilogue(draw, builder, normalised, fp16)


def _weight_epilogue(draw: st.DrawFn, builder: GraphBuilder, normalised: str, fp16: bool) -> str:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    weight = rng.normal(1.0, 0.5, builder.hidden)
    mode = draw(st.sampled_from(("none", "after_cast", "before_cast", "before_cast_offset")))
    if mode == "before_cast_offset":
        scale = builder.op("Add", [builder.const(1.0), builder.const(weight)])
        normalised = builder.op("Mul", [normalised, scale])
    elif mode == "before_cast" or (mode == "after_cast" and not fp16):
        normalised = builder.op("Mul", [normalised, builder.const(weight)])
    if fp16:
        normalised = builder.cast(normalised, TensorProto.FLOAT16)
        if mode == "after_cast":
            normalised = builder.op("Mul", [builder.const(weight, np.float16), normalised])
    return normalised


@dataclass(frozen=True)
class RandomGraph:
    model: onnx.ModelProto
    real_norms: int


@st.composite
def random_graphs(draw: st.DrawFn) -> RandomGraph:
    fp16 = draw(st.booleans())
    builder = GraphBuilder(hidden=draw(st.sampled_from((4, 8, 16))))
    tensor = draw(random_chain(builder, "x", ANY_OPS)) if draw(st.booleans()) else "x"
    if fp16:
        tensor = builder.cast(tensor, TensorProto.FLOAT16)
    real_norms = 0
    normalised_once = False
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(("norm", "near_miss", "chain")))
        if kind == "chain":
            ops = ANY_OPS if not normalised_once else LINEAR_OPS if fp16 else WELL_CONDITIONED_OPS
            source = builder.cast(tensor, TensorProto.FLOAT) if fp16 else tensor
            tensor = draw(random_chain(builder, source, ops))
            tensor = builder.cast(tensor, TensorProto.FLOAT16) if fp16 else tensor
            if draw(st.integers(0, 4)) == 0:
                builder.mark_output(tensor, TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT, builder.hidden)
            continue
        near_miss = draw(st.sampled_from(NEAR_MISSES)) if kind == "near_miss" else None
        tensor = draw(rms_norm(builder, tensor, fp16, near_miss))
        real_norms += near_miss is None or near_miss in NEAR_MISSES_WITH_A_NORM_INSIDE
        normalised_once = True
    elem_type = TensorProto.FLOAT16 if fp16 else TensorProto.FLOAT
    builder.nodes.append(helper.make_node("Identity", [tensor], ["y"], name="output"))
    graph = helper.make_graph(
        builder.nodes,
        "random",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [BATCH, TOKENS, builder.hidden])],
        [helper.make_tensor_value_info("y", elem_type, [BATCH, TOKENS, builder.hidden]), *builder.extra_outputs],
        builder.initializers,
    )
    return RandomGraph(helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)]), real_norms)


@settings(
    max_examples=60,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(random_graphs())
def test_fusion_keeps_numerics_and_fuses_exactly_the_real_norms(graph: RandomGraph) -> None:
    onnx.checker.check_model(graph.model, full_check=True)
    result = fuse_model(graph.model)
    onnx.checker.check_model(result.model, full_check=True)
    totals = result.report()["totals"]
    assert totals["norms"] == graph.real_norms, result.report()
    here = Path(".")
    check = check_fused(LoadedModel(graph.model, here), LoadedModel(result.model, here), CheckInputs(seed=0))
    assert check.passed, check.errors
    if totals["norms"] == 0:
        assert _node_signatures(result.model) == _node_signatures(graph.model)


def _node_signatures(model: onnx.ModelProto) -> list[tuple[str, list[str], list[str]]]:
    """The nodes regardless of order: the rewrite re-sorts the graph topologically."""
    return sorted((node.op_type, list(node.input), list(node.output)) for node in model.graph.node)
