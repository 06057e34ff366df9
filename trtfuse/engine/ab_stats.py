"""Is one engine faster than another? Paired timing rounds, a difference of medians and its noise.

The two engines run in alternating rounds on the same GPU (baseline first in even rounds, trtfuse first in odd ones),
so clock and thermal drift reach both alike; each round gives one median time per engine. The verdict reads the
per-round differences (trtfuse minus baseline): their median, and a distribution-free confidence interval of that
median from the order statistics (the sign test's interval), so no normality is assumed of GPU times, whose tails
are long. A difference whose interval holds zero is within noise.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

# The interval's confidence: the smallest order statistics whose binomial tail stays under (1 - CONFIDENCE) / 2.
CONFIDENCE = 0.95
# Below this many rounds the sign test's 95 % interval is the whole range of the differences (n = 5 gives 2 x 1/32 =
# 0.0625 > 0.05 already at the extremes), so fewer rounds could never call a difference.
MIN_ROUNDS = 6


class Verdict(Enum):
    FASTER = "faster"
    SLOWER = "slower"
    NOISE = "within noise"


def _interval_rank(rounds: int, confidence: float = CONFIDENCE) -> int:
    """The 0-based rank j such that [d_(j), d_(n-1-j)] of n sorted differences covers their population median with
    at least `confidence`: the largest j with P(Binomial(n, 1/2) <= j) <= (1 - confidence) / 2, the interval's
    coverage being 1 - 2 P(Binomial(n, 1/2) <= j). 0 (the whole range) when even j = 0 fails, which MIN_ROUNDS
    rules out."""
    tail = (1.0 - confidence) / 2.0
    cumulative, rank = 0.0, 0
    for below in range(rounds):
        cumulative += math.comb(rounds, below) / 2.0**rounds
        if cumulative > tail:
            break
        rank = below
    return rank


@dataclass(frozen=True)
class Comparison:
    """Two engines' times on one case (ms per run): each one's median over the rounds, the median of the per-round
    differences (candidate - baseline) and the interval around it; `noise` is the interval's half width."""

    baseline_ms: float
    candidate_ms: float
    difference_ms: float
    low_ms: float
    high_ms: float
    rounds: int

    @property
    def noise_ms(self) -> float:
        return (self.high_ms - self.low_ms) / 2.0

    @property
    def ratio(self) -> float:
        """Candidate over baseline: below 1 is faster."""
        return self.candidate_ms / self.baseline_ms

    @property
    def verdict(self) -> Verdict:
        if self.high_ms < 0.0:
            return Verdict.FASTER
        if self.low_ms > 0.0:
            return Verdict.SLOWER
        return Verdict.NOISE

    def to_json(self) -> dict:
        return {
            "baseline_ms": self.baseline_ms,
            "trtfuse_ms": self.candidate_ms,
            "difference_ms": self.difference_ms,
            "difference_pct": 100.0 * (self.ratio - 1.0),
            "interval_ms": [self.low_ms, self.high_ms],
            "noise_ms": self.noise_ms,
            "rounds": self.rounds,
            "verdict": self.verdict.value,
        }


def compare_rounds(baseline: Sequence[float], candidate: Sequence[float]) -> Comparison:
    """The comparison of paired rounds: `baseline[i]` and `candidate[i]` timed in the same round."""
    if len(baseline) != len(candidate):
        raise ValueError(f"paired rounds differ in number: {len(baseline)} and {len(candidate)}")
    if len(baseline) < MIN_ROUNDS:
        raise ValueError(f"a comparison needs at least {MIN_ROUNDS} rounds, got {len(baseline)}")
    differences = sorted(c - b for b, c in zip(baseline, candidate, strict=True))
    rank = _interval_rank(len(differences))
    return Comparison(
        baseline_ms=statistics.median(baseline),
        candidate_ms=statistics.median(candidate),
        difference_ms=statistics.median(differences),
        low_ms=differences[rank],
        high_ms=differences[len(differences) - 1 - rank],
        rounds=len(differences),
    )
