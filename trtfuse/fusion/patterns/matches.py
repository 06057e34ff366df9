"""What the matcher finds: norms to fuse, q/k pairs of them, and candidates it rejected with the reason."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import onnx_graphsurgeon as gs

from trtfuse.contract import NormParams, WeightMode
from trtfuse.fusion.patterns.queries import describe, dtype_name


@dataclass
class RmsNormMatch:
    """One RMSNorm: y = x · rsqrt(mean(x², last axis) + epsilon) · (weight + weight_offset), per `params`.

    `x` is the tensor the fused node reads and `y` the final tensor it writes (after the cast back and the weight
    multiply); their dtypes may differ when one is float32 (contract.WeightMode says where the rounding happens).

    `skip_inputs` is empty except for a fused residual norm (SkipSimplifiedLayerNormalization): the tensors added to
    `x` before normalising, in `skip_dtype`. The rewrite writes that sum as Add nodes in front of the fused node, as
    onnxruntime computes it: every operand widened to float32, added in float32, the norm reading the float32 sum;
    `skip_sum`, when the original node exposed it, is that sum rounded once to x's dtype.
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


@dataclass
class QkNormPair:
    """The q-norm and k-norm of one attention block: fused into one node, launched once."""

    q: RmsNormMatch
    k: RmsNormMatch


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


class Rejected(Exception):
    """Raised inside the matcher when a candidate fails a condition; find_norms turns it into a NearMiss."""

    def __init__(self, node: gs.Node, reason: str) -> None:
        super().__init__(f"{describe(node)}: {reason}")
        self.near_miss = NearMiss(describe(node), reason)
