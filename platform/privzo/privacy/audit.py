"""The one-run privacy audit's statistics: from guesses about canaries to a lower bound on ε.

Steinke, Nasr and Jagielski, "Privacy Auditing with One (1) Training Run" (NeurIPS 2023,
arXiv 2305.08846). m canaries are each put in the training set by an independent fair coin; after
one run the auditor guesses "in" or "out" for r of them (abstaining on the rest) and gets v right.
Their main theorem: if the run is (ε, δ)-DP, then for every v

    P[W ≥ v] ≤ P[Binomial(r, q) ≥ v] + 2mδ · max_{i = 1..v} P[v > Binomial(r, q) ≥ v − i] / i,

with q = e^ε / (1 + e^ε), the accuracy of ε-DP randomized response. The right-hand side is the
p-value of "the run is (ε, δ)-DP" given v correct guesses, and it grows with ε; the lower bound
ε_lb at confidence 1 − α is the largest ε whose p-value is still ≤ α (every smaller ε is rejected
at level α). With δ = 0 this reduces to the binomial tail (the pure-DP case); the δ term is what
makes the bound valid for the (ε, δ) guarantee a Gaussian run actually claims.

Everything here is pure (numbers in, numbers out): the run, the canaries and the scores live in
``privzo.audit``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

EPSILON_TOLERANCE = 1e-6  # bisection stops when the bracket around ε_lb is this narrow
MAX_EPSILON = 60.0  # q = 1 − 1e-26 here: beyond float64's resolution of a binomial tail


def randomized_response_accuracy(epsilon: float) -> float:
    """q = e^ε / (1 + e^ε): the best accuracy of a guess about one ε-DP coin."""
    return 1.0 / (1.0 + math.exp(-epsilon))


def check_counts(canaries: int, guesses: int, correct: int) -> None:
    """0 ≤ v ≤ r ≤ m, as the theorem needs (ValueError naming the counts otherwise)."""
    if not 0 <= correct <= guesses <= canaries:
        raise ValueError(
            f"need 0 ≤ correct ≤ guesses ≤ canaries; got correct={correct}, guesses={guesses}, "
            f"canaries={canaries}"
        )


def p_value(canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[≥ ``correct`` right guesses] for an (ε, δ)-DP run (the theorem above)."""
    check_counts(canaries, guesses, correct)
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon ≥ 0 and 0 ≤ delta ≤ 1; got {epsilon}, {delta}")
    q = randomized_response_accuracy(epsilon)
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # P[Binomial(r, q) ≥ v]
    return min(1.0, tail + 2 * canaries * delta * _delta_weight(guesses, correct, q))


def _delta_weight(guesses: int, correct: int, q: float) -> float:
    """max over i in 1..v of P[v > Binomial(r, q) ≥ v − i] / i (0 when v = 0)."""
    if correct == 0:
        return 0.0
    below = stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, q)  # P[= v−1], P[= v−2], …
    windows = np.cumsum(below) / np.arange(1, correct + 1)
    return float(windows.max())


def epsilon_lower_bound(
    canaries: int, guesses: int, correct: int, *, delta: float, alpha: float
) -> float:
    """The largest ε that ``correct`` of ``guesses`` right guesses reject at level ``alpha``.

    0 when even ε = 0 is not rejected (no evidence of leakage). Bisection on the p-value, which
    is continuous and non-decreasing in ε.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha}: allowed 0 < alpha < 1")
    check_counts(canaries, guesses, correct)

    def rejected(epsilon: float) -> bool:
        return p_value(canaries, guesses, correct, epsilon, delta) <= alpha

    if not rejected(0.0):
        return 0.0
    low, high = 0.0, 1.0
    while rejected(high) and high < MAX_EPSILON:
        low, high = high, min(2 * high, MAX_EPSILON)
    if rejected(high):
        return high
    while high - low > EPSILON_TOLERANCE:
        middle = (low + high) / 2
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class GuessResult:
    """One choice of k: guess "in" for the k highest scores, "out" for the k lowest."""

    k: int
    guesses: int
    correct: int
    correct_in: int
    correct_out: int
    epsilon_lower_bound: float


def count_correct(
    scores: Sequence[float] | np.ndarray, included: Sequence[bool] | np.ndarray, k: int
) -> tuple[int, int]:
    """(right "in" guesses among the k highest scores, right "out" among the k lowest).

    Ties are broken by canary order, which the coins do not affect.
    """
    if not 1 <= k <= len(scores) // 2:
        raise ValueError(f"k={k}: allowed 1 ≤ k ≤ canaries / 2 = {len(scores) // 2}")
    order = np.argsort(np.asarray(scores, dtype=np.float64), kind="stable")
    members = np.asarray(included, dtype=bool)
    return int(members[order[-k:]].sum()), int((~members[order[:k]]).sum())


def audit_guesses(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    ks: Sequence[int],
    *,
    delta: float,
    alpha: float,
) -> list[GuessResult]:
    """ε_lb for each k in ``ks``, each at level α / len(ks) (Bonferroni over the sweep).

    The largest of them is then a valid lower bound at confidence 1 − α: trying several k and
    keeping the best is multiple testing, and the union bound over the len(ks) tests pays for it.
    """
    if len(scores) != len(included):
        raise ValueError(f"{len(scores)} scores for {len(included)} canaries")
    if not ks:
        raise ValueError("give at least one k")
    level = alpha / len(ks)
    results = []
    for k in ks:
        correct_in, correct_out = count_correct(scores, included, k)
        correct = correct_in + correct_out
        bound = epsilon_lower_bound(len(scores), 2 * k, correct, delta=delta, alpha=level)
        results.append(GuessResult(k, 2 * k, correct, correct_in, correct_out, bound))
    return results
