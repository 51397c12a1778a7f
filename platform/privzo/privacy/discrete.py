"""Exact discrete Laplace and discrete Gaussian samplers (Canonne, Kamath & Steinke, 2020).

A float sampler's outputs are not spread over the reals as its density says: which doubles can
come out of ``normal`` or ``laplace`` depends on the draw, so the low bits of a noisy release can
reveal the un-noised value (Mironov, 2012). These samplers draw an *integer* k with exactly the
discrete distribution, using only integer and rational arithmetic on uniform integers from the
operating system's entropy (``secrets``); the released noise is γ·k on a public grid γ, a
post-processing of k, so no floating-point artefact depends on the secret.

The algorithms are those of the paper (Algorithms 1 to 3): ``bernoulli_exp`` draws
Bernoulli(e^{−γ}) for a rational γ ≥ 0, ``discrete_laplace`` draws P(k) ∝ e^{−|k|/t} by a
geometric number of e^{−1} coins, and ``discrete_gaussian`` draws P(k) ∝ e^{−k²/2σ²} by
rejection from a discrete Laplace of scale ⌊σ⌋ + 1. ``rounded_laplace`` draws round(X) for X
continuous Laplace of any rational scale b (LMO's noise on the grid), with a geometric of ratio
e^{−1/b} drawn as the paper draws its discrete Laplace (a uniform remainder plus whole units),
so a large b costs no more coins than a small one.
"""

from __future__ import annotations

import math
import secrets
from fractions import Fraction

__all__ = [
    "DEFAULT_SCORE_GRID",
    "bernoulli",
    "bernoulli_exp",
    "check_grid",
    "discrete_gaussian",
    "discrete_laplace",
    "geometric_exp",
    "grid_sensitivity",
    "noise_units",
    "rounded_laplace",
    "unit_interval_units",
    "vector_grid_bound",
]

_ONE = Fraction(1)


def bernoulli(probability: Fraction) -> bool:
    """True with probability ``probability`` (a rational in [0, 1]), exactly."""
    assert 0 <= probability <= 1, probability
    return secrets.randbelow(probability.denominator) < probability.numerator


def _bernoulli_exp_unit(gamma: Fraction) -> bool:
    """Bernoulli(e^{−γ}) for 0 ≤ γ ≤ 1: the parity of the first k with no Bernoulli(γ/k) success."""
    k = 1
    while bernoulli(gamma / k):
        k += 1
    return k % 2 == 1


def bernoulli_exp(gamma: Fraction) -> bool:
    """True with probability e^{−γ} for a rational γ ≥ 0, exactly (γ > 1: ⌊γ⌋ e^{−1} coins
    and one e^{−(γ − ⌊γ⌋)} coin must all come up)."""
    assert gamma >= 0, gamma
    whole = math.floor(gamma)
    for _ in range(whole):
        if not _bernoulli_exp_unit(_ONE):
            return False
    return _bernoulli_exp_unit(gamma - whole)


def discrete_laplace(scale: int) -> int:
    """k with P(k) ∝ e^{−|k|/scale} for an integer scale ≥ 1."""
    if isinstance(scale, bool) or not isinstance(scale, int) or scale < 1:
        raise ValueError(f"scale={scale!r} must be an integer ≥ 1")
    while True:
        low = secrets.randbelow(scale)  # the remainder of |k| modulo scale
        if not bernoulli_exp(Fraction(low, scale)):
            continue
        high = 0  # the quotient, geometric with ratio e^{−1}
        while bernoulli_exp(_ONE):
            high += 1
        magnitude = low + scale * high
        negative = secrets.randbelow(2) == 1
        if negative and magnitude == 0:
            continue  # 0 would otherwise be drawn twice as often
        return -magnitude if negative else magnitude


def geometric_exp(rate: Fraction) -> int:
    """G ≥ 0 with P(G = g) = (1 − e^{−rate})·e^{−rate·g} for a rational rate = n/d > 0.

    X = U + d·V, with U uniform on {0..d−1} kept with probability e^{−U/d} and V geometric of
    ratio e^{−1}, has P(X = x) ∝ e^{−x/d} on every integer x ≥ 0; then ⌊X/n⌋ = g collects n
    consecutive x and has P ∝ e^{−gn/d}. Each try keeps U with probability at least 1 − e^{−1}
    and V needs about 0.6 coins on average, whatever n and d: a tiny rate (a huge scale) does
    not make the draw longer, only its integers bigger."""
    assert rate > 0, rate
    numerator, denominator = rate.numerator, rate.denominator
    while True:
        remainder = secrets.randbelow(denominator)
        if not bernoulli_exp(Fraction(remainder, denominator)):
            continue
        whole = 0
        while bernoulli_exp(_ONE):
            whole += 1
        return (remainder + denominator * whole) // numerator


