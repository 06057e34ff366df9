"""Small synthetic ONNX graphs: one per RMSNorm spelling the matcher must accept, one per form it must reject.

Every builder returns a shape-inferred model that passes onnx.checker. Graph inputs and outputs are float32 and cast
to and from the activation dtype inside, so onnxruntime can feed bfloat16 graphs too. `Expect` records what a
correct matcher reports for the norm(s) of a graph.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from trtfuse.contract import WeightMode

ELEM_TYPES = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float64": TensorProto.DOUBLE,
}
NUMPY_TYPES = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
HIDDEN = 64
BATCH, SEQUENCE = 2, 3


class Builder:
    """Appends nodes and constants with fresh names; `model()` wraps them into a checked, shape-inferred model."""

    def __init__(self, opset: int = 17, seed: int = 0) -> None:
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self.domains: dict[str, int] = {"": opset}
        self.count = 0

    def fresh(self, base: str) -> str:
        self.count += 1
        return f"{base}_{self.count}"

    def input(self, name: str, shape: list, dtype: str = "float32") -> str:
        """A float32 graph input, cast to `dtype` inside the graph when that differs."""
        self.inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name if dtype == "float32" else self.cast(name, dtype)

    def output(self, tensor: str, shape: list | None = None) -> str:
        """Expose `tensor` as a float32 graph output named `<tensor>_out`, through a Cast."""
        name = f"{tensor}_out"
        self.op("Cast", tensor, to=TensorProto.FLOAT, out=name)
        self.outputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, shape))
        return name

    def raw_output(self, tensor: str, dtype: str) -> None:
        """Make an intermediate itself a graph output."""
        self.outputs.append(helper.make_tensor_value_info(tensor, ELEM_TYPES[dtype], None))

    def constant(self, values: object, dtype: str = "float32", as_node: bool = False, base: str = "const") -> str:
        name = self.fresh(base)
        array = np.asarray(values, dtype=np.float32 if dtype in NUMPY_TYPES else dtype)
        if dtype in NUMPY_TYPES:
            array = array.astype(NUMPY_TYPES[dtype])
        tensor = numpy_helper.from_array(array, name)
        if as_node:
            self.nodes.append(helper.make_node("Constant", [], [name], name=f"{name}_node", value=tensor))
        else:
            self.initializers.append(tensor)
        return name

    def weight(self, hidden: int, dtype: str, base: str = "weight") -> str:
        return self.constant(self.rng.uniform(0.5, 1.5, hidden), dtype, base=base)

    def op(self, op_type: str, *inputs: str, out: str | None = None, domain: str = "", outputs: int = 1, **attrs):
        """Add a node; returns its output name (or the list of names when `outputs` > 1)."""
        names = [out] if out else [self.fresh(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(
            helper.make_node(op_type, list(inputs), names, name=self.fresh(op_type), domain=domain, **attrs)
        )
        if domain:
            self.domains.setdefault(domain, 1)
        return names[0] if outputs == 1 else names

    def cast(self, tensor: str, dtype: str) -> str:
        return self.op("Cast", tensor, to=ELEM_TYPES[dtype])

    def reduce(self, op_type: str, tensor: str, axes: list[int], keepdims: int = 1) -> str:
        """A reduction with axes as an attribute (opset <= 17, or 12 for ReduceSum) or as an input."""
        axes_as_input = self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13)
        if axes_as_input:
            return self.op(op_type, tensor, self.constant(axes, "int64", base="axes"), keepdims=keepdims)
        return self.op(op_type, tensor, axes=axes, keepdims=keepdims)

    def model(self, standard: bool = True) -> onnx.ModelProto:
        """`standard=False` for graphs holding onnxruntime's ops, which onnx's checker does not know."""
        graph = helper.make_graph(self.nodes, "synthetic", self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid(domain, version) for domain, version in self.domains.items()]
        model = helper.make_model(graph, opset_imports=opsets, ir_version=10)
        model = onnx.shape_inference.infer_shapes(model, strict_mode=standard, data_prop=True)
        if standard:
            onnx.checker.check_model(model, full_check=True)
        return model


@dataclass(frozen=True)
class NormSpec:
    """How one decomposed RMSNorm is spelled. Defaults: the Llama TorchScript export."""

    dtype: str = "float32"
    hidden: int = HIDDEN
    square: str = "pow"  # pow | mul | reduce-sum-square
    exponent_dtype: str = "float32"
    mean: str = "reduce-mean"  # reduce-mean | reduce-sum-mul | reduce-sum-div
    root: str = "div-one"  # div-one | reciprocal | pow-half | div-sqrt
    epsilon: float = 1e-6
    epsilon_dtype: str = "float32"  # another dtype: a constant of that dtype cast to the core dtype
    epsilon_as_node: bool = False
    epsilon_first: bool = False
    rsqrt_first: bool = False
    weight: str = "after-cast"  # after-cast | before-cast | none
    offset: str = "none"  # none | add-one-first | add-one-last | folded
    weight_first: bool = False
    weight_as_node: bool = False
    weight_dtype: str | None = None  # default: the activation dtype
    t5: bool = False
    core_dtype: str = "float32"


@dataclass(frozen=True)
class Expect:
    """What find_norms must report for one norm."""

    epsilon: float
    weight_offset: float
    weight_mode: WeightMode
    hidden: int


def expected(spec: NormSpec) -> Expect:
    if spec.weight == "none":
        mode = WeightMode.NONE
    elif spec.weight == "before-cast" and spec.dtype != "float32":
        mode = WeightMode.BEFORE_CAST
    else:
        mode = WeightMode.AFTER_CAST
    offset = 1.0 if spec.offset in ("add-one-first", "add-one-last") else 0.0
    epsilon = float(np.float32(np.asarray(spec.epsilon).astype(NUMPY_TYPES.get(spec.epsilon_dtype, np.float64))))
    return Expect(epsilon, offset, mode, spec.hidden)


def rms_norm(b: Builder, x: str, spec: NormSpec) -> str:
    """Append one decomposed RMSNorm reading x (in spec.dtype); returns its output tensor (in spec.dtype)."""
    core = spec.core_dtype
    x_core = x if spec.dtype == core else b.cast(x, core)
    if spec.square == "pow":
        squared = b.op("Pow", x_core, b.constant(2.0, spec.exponent_dtype))
    elif spec.square == "mul":
        squared = b.op("Mul", x_core, x_core)
    else:
        squared = x_core
    if spec.mean == "reduce-mean":
        mean = b.reduce("ReduceMean", squared, [-1])
    else:
        total = b.reduce("ReduceSumSquare" if spec.square == "reduce-sum-square" else "ReduceSum", squared, [-1])
        if spec.mean == "reduce-sum-mul":
            mean = b.op("Mul", total, b.constant(1.0 / spec.hidden, core))
        else:
            mean = b.op("Div", total, b.constant(float(spec.hidden), core))
    epsilon = b.constant(spec.epsilon, spec.epsilon_dtype, as_node=spec.epsilon_as_node, base="epsilon")
    if spec.epsilon_dtype != core:
        epsilon = b.cast(epsilon, core)
    variance = b.op("Add", *((epsilon, mean) if spec.epsilon_first else (mean, epsilon)))
    scaled = x if spec.t5 else x_core
    if spec.root == "div-sqrt":
        normalized = b.op("Div", scaled, b.op("Sqrt", variance))
    else:
        if spec.root == "div-one":
            inverse = b.op("Div", b.constant(1.0, core), b.op("Sqrt", variance))
        elif spec.root == "reciprocal":
            inverse = b.op("Reciprocal", b.op("Sqrt", variance))
        else:
            inverse = b.op("Pow", variance, b.constant(-0.5, core))
        if spec.t5:
            inverse = b.cast(inverse, spec.dtype)
        normalized = b.op("Mul", *((inverse, scaled) if spec.rsqrt_first else (scaled, inverse)))
    return _epilogue(b, normalized, spec)


def _epilogue(b: Builder, normalized: str, spec: NormSpec) -> str:
    core = spec.dtype if spec.t5 else spec.core_dtype
    if spec.weight == "none":
        return normalized if spec.dtype == core else b.cast(normalized, spec.dtype)
    if spec.weight == "after-cast":
        rounded = normalized if spec.dtype == core else b.cast(normalized, spec.dtype)
        weight = b.constant(
            b.rng.uniform(0.5, 1.5, spec.hidden), spec.weight_dtype or spec.dtype, as_node=spec.weight_as_node
        )
        return b.op("Mul", *((weight, rounded) if spec.weight_first else (rounded, weight)))
    raw = b.rng.uniform(-0.5, 0.5, spec.hidden)
    weight_dtype = spec.weight_dtype or spec.dtype
    if spec.offset == "folded":
        weight = b.constant(1.0 + raw.astype(NUMPY_TYPES[weight_dtype]).astype(np.float32), core)
    else:
        weight = b.constant(raw, weight_dtype, as_node=spec.weight_as_node)
        if weight_dtype != core:
            weight = b.cast(weight, core)
        one = b.constant(1.0, core)
        if spec.offset == "add-one-first":
            weight = b.op("Add", one, weight)
        elif spec.offset == "add-one-last":
            weight = b.op("Add", weight, one)
    scaled = b.op("Mul", *((weight, normalized) if spec.weight_first else (normalized, weight)))
    return scaled if spec.dtype == core else b.cast(scaled, spec.dtype)


def single_norm(spec: NormSpec, opset: int = 17) -> onnx.ModelProto:
    """x [2, 3, H] -> RMSNorm -> y."""
    b = Builder(opset)
    x = b.input("x", [BATCH, SEQUENCE, spec.hidden], spec.dtype)
    b.output(rms_norm(b, x, spec))
    return b.model()


# Every accepted spelling of a single RMSNorm: name -> (spec, opset).
ACCEPTED: dict[str, tuple[NormSpec, int]] = {
    "llama-fp32": (NormSpec(), 17),
    "llama-fp16": (NormSpec(dtype="float16"), 17),
    "llama-bf16": (NormSpec(dtype="bfloat16"), 17),
    "square-mul": (NormSpec(square="mul", dtype="float16"), 17),
    "exponent-fp16": (NormSpec(exponent_dtype="float16"), 17),
    "exponent-int64": (NormSpec(exponent_dtype="int64"), 17),
    "axes-input-opset18": (NormSpec(dtype="float16"), 18),
    "reduce-sum-mul": (NormSpec(mean="reduce-sum-mul"), 17),
    "reduce-sum-div": (NormSpec(mean="reduce-sum-div", dtype="bfloat16"), 18),
    "reduce-sum-square": (NormSpec(square="reduce-sum-square", mean="reduce-sum-mul"), 18),
    "reciprocal": (NormSpec(root="reciprocal", dtype="float16"), 18),
    "pow-half": (NormSpec(root="pow-half"), 17),
    "div-sqrt": (NormSpec(root="div-sqrt", dtype="float16"), 17),
    "epsilon-constant-node": (NormSpec(epsilon_as_node=True, epsilon=1e-5), 17),
    "epsilon-first": (NormSpec(epsilon_first=True, epsilon=3e-6), 17),
    "epsilon-fp16": (NormSpec(epsilon_dtype="float16", epsilon=1e-5, dtype="float16"), 17),
    "epsilon-fp64": (NormSpec(epsilon_dtype="float64", epsilon=1e-6), 17),
    "rsqrt-first": (NormSpec(rsqrt_first=True, dtype="bfloat16"), 17),
    "weight-first": (NormSpec(weight_first=True, dtype="float16"), 17),
    "weight-constant-node": (NormSpec(weight_as_node=True), 17),
    "no-weight-fp32": (NormSpec(weight="none"), 17),
    "no-weight-fp16": (NormSpec(weight="none", dtype="float16"), 17),
    "gemma-add-one-first-fp16": (NormSpec(weight="before-cast", offset="add-one-first", dtype="float16"), 17),
    "gemma-add-one-last-bf16": (NormSpec(weight="before-cast", offset="add-one-last", dtype="bfloat16"), 18),
    "gemma-folded-fp16": (NormSpec(weight="before-cast", offset="folded", dtype="float16"), 17),
    "gemma-fp32": (NormSpec(weight="before-cast", offset="add-one-first"), 17),
    "olmo2-fp16": (NormSpec(weight="before-cast", dtype="float16"), 17),
    "olmo2-fp32-weight-bf16": (NormSpec(weight="before-cast", weight_dtype="bfloat16"), 17),
    "t5-fp16": (NormSpec(t5=True, dtype="float16"), 17),
    "t5-bf16-no-weight": (NormSpec(t5=True, dtype="bfloat16", weight="none"), 17),
    "fp16-core": (NormSpec(dtype="float16", core_dtype="float16", epsilon_dtype="float16", epsilon=1e-5), 17),
}

# Tags each accepted spelling must carry (beyond "decomposed").
ACCEPTED_TAGS: dict[str, tuple[str, ...]] = {
    "llama-fp32": ("pow", "reduce-mean", "div-one"),
    "square-mul": ("mul",),
    "reduce-sum-mul": ("reduce-sum",),
    "reduce-sum-square": ("reduce-sum-square", "reduce-sum"),
    "reciprocal": ("reciprocal",),
    "pow-half": ("pow-half",),
    "div-sqrt": ("div-sqrt",),
    "t5-fp16": ("t5",),
    "fp16-core": ("core-float16",),
}


def fused_op_norm(kind: str, dtype: str = "float32", epsilon: float = 1e-5, **attrs: object) -> onnx.ModelProto:
    """One already-fused norm node: RMSNormalization, SimplifiedLayerNormalization or the Skip variant."""
    opset = 23 if kind == "RMSNormalization" else 17
    b = Builder(opset)
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    weight = b.weight(HIDDEN, dtype)
    if kind == "SkipSimplifiedLayerNormalization":
        skip = b.input("skip", [BATCH, SEQUENCE, HIDDEN], dtype)
        bias = b.weight(HIDDEN, dtype, base="bias")
        outputs = b.op(kind, x, skip, weight, bias, domain="com.microsoft", outputs=4, epsilon=epsilon, **attrs)
        b.nodes[-1].output[1] = b.nodes[-1].output[2] = ""
        b.output(outputs[0], [BATCH, SEQUENCE, HIDDEN])
        b.output(outputs[3], [BATCH, SEQUENCE, HIDDEN])
    else:
        b.output(b.op(kind, x, weight, epsilon=epsilon, **attrs), [BATCH, SEQUENCE, HIDDEN])
    return b.model(standard=kind == "RMSNormalization")


# Graphs where the norm must be found but a following Mul must stay out of it, and why.
def partial_weight(case: str, dtype: str = "float32") -> onnx.ModelProto:
    """A norm followed by a multiply that is not its weight: a gate input, or a constant of the wrong length."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    normalized = rms_norm(b, x, NormSpec(dtype=dtype, weight="none"))
    if case == "gate":
        other = b.input("gate", [BATCH, SEQUENCE, HIDDEN], dtype)
    elif case == "wrong-length":
        other = b.constant(np.ones((BATCH, 1, HIDDEN)), dtype)
    else:
        other = b.constant(0.5, dtype)
    b.output(b.op("Mul", normalized, other))
    return b.model()


