"""A record that moves a gridded sum by fewer than Δ grid units costs no more privacy than one
that moves it by Δ (the proof is in docs/privacy/smaller-shifts.md).

The proof: for log-concave integer noise (discrete Gaussian, discrete Laplace) the likelihood
ratio of shift c against shift 0 is monotone, so threshold tests are optimal and the trade-off
curve of shift c lies on or above that of shift Δ ≥ c; Blackwell's theorem then gives one kernel
that maps the Δ pair to the c pair, subsampled mixtures included. These tests check each link
numerically, with exact lattice sums, and check that the accountants' numbers (the single run's
PLD at Δ and the search's RDP at Δ) are at or above the direct sums for every smaller shift.
The last tests check the hockey-stick argument that covers LMO's noise, which is not log-concave.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.special import logsumexp

from conftest import LMO_PARAMETERS
from privzo.privacy import compute_epsilon
from privzo.privacy.accountants.numeric import LmoNoise
from privzo.privacy.discrete import grid_sensitivity
from privzo.privacy.dp_accounting_adapter import RDP_ORDERS
from privzo.search.privacy import TrialEvent

REACH = 2000  # lattice points ±2000 at scales ≤ 16: the mass beyond is below e^{-7800}
POINTS = np.arange(-REACH, REACH + 1, dtype=np.float64)


def _log_pmf(kind: str, scale: int, shift: int = 0) -> np.ndarray:
    """log P(N + shift = x) on POINTS for N ~ N_Z(0, scale²) or discrete Laplace of scale."""
    centred = POINTS - shift
    weights = -(centred**2) / (2 * scale**2) if kind == "gaussian" else -np.abs(centred) / scale
    return weights - logsumexp(weights)


def _trade_off(log_p: np.ndarray, log_q: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """T(P, Q)(α): the smallest type-II error of a level-α test of P against Q, from the
    Neyman–Pearson lemma with no assumption on the ratio's shape: reject at the points of
    largest q/p first, randomising at the last one (linear interpolation)."""
    with np.errstate(invalid="ignore"):  # −∞ − (−∞) where both have no mass: placed last
        order = np.argsort(-(log_q - log_p), kind="stable")
    size = np.concatenate([[0.0], np.cumsum(np.exp(log_p[order]))])
    power = np.concatenate([[0.0], np.cumsum(np.exp(log_q[order]))])
    return 1.0 - np.interp(alphas, size, power)


def _threshold_trade_off(log_p: np.ndarray, log_q: np.ndarray, alphas: np.ndarray) -> np.ndarray:
    """Type-II error of the randomised threshold test 'reject when x is large' at level α."""
    order = np.arange(len(POINTS))[::-1]
    size = np.concatenate([[0.0], np.cumsum(np.exp(log_p[order]))])
    power = np.concatenate([[0.0], np.cumsum(np.exp(log_q[order]))])
    return 1.0 - np.interp(alphas, size, power)


CASES = [(16, 13, c) for c in (1, 5, 12)] + [(5, 7, c) for c in (2, 6)] + [(3, 2, 1)]
ALPHAS = np.concatenate([np.geomspace(1e-12, 1e-2, 60), np.linspace(0.01, 0.99, 99)])


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
@pytest.mark.parametrize(("scale", "sensitivity", "shift"), CASES)
def test_a_smaller_shift_has_a_trade_off_curve_on_or_above_the_full_shift(
    kind, scale, sensitivity, shift
):
    """Each link of the proof, on the lattice: the threshold test is Neyman–Pearson optimal
    for shift c (monotone likelihood ratio), and T(P₀, P_c) ≥ T(P₀, P_Δ) at every level."""
    base = _log_pmf(kind, scale)
    smaller, full = _log_pmf(kind, scale, shift), _log_pmf(kind, scale, sensitivity)
    optimal = _trade_off(base, smaller, ALPHAS)
    assert np.allclose(_threshold_trade_off(base, smaller, ALPHAS), optimal, atol=1e-12)
    assert np.all(optimal >= _trade_off(base, full, ALPHAS) - 1e-12)
    # a negative shift is the mirror image (symmetric noise): the same curve
    mirrored = _trade_off(base, _log_pmf(kind, scale, -shift), ALPHAS)
    assert np.allclose(mirrored, optimal, atol=1e-12)


def test_the_trade_off_check_fails_for_noise_that_is_not_log_concave():
    """The check above can fail: noise on {−2, 0, 2} only (not log-concave on Z) makes shift 1
    perfectly distinguishable while shift 2 is not, so T(P₀, P₁) lies below T(P₀, P₂)."""
    weights = np.full(len(POINTS), -np.inf)
    weights[np.isin(POINTS, [-2, 0, 2])] = math.log(1 / 3)
    shifted = {c: np.roll(weights, c) for c in (1, 2)}
    assert np.any(_trade_off(weights, shifted[1], ALPHAS) < _trade_off(weights, shifted[2], ALPHAS))


# --- the accountants' numbers against direct lattice sums for every smaller shift ---------------


def _subsampled(log_base: np.ndarray, log_shifted: np.ndarray, rate: float) -> np.ndarray:
    kept = -math.inf if rate == 1 else math.log1p(-rate)
    return np.logaddexp(kept + log_base, math.log(rate) + log_shifted)


def _hockey_stick(log_p: np.ndarray, log_q: np.ndarray, epsilon: float) -> float:
    """δ(ε) = Σ [P − e^ε Q]₊, summed directly on the lattice."""
    return float(np.clip(np.exp(log_p) - np.exp(epsilon + log_q), 0.0, None).sum())


def _direct_epsilon(kind: str, scale: int, shift: int, rate: float, delta: float) -> float:
    """The smallest ε (to 1e-6) with δ(ε) ≤ delta in both directions of add/remove for one
    Poisson-subsampled step whose record moves the sum by ``shift`` grid units."""
    base = _log_pmf(kind, scale)
    mixture = _subsampled(base, _log_pmf(kind, scale, shift), rate)

    def worst(epsilon: float) -> float:
        return max(_hockey_stick(mixture, base, epsilon), _hockey_stick(base, mixture, epsilon))

    low, high = 0.0, 50.0
    if worst(low) <= delta:
        return 0.0
    while high - low > 1e-6:
        middle = (low + high) / 2
        low, high = (middle, high) if worst(middle) > delta else (low, middle)
    return high


@pytest.mark.parametrize(
    ("kind", "grid", "sigma", "rate"),
    [
        ("gaussian", 16, 1.25, 0.1),
        ("gaussian", 16, 0.7, 0.5),
        ("laplace", 16, 1.25, 0.1),
        ("laplace", 16, 3.0, 1.0),
    ],
)
def test_the_single_run_pld_bounds_one_step_at_every_smaller_shift(kind, grid, sigma, rate):
    """One step's ε(δ) summed on the lattice for each shift c ≤ Δ is at most what the run's
    accountant (dp-accounting's discrete PLD at Δ, pessimistic) reports for that step."""
    sensitivity = grid_sensitivity(grid, sigma)
    for delta in (1e-3, 1e-5, 1e-8):
        accounted = compute_epsilon(
            noise_multiplier=sigma,
            sample_rate=rate,
            steps=1,
            delta=delta,
            mechanism=kind,
            noise_parameters={"grid": grid},
        )
        direct = [_direct_epsilon(kind, grid, c, rate, delta) for c in range(1, sensitivity + 1)]
        assert direct[-1] <= accounted + 1e-5  # the accountant bounds the full shift ...
        assert direct[-1] >= accounted - 0.02  # ... tightly (its discretisation 1e-4)
        assert max(direct) == direct[-1]  # and no smaller shift costs more


def _lattice_divergences(scale: int, shift: int, rate: float, alpha: float) -> tuple[float, float]:
    """(D_α(p_q‖p₀), D_α(p₀‖p_q)) of the subsampled discrete Gaussian, by brute force."""
    base = _log_pmf("gaussian", scale)
    mixture = _subsampled(base, _log_pmf("gaussian", scale, shift), rate)
    remove = logsumexp(alpha * mixture + (1 - alpha) * base) / (alpha - 1)
    add = logsumexp(alpha * base + (1 - alpha) * mixture) / (alpha - 1)
    return float(remove), float(add)


@pytest.mark.parametrize(
    ("grid", "sigma", "rate"), [(16, 1.25, 0.1), (16, 0.7, 0.02), (20, 1.5, 0.3)]
)
def test_the_search_rdp_bounds_every_smaller_shift_in_both_directions(grid, sigma, rate):
    """The search's RDP of a gridded step (computed at Δ) is at or above the brute-force Rényi
    divergence of every shift 1..Δ in both directions, and each direction grows with the shift
    (orders 1.5 to 16)."""
    sensitivity = grid_sensitivity(grid, sigma)
    event = TrialEvent(steps=1, sample_rate=rate, noise_multiplier=sigma, noise_grid=grid)
    curve = event.curve()
    for index, alpha in enumerate(RDP_ORDERS):
        if not 1.5 <= alpha <= 16:
            continue
        previous = (0.0, 0.0)
        for shift in range(1, sensitivity + 1):
            remove, add = _lattice_divergences(grid, shift, rate, float(alpha))
            assert remove >= previous[0] - 1e-12 and add >= previous[1] - 1e-12
            previous = (remove, add)
        assert curve[index] >= max(previous) * (1 - 1e-12)


# --- continuous symmetric unimodal noise: LMO ----------------------------------------------
# LMO's noise is not log-concave, so the trade-off argument above does not apply to it; the
# hockey-stick argument of docs/privacy/smaller-shifts.md ("LMO") does: for a density symmetric and
# non-increasing in |x|, every hockey-stick divergence of the subsampled pair, both directions,
# grows with the shift. These tests check that conclusion by direct sums on a fine grid.

LINE = np.linspace(-400.0, 400.0, 400_001)  # outcome x at noise scale 1; shifts are in (0, 1]
SHIFTS = np.linspace(0.05, 1.0, 20)
HOCKEY_EPSILONS = (0.0, 0.05, 0.2, 0.5, 1.0, 2.0, 4.0)
TWO_SCALES = {  # R near 10 (Gamma) or near 0.1 (Uniform): far from log-concave
    "weights": [0.5, 0.0, 0.5],
    "gamma_shape": 1000.0,
    "gamma_scale": 0.01,
    "exponential_rate": 1.0,
    "uniform_low": 0.09,
    "uniform_high": 0.11,
}


def _line_hockey_sticks(density, rate: float) -> np.ndarray:
    """δ(ε) of one subsampled step at each of HOCKEY_EPSILONS (rows) and SHIFTS (columns), the
    larger of the remove and add directions, by Riemann sums on LINE."""
    width = LINE[1] - LINE[0]
    base = density(LINE)
    table = np.empty((len(HOCKEY_EPSILONS), len(SHIFTS)))
    for column, shift in enumerate(SHIFTS):
        mixture = (1 - rate) * base + rate * density(LINE - shift)
        for row, epsilon in enumerate(HOCKEY_EPSILONS):
            remove = np.clip(mixture - math.exp(epsilon) * base, 0.0, None).sum() * width
            add = np.clip(base - math.exp(epsilon) * mixture, 0.0, None).sum() * width
            table[row, column] = max(remove, add)
    return table


def _lmo_density(parameters, sigma: float):
    """The density of σX, X the unit-scale LMO noise (shifts in (0, 1] are then shifts of up to
    the sensitivity at noise multiplier σ)."""
    noise = LmoNoise(**parameters)
    return lambda x: np.exp(noise.log_density(x / sigma)) / sigma


@pytest.mark.parametrize(
    ("parameters", "sigma"),
    [(LMO_PARAMETERS, 1.0), (LMO_PARAMETERS, 0.4), (TWO_SCALES, 1.0)],
    ids=["default", "default-little-noise", "two-scales"],
)
@pytest.mark.parametrize("rate", [1.0, 0.125])
def test_a_smaller_shift_of_lmo_noise_diverges_no_more(parameters, sigma, rate):
    """δ(ε) of shift c ≤ 1 never exceeds that of shift 1 (nor of any larger shift), at ε from 0
    to 4, both directions; together with the accountant's certified bound at the full shift
    (test_numeric_accountant), every record's shift is covered."""
    table = _line_hockey_sticks(_lmo_density(parameters, sigma), rate)
    assert table.max() > 1e-3  # the check is not made where every δ is 0
    growth = np.diff(table, axis=1)
    assert np.all(growth >= -1e-12 - 1e-9 * table[:, 1:]), growth.min()


def test_the_hockey_stick_check_fails_for_noise_that_is_not_unimodal():
    """The check above can fail: noise with modes at ±0.5 (symmetric, not unimodal) is harder to
    tell from itself shifted by 1 (a mode lands on a mode) than shifted by 0.5."""

    def bimodal(x):
        return 0.25 / 0.05 * (np.exp(-np.abs(x - 0.5) / 0.05) + np.exp(-np.abs(x + 0.5) / 0.05))

    table = _line_hockey_sticks(bimodal, 1.0)
    half, full = np.argmin(np.abs(SHIFTS - 0.5)), len(SHIFTS) - 1
    assert table[3, half] > table[3, full] + 0.1  # ε = 0.5
