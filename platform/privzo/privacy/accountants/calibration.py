"""Calibration: the smallest noise multiplier σ whose ε after T steps meets a target.

One search serves every accountant (``search_sigma``). An accountant hands it ε(σ) curves
(``Curve``): a fine one, whose answer is returned, and optionally a cheaper coarse one that
steers the first probes. The search starts from ``noise_hint`` (a closed-form guess), brackets
the target with secant probes on log ε against log σ (then a geometric walk if need be) and
finishes with Brent's method on the bracket, verified the way
``dp_accounting.calibrate_dp_mechanism`` verifies it (so ε at the returned σ is within the
target). ε(σ) need only fall as σ grows: the discrete mechanisms' step functions work too.

Every ε a curve evaluates is kept in ``memo.EPSILONS``, keyed by the public parameters of the
evaluation: a run's preflight, a study's cells and a search's trials repeat the same
calibrations, and the PLD accountant's evaluations (``pld``) share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable
from dataclasses import dataclass

import numpy as np

from privzo.privacy.accountants.memo import EPSILONS
from privzo.privacy.accountants.query import AccountingQuery

__all__ = [
    "CALIBRATION_RTOL",
    "COARSE_FACTOR",
    "MAX_NOISE_MULTIPLIER",
    "MIN_NOISE_MULTIPLIER",
    "Curve",
    "laplace_sigma_for_pure_dp",
    "noise_hint",
    "search_sigma",
    "subsampled_pure_epsilon",
]

# Calibration searches σ in [MIN, MAX]: above MAX the target is called unattainable; below MIN
# the PLD of one step gets so wide that each evaluation takes tens of seconds.
MIN_NOISE_MULTIPLIER = 0.05
MAX_NOISE_MULTIPLIER = 1e4
# Calibrated σ is within this relative distance above the smallest σ meeting the target.
CALIBRATION_RTOL = 1e-3
# A coarse curve's ε grid is this much coarser than the fine one's (≈10x cheaper per probe).
COARSE_FACTOR = 10.0


@dataclass(frozen=True)
class Curve:
    """ε(σ) of one query at one precision; ``key`` (``AccountingQuery.curve_key``) names it in
    ``EPSILONS``."""

    key: tuple[Hashable, ...]
    epsilon_of: Callable[[float], float]

    def __call__(self, sigma: float) -> float:
        return EPSILONS.get((self.key, sigma), lambda: self.epsilon_of(sigma))


# --- the first guess ---------------------------------------------------------------------------


def subsampled_pure_epsilon(step_epsilon: float, sample_rate: float) -> float:
    """ε of one Poisson-subsampled ``step_epsilon``-DP step: log(1 + p(e^ε − 1))."""
    return math.log1p(sample_rate * math.expm1(step_epsilon))


def laplace_sigma_for_pure_dp(epsilon: float, sample_rate: float, steps: int) -> float:
    """Invert ε = T·log(1 + p(e^{1/σ} − 1)) exactly, rounding σ up so ε never exceeds target.

    The pure accountant's answer for continuous Laplace noise, and the ceiling of
    ``noise_hint`` for Laplace noise, which is valid at any δ."""
    inner = math.log1p(math.expm1(epsilon / steps) / sample_rate)
    sigma = 1.0 / inner if inner > 0 else math.inf
    while math.isfinite(sigma) and steps * subsampled_pure_epsilon(1.0 / sigma, sample_rate) > (
        epsilon
    ):
        sigma = math.nextafter(sigma, math.inf)
    return sigma


def _gdp_mu(epsilon: float, delta: float) -> float:
    """μ of the μ-GDP trade-off curve passing through (ε, δ) (Dong, Roth & Su 2019)."""

    # lazy: a config is validated without scipy and dp_accounting loaded
    from scipy import optimize, stats

    def delta_of(mu: float) -> float:
        upper = stats.norm.cdf(-epsilon / mu + mu / 2)
        lower = math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2))
        return upper - lower - delta

    # At μ = ε/40 the curve's δ is ~Φ(−40) ≈ 0; at μ = 2ε + 80 it is ~1.
    return float(optimize.brentq(delta_of, epsilon / 40, 2 * epsilon + 80, xtol=1e-12))


def noise_hint(
    mechanism: str, epsilon: float, delta: float, sample_rate: float, steps: int
) -> float:
    """A closed-form first guess of σ from the central limit theorem for composed DP.

    Composing T steps behaves like μ-GDP with μ = p·sqrt(T·χ²(σ)), χ² the divergence between the
    noise and its unit shift (Bu et al. 2020). Good within ~10 % for large p·T and off further for
    few steps, which the bracket search absorbs. Noise other than Gaussian is guessed as Laplace,
    whose pure-DP σ is also a valid answer, so the hint never exceeds it.
    """
    target = _gdp_mu(epsilon, delta) ** 2 / (sample_rate**2 * steps)
    if mechanism == "gaussian":
        return float(np.clip(1.0 / math.sqrt(math.log1p(target)), MIN_NOISE_MULTIPLIER, 1e3))

    from scipy import optimize

    def chi2_gap(x: float) -> float:  # x = 1/b; χ² of Laplace(1, b) vs Laplace(0, b)
        return 2 / 3 * math.exp(x) + 1 / 3 * math.exp(-2 * x) - 1 - target

    x = optimize.brentq(chi2_gap, 0.0, math.log1p(target) + 2.0)
    clt = 1.0 / x if x > 0 else 1e3
    pure = laplace_sigma_for_pure_dp(epsilon, sample_rate, steps)
    return float(np.clip(min(clt, pure), MIN_NOISE_MULTIPLIER, 1e3))


# --- the search --------------------------------------------------------------------------------


def search_sigma(
    query: AccountingQuery, epsilon: float, fine: Curve, coarse: Curve | None = None
) -> float:
    """The smallest σ (within ``CALIBRATION_RTOL``) whose ε on ``fine`` (a curve of ``query``)
    is ≤ ``epsilon``.

    Every fine evaluation may be expensive (PLD's grows with the steps), so the probes first run on
    ``coarse`` when given, then need about three fine ones; the bracket handed to Brent's
    method is usually already within ``CALIBRATION_RTOL``, so the finish only verifies it.
    """
    guess = noise_hint(query.mechanism, epsilon, query.delta, query.sample_rate, query.steps)
    slope = -1.5
    if coarse is not None:
        _, guess, slope = _bracket(coarse, query, epsilon, guess, slope, rtol=CALIBRATION_RTOL / 10)
    lo, hi, _ = _bracket(fine, query, epsilon, guess, slope, rtol=CALIBRATION_RTOL)
    tight = hi - lo <= CALIBRATION_RTOL * lo
    return _finish(fine, epsilon, lo, hi, tol=(hi - lo) if tight else CALIBRATION_RTOL * lo)


def _finish(fine: Curve, epsilon: float, lo: float, hi: float, tol: float) -> float:
    """Brent's method on [lo, hi], then the root moved by ``tol`` to where ε ≤ target if it
    is not there, else bisection (as ``dp_accounting.calibrate_dp_mechanism`` does)."""

    from scipy import optimize

    def gap(sigma: float) -> float:
        return fine(sigma) - epsilon

    root, result = optimize.brentq(gap, lo, hi, xtol=tol, full_output=True)
    if result.converged:
        if not gap(root) > 0:
            return float(root)
        if gap(root + tol) < 0:
            return float(root + tol)
        if gap(root - tol) < 0:
            return float(root - tol)
    return _bisect(gap, lo, hi, tol)


def _bisect(gap: Callable[[float], float], lower: float, upper: float, tol: float) -> float:
    """A point within ``tol`` of the root whose gap is ≤ 0 (the ends' gaps have opposite signs)."""
    lower_value, upper_value = gap(lower), gap(upper)
    while True:
        if lower_value == 0:
            return lower
        if upper_value == 0:
            return upper
        if upper - lower <= tol:
            return lower if lower_value < 0 else upper
        middle = (lower + upper) / 2
        middle_value = gap(middle)
        if middle_value == 0:
            return middle
        if lower_value * middle_value < 0:
            upper, upper_value = middle, middle_value
        else:
            lower, lower_value = middle, middle_value


def _bracket(
    curve: Curve,
    query: AccountingQuery,
    epsilon: float,
    guess: float,
    slope: float,
    rtol: float,
) -> tuple[float, float, float]:
    """(lo, hi, slope): ε(lo) > ``epsilon`` ≥ ε(hi), as tight as a few secant probes make it."""
    lo, hi, slope = _secant_probes(curve, epsilon, guess, slope, rtol)
    if lo is None or hi is None:
        start = lo if lo is not None else hi
        assert start is not None  # the first probe always lands on one side
        lo, hi = _expand(curve, query, epsilon, start)
    return lo, hi, slope


def _secant_probes(
    curve: Curve, epsilon: float, guess: float, slope: float, rtol: float, budget: int = 8
) -> tuple[float | None, float | None, float]:
    """Safeguarded secant on log ε against log σ, which is nearly linear.

    Each probe is aimed a quarter tolerance to the side of the predicted root where no probe has
    landed yet, so a good prediction closes the bracket to ``rtol`` with the next probe. Steps
    are capped at a factor 2 and σ stays in [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER].
    """
    tau = math.log1p(rtol)
    bounds = (math.log(MIN_NOISE_MULTIPLIER), math.log(MAX_NOISE_MULTIPLIER))
    lo: tuple[float, float] | None = None  # (log σ, log ε − log target) with ε above target
    hi: tuple[float, float] | None = None  # ... with ε at or below target
    u = _clamp(math.log(guess), *bounds)
    previous: tuple[float, float] | None = None
    for _ in range(budget):
        h = math.log(max(curve(math.exp(u)), 1e-300)) - math.log(epsilon)
        if h > 0 and (lo is None or u > lo[0]):
            lo = (u, h)
        if h <= 0 and (hi is None or u < hi[0]):
            hi = (u, h)
        if lo is not None and hi is not None and hi[0] - lo[0] <= tau:
            break
        # an accountant answers ε = inf below some σ (the discrete noise's grid): no slope there
        finite = math.isfinite(h) and previous is not None and math.isfinite(previous[1])
        if finite and previous is not None and abs(u - previous[0]) > 4 * tau:
            measured = (h - previous[1]) / (u - previous[0])
            slope = measured if measured < 0 else slope
        previous = (u, h)
        root = _clamp(u - h / slope, u - math.log(2), u + math.log(2))
        if lo is None:
            aim = root - tau / 4
        elif hi is None:
            aim = root + tau / 4
        else:
            root = _clamp(root, lo[0], hi[0])
            if root - lo[0] < tau / 2:
                aim = lo[0] + tau
            elif hi[0] - root < tau / 2:
                aim = hi[0] - tau
            else:
                aim = root
        aim = _clamp(aim, *bounds)
        if aim == u:
            break
        u = aim
    return (
        None if lo is None else math.exp(lo[0]),
        None if hi is None else math.exp(hi[0]),
        slope,
    )


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _expand(
    curve: Curve, query: AccountingQuery, epsilon: float, start: float
) -> tuple[float, float]:
    """Fallback: walk from ``start`` in growing geometric steps until the target is bracketed.

    Small σ is expensive for PLD (a wider loss distribution), so the walk down grows its step
    slowly; the walk up may double. Raises ValueError when σ leaves the searched range.
    """
    factor, problem = 1.02, query.describe(epsilon)
    sigma = _clamp(start, MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER)
    if curve(sigma) > epsilon:  # too little noise: walk up
        while True:
            upper = min(sigma * factor, MAX_NOISE_MULTIPLIER)
            if curve(upper) <= epsilon:
                return sigma, upper
            if upper >= MAX_NOISE_MULTIPLIER:
                raise ValueError(
                    f"cannot meet {problem} (accountant {query.accountant!r}): even "
                    f"noise_multiplier={MAX_NOISE_MULTIPLIER:g} spends more; allow a larger "
                    "epsilon or delta, or use fewer steps or a smaller sample_rate"
                )
            sigma, factor = upper, min(factor**2, 2.0)
    while True:  # enough noise: walk down
        lower = max(sigma / factor, MIN_NOISE_MULTIPLIER)
        if curve(lower) > epsilon:
            return lower, sigma
        if lower <= MIN_NOISE_MULTIPLIER:
            raise ValueError(
                f"{problem} is met even at noise_multiplier={MIN_NOISE_MULTIPLIER} "
                f"(accountant {query.accountant!r}); calibration does not search lower, where "
                "PLD evaluations take minutes: set noise_multiplier explicitly or tighten the "
                "target"
            )
        sigma, factor = lower, min(factor**2, 1.5)