def shared_normalized(dtype: str) -> onnx.ModelProto:
    """The normalised value (after the cast back) is also read by a second node: fuse without the weight."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    normalized = rms_norm(b, x, NormSpec(dtype=dtype, weight="none"))
    b.output(b.op("Mul", normalized, b.weight(HIDDEN, dtype)))
    b.output(b.op("Relu", normalized))
    return b.model()


def before_cast_gate(dtype: str = "float16") -> onnx.ModelProto:
    """fp16 activations, normalised value multiplied in fp32 by a non-constant: only the fp32 part can fuse."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    spec = NormSpec(dtype=dtype, weight="none")
    x_core = b.cast(x, "float32")
    inverse = _inverse_root(b, x_core, spec)
    gate = b.input("gate", [BATCH, SEQUENCE, HIDDEN])
    b.output(b.cast(b.op("Mul", b.op("Mul", x_core, inverse), gate), dtype))
    return b.model()


def _inverse_root(b: Builder, x_core: str, spec: NormSpec) -> str:
    mean = b.reduce("ReduceMean", b.op("Pow", x_core, b.constant(2.0)), [-1])
    return b.op("Div", b.constant(1.0), b.op("Sqrt", b.op("Add", mean, b.constant(spec.epsilon))))


# Forms that must never match: name -> (builder, the substring the near-miss reason must contain).
def _layer_norm(bias: bool) -> onnx.ModelProto:
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    centred = b.op("Sub", x, b.reduce("ReduceMean", x, [-1]))
    variance = b.reduce("ReduceMean", b.op("Pow", centred, b.constant(2.0)), [-1])
    std = b.op("Sqrt", b.op("Add", variance, b.constant(1e-5)))
    y = b.op("Mul", b.op("Div", centred, std), b.weight(HIDDEN, "float32"))
    if bias:
        y = b.op("Add", y, b.weight(HIDDEN, "float32", base="bias"))
    b.output(y)
    return b.model()


