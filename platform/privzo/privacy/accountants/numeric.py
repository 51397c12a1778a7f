"""``numeric``: a numeric PLD accountant for any symmetric 1-D noise with a computable tail.

For noise σ·X (X of unit scale, sensitivity 1 as elsewhere: σC noise over clip C) and one
Poisson-subsampled step at rate p, the two directions of add/remove adjacency are

    remove: P = (1−p)·μ₀ + p·μ₁ against Q = μ₀,     add: P = μ₀ against Q = (1−p)·μ₀ + p·μ₁,

with μ₀ the law of σX and μ₁ that of σX + 1. Each direction's hockey-stick curve
δ(ε) = ∫ [P − e^ε Q]₊ is bounded from above on a fine partition of the line: a uniform grid of
width ``GRID_STEP``·σ over the centre and geometrically growing bins in the tails, out to
``TAIL_LIMIT``·σ; the P-mass beyond is added to δ at every ε. Each bin's exact P-mass (differences
of the tail function, so no density quadrature) is given the bin's *largest* privacy loss L_j, so

    ∫_bin [P − e^ε Q]₊ = ∫_bin p·[1 − e^{ε − L(x)}]₊ ≤ P_j·[1 − e^{ε − L_j}]₊

for every ε: the binned pair dominates the true one, and so does its T-fold composition, so the
ε read off is a certified upper bound (up to float64 rounding). The loss is a monotone function of
the density ratio r(x) = f((x−1)/σ)/f(x/σ); for every noise here r is monotone on each of
(−∞, 0], [0, 1] and [1, ∞) (Gaussian and Laplace everywhere; LMO, a scale mixture of Laplace
whose density is log-convex in |x|, between those cusps), and 0 and 1 are bin edges, so a bin's
largest loss is at one of its two edges. (Giving each bin its average loss log(P_j/Q_j) instead
is a post-processing of the outcome, so it can only *under*-state δ: 2-18 % for one LMO step near
its largest loss; the tests use that as the lower bound this one must stay above.)

Sorting bins by loss makes δ(ε) two cumulative sums. dp_accounting's pessimistic Connect-the-Dots
(Doroshenko et al. 2022) turns each curve into a PLD on the ε grid of
``value_discretization_interval``; the two PLDs are self-composed T times and ε is read at δ.
Nothing assumes the loss is monotone in the outcome, so heavy-tailed mixtures work.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.calibration import Curve
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.config import LMO_MIN_GAMMA_SHAPE
from privzo.privacy.discrete import grid_sensitivity

if TYPE_CHECKING:
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

__all__ = ["NOISE_DISTRIBUTIONS", "LmoNoise", "NumericAccountant", "noise_distribution"]

GRID_STEP = 1e-3  # centre bin width, in units of σ
CENTRE_HALF_WIDTH = 60.0  # uniform bins over [−60σ, 60σ + 1]
TAIL_LIMIT = 1e12  # geometric bins out to ±1e12·σ; the rest is counted as δ
TAIL_RATIO = 1.01
_LOSS_FLOOR = -30.0  # ε grid starts no lower (a pessimistic cut, see connect-the-dots)
_DELTA_FLOOR = 1e-25  # ε grid ends where δ(ε) is below this (the rest goes to +∞)


# --- unit-scale noise distributions --------------------------------------------------------------


class NoiseDistribution(ABC):
    """A symmetric unit-scale noise X, described by its upper tail P(X > t), t ≥ 0."""

    @abstractmethod
    def tail(self, t: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def log_density(self, t: np.ndarray) -> np.ndarray:
        """log f(t), the density of X (symmetric in t); the loss's bin maxima are read from it."""

    def interval_mass(self, lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
        """P(lo < X ≤ hi) from tails only (no 1 − F cancellation in either tail)."""
        both_right = self.tail(np.maximum(lo, 0)) - self.tail(np.maximum(hi, 0))
        both_left = self.tail(np.maximum(-hi, 0)) - self.tail(np.maximum(-lo, 0))
        across = 1.0 - self.tail(np.maximum(-lo, 0)) - self.tail(np.maximum(hi, 0))
        return np.where(lo >= 0, both_right, np.where(hi <= 0, both_left, across))


class GaussianNoise(NoiseDistribution):
    def tail(self, t: np.ndarray) -> np.ndarray:
        # lazy: a config is validated without scipy and dp_accounting loaded
        from scipy import special

        return special.ndtr(-t)

    def log_density(self, t: np.ndarray) -> np.ndarray:
        return -0.5 * np.square(t) - 0.5 * math.log(2 * math.pi)


class LaplaceNoise(NoiseDistribution):
    def tail(self, t: np.ndarray) -> np.ndarray:
        return 0.5 * np.exp(-t)

    def log_density(self, t: np.ndarray) -> np.ndarray:
        return -np.abs(t) - math.log(2.0)


@dataclass(frozen=True)
class LmoNoise(NoiseDistribution):
    """Laplace(0, 1/R) with R from a weighted mixture of Gamma(shape, scale), Exponential(rate)
    and Uniform(low, high): P(X > t) = ½·E[e^{−Rt}], the mixture of the Laplace transforms
    (1 + scale·t)^−shape, rate / (rate + t) and (e^{−low·t} − e^{−high·t}) / ((high − low)·t).

    The one statement of the LMO noise's parameters: ``LmoMechanism`` draws from it and this
    accountant bounds it, so both read the same checked mixture."""

    weights: tuple[float, float, float]
    gamma_shape: float
    gamma_scale: float
    exponential_rate: float
    uniform_low: float
    uniform_high: float

    def __post_init__(self) -> None:
        weights = tuple(float(w) for w in self.weights)
        if len(weights) != 3 or min(weights) < 0 or abs(sum(weights) - 1) > 1e-9:
            raise ValueError(
                f"weights={list(self.weights)!r}: three non-negative weights summing to 1"
            )
        object.__setattr__(self, "weights", weights)
        for label in [field.name for field in fields(self)][1:]:  # all but the weights
            value = getattr(self, label)
            if isinstance(value, bool) or not (math.isfinite(value) and value > 0):
                raise ValueError(f"{label}={value!r} must be a positive finite number")
            object.__setattr__(self, label, float(value))
        if self.gamma_shape < LMO_MIN_GAMMA_SHAPE:
            raise ValueError(
                f"gamma_shape={self.gamma_shape!r} must be at least {LMO_MIN_GAMMA_SHAPE}: "
                "smaller shapes draw R = 0 (an infinite noise scale) with non-negligible "
                "probability"
            )
        if not self.uniform_high > self.uniform_low:
            raise ValueError(
                f"uniform_high={self.uniform_high} must exceed uniform_low={self.uniform_low}"
            )

    def tail(self, t: np.ndarray) -> np.ndarray:
        t = np.asarray(t, dtype=np.float64)
        w_gamma, w_exp, w_uniform = self.weights
        gamma = (1.0 + self.gamma_scale * t) ** (-self.gamma_shape)
        exponential = self.exponential_rate / (self.exponential_rate + t)
        low, high = self.uniform_low, self.uniform_high
        safe = np.where(t > 0, t, 1.0)
        uniform = np.where(
            t > 0,
            np.exp(-low * safe) * -np.expm1(-(high - low) * safe) / ((high - low) * safe),
            1.0,
        )
        return 0.5 * (w_gamma * gamma + w_exp * exponential + w_uniform * uniform)

    def log_density(self, t: np.ndarray) -> np.ndarray:
        """f(t) = ½·E[R·e^{−R|t|}] (minus the derivative of each Laplace transform), summed in
        log space: the uniform part's e^{−low·t} underflows far out, the others do not."""
        t = np.abs(np.asarray(t, dtype=np.float64))
        w_gamma, w_exp, w_uniform = self.weights
        shape, scale, rate = self.gamma_shape, self.gamma_scale, self.exponential_rate
        parts = []
        if w_gamma > 0:
            parts.append(math.log(w_gamma * shape * scale) - (shape + 1.0) * np.log1p(scale * t))
        if w_exp > 0:
            parts.append(math.log(w_exp * rate) - 2.0 * np.log(rate + t))
        if w_uniform > 0:
            parts.append(math.log(w_uniform) + self._uniform_log_mean_r_exp(t))
        return math.log(0.5) + np.logaddexp.reduce(np.stack(parts), axis=0)

    def _uniform_log_mean_r_exp(self, t: np.ndarray) -> np.ndarray:
        """log E[R·e^{−Rt}] for R ~ Uniform(low, high) = −low·t + log(low·A + B) − log(high − low)
        with A = ∫₀ʷ e^{−ut} du and B = ∫₀ʷ u·e^{−ut} du (w = high − low), B by its series where
        the closed form cancels (wt < 1e-3)."""
        low, width = self.uniform_low, self.uniform_high - self.uniform_low
        x = width * t
        safe_t = np.where(t > 0, t, 1.0)
        integral = np.where(t > 0, -np.expm1(-x) / safe_t, width)
        closed = (-np.expm1(-x) - x * np.exp(-x)) / np.square(safe_t)
        series = width**2 * (0.5 - x / 3 + x**2 / 8 - x**3 / 30)
        moment = np.where(x < 1e-3, series, closed)
        return -low * t + np.log(low * integral + moment) - math.log(width)


NOISE_DISTRIBUTIONS: dict[str, type[NoiseDistribution]] = {
    "gaussian": GaussianNoise,
    "laplace": LaplaceNoise,
    "lmo": LmoNoise,
}


def noise_distribution(mechanism: str, parameters: dict[str, Any] | None) -> NoiseDistribution:
    """The unit-scale continuous noise of ``mechanism`` (a grid in ``parameters`` is not the
    noise's business: see ``NumericAccountant``)."""
    if mechanism == "lmo":
        mixture = {key: value for key, value in (parameters or {}).items() if key != "grid"}
        if not mixture:
            raise ValueError("mechanism='lmo' needs its noise_parameters (privacy.lmo)")
        return LmoNoise(**mixture)
    return NOISE_DISTRIBUTIONS[mechanism]()


# --- one step's privacy loss distribution --------------------------------------------------------


def _bin_edges(sigma: float) -> np.ndarray:
    """Uniform centre bins of width GRID_STEP·σ, geometric bins beyond (in outcome units).

    0 and 1, where the privacy loss may turn (the module docstring), are edges: the grid is
    anchored at 0 (k·width is exact for k = 0) and 1 is inserted."""
    half = CENTRE_HALF_WIDTH * sigma
    width = GRID_STEP * sigma
    count = math.ceil(half / width)
    centre = np.union1d(np.arange(-count, count + math.ceil(1.0 / width) + 1) * width, [1.0])
    tail_count = math.ceil(math.log(TAIL_LIMIT / CENTRE_HALF_WIDTH) / math.log(TAIL_RATIO))
    growth = half * TAIL_RATIO ** np.arange(1, tail_count + 1)
    return np.concatenate([centre[0] - growth[::-1] + half, centre, centre[-1] + growth - half])


def _masses(
    noise: NoiseDistribution, edges: np.ndarray, sigma: float
) -> tuple[np.ndarray, np.ndarray, float, float]:
    """Bin masses of σX (μ₀) and σX + 1 (μ₁), and each one's mass outside the bins."""
    mu0 = noise.interval_mass(edges[:-1] / sigma, edges[1:] / sigma)
    mu1 = noise.interval_mass((edges[:-1] - 1) / sigma, (edges[1:] - 1) / sigma)
    outside0 = float(noise.tail(-edges[0] / sigma) + noise.tail(edges[-1] / sigma))
    outside1 = float(noise.tail((1 - edges[0]) / sigma) + noise.tail((edges[-1] - 1) / sigma))
    return np.clip(mu0, 0, None), np.clip(mu1, 0, None), outside0, outside1


def _largest_losses(
    noise: NoiseDistribution, edges: np.ndarray, sigma: float, sample_rate: float
) -> tuple[np.ndarray, np.ndarray]:
    """Each bin's largest privacy loss, remove and add direction, from log r at its two edges:
    remove log(1 − p + p·r) grows with r, add −log(1 − p + p·r) shrinks with it."""
    log_ratio = noise.log_density((edges - 1) / sigma) - noise.log_density(edges / sigma)
    highest = np.maximum(log_ratio[:-1], log_ratio[1:])
    lowest = np.minimum(log_ratio[:-1], log_ratio[1:])
    log_kept = -math.inf if sample_rate == 1 else math.log1p(-sample_rate)
    log_rate = math.log(sample_rate)
    remove = np.logaddexp(log_kept, log_rate + highest)
    add = -np.logaddexp(log_kept, log_rate + lowest)
    return remove, add


def _direction_pmf(upper: np.ndarray, losses: np.ndarray, upper_outside: float, interval: float):
    """Pessimistic connect-the-dots PMF of one direction: bin j has P-mass upper[j] at loss
    losses[j] (its largest), so its Q-mass is taken as upper[j]·e^{−losses[j]}."""
    keep = upper > 0
    upper, losses = upper[keep], losses[keep]
    finite = np.isfinite(losses)
    infinite = float(upper[~finite].sum()) + upper_outside  # loss +∞ (and beyond the bins)
    upper, losses = upper[finite], losses[finite]
    lower = upper * np.exp(-losses)
    order = np.argsort(-losses)
    losses, cum_upper, cum_lower = (
        losses[order],
        np.concatenate([[0.0], np.cumsum(upper[order])]),
        np.concatenate([[0.0], np.cumsum(lower[order])]),
    )

    def delta(epsilons: np.ndarray) -> np.ndarray:
        above = np.searchsorted(-losses, -epsilons, side="left")  # bins with loss > ε
        values = cum_upper[above] - np.exp(epsilons) * cum_lower[above] + infinite
        return np.clip(values, 0.0, 1.0)

    low = max(float(losses[-1]), _LOSS_FLOOR)
    high = float(losses[0])
    probe = np.linspace(low, high, 2001)
    small = probe[delta(probe) <= _DELTA_FLOOR]
    high = float(small[0]) if small.size else high
    lower_index, upper_index = math.floor(low / interval), math.ceil(high / interval)
    epsilons = np.arange(lower_index, upper_index + 1) * interval
    deltas = np.minimum.accumulate(delta(epsilons))  # δ(ε) is non-increasing; remove rounding
    from dp_accounting.pld import pld_pmf

    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(
        interval, lower_index, upper_index, deltas
    )


def one_step_pld(
    noise: NoiseDistribution, sigma: float, sample_rate: float, interval: float
) -> PrivacyLossDistribution:
    """Both directions of one Poisson-subsampled step (sensitivity 1, noise σX)."""
    edges = _bin_edges(sigma)
    mu0, mu1, outside0, outside1 = _masses(noise, edges, sigma)
    remove_losses, add_losses = _largest_losses(noise, edges, sigma, sample_rate)
    mixture = (1 - sample_rate) * mu0 + sample_rate * mu1
    mixture_outside = (1 - sample_rate) * outside0 + sample_rate * outside1
    remove = _direction_pmf(mixture, remove_losses, mixture_outside, interval)
    add = _direction_pmf(mu0, add_losses, outside0, interval)
    from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution

    return PrivacyLossDistribution(remove, add)


# --- the accountant ------------------------------------------------------------------------------


class NumericAccountant(Accountant):
    """Numeric PLD accounting (see the module docstring): Gaussian, Laplace and LMO noise.

    LMO on a grid (``noise_parameters`` with ``"grid": K``): the run releases γ·round((γS + X)/γ)
    for the gridded sum γS, whose sensitivity is γΔ with Δ = ⌈K/σ⌉, and X the continuous LMO
    noise of scale σC = Kγ. That is a post-processing of the continuous LMO at noise-to-
    sensitivity ratio K/Δ (≤ σ), which is what is accounted. The discrete Gaussian and discrete
    Laplace are not roundings of their continuous twins: they are refused here (``pld``).
    """

    name: ClassVar[str] = "numeric"
    title: ClassVar[str] = "numeric PLD"
    mechanisms: ClassVar[tuple[str, ...]] = ("gaussian", "laplace", "lmo")
    grid_mechanisms: ClassVar[tuple[str, ...]] = ("lmo",)
    discretized: ClassVar[bool] = True

    def _prepare(self) -> None:
        self._noise = noise_distribution(self._mechanism, self._given_parameters)
        self._one_step: PrivacyLossDistribution | None = None

    @property
    def noise_parameters(self) -> dict[str, Any] | None:
        """The LMO mixture, if any, and the grid: all of them shape the noise."""
        return self._given_parameters

    @property
    def effective_noise_multiplier(self) -> float:
        """σ, or on a grid K/Δ with Δ = ⌈K/σ⌉: noise scale over the gridded sensitivity."""
        if self._grid is None:
            return self._noise_multiplier
        return self._grid / grid_sensitivity(self._grid, self._noise_multiplier)

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        if self._one_step is None:
            assert self._interval is not None
            self._one_step = one_step_pld(
                self._noise, self.effective_noise_multiplier, self._sample_rate, self._interval
            )
        return float(self._one_step.self_compose(steps).get_epsilon_for_delta(delta))

    @classmethod
    def _curves(cls, query: AccountingQuery) -> tuple[Curve, Curve | None]:
        """Fresh accountants of this class, on a 10x coarser ε grid first."""
        return cls._accountant_curves(query)
