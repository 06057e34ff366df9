"""`compile --never-slower`: where the trtfuse engine loses a case to TensorRT alone beyond noise, find which kinds
of node lose, with a bounded number of extra builds, and keep the fastest configuration.

The kinds are the fusion's switches (`FusionOptions`): norms fused alone (`--no-fuse-norm`), residual add-norms
(`--no-fuse-residual`: the norm stays fused, the Add goes back to TensorRT), q/k pairs (`--no-fuse-qk`, their
rotations with them), rotary embeddings (`--no-fuse-rope`: the pair stays fused, the rotation goes back) and the
quantized forms (`--no-fuse-quant`: the Q/DQ pairs go back to the graph). The search, given the full fusion's A/B:

1. no case slower beyond noise: keep the full fusion (no extra build);
2. else one build per kind the model has, that kind left to TensorRT (K builds, K <= 5);
3. then, where two or more of those were better than the full fusion, one build with all of them left (1 build);

and keeps, of everything measured and of TensorRT alone (every kind left), the configuration with no slower case
and the lowest geometric mean of its time ratios to TensorRT alone. At most K + 1 extra builds, K the kinds present.
Each candidate is timed against a fresh pairing with TensorRT alone's engine, so their ratios compare.

`choose_fusion` is plain Python over a `measure` callable; the pipeline gives it the builds and the A/B.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from trtfuse import contract
from trtfuse.engine.ab_stats import Comparison, Verdict
from trtfuse.fusion.options import FusionOptions


class FusionKind(enum.Enum):
    """A kind of trtfuse node the search can leave to TensorRT, by the flag that does it."""

    NORM = "--no-fuse-norm"
    ADD_NORM = "--no-fuse-residual"
    QK = "--no-fuse-qk"
    ROPE = "--no-fuse-rope"
    QUANT = "--no-fuse-quant"

    @property
    def noun(self) -> str:
        return {
            FusionKind.NORM: "norms fused alone",
            FusionKind.ADD_NORM: "residual add-norms",
            FusionKind.QK: "q/k-norm pairs",
            FusionKind.ROPE: "rotary embeddings",
            FusionKind.QUANT: "quantized forms",
        }[self]


def without(options: FusionOptions, kinds: Iterable[FusionKind]) -> FusionOptions:
    """`options` with each of `kinds` left to TensorRT."""
    off = set(kinds)
    return replace(
        options,
        fuse_norm=options.fuse_norm and FusionKind.NORM not in off,
        fuse_residual=options.fuse_residual and FusionKind.ADD_NORM not in off,
        fuse_qk=options.fuse_qk and FusionKind.QK not in off,
        fuse_rope=options.fuse_rope and FusionKind.ROPE not in off,
        fuse_quant=options.fuse_quant and FusionKind.QUANT not in off,
    )


def kinds_present(nodes: Mapping[str, int]) -> list[FusionKind]:
    """The kinds a fused model's plugin nodes (counted per op, a quantized op with its plain one) hold, in
    FusionKind order; a rotary QK-norm is both a q/k pair and a rotary embedding."""
    counts = {op: nodes.get(op, 0) + nodes.get(contract.QUANTIZED_OPS[op].name, 0) for op in contract.QUANTIZED_OPS}
    ops = {
        FusionKind.NORM: (contract.RMS_NORM_OP,),
        FusionKind.ADD_NORM: (contract.ADD_RMS_NORM_OP,),
        FusionKind.QK: (contract.QK_NORM_OP, contract.QK_NORM_ROPE_OP),
        FusionKind.ROPE: (contract.QK_NORM_ROPE_OP,),
    }
    present = [kind for kind, names in ops.items() if any(counts[name] for name in names)]
    if any(nodes.get(op.name, 0) for op in contract.OPS.values() if op.quantized):
        present.append(FusionKind.QUANT)
    return present


@dataclass(frozen=True)
class Candidate:
    """One configuration measured against TensorRT alone: the kinds it leaves to TensorRT and each case's
    comparison (empty for TensorRT alone itself, which is the reference)."""

    left: frozenset[FusionKind]
    comparisons: Mapping[str, Comparison] = field(default_factory=dict)
    alone: bool = False

    @property
    def slower(self) -> list[str]:
        return [name for name, c in self.comparisons.items() if c.verdict is Verdict.SLOWER]

    @property
    def score(self) -> float:
        """The geometric mean of the cases' time ratios to TensorRT alone (1 for TensorRT alone): lower is faster."""
        if self.alone or not self.comparisons:
            return 1.0
        return math.exp(sum(math.log(c.ratio) for c in self.comparisons.values()) / len(self.comparisons))

    def label(self) -> str:
        if self.alone:
            return "TensorRT alone (no trtfuse node)"
        if not self.left:
            return "every trtfuse node"
        return "without " + ", ".join(kind.noun for kind in _ordered(self.left)) + f" ({flags(self.left)})"

    def to_json(self) -> dict:
        return {
            "configuration": self.label(),
            "flags": [kind.value for kind in _ordered(self.left)],
            "tensorrt_alone": self.alone,
            "score": self.score,
            "slower_cases": self.slower,
            "cases": {name: c.to_json() for name, c in self.comparisons.items()},
        }


