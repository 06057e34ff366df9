"""The residual Add in front of a norm: a matched RMSNorm whose x is the sum of two activations becomes, with that
Add, one TrtfuseAddRmsNorm (docs/patterns.md, "Residual Add").

In a pre-norm decoder every norm but the first reads the residual stream right after an Add (`h = h + attn(...)`),
directly or through the widening Cast an exporter puts at the norm's start. The node computes the sum, rounded once
to the Add's dtype D, and the norm of that rounded sum, and writes both: the sum under the Add's output name, so every
other reader of the residual stream (the next residual Add) reads it as before. onnxruntime's
SkipSimplifiedLayerNormalization is such a node already, its sum in float32.

A norm that reads the sum through an exact QuantizeLinear -> DequantizeLinear pair (ModelOpt's FP8 and INT8 exports)
takes the pair in as its input quantizer when the fusion takes quantizers (`quant_opset`): the node normalises
DQ(Q(h)) and still writes h itself, which the next residual Add reads.

Only an Add of two activations of one dtype and one shape qualifies. Any other Add right before a norm (a bias, a
broadcast, the end of x + a + b, a sum rounded or read in another dtype on its way to the norm) stays outside and the
norm is fused alone; a residual near miss says why, and no count takes it for a rejected norm.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx_graphsurgeon as gs

from trtfuse.contract import (
    ACTIVATION_DTYPES,
    NormParams,
    QuantStage,
    WeightMode,
    dtype_pair_problem,
    rounding_dtype,
)
from trtfuse.fusion.patterns.matches import AddNormMatch, NearMiss, RmsNormMatch, TakenQuantizer
from trtfuse.fusion.patterns.qk import PROJECTION_TAGS
from trtfuse.fusion.patterns.quant import fake_quant_pair, qdq_pair
from trtfuse.fusion.patterns.queries import (
    cast_target,
    describe,
    dtype_name,
    is_constant_value,
    look_through_lossless_casts,
    onnx_op,
    producer,
    unique,
)
from trtfuse.fusion.patterns.shapes import Shapes, provable_dim

SKIP_OP = "SkipSimplifiedLayerNormalization"
# A 16-bit skip op: the node reads its input and skip widened to float32 (exact), as onnxruntime sums them.
WIDENED_TAG = "skip-widened-to-float32"
# A skip op with a bias: float32 Adds in front of a TrtfuseRmsNorm, as before the add-norm.
BIAS_TAG = "skip-bias-outside"


@dataclass
class ResidualPairing:
    """The norms fused with their residual Add, the norms fused alone, and why an Add in front of one stayed out."""

    add_norms: list[AddNormMatch] = field(default_factory=list)
    norms: list[RmsNormMatch] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)


FUSED_ALONE = "the norm was fused alone"
# A skip op that is no add-norm keeps the path it had before the add-norm existed.
SKIP_FUSED_ALONE = "fused as float32 Adds in front of a TrtfuseRmsNorm"


class _KeptOutside(Exception):
    """The Add in front of `norm` stays outside it; the norm is fused alone (as `norm`, which may carry a tag more).
    A skip op is its own Add: its near miss says why it is no add-norm."""

    def __init__(self, add: gs.Node, norm: RmsNormMatch, reason: str, fused_as: str = FUSED_ALONE) -> None:
        super().__init__(reason)
        self.norm = norm
        subject = "no TrtfuseAddRmsNorm" if add.op == SKIP_OP else f"not fused into the norm {norm.name}"
        self.near_miss = NearMiss(describe(add), f"{subject}: {reason}; {fused_as}")


def pair_residual_adds(
    matches: list[RmsNormMatch], graph_outputs: set[str], shapes: Shapes, quant_opset: int | None = None
) -> ResidualPairing:
    """Each match (in graph order) with the residual Add whose sum it normalises, where there is one it may take;
    with `quant_opset` (the graph's opset, where the fusion takes quantizers), also through a Q -> DQ pair on the sum
    (the node's input quantizer).

    Projection norms (q/k, MLA latents) never take one. A sum two norms read goes to the first: the other reads h."""
    residuals = _Residuals(graph_outputs, shapes, quant_opset)
    pairing = ResidualPairing()
    for match in matches:
        if PROJECTION_TAGS & set(match.tags):
            pairing.norms.append(match)
            continue
        try:
            found = residuals.skip_add_norm(match) if match.skip_inputs else residuals.add_norm(match)
        except _KeptOutside as kept:
            pairing.near_misses.append(kept.near_miss)
            pairing.norms.append(kept.norm)
            continue
        if found is None:
            pairing.norms.append(match)
        else:
            pairing.add_norms.append(found)
    return pairing


class _Residuals:
    """The conditions on the Add in front of a norm; remembers which Adds a norm took already."""

    def __init__(self, graph_outputs: set[str], shapes: Shapes, quant_opset: int | None) -> None:
        self.graph_outputs = graph_outputs
        self.shapes = shapes
        self.quant_opset = quant_opset
        self.owners: dict[int, str] = {}

    def add_norm(self, match: RmsNormMatch) -> AddNormMatch | None:
        """The Add whose sum `match` normalises (its x, or a widening Cast of it; with `quant_opset` also a Q -> DQ
        pair of it), or None when x is no Add's sum."""
        total = look_through_lossless_casts(match.x)
        quantizers = self._input_quantizer(match, total, self.quant_opset) if self.quant_opset is not None else ()
        if quantizers:
            total = look_through_lossless_casts(quantizers[0].quantize.inputs[0])
        add = producer(total)
        if onnx_op(add) != "Add" or len(add.inputs) != 2:
            _reject_rounded_sum(match)
            return None
        first, second = add.inputs
        for operand in add.inputs:
            if is_constant_value(operand):
                raise _KeptOutside(add, match, f"it adds the constant {operand.name} (a bias), not two activations")
        dtype = _one_dtype(add, match, (first, second, total))
        broadcast = _broadcast(first, second, self.shapes)
        if broadcast is not None:
            raise _KeptOutside(add, match, f"{broadcast}, and the add-norm adds without broadcasting")
        self._reject_chain(add, match)
        casts = _widening_casts(match, total, add, self.graph_outputs)
        problem = dtype_pair_problem(dtype, match.output_dtype)
        if problem is not None:
            raise _KeptOutside(add, match, f"summed in {dtype}, the norm is no fused node: {problem}")
        owner = self.owners.get(id(add))
        if owner is not None:
            raise _KeptOutside(add, match, f"its sum is normalised by {owner} too, which took the Add")
        self.owners[id(add)] = match.name
        return AddNormMatch(
            norm=match,
            operands=(first, second),
            operand_dtype=dtype,
            dtype=dtype,
            total=total,
            params=_params_from_sum(match, dtype),
            nodes=[add, *casts],
            add=describe(add),
            tags=match.tags,
            quantizers=quantizers,
        )

    def _input_quantizer(self, match: RmsNormMatch, x: gs.Tensor, opset: int) -> tuple[TakenQuantizer, ...]:
        """The pair through which the norm reads an Add's sum, as the node's input quantizer (none when x is no such
        pair's output); an exact pair that is no quantizer of the contract keeps the Add out, saying why."""
        pair = qdq_pair(x)
        add = None if pair is None else producer(pair.source)
        if onnx_op(add) != "Add":
            return ()
        taken = fake_quant_pair(QuantStage.INPUT, pair, opset)
        if isinstance(taken, str):
            through = f"the norm reads its sum through the pair {pair.text}"
            raise _KeptOutside(add, match, f"{through}, which is no quantizer a fused node takes: {taken}")
        return (taken,)

    def _reject_chain(self, add: gs.Node, match: RmsNormMatch) -> None:
        """x + a + b: the last of two Adds, the first read by nothing else, and neither operand read elsewhere, so the
        residual stream (which its sublayer reads too) entered the first. A residual Add whose other operand is a
        sum of its own (DeepSeek's routed + shared experts) reads the stream directly and is taken."""
        chained = [
            operand
            for operand in add.inputs
            if onnx_op(producer(operand)) == "Add"
            and list(operand.outputs) == [add]
            and operand.name not in self.graph_outputs
        ]
        stream = [operand for operand in add.inputs if len(operand.outputs) > 1 or operand.name in self.graph_outputs]
        if chained and not stream:
            chain = f"{describe(producer(chained[0]))} -> {describe(add)}"
            reason = (
                f"it ends the chain {chain} (x + a + b): neither operand is read elsewhere, so it is no residual Add"
            )
            raise _KeptOutside(add, match, reason)

    def skip_add_norm(self, match: RmsNormMatch) -> AddNormMatch:
        """onnxruntime's SkipSimplifiedLayerNormalization without a bias, as one add-norm over float32 (exact for
        any input dtype: onnxruntime widens input and skip, adds in float32 and normalises the unrounded sum)."""
        skip_node = next(node for node in match.nodes if node.op == SKIP_OP)
        if len(match.skip_inputs) > 1:
            bias = match.skip_inputs[1]
            raise _KeptOutside(
                skip_node,
                replace(match, tags=(*match.tags, BIAS_TAG)),
                f"it adds the bias {bias.name} too, for which that op has no input",
                fused_as="fused as float32 Adds ((input + skip) + bias, onnxruntime's order) in front of a "
                "TrtfuseRmsNorm",
            )
        x, skip = match.x, match.skip_inputs[0]
        operand_dtype = _one_dtype(skip_node, match, (x, skip), fused_as=SKIP_FUSED_ALONE)
        broadcast = _broadcast(x, skip, self.shapes)
        if broadcast is not None:
            reason = f"{broadcast}, and the add-norm adds without broadcasting"
            raise _KeptOutside(skip_node, match, reason, fused_as=SKIP_FUSED_ALONE)
        widened = (WIDENED_TAG,) if operand_dtype != "float32" else ()
        return AddNormMatch(
            norm=match,
            operands=(x, skip),
            operand_dtype=operand_dtype,
            dtype="float32",
            total=match.skip_sum,
            params=match.params,
            nodes=[],
            add=describe(skip_node),
            tags=(*match.tags, *widened),
        )


def _one_dtype(node: gs.Node, match: RmsNormMatch, tensors: tuple[gs.Tensor, ...], fused_as: str = FUSED_ALONE) -> str:
    """The one dtype the Add (or skip op) takes for all of `tensors`, its operands and sum: ONNX's Add and
    onnxruntime's skip op have one type parameter for them, so one known dtype is every operand's (a contrib op's
    output often has none inferred). Known dtypes that differ (a graph no checker passed) keep the Add out."""
    known = {dtype for tensor in tensors if (dtype := dtype_name(tensor)) is not None}
    if len(known) != 1:
        shown = " and ".join(f"{tensor.name} ({dtype_name(tensor) or 'unknown'})" for tensor in tensors[:2])
        raise _KeptOutside(node, match, f"its operands {shown} are not of one known dtype", fused_as=fused_as)
    (dtype,) = known
    if dtype not in ACTIVATION_DTYPES:
        raise _KeptOutside(node, match, f"it adds in {dtype}, which no fused node reads", fused_as=fused_as)
    return dtype


def _broadcast(first: gs.Tensor, second: gs.Tensor, shapes: Shapes) -> str | None:
    """How the two operands' shapes may differ (a rank, a static dim, or a symbol of another name), as far as the
    shapes are known; None when no known dim differs."""
    shape_a, shape_b = shapes.of(first), shapes.of(second)
    if shape_a is None or shape_b is None:
        return None
    shown = f"its operands {first.name} {_text(shape_a)} and {second.name} {_text(shape_b)}"
    if len(shape_a) != len(shape_b):
        return f"{shown} have different ranks"
    for axis, (dim_a, dim_b) in enumerate(zip(shape_a, shape_b, strict=True)):
        if provable_dim(dim_a) is not None and provable_dim(dim_b) is not None and dim_a != dim_b:
            return f"{shown} may broadcast (dim {axis})"
    return None


def _text(shape: tuple[int | str | None, ...]) -> str:
    return "[" + ", ".join("?" if dim is None else str(dim) for dim in shape) + "]"


def _widening_casts(match: RmsNormMatch, total: gs.Tensor, add: gs.Node, graph_outputs: set[str]) -> list[gs.Node]:
    """The widening Casts (and Identities) between the sum and the norm's nodes that go with the norm: those that feed
    only it. A Cast that widens the sum for a reader outside the norm too is the sum consumed in another dtype before
    the norm: the Add stays out. One that keeps the dtype (an exporter's no-op Cast, an Identity) stays in the graph,
    reading h, which holds the same values."""
    inside = {id(node) for node in match.nodes}
    path: list[gs.Node] = []
    for node in match.nodes:
        for tensor in node.inputs:
            while tensor is not total and look_through_lossless_casts(tensor) is total:
                step = producer(tensor)
                if id(step) in inside:
                    break
                path.append(step)
                tensor = step.inputs[0]
    path = unique(path)
    along = inside | {id(step) for step in path}
    taken = []
    for step in path:
        converted = step.outputs[0]
        readers = [describe(reader) for reader in converted.outputs if id(reader) not in along]
        if converted.name in graph_outputs:
            readers.append("a graph output")
        if not readers:
            taken.append(step)
        elif dtype_name(converted) != dtype_name(step.inputs[0]):
            also = f"{dtype_name(converted)} ({describe(step)}) by {', '.join(readers)}"
            raise _KeptOutside(add, match, f"its sum is also read as {also}, outside the norm")
    return taken


def _reject_rounded_sum(match: RmsNormMatch) -> None:
    """An Add whose sum the norm reads only after rounding it (a narrowing Cast, a QuantizeLinear -> DequantizeLinear
    pair): an add-norm would normalise the unrounded sum, so the Add stays out; any other x is no sum at all."""
    node = producer(look_through_lossless_casts(match.x))
    if onnx_op(node) == "Cast" and node.inputs:
        add = producer(look_through_lossless_casts(node.inputs[0]))
        if onnx_op(add) == "Add":
            rounding = f"rounded to {cast_target(node)} by {describe(node)}"
            raise _KeptOutside(add, match, f"the norm reads its sum {rounding}, not the sum itself")
    if onnx_op(node) == "DequantizeLinear" and node.inputs:
        quantize = producer(node.inputs[0])
        quantized = onnx_op(quantize) == "QuantizeLinear" and bool(quantize.inputs)
        add = producer(look_through_lossless_casts(quantize.inputs[0])) if quantized else None
        if onnx_op(add) == "Add":
            pair = f"{describe(quantize)} -> {describe(node)}"
            raise _KeptOutside(add, match, f"the norm reads its sum through the pair {pair}, which rounds it")


def _params_from_sum(match: RmsNormMatch, dtype: str) -> NormParams:
    """The norm's constants for the node that reads the sum in `dtype` (D). A norm that read the sum widened to
    float32, with a float32 y, multiplied by its weight unrounded (AFTER_CAST and BEFORE_CAST were one function
    there); from a 16-bit D, AFTER_CAST would round to D before the weight, so that norm is BEFORE_CAST."""
    params, output = match.params, match.output_dtype
    rounds_elsewhere = rounding_dtype(match.dtype, output) != rounding_dtype(dtype, output)
    if params.weight_mode is WeightMode.AFTER_CAST and rounds_elsewhere:
        return replace(params, weight_mode=WeightMode.BEFORE_CAST)
    return params
