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

Beside it, two more readings of the same guesses:

- the one-run f-DP audit of Mahloujifar, Melis and Chaudhuri ("Auditing f-Differential Privacy in
  One Run", ICML 2025, arXiv 2410.22235) with a Gaussian trade-off: it rejects "the run is μ-GDP"
  when v right guesses of r are too many for any μ-GDP mechanism (their recursion over the
  guesses, below), and reports ε_lb as the largest ε whose Gaussian mechanism at the same δ,
  μ(ε, δ), is rejected. It is tighter than the binomial bound because the Gaussian trade-off
  curve is, but it tests a stronger claim than (ε, δ)-DP: a run that is (ε, δ)-DP but not
  Gaussian-shaped can fail it, so the verdict does not rest on it;
- the true-positive rate at a fixed low false-positive rate, with Clopper–Pearson intervals and
  the ε estimate log((TPR_low − δ) / FPR_high) they give: a description of the scores (the
  canaries of one run are not independent trials), not a bound.

Everything here is pure (numbers in, numbers out): the run, the canaries and the scores live in
``privzo.audit``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy import optimize, special, stats

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
    return largest_rejected(
        lambda epsilon: p_value(canaries, guesses, correct, epsilon, delta) <= alpha
    )


def largest_rejected(rejected: Callable[[float], bool]) -> float:
    """The largest ε in [0, MAX_EPSILON] that ``rejected`` holds for, by doubling then bisection
    (``rejected`` holds on an interval [0, ε_lb]); 0 when it fails at ε = 0."""
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


# The bounds computed from each test's counts: every test is made once per bound, so a
# Bonferroni correction over the tests divides α by this many as well.
BOUNDS = ("one-run", "one-run-f-dp-gaussian")


@dataclass(frozen=True)
class GuessResult:
    """One choice of k: guess "in" for the k highest scores, "out" for the k lowest; ε_lb by
    the binomial bound and by the f-DP one with a Gaussian trade-off (0.0 in records written
    before the latter was computed)."""

    k: int
    guesses: int
    correct: int
    correct_in: int
    correct_out: int
    epsilon_lower_bound: float
    fdp_epsilon_lower_bound: float = 0.0


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
    """Both ε_lb (``BOUNDS``) for each k in ``ks``, each at level α / (len(ks) · len(BOUNDS))
    (Bonferroni over the sweep and the bounds).

    The largest of them is then a valid lower bound at confidence 1 − α (each under its own
    hypothesis): trying several k and bounds and keeping the best is multiple testing, and the
    union bound over the tests pays for it.
    """
    if len(scores) != len(included):
        raise ValueError(f"{len(scores)} scores for {len(included)} canaries")
    if not ks:
        raise ValueError("give at least one k")
    level = alpha / (len(ks) * len(BOUNDS))
    results = []
    for k in ks:
        correct_in, correct_out = count_correct(scores, included, k)
        correct = correct_in + correct_out
        bound = epsilon_lower_bound(len(scores), 2 * k, correct, delta=delta, alpha=level)
        fdp = fdp_epsilon_lower_bound(len(scores), 2 * k, correct, delta=delta, alpha=level)
        results.append(GuessResult(k, 2 * k, correct, correct_in, correct_out, bound, fdp))
    return results


def gaussian_delta(epsilon: float, mu: float) -> float:
    """δ(ε) of μ-GDP: Φ(−ε/μ + μ/2) − e^ε Φ(−ε/μ − μ/2) (Dong, Roth and Su 2022)."""
    if mu <= 0:
        return 0.0
    first = special.ndtr(-epsilon / mu + mu / 2)
    second = math.exp(epsilon + special.log_ndtr(-epsilon / mu - mu / 2))
    return float(max(0.0, first - second))


def gaussian_mu(epsilon: float, delta: float) -> float:
    """The μ of the Gaussian mechanism that is exactly (ε, δ)-DP: δ(ε) grows with μ."""
    if epsilon < 0 or not 0 < delta < 1:
        raise ValueError(f"need epsilon ≥ 0 and 0 < delta < 1; got {epsilon}, {delta}")
    high = 1.0
    while gaussian_delta(epsilon, high) < delta:
        high *= 2
    return float(optimize.brentq(lambda mu: gaussian_delta(epsilon, mu) - delta, 0.0, high))


def gaussian_floor(mu: float) -> Callable[[float], float]:
    """x ↦ Φ(Φ⁻¹(x) − μ): the least probability, under the other of two neighbouring inputs,
    of an event that has probability x under one, for a μ-GDP mechanism (its trade-off at
    1 − x)."""
    return lambda x: float(special.ndtr(special.ndtri(x) - mu))


def fdp_rejects(
    canaries: int, guesses: int, correct: int, floor: Callable[[float], float], alpha: float
) -> bool:
    """Whether ``correct`` of ``guesses`` right guesses reject the trade-off behind ``floor``
    at level ``alpha`` (Mahloujifar et al., the recursion with a cap).

    Suppose P[≥ v right] > α. Then a fraction α·v/m of the canaries is, in expectation, guessed
    right in that event and α·(r − v)/m wrong; the trade-off forces the wrong mass h up to at
    least floor(right mass r), and each rise of h lifts r again by i/(r − i) of it, for
    i = v − 1 down to 0. Guessing more than r/m of the canaries (r + h > r/m) is impossible, so
    the assumption, and with it the trade-off, is rejected.
    """
    check_counts(canaries, guesses, correct)
    right = alpha * correct / canaries
    wrong = alpha * (guesses - correct) / canaries
    for index in range(correct - 1, -1, -1):
        raised = max(wrong, floor(right))
        if raised == wrong:  # neither mass moves again
            break
        right = min(right + index / (guesses - index) * (raised - wrong), 1.0)
        wrong = raised
    return right + wrong > guesses / canaries


def fdp_epsilon_lower_bound(
    canaries: int, guesses: int, correct: int, *, delta: float, alpha: float
) -> float:
    """The largest ε whose Gaussian mechanism at δ, μ(ε, δ)-GDP, the guesses reject."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha={alpha}: allowed 0 < alpha < 1")
    check_counts(canaries, guesses, correct)
    if correct == 0:
        return 0.0
    return largest_rejected(
        lambda epsilon: fdp_rejects(
            canaries, guesses, correct, gaussian_floor(gaussian_mu(epsilon, delta)), alpha
        )
    )


def clopper_pearson(successes: int, trials: int, alpha: float) -> tuple[float, float]:
    """The two-sided 1 − α Clopper–Pearson interval of a binomial proportion."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"need 0 ≤ successes ≤ trials, trials ≥ 1; got {successes}, {trials}")
    low = 0.0 if successes == 0 else stats.beta.ppf(alpha / 2, successes, trials - successes + 1)
    high = (
        1.0
        if successes == trials
        else stats.beta.ppf(1 - alpha / 2, successes + 1, trials - successes)
    )
    return float(low), float(high)


@dataclass(frozen=True)
class TprAtFpr:
    """Guess "in" above the threshold that lets at most ⌊FPR · out-canaries⌋ out-canaries
    through: the in-canaries caught, with Clopper–Pearson intervals of both rates and the ε
    estimate log((TPR_low − δ) / FPR_high), 0 when that is not positive."""

    fpr_target: float
    true_positives: int
    false_positives: int
    canaries_in: int
    canaries_out: int
    tpr: float
    tpr_low: float
    fpr_high: float
    epsilon_estimate: float


def tpr_at_fpr(
    scores: Sequence[float] | np.ndarray,
    included: Sequence[bool] | np.ndarray,
    fpr: float,
    *,
    delta: float,
    alpha: float,
) -> TprAtFpr:
    """TPR at false-positive rate ``fpr``: the threshold is the score of the out-canary ranked
    ⌊fpr · out⌋ + 1 from the top, and only scores strictly above it are guessed "in"."""
    if not 0 < fpr < 1:
        raise ValueError(f"fpr={fpr}: allowed 0 < fpr < 1")
    values = np.asarray(scores, dtype=np.float64)
    members = np.asarray(included, dtype=bool)
    inside, outside = values[members], np.sort(values[~members])[::-1]
    if not inside.size or not outside.size:
        raise ValueError("need in- and out-canaries for a true- and a false-positive rate")
    allowed = math.floor(fpr * outside.size)
    threshold = outside[allowed] if allowed < outside.size else -math.inf
    positives, false = int((inside > threshold).sum()), int((outside > threshold).sum())
    tpr_low, _ = clopper_pearson(positives, inside.size, alpha)
    _, fpr_high = clopper_pearson(false, outside.size, alpha)
    ratio = (tpr_low - delta) / fpr_high
    return TprAtFpr(
        fpr_target=fpr,
        true_positives=positives,
        false_positives=false,
        canaries_in=int(inside.size),
        canaries_out=int(outside.size),
        tpr=positives / inside.size,
        tpr_low=tpr_low,
        fpr_high=fpr_high,
        epsilon_estimate=max(0.0, math.log(ratio)) if ratio > 0 else 0.0,
    )