def _variant(mutate, shape: tuple[int, ...] = (BATCH, SEQUENCE, HIDDEN)) -> onnx.ModelProto:
    """A Llama-style fp32 norm with one step changed by `mutate(builder, x) -> y`."""
    b = Builder()
    x = b.input("x", list(shape))
    b.output(mutate(b, x))
    return b.model()


def _eps_outside(b: Builder, x: str) -> str:
    rms = b.op("Sqrt", b.reduce("ReduceMean", b.op("Pow", x, b.constant(2.0)), [-1]))
    return b.op("Div", x, b.op("Add", rms, b.constant(1e-6)))


def _l2_sum(b: Builder, x: str) -> str:
    total = b.reduce("ReduceSum", b.op("Mul", x, x), [-1])
    return b.op("Div", x, b.op("Sqrt", b.op("Add", total, b.constant(1e-12))))


def _reduce_l2(b: Builder, x: str) -> str:
    return b.op("Div", x, b.op("Add", b.reduce("ReduceL2", x, [-1]), b.constant(1e-12)))


def _lp_normalization(b: Builder, x: str) -> str:
    return b.op("LpNormalization", x, axis=-1, p=2)


def _chain(b: Builder, x: str, exponent: float = 2.0, numerator: float = 1.0, root_exponent: float | None = None,
           axes: tuple[int, ...] = (-1,), keepdims: int = 1) -> str:  # fmt: skip
    mean = b.reduce("ReduceMean", b.op("Pow", x, b.constant(exponent)), list(axes), keepdims)
    variance = b.op("Add", mean, b.constant(1e-6))
    if root_exponent is None:
        inverse = b.op("Div", b.constant(numerator), b.op("Sqrt", variance))
    else:
        inverse = b.op("Pow", variance, b.constant(root_exponent))
    return b.op("Mul", x, inverse)