def _ordered(kinds: Iterable[FusionKind]) -> list[FusionKind]:
    return [kind for kind in FusionKind if kind in set(kinds)]


def flags(kinds: Iterable[FusionKind]) -> str:
    return " ".join(kind.value for kind in _ordered(kinds))


@dataclass(frozen=True)
class FusionChoice:
    """What the search kept and why, with every candidate it measured and how many extra builds it made (and the
    bound it stated before it began)."""

    kept: Candidate
    why: str
    candidates: tuple[Candidate, ...]
    builds: int
    bound: int

    def to_json(self) -> dict:
        return {
            "kept": self.kept.label(),
            "flags": [kind.value for kind in _ordered(self.kept.left)],
            "tensorrt_alone": self.kept.alone,
            "why": self.why,
            "extra_builds": self.builds,
            "extra_builds_bound": self.bound,
            "candidates": [candidate.to_json() for candidate in self.candidates],
        }


# Measures one configuration (the kinds it leaves to TensorRT) against TensorRT alone: one build and one A/B.
Measure = Callable[[frozenset[FusionKind]], Candidate]


def search_bound(present: Sequence[FusionKind]) -> int:
    """The most extra builds the search makes for a model with these kinds: one per kind, one combination."""
    return len(present) + 1 if len(present) > 1 else len(present)


def choose_fusion(full: Candidate, present: Sequence[FusionKind], measure: Measure) -> FusionChoice:
    """The search of the module docstring, from the full fusion's measurement."""
    bound = search_bound(present)
    if not full.slower:
        why = "no case is slower than TensorRT alone beyond noise, so every trtfuse node is kept"
        return FusionChoice(full, why, (full,), 0, bound)
    singles = [measure(frozenset({kind})) for kind in present if kind not in full.left]
    helped = [candidate for candidate in singles if candidate.score < full.score]
    measured = [full, *singles]
    if len(helped) > 1:
        measured.append(measure(frozenset().union(*(candidate.left for candidate in helped))))
    builds = len(measured) - 1
    alone = Candidate(frozenset(present), alone=True)
    never_slower = [candidate for candidate in measured if not candidate.slower]
    best = min(never_slower, key=lambda candidate: candidate.score, default=None)
    if best is None or best.score >= 1.0:
        why = (
            f"every trtfuse configuration measured ({builds} extra builds) was slower than TensorRT alone in some "
            "case or no faster overall, so the engine is TensorRT's own, with no trtfuse node"
        )
        return FusionChoice(alone, why, (*measured, alone), builds, bound)
    slow = ", ".join(full.slower)
    why = (
        f"with every trtfuse node, {slow} {'was' if len(full.slower) == 1 else 'were'} slower than TensorRT alone "
        f"beyond noise; {best.label()} is slower in no case and the fastest measured "
        f"({100.0 * (best.score - 1.0):+.1f} % against TensorRT alone, geometric mean over the cases)"
    )
    return FusionChoice(best, why, tuple(measured), builds, bound)