def rounded_laplace(scale: Fraction) -> int:
    """round(X) for X ~ Laplace(0, b = ``scale``), a positive rational, exactly (ties have
    probability 0): P(0) = 1 − e^{−1/(2b)}; otherwise a fair sign and |k| = 1 + G with G
    geometric of ratio e^{−1/b}, since P(|k| = j) = e^{−(j − ½)/b}·(1 − e^{−1/b}) for j ≥ 1."""
    assert scale > 0, scale
    if not bernoulli_exp(1 / (2 * scale)):
        return 0
    magnitude = 1 + geometric_exp(1 / scale)
    return -magnitude if secrets.randbelow(2) else magnitude


def discrete_gaussian(sigma: int) -> int:
    """k with P(k) ∝ e^{−k²/2σ²} for an integer σ ≥ 1 (σ² is then an exact integer)."""
    if isinstance(sigma, bool) or not isinstance(sigma, int) or sigma < 1:
        raise ValueError(f"sigma={sigma!r} must be an integer ≥ 1")
    scale = sigma + 1  # ⌊σ⌋ + 1
    variance = sigma * sigma
    while True:
        candidate = discrete_laplace(scale)
        gap = Fraction(abs(candidate)) - Fraction(variance, scale)
        if bernoulli_exp(gap * gap / (2 * variance)):
            return candidate


# --- the grid the scalar noise is drawn on -------------------------------------------------------


def check_grid(grid: int | None) -> int | None:
    """None (continuous) or an integer number of grid points per noise scale, at least 16."""
    if grid is None:
        return None
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 16:
        raise ValueError(f"grid={grid!r} must be an integer ≥ 16 (points per noise scale σC)")
    return grid


def grid_sensitivity(grid: int, noise_multiplier: float) -> int:
    """The sensitivity in grid units of a clipped value |d| ≤ C on the grid γ = σC/K: ⌈K/σ⌉.

    The estimator clamps each rounded value to ±this and the accountants use it, so the two
    always agree (one function, one float rounding)."""
    return math.ceil(grid / noise_multiplier)


def vector_grid_bound(grid: int, noise_multiplier: float, directions: int) -> int:
    """N, the largest integer with √N ≤ K/σ + √J/2: a bound on the squared L2 norm, in grid
    units, of a vector of J ≥ 2 directions' values with L2 norm ≤ C, each rounded to the
    nearest point of the grid γ = σC/K (each coordinate moves by ≤ ½, so the norm by ≤ √J/2,
    and a vector of integers has an integer squared norm). The estimator replaces a rounded
    vector beyond it (only float error in the clipping could make one) and the accountants
    use √N, so the two always agree. Decided in exact rational arithmetic on the float σ."""
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 2:
        raise ValueError(f"directions={directions!r} must be an integer ≥ 2")
    ratio = Fraction(check_grid(grid) or 0) / Fraction(noise_multiplier)  # C in grid units

    def fits(count: int) -> bool:  # √count ≤ ratio + √J/2, squared twice without roots
        if count <= ratio * ratio:
            return True
        gap = count + ratio * ratio - Fraction(directions, 4)  # √count > ratio from here on
        return gap <= 0 or gap * gap <= 4 * ratio * ratio * count

    count = math.floor((float(ratio) + math.sqrt(directions) / 2) ** 2)
    while not fits(count):
        count -= 1
    while fits(count + 1):
        count += 1
    return count


# --- a noised sum of per-example values in [0, 1] (a search's selection score) ------------------

DEFAULT_SCORE_GRID = 1024  # grid points per example of a noised score sum (selection.score_grid)


def noise_units(noise_multiplier: float, grid: int) -> int:
    """⌈σ·m⌉: the integer scale, in grid units 1/m, of discrete Gaussian noise whose std is at
    least σ (computed on the exact rational value of the float σ, so never rounded down)."""
    if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
        raise ValueError(f"noise_multiplier={noise_multiplier!r} must be positive and finite")
    if isinstance(grid, bool) or not isinstance(grid, int) or grid < 1:
        raise ValueError(f"grid={grid!r} must be an integer ≥ 1")
    return math.ceil(Fraction(noise_multiplier) * grid)


def unit_interval_units(value: float, grid: int) -> int:
    """A value in [0, 1] rounded to the grid 1/m, as an integer in [0, m]: a sum of these over
    examples changes by at most m when one example is added, removed or replaced."""
    if not 0.0 <= value <= 1.0:  # also refuses NaN
        raise ValueError(f"value={value!r} must lie in [0, 1]")
    return min(max(round(value * grid), 0), grid)