def _shared_intermediate(b: Builder, x: str) -> str:
    mean = b.reduce("ReduceMean", b.op("Pow", x, b.constant(2.0)), [-1])
    inverse = b.op("Div", b.constant(1.0), b.op("Sqrt", b.op("Add", mean, b.constant(1e-6))))
    b.output(mean)
    return b.op("Mul", x, inverse)


def _intermediate_output(b: Builder, x: str) -> str:
    squared = b.op("Pow", x, b.constant(2.0))
    mean = b.reduce("ReduceMean", squared, [-1])
    inverse = b.op("Div", b.constant(1.0), b.op("Sqrt", b.op("Add", mean, b.constant(1e-6))))
    b.raw_output(squared, "float32")
    return b.op("Mul", x, inverse)


def _attention_scale(b: Builder, x: str) -> str:
    """softmax(x xᵀ / sqrt(d)) x, the softmax written out: its ReduceSum is no mean of squares."""
    scores = b.op("Div", b.op("MatMul", x, b.op("Transpose", x, perm=[0, 2, 1])), b.op("Sqrt", b.constant(64.0)))
    exp = b.op("Exp", b.op("Sub", scores, b.reduce("ReduceMax", scores, [-1])))
    return b.op("MatMul", b.op("Div", exp, b.reduce("ReduceSum", exp, [-1])), x)


def _other_source(b: Builder, x: str) -> str:
    """mean(x²) normalises a different tensor: x / rms(x) applied to relu(x)."""
    mean = b.reduce("ReduceMean", b.op("Pow", x, b.constant(2.0)), [-1])
    inverse = b.op("Div", b.constant(1.0), b.op("Sqrt", b.op("Add", mean, b.constant(1e-6))))
    return b.op("Mul", b.op("Relu", x), inverse)


REJECTED: dict[str, tuple[object, str]] = {
    "layer-norm": (lambda: _layer_norm(bias=True), "LayerNorm"),
    "layer-norm-no-bias": (lambda: _layer_norm(bias=False), "LayerNorm"),
    "epsilon-outside-root": (lambda: _variant(_eps_outside), "outside the square root"),
    "l2-reduce-sum": (lambda: _variant(_l2_sum), "L2 normalisation"),
    "l2-reduce-l2": (lambda: _variant(_reduce_l2), "L2 normalisation"),
    "lp-normalization": (lambda: _variant(_lp_normalization), "Lp normalisation"),
    "exponent-4": (lambda: _variant(lambda b, x: _chain(b, x, exponent=4.0)), "not 2"),
    "numerator-2": (lambda: _variant(lambda b, x: _chain(b, x, numerator=2.0)), "not 1"),
    "root-exponent": (lambda: _variant(lambda b, x: _chain(b, x, root_exponent=-1.0)), "not -0.5"),
    "non-last-axis": (lambda: _variant(lambda b, x: _chain(b, x, axes=(1,))), "not the last axis"),
    "several-axes": (lambda: _variant(lambda b, x: _chain(b, x, axes=(1, 2))), "several axes"),
    "keepdims-0": (lambda: _variant(lambda b, x: _chain(b, x, keepdims=0), (HIDDEN, HIDDEN)), "keepdims=0"),
    "shared-intermediate": (lambda: _variant(_shared_intermediate), "not by one node"),
    "intermediate-graph-output": (lambda: _variant(_intermediate_output), "graph output"),
    "attention-scale": (lambda: _variant(_attention_scale), "not a square"),
    "other-source": (lambda: _variant(_other_source), "not the squared tensor"),
}


# Attention blocks: the q and k projections of one normalised hidden state, each with its own norm.
@dataclass(frozen=True)
class AttentionSpec:
    layout: str  # qk-head-dim (Qwen3) | qk-head-dim-transposed (Gemma3) | qk-full-width (OLMo2) | mla-latent
    dtype: str = "float32"
    q_heads: int = 4
    kv_heads: int = 2
    head_dim: int = 16
    q_rank: int = 48  # MLA latent widths
    kv_rank: int = 32
    rope_dim: int = 8
    q_epsilon: float = 1e-6
    k_epsilon: float = 1e-6
    k_reads_q: bool = False  # k's Reshape takes its shape from q's normalised output: pairing would make a cycle
    latent_reshape: bool = False  # the kv latent is flattened to 2-D before its up-projection (TorchScript)
    norm: NormSpec = NormSpec()
    # A bias Add after each q/k/v projection (Qwen2-style): "constant", "cast" (Cast of a constant of another float
    # dtype), "identity" (Identity of a constant); None for none.
    bias: str | None = None


def _project(b: Builder, x: str, width_in: int, width_out: int, dtype: str, bias: str | None = None) -> str:
    weight = b.constant(b.rng.normal(0, width_in**-0.5, (width_in, width_out)), dtype, base="proj")
    projected = b.op("MatMul", x, weight)
    if bias is None:
        return projected
    values = b.rng.normal(0, 0.1, width_out)
    if bias == "cast":
        offset = b.cast(b.constant(values, "float16" if dtype == "float32" else "float32", base="bias"), dtype)
    elif bias == "identity":
        offset = b.op("Identity", b.constant(values, dtype, base="bias"))
    else:
        offset = b.constant(values, dtype, base="bias")
    return b.op("Add", projected, offset)


def _heads(b: Builder, tensor: str, heads: int, head_dim: int, shape_from: str | None = None) -> str:
    if shape_from is None:
        shape = b.constant([BATCH, SEQUENCE, heads, head_dim], "int64", base="shape")
    else:
        shape = b.op("Shape", shape_from)
    return b.op("Reshape", tensor, shape)


