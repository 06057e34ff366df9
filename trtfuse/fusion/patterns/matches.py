"""What the matcher finds: norms to fuse, q/k pairs of them, and candidates it rejected with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx_graphsurgeon as gs

from trtfuse.contract import NormParams, Quantizer, QuantStage, RotaryParams, WeightMode
from trtfuse.fusion.patterns.queries import describe, dtype_name


@dataclass(frozen=True)
class TakenQuantizer:
    """One QuantizeLinear (with the DequantizeLinear after it, for a fake-quant stage) that a fused node takes in as
    the quantizer of `stage` (docs/patterns.md, "Quantized norms"). `nodes` are the pair's nodes, named in reports;
    `output`, for the output stage, is the QuantizeLinear's output: the node writes it in place of the norm's y, or,
    where the QuantizeLinear reads y through `layout` (a Reshape, ...: patterns/quant.py's LAYOUT_OPS), the node
    writes y's codes and `layout`, which stays in the graph, moves them into `output`."""

    stage: QuantStage
    quantizer: Quantizer
    nodes: tuple[gs.Node, ...]
    output: gs.Variable | None = None
    layout: gs.Node | None = None

    @property
    def quantize(self) -> gs.Node:
        return next(node for node in self.nodes if node.op == "QuantizeLinear")


@dataclass
class RmsNormMatch:
    """One RMSNorm: y = x · rsqrt(mean(x², last axis) + epsilon) · (weight + weight_offset), per `params`.

    `x` is the tensor the fused node reads and `y` the final tensor it writes (after the cast back and the weight
    multiply); their dtypes may differ when one is float32 (contract.WeightMode says where the rounding happens).

    `skip_inputs` is empty except for a fused residual norm (SkipSimplifiedLayerNormalization): the tensors added to
    `x` before normalising, in `skip_dtype`. The rewrite writes that sum as Add nodes in front of the fused node, as
    onnxruntime computes it: every operand widened to float32, added in float32, the norm reading the float32 sum;
    `skip_sum`, when the original node exposed it, is that sum rounded once to x's dtype.

    `quantizers` are the Q/DQ pairs the node takes in (its input's, its inverse root's, its output's Q), in stage
    order; none makes it a plain node.
    """

    nodes: list[gs.Node]
    x: gs.Variable
    y: gs.Variable
    weight: gs.Constant | gs.Variable | None
    params: NormParams
    hidden_size: int
    tags: tuple[str, ...]
    name: str
    skip_inputs: tuple[gs.Tensor, ...] = ()
    skip_sum: gs.Variable | None = None
    skip_dtype: str | None = None
    quantizers: tuple[TakenQuantizer, ...] = ()

    def __post_init__(self) -> None:
        # With float32 in and out the cast back is the identity and both weighted modes are one function; naming it
        # one way keeps one kernel variant per norm, as docs/plugin-nodes.md says.
        if self.params.weight_mode == WeightMode.BEFORE_CAST and self.dtype == self.output_dtype == "float32":
            self.params = replace(self.params, weight_mode=WeightMode.AFTER_CAST)

    @property
    def dtype(self) -> str:
        """The dtype the fused node reads: x's, or for a residual norm the dtype its sum is computed in."""
        return self.skip_dtype or dtype_name(self.x) or "unknown"

    @property
    def output_dtype(self) -> str:
        """y's dtype; a y the graph leaves untyped (onnx infers no contrib op) has x's, as every norm op gives it."""
        return dtype_name(self.y) or dtype_name(self.x) or "unknown"

    @property
    def rounds_otherwise(self) -> str | None:
        """The tag of a norm the graph rounds otherwise than its node (`t5`, `core-float16`...: docs/patterns.md),
        whose y may then differ from the graph's in its last bit; None where the node's y is the graph's."""
        return next((tag for tag in self.tags if tag == "t5" or tag.startswith("core-")), None)


@dataclass
class QkNormPair:
    """The q-norm and k-norm of one attention block: fused into one node, launched once."""

    q: RmsNormMatch
    k: RmsNormMatch


@dataclass(frozen=True)
class RotaryTable:
    """cos or sin as a rotation reads it (`tensor`), and the standard ops that make it the node's [Bc, S, R] table
    (docs/plugin-nodes.md, "Rotary embedding"): squeeze axis `squeeze` of a 4-D operand (its head axis), or prepend a
    batch axis to a 2-D one (`unsqueeze`); gather a cache's rows by `positions`; widen a half-width cache (`half`) to R
    as the rotation pairs its elements. `tensor` itself where it is the table already."""

    tensor: gs.Tensor
    squeeze: int | None = None
    unsqueeze: bool = False
    positions: gs.Tensor | None = None
    half: bool = False


@dataclass
class RotatedNorm:
    """One norm of a QK pair and the rotary embedding its output goes through: `layout` are the ops between them
    (Reshape, Transpose), which stay in the graph after the fused node and then move the rotated values (unless the
    node writes their layout itself, `rotary.output_layout`); `nodes` the
    rotation's own, which the node replaces; `rotated` the tensor the rotation reads (the layout's last output, or
    the norm's y); `result` what it computes, under the graph's name (after the Casts that end it); `quantizer` the
    QuantizeLinear of the result the node takes in as its output stage, if any; `products` the QuantizeLinear ->
    DequantizeLinear pairs on the rotation's cos and sin products it takes in as its product stages (ModelOpt);
    `normalised` the pair on the norm's output that the rotation reads through, taken in as the normalised stage
    (ModelOpt's INT8 Gemma3: `norm.y` is then that pair's dequantized value, what the rotation reads)."""

    norm: RmsNormMatch
    layout: tuple[gs.Node, ...]
    nodes: tuple[gs.Node, ...]
    rotated: gs.Tensor
    result: gs.Variable
    cos: RotaryTable
    sin: RotaryTable
    rotary: RotaryParams
    quantizer: TakenQuantizer | None = None
    products: tuple[TakenQuantizer, ...] = ()
    normalised: TakenQuantizer | None = None
    # The layout ops take y from token-major into [B, H, S, D] (no Shape node reading between them): the node may
    # write that layout itself (`RotaryParams.output_layout`), which it does where it takes a Q after them.
    moves_into_heads: bool = False

    @property
    def rotation_quantizers(self) -> tuple[TakenQuantizer, ...]:
        """The pairs the rotation adds to its norm's: on the norm's output, on its cos and sin products, then its
        output's QuantizeLinear, in stage order."""
        ends = (self.normalised, *self.products, self.quantizer)
        return tuple(taken for taken in ends if taken is not None)

    @property
    def quantizers(self) -> tuple[TakenQuantizer, ...]:
        """The norm's own pairs (input, inverse root), then the rotation's: the part's stages in order."""
        return (*self.norm.quantizers, *self.rotation_quantizers)

    @property
    def output_dtype(self) -> str:
        return dtype_name(self.result) or self.norm.output_dtype


@dataclass
class QkNormRopeMatch:
    """A QK pair and the rotary embedding of both its outputs, with the same cos and sin: one TrtfuseQkNormRope."""

    q: RotatedNorm
    k: RotatedNorm

    @property
    def name(self) -> str:
        return self.q.norm.name

    @property
    def quantizers(self) -> tuple[TakenQuantizer, ...]:
        return (*self.q.quantizers, *self.k.quantizers)


@dataclass
class AddNormMatch:
    """A residual Add and the norm that reads its sum: one TrtfuseAddRmsNorm (docs/patterns.md, "Residual Add").

    `operands` are the two tensors added, in the Add's order (the sum is symmetric), both of `operand_dtype`; the
    node reads them in `dtype` (D: the Add's dtype; float32 for onnxruntime's SkipSimplifiedLayerNormalization, whose
    16-bit operands the rewrite widens first, exactly). `total` is the tensor that holds the sum in the original
    graph, whose name the node's h keeps: the Add's output, or the skip op's sum output when the graph reads it (None
    when nothing does: h is then a new tensor nobody reads). `params` are the norm's as the contract computes them
    from the rounded sum in D; `nodes` are the ones replaced besides the norm's (the Add, the widening Casts between
    it and the norm); `add` names the Add (or the skip op) in reports. `quantizers` holds the input stage when the norm
    reads the sum through a QuantizeLinear -> DequantizeLinear pair; the norm's own quantizers are `norm.quantizers`.
    """

    norm: RmsNormMatch
    operands: tuple[gs.Tensor, gs.Tensor]
    operand_dtype: str
    dtype: str
    total: gs.Variable | None
    params: NormParams
    nodes: list[gs.Node]
    add: str
    tags: tuple[str, ...]
    quantizers: tuple[TakenQuantizer, ...] = ()

    @property
    def name(self) -> str:
        return self.norm.name

    @property
    def all_quantizers(self) -> tuple[TakenQuantizer, ...]:
        """The node's quantizers in stage order: the sum's, then the norm's."""
        return (*self.quantizers, *self.norm.quantizers)


@dataclass(frozen=True)
class NearMiss:
    """A candidate that did not match (or was fused only in part): the node and the failed condition."""

    node: str
    reason: str


@dataclass
class NormSearch:
    matches: list[RmsNormMatch] = field(default_factory=list)
    qk_norm_pairs: list[QkNormPair] = field(default_factory=list)
    near_misses: list[NearMiss] = field(default_factory=list)
    # Matched norms whose result reaches no graph output (dead code in the original). They are never rewritten, and
    # each is also a near miss, so inspect and fuse name them and report the same counts.
    dead: list[RmsNormMatch] = field(default_factory=list)
    # Norms fused with the residual Add in front of them (none of them is also in `matches`).
    add_norms: list[AddNormMatch] = field(default_factory=list)
    # Adds in front of a norm that stay outside it, with the reason: the norm itself is fused (in `matches`), so these
    # are no rejected norms and no summary counts them as such.
    residual_near_misses: list[NearMiss] = field(default_factory=list)
    # QuantizeLinear nodes at a fused norm that stay outside it, with the reason; None when the search left every
    # quantizer out (`FusionOptions(fuse_quant=False)`), so that the reports are what they were without the option.
    quant_near_misses: list[NearMiss] | None = None
    # QK pairs fused with the rotary embedding after them (none of them is also in `qk_norm_pairs`).
    qk_norm_ropes: list[QkNormRopeMatch] = field(default_factory=list)
    # Rotations after a fused QK pair that stay outside its node, with the reason; None when the search took no
    # rotations (`FusionOptions(fuse_rope=False)`), so that the reports are what they were without the option.
    rope_near_misses: list[NearMiss] | None = None

    def quantizers_taken(self) -> list[TakenQuantizer]:
        """Every quantizer a fused node takes in, in the order the nodes are listed."""
        taken = [quantizer for match in self.matches for quantizer in match.quantizers]
        taken += [quantizer for add in self.add_norms for quantizer in add.all_quantizers]
        taken += [
            quantizer for pair in self.qk_norm_pairs for match in (pair.q, pair.k) for quantizer in match.quantizers
        ]
        return taken + [quantizer for rope in self.qk_norm_ropes for quantizer in rope.quantizers]


class Rejected(Exception):
    """Raised inside the matcher when a candidate fails a condition; find_norms turns it into a NearMiss."""

    def __init__(self, node: gs.Node, reason: str) -> None:
        super().__init__(f"{describe(node)}: {reason}")
        self.near_miss = NearMiss(describe(node), reason)