def attention_block(spec: AttentionSpec) -> onnx.ModelProto:
    """input norm -> q/k projections -> per-layout q-norm and k-norm; q and k are graph outputs."""
    b = Builder()
    dtype = spec.dtype
    norm = replace(spec.norm, dtype=dtype)
    hidden = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    normed = rms_norm(b, hidden, replace(norm, hidden=HIDDEN))
    q_norm = replace(norm, epsilon=spec.q_epsilon)
    k_norm = replace(norm, epsilon=spec.k_epsilon)
    if spec.layout == "mla-latent":
        q_latent = rms_norm(b, _project(b, normed, HIDDEN, spec.q_rank, dtype), replace(q_norm, hidden=spec.q_rank))
        q = _project(b, q_latent, spec.q_rank, spec.q_heads * spec.head_dim, dtype)
        compressed = _project(b, normed, HIDDEN, spec.kv_rank + spec.rope_dim, dtype)
        split = b.constant([spec.kv_rank, spec.rope_dim], "int64", base="split")
        kv_latent, k_rope = b.op("Split", compressed, split, axis=-1, outputs=2)
        kv = rms_norm(b, kv_latent, replace(k_norm, hidden=spec.kv_rank))
        if spec.latent_reshape:
            kv = b.op("Reshape", kv, b.constant([BATCH * SEQUENCE, spec.kv_rank], "int64", base="shape"))
        b.output(q)
        b.output(_project(b, kv, spec.kv_rank, spec.kv_heads * spec.head_dim, dtype))
        b.output(k_rope)
        return b.model()
    q = _project(b, normed, HIDDEN, spec.q_heads * spec.head_dim, dtype, spec.bias)
    k = _project(b, normed, HIDDEN, spec.kv_heads * spec.head_dim, dtype, spec.bias)
    v = _project(b, normed, HIDDEN, spec.kv_heads * spec.head_dim, dtype, spec.bias)
    q_out = norm_heads(b, q, spec.q_heads, spec, q_norm)
    k_out = norm_heads(b, k, spec.kv_heads, spec, k_norm, shape_from=q_out if spec.k_reads_q else None)
    for tensor in (q_out, k_out, v):
        b.output(tensor)
    return b.model()


def norm_heads(
    b: Builder, projected: str, heads: int, spec: AttentionSpec, norm: NormSpec, shape_from: str | None = None
) -> str:
    """One projection reshaped to heads and normalised the way `spec.layout` does; returns [B, heads, S, D]."""
    perm = [0, 2, 1, 3]
    if spec.layout == "qk-full-width":
        normed = rms_norm(b, projected, replace(norm, hidden=heads * spec.head_dim))
        return b.op("Transpose", _heads(b, normed, heads, spec.head_dim), perm=perm)
    if shape_from is not None:
        shape_from = b.op("Transpose", shape_from, perm=perm)
    split = _heads(b, projected, heads, spec.head_dim, shape_from)
    if spec.layout == "qk-head-dim":
        return b.op("Transpose", rms_norm(b, split, replace(norm, hidden=spec.head_dim)), perm=perm)
    return rms_norm(b, b.op("Transpose", split, perm=perm), replace(norm, hidden=spec.head_dim))


# Random graphs for property tests: elementwise ops, reductions and whole norms over a small pool of tensors.
RANDOM_SHAPE = [2, 3, 8]
UNARY_OPS = ("Sqrt", "Reciprocal", "Relu", "Neg", "Abs")
BINARY_OPS = ("Add", "Mul", "Div", "Sub")


@dataclass
class RandomGraph:
    """Builds a graph step by step from choices a test draws; `pool` holds (tensor, dtype, last dim)."""

    builder: Builder
    pool: list[tuple[str, str, int]]

    @classmethod
    def start(cls) -> RandomGraph:
        b = Builder()
        x = b.input("x", RANDOM_SHAPE)
        return cls(b, [(x, "float32", RANDOM_SHAPE[-1])])

    def unary(self, op: str, index: int) -> None:
        tensor, dtype, width = self.pool[index % len(self.pool)]
        self.pool.append((self.builder.op(op, tensor), dtype, width))

    def binary(self, op: str, first: int, second: int) -> None:
        a, dtype, width = self.pool[first % len(self.pool)]
        same = [entry for entry in self.pool if entry[1] == dtype]
        b, _, other_width = same[second % len(same)]
        self.pool.append((self.builder.op(op, a, b), dtype, max(width, other_width)))

    def constant_op(self, op: str, index: int, value: float) -> None:
        tensor, dtype, width = self.pool[index % len(self.pool)]
        self.pool.append((self.builder.op(op, tensor, self.builder.constant(value, dtype)), dtype, width))

    def reduce(self, op: str, index: int, axis: int) -> None:
        tensor, dtype, width = self.pool[index % len(self.pool)]
        self.pool.append((self.builder.reduce(op, tensor, [axis]), dtype, 1 if axis == -1 else width))

    def cast(self, index: int, dtype: str) -> None:
        tensor, _, width = self.pool[index % len(self.pool)]
        self.pool.append((self.builder.cast(tensor, dtype), dtype, width))

    def norm(self, index: int, spec: NormSpec) -> None:
        """A whole norm, every intermediate of it added to the pool so later steps may read them."""
        candidates = [entry for entry in self.pool if entry[2] == RANDOM_SHAPE[-1]]
        tensor, dtype, width = candidates[index % len(candidates)]
        first_new = len(self.builder.nodes)
        y = rms_norm(self.builder, tensor, replace(spec, dtype=dtype, hidden=width))
        types = self._types()
        for node in self.builder.nodes[first_new:]:
            name = node.output[0]
            if node.op_type != "Constant" and name != y and types.get(name, ("other",))[0] in ELEM_TYPES:
                self.pool.append((name, *types[name]))
        self.pool.append((y, dtype, width))

    def _types(self) -> dict[str, tuple[str, int]]:
        """dtype name and last dim of every inferred tensor of the graph built so far."""
        graph = helper.make_graph(self.builder.nodes, "partial", self.builder.inputs, [], self.builder.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.builder.opset)])
        inferred = onnx.shape_inference.infer_shapes(model)
        names = {code: name for name, code in ELEM_TYPES.items()}
        return {
            value.name: (
                names.get(value.type.tensor_type.elem_type, "other"),
                value.type.tensor_type.shape.dim[-1].dim_value,
            )
            for value in inferred.graph.value_info
            if len(value.type.tensor_type.shape.dim) == len(RANDOM_SHAPE)
        }

    def model(self, outputs: list[int]) -> onnx.ModelProto:
        """Expose the last tensor and the chosen others as graph outputs."""
        chosen = dict.fromkeys([len(self.pool) - 1, *(index % len(self.pool) for index in outputs)])
        for index in chosen:
            self.builder.output(self.pool[index][0])
        return self.builder.model()


# Graphs a correct matcher must not fuse as they look, or must fuse in a way today's did not (issues 10 and 12).
def foreign_domain_norm(op: str, local_function: bool = False) -> onnx.ModelProto:
    """An fp32 norm whose `op` node is another domain's op of that name, or a model-local function named like it."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    rms_norm(b, x, NormSpec(root="div-one"))
    node = next(node for node in b.nodes if node.op_type == op)
    if local_function:
        body = [helper.make_node("Neg", ["a"], ["b"])]
        function = helper.make_function("", op, ["a"], ["b"], body, [helper.make_opsetid("", b.opset)])
    else:
        node.domain = "custom.ops"
        b.domains["custom.ops"] = 1
    y = b.nodes[-1].output[0]
    b.outputs.append(helper.make_tensor_value_info(y, TensorProto.FLOAT, None))
    model = b.model(standard=False)
    if local_function:
        model.functions.append(function)
    return model


def broadcasting_constant(which: str) -> onnx.ModelProto:
    """A norm over x [B, S, H] whose `which` constant has shape [1, 1, 1, 1] (or [1, 1, 1, H]): the result is rank 4."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    wide = [1, 1, 1, 1]

    def scalar(value: float, name: str) -> str:
        return b.constant(np.full(wide if which == name else [], value), base=name)

    squared = b.op("Pow", x, scalar(2.0, "exponent"))
    mean = b.reduce("ReduceMean", squared, [-1])
    variance = b.op("Add", mean, scalar(1e-6, "epsilon"))
    inverse = b.op("Div", scalar(1.0, "numerator"), b.op("Sqrt", variance))
    normalized = b.op("Mul", x, inverse)
    weight = b.rng.uniform(0.5, 1.5, HIDDEN)
    weight_name = b.constant(weight.reshape([1, 1, 1, HIDDEN]) if which == "weight" else weight, base="weight")
    if which == "offset":
        weight_name = b.op("Add", b.constant(np.ones(wide), base="offset"), weight_name)
    b.output(b.op("Mul", normalized, weight_name))
    return b.model()


def layer_norm_sum_mean(spelling: str) -> onnx.ModelProto:
    """LayerNorm whose mean is ReduceSum(x)·(1/H) or ReduceSum(x)/H, then the usual variance and root."""
    b = Builder(18)
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    total = b.reduce("ReduceSum", x, [-1])
    if spelling == "mul":
        mean = b.op("Mul", total, b.constant(1.0 / HIDDEN))
    else:
        mean = b.op("Div", total, b.constant(float(HIDDEN)))
    centred = b.op("Sub", x, mean)
    variance = b.reduce("ReduceMean", b.op("Pow", centred, b.constant(2.0)), [-1])
    std = b.op("Sqrt", b.op("Add", variance, b.constant(1e-5)))
    b.output(b.op("Mul", b.op("Div", centred, std), b.weight(HIDDEN, "float32")))
    return b.model()


def stale_value_info(claimed: int = 32) -> onnx.ModelProto:
    """An fp16 norm over H = 64 whose value_info claims the reduced tensor's last dim is `claimed`."""
    model = single_norm(NormSpec(dtype="float16"))
    reduced = next(node for node in model.graph.node if node.op_type == "ReduceMean").input[0]
    for value in model.graph.value_info:
        if value.name == reduced:
            value.type.tensor_type.shape.dim[-1].dim_value = claimed
    return model


def symbolic_hidden(kind: str) -> onnx.ModelProto:
    """x of shape [B, S, "hidden"] into a decomposed norm or a fused norm op with a weight of 64 elements."""
    b = Builder(23 if kind == "RMSNormalization" else 17)
    x = b.input("x", [BATCH, SEQUENCE, "hidden"])
    if kind == "decomposed":
        b.output(rms_norm(b, x, NormSpec()))
        return b.model()
    domain = "com.microsoft" if kind == "SkipSimplifiedLayerNormalization" else ""
    b.output(b.op(kind, x, b.weight(HIDDEN, "float32"), epsilon=1e-6, domain=domain))
    return b.model(standard=kind == "RMSNormalization")


def unknown_shape_fused_norm() -> onnx.ModelProto:
    """SimplifiedLayerNormalization reading a contrib op's output, its shape dropped: only the weight says H = 64."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    gelu = b.op("FastGelu", x, domain="com.microsoft")
    b.output(b.op("SimplifiedLayerNormalization", gelu, b.weight(HIDDEN, "float32"), epsilon=1e-6))
    model = b.model(standard=False)
    model.graph.value_info.append(helper.make_tensor_value_info(gelu, TensorProto.FLOAT, None))
    return model


def no_epsilon_norm(root: str = "div-one") -> onnx.ModelProto:
    """An fp16 Llama norm without the epsilon Add (some dynamo exports drop it): mean → root directly."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], "float16")
    x32 = b.cast(x, "float32")
    mean = b.reduce("ReduceMean", b.op("Pow", x32, b.constant(2.0)), [-1])
    if root == "pow-half":
        inverse = b.op("Pow", mean, b.constant(-0.5))
    else:
        inverse = b.op("Div", b.constant(1.0), b.op("Sqrt", mean))
    normalized = b.cast(b.op("Mul", x32, inverse), "float16")
    b.output(b.op("Mul", normalized, b.weight(HIDDEN, "float16")))
    return b.model()


def mixed_precision_norm(order: str, out_dtype: str = "float16") -> onnx.ModelProto:
    """optimum fp16 with an fp32 residual stream: fp32 x, normalised in fp32, the result 16-bit.

    order "cast-then-weight": Cast(x·r) then Mul(w16) (Llama's order); "weight-then-cast": Mul(w32) then Cast.
    """
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])
    normalized = b.op("Mul", x, _inverse_root(b, x, NormSpec()))
    if order == "cast-then-weight":
        y = b.op("Mul", b.cast(normalized, out_dtype), b.weight(HIDDEN, out_dtype))
    else:
        y = b.cast(b.op("Mul", normalized, b.weight(HIDDEN, "float32")), out_dtype)
    b.output(y)
    return b.model()


def mixed_rms_normalization(x_dtype: str, scale_dtype: str) -> onnx.ModelProto:
    """Opset-23 RMSNormalization with X, scale (and so Y) of different dtypes, as dynamo emits for Gemma3/OLMo2."""
    b = Builder(23)
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], x_dtype)
    y = b.op("RMSNormalization", x, b.weight(HIDDEN, scale_dtype), epsilon=1e-6)
    b.output(y, [BATCH, SEQUENCE, HIDDEN])
    # onnx's inference types Y from the function body (X's dtype), not from the schema (the scale's), so Y's type
    # is declared as the exporter declares it.
    model = b.model(standard=False)
    for value in [*model.graph.value_info]:
        if value.name == y:
            model.graph.value_info.remove(value)
    model.graph.value_info.append(helper.make_tensor_value_info(y, ELEM_TYPES[scale_dtype], [BATCH, SEQUENCE, HIDDEN]))
    return model


def overridable_constant(which: str) -> onnx.ModelProto:
    """An fp32 norm whose epsilon or weight initializer is also a graph input: a user may feed another value."""
    model = single_norm(NormSpec())
    if which == "epsilon":
        add = next(node for node in model.graph.node if node.op_type == "Add")
        name = add.input[1]
    else:
        name = next(tensor.name for tensor in model.graph.initializer if list(tensor.dims) == [HIDDEN])
    tensor = next(tensor for tensor in model.graph.initializer if tensor.name == name)
    model.graph.input.append(helper.make_tensor_value_info(name, tensor.data_type, list(tensor.dims)))
    return model


def qdq_norm(place: str, quantized: bool = True, dequantize: str = "exact") -> onnx.ModelProto:
    """An fp32 Llama norm with an int8 QuantizeLinear → DequantizeLinear pair at `place` (ModelOpt's spelling).

    place: "rsqrt" (on the inverse root before Mul(x, r)), "normalized" (before the weight multiply), "output" (on
    the norm's output, feeding the next MatMul), "x" (on the x the normalising Mul reads), "shared-x" (on x, read by
    the square and the normalising Mul alike: ModelOpt int8/fp8). `quantized=False` builds the same graph without
    the pair: the float evaluation of its arithmetic. `dequantize`: "exact" (the DequantizeLinear undoes the
    QuantizeLinear), "scale" (its scale is 1.25 times the QuantizeLinear's) or "zero-point" (its zero point is 3,
    the QuantizeLinear's 0): such a pair is arithmetic, not a rounding.
    """
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN])

    def qdq(tensor: str, scale: float) -> str:
        if not quantized:
            return tensor
        scale_name, zero = b.constant(scale, base="scale"), b.constant(0, "int8", base="zero_point")
        dq_scale = b.constant(scale * 1.25, base="scale") if dequantize == "scale" else scale_name
        dq_zero = b.constant(3, "int8", base="zero_point") if dequantize == "zero-point" else zero
        return b.op("DequantizeLinear", b.op("QuantizeLinear", tensor, scale_name, zero), dq_scale, dq_zero)

    if place == "shared-x":
        x = qdq(x, 4.0 / 127)
    inverse = _inverse_root(b, x, NormSpec())
    normalized = b.op(
        "Mul", qdq(x, 4.0 / 127) if place == "x" else x, qdq(inverse, 2.0 / 127) if place == "rsqrt" else inverse
    )
    if place == "normalized":
        normalized = qdq(normalized, 4.0 / 127)
    y = b.op("Mul", normalized, b.weight(HIDDEN, "float32"))
    if place == "output":
        y = qdq(y, 6.0 / 127)
    b.output(b.op("MatMul", y, b.constant(b.rng.normal(0, 0.1, (HIDDEN, 8)), base="proj")))
    return b.model()


def rewidened_weight(x_dtype: str = "float16") -> onnx.ModelProto:
    """x normalised in fp32, rounded to fp16, widened to fp32 again and only then multiplied by an fp32 weight.

    With fp16 x that is torch's `weight * hidden.to(input_dtype)` for an fp32 weight (AutoCast keeping norm weights
    in fp32).
    """
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], x_dtype)
    x32 = x if x_dtype == "float32" else b.cast(x, "float32")
    rounded = b.cast(b.op("Mul", x32, _inverse_root(b, x32, NormSpec())), "float16")
    b.output(b.op("Mul", b.cast(rounded, "float32"), b.weight(HIDDEN, "float32")))
    return b.model()


def widened_norm(x_dtype: str, out_dtype: str) -> onnx.ModelProto:
    """A 16-bit x widened to fp32, normalised, cast to the other 16-bit dtype and multiplied by a weight of that
    dtype: the norm reads the widened fp32 x (fp32 in, 16-bit out), the widening Cast stays before it."""
    b = Builder()
    x32 = b.cast(b.input("x", [BATCH, SEQUENCE, HIDDEN], x_dtype), "float32")
    normalized = b.op("Mul", x32, _inverse_root(b, x32, NormSpec()))
    b.output(b.op("Mul", b.cast(normalized, out_dtype), b.weight(HIDDEN, out_dtype)))
    return b.model()


def rms_normalization_cast_back(
    x_dtype: str, scale_dtype: str = "float32", cast_to: str = "float16"
) -> onnx.ModelProto:
    """RMSNormalization with a float32 Y cast down afterwards (dynamo's Gemma3/OLMo2 in fp16)."""
    model = mixed_rms_normalization(x_dtype, scale_dtype)
    y = next(node for node in model.graph.node if node.op_type == "RMSNormalization").output[0]
    reader = next(node for node in model.graph.node if y in node.input)
    reader.input[0] = "y_cast"
    model.graph.node.insert(
        list(model.graph.node).index(reader), helper.make_node("Cast", [y], ["y_cast"], to=ELEM_TYPES[cast_to])
    )
    return onnx.shape_inference.infer_shapes(model)


def autocast_norm(dtype: str = "float16") -> onnx.ModelProto:
    """ModelOpt AutoCast's Gemma3/OLMo2 norm: mean, epsilon and root in 16 bits, widened for an fp32 reciprocal."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    mean = b.reduce("ReduceMean", b.op("Pow", x, b.constant(2.0, dtype)), [-1])
    root = b.op("Sqrt", b.op("Add", mean, b.constant(1e-6, dtype)))
    inverse = b.op("Reciprocal", b.cast(root, "float32"))
    normalized = b.cast(b.op("Mul", b.cast(x, "float32"), inverse), dtype)
    b.output(b.op("Mul", normalized, b.weight(HIDDEN, dtype)))
    return b.model()


# Residual Adds in front of norms (patterns/residual.py): the stacks that become add-norms, and each Add that stays out.
def residual_stack(dtype: str = "float32", layers: int = 2, sums_as_outputs: bool = False) -> onnx.ModelProto:
    """A Llama-style decoder stack with a projection for each sublayer: per layer the stream h goes through two
    residual steps h = h + proj(norm(h)) (attention's and the MLP's), then the final norm reads the last sum. So
    2·layers residual Adds, each read by the next norm and the next Add, and 2·layers + 1 norms, the first reading the
    input. `sums_as_outputs` also makes every residual sum a graph output (through an exact Cast to float32)."""
    b = Builder()
    stream = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    spec = NormSpec(dtype=dtype)
    for _ in range(2 * layers):
        projection = b.constant(b.rng.normal(0.0, HIDDEN**-0.5, (HIDDEN, HIDDEN)), dtype, base="proj")
        stream = b.op("Add", stream, b.op("MatMul", rms_norm(b, stream, spec), projection))
        if sums_as_outputs:
            b.output(stream, [BATCH, SEQUENCE, HIDDEN])
    b.output(rms_norm(b, stream, spec), [BATCH, SEQUENCE, HIDDEN])
    return b.model()


def residual_near_miss(case: str, dtype: str = "float16") -> onnx.ModelProto:
    """One Add in front of a norm that must stay out of it (the norm fused alone); `case` names why:
    "bias" (a constant operand; "cast-bias", "identity-bias", "folded-bias": one reached through a Cast, an Identity,
    or an Identity and a Reshape), "broadcast" (a [1, S, H] operand), "chain" (the last Add of x + a + b), "widened"
    (the widened sum the norm reads is read elsewhere too), "rounded" (a float32 sum cast down to the norm's dtype),
    "qdq" (the norm reads a QuantizeLinear -> DequantizeLinear of the sum), "shared" (two norms read one sum: the
    first takes the Add), "dtypes" (operands of two dtypes: no checker passes it, the matcher must not fuse it)."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    other = b.input("r", [1, SEQUENCE, HIDDEN] if case == "broadcast" else [BATCH, SEQUENCE, HIDDEN], dtype)
    spec = NormSpec(dtype=dtype)
    if case == "bias":
        total = b.op("Add", x, b.weight(HIDDEN, dtype, base="bias"))
    elif case == "cast-bias":
        total = b.op("Add", x, b.cast(b.weight(HIDDEN, "float32", base="bias"), dtype))
    elif case == "identity-bias":
        total = b.op("Add", x, b.op("Identity", b.weight(HIDDEN, dtype, base="bias")))
    elif case == "folded-bias":
        shape = b.constant(np.array([1, 1, HIDDEN], np.int64), "int64", base="shape")
        total = b.op("Add", x, b.op("Reshape", b.op("Identity", b.weight(HIDDEN, dtype, base="bias")), shape))
    elif case == "chain":
        total = b.op("Add", b.op("Add", x, other), b.input("s", [BATCH, SEQUENCE, HIDDEN], dtype))
    elif case == "rounded":
        wide = b.op("Add", b.cast(x, "float32"), b.cast(other, "float32"))
        total = b.cast(wide, dtype)
        b.output(wide, [BATCH, SEQUENCE, HIDDEN])
    elif case == "qdq":
        scale, zero = b.constant(4.0 / 127, dtype, base="scale"), b.constant(0, "int8", base="zero_point")
        summed = b.op("Add", x, other)
        total = b.op("DequantizeLinear", b.op("QuantizeLinear", summed, scale, zero), scale, zero)
    elif case == "dtypes":
        total = b.op("Add", x, b.cast(other, "float32" if dtype != "float32" else "float16"))
    else:
        total = b.op("Add", x, other)
    y = rms_norm(b, total, spec)
    if case == "widened":
        widened = next(node.output[0] for node in b.nodes if node.op_type == "Cast" and node.input[0] == total)
        b.output(b.op("Relu", widened), [BATCH, SEQUENCE, HIDDEN])
    if case == "shared":
        b.output(rms_norm(b, total, replace(spec, epsilon=1e-5)), [BATCH, SEQUENCE, HIDDEN])
    b.output(y, [BATCH, SEQUENCE, HIDDEN])
    return b.model(standard=case != "dtypes")


def skip_norm(dtype: str = "float32", bias: bool = False, sum_output: bool = True) -> onnx.ModelProto:
    """onnxruntime's SkipSimplifiedLayerNormalization of x and skip, with a bias input or not, its sum output
    (index 3) a graph output or absent."""
    b = Builder()
    x = b.input("x", [BATCH, SEQUENCE, HIDDEN], dtype)
    skip = b.input("skip", [BATCH, SEQUENCE, HIDDEN], dtype)
    inputs = [x, skip, b.weight(HIDDEN, dtype)] + ([b.weight(HIDDEN, dtype, base="bias")] if bias else [])
    kind = "SkipSimplifiedLayerNormalization"
    outputs = b.op(kind, *inputs, domain="com.microsoft", outputs=4 if sum_output else 1, epsilon=1e-6)
    if sum_output:
        b.nodes[-1].output[1] = b.nodes[-1].output[2] = ""
        b.output(outputs[0], [BATCH, SEQUENCE, HIDDEN])
        b.output(outputs[3], [BATCH, SEQUENCE, HIDDEN])
    else:
        b.output(outputs, [BATCH, SEQUENCE, HIDDEN])
    return b.model(standard=False)
