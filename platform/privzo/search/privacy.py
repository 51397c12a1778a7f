"""What a whole search costs: each trial's privacy event and the end-to-end bound.

Every trial is calibrated (PLD, as single runs are) to the same (ε, δ) for its own steps and
sampling rate. Selecting the best trial by a score computed on private validation data is a
further release, so each trial's event here is its training plus its noised score releases.
Two guarantees come out of a search, both from RDP (the accountant that handles
repeat-and-select):

- **composition** of every trial: covers everything the search records (all trials'
  trajectories, scores and metrics), whatever the search algorithm, adaptive or not, because
  each trial's RDP curve is bounded by the pointwise maximum over the finite set of privacy
  events the space allows;
- **repeat-and-select** (Papernot & Steinke 2022, geometric trial count): covers the released
  best trial *alone*, when the number of trials was random and the other trials are withheld.

Trials with a varying event (steps or batch size searched) are a mixture over the space's
points; a mixture's RDP is at most the pointwise maximum of its components' curves (Rényi
divergence is quasi-convex), which is the curve both bounds use.

The noise is discrete (``privzo.privacy.discrete``): a gridded trial step is bounded order by
order by the larger of the continuous Gaussian's closed form at K/Δ and the discrete step's own
Rényi divergences summed on the lattice (``privzo.privacy.discrete_rdp``); a score release
(N_Z(0, s²) on a sum of sensitivity m) by the continuous Gaussian's at s/m, which Canonne,
Kamath & Steinke (2020) show bounds the discrete Gaussian at every order. A gridded trial of
J ≥ 2 directions per step is bounded by the continuous Gaussian's closed form at K/√N (N the
rounded vector's squared norm bound) at the integer order ⌈α⌉ for each order α
(``docs/privacy/vector-grid.md``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import dp_accounting
import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

from privzo.privacy.accountants import quiet_absl
from privzo.privacy.accountants.rdp import vector_grid_noise_multiplier
from privzo.privacy.discrete import DEFAULT_SCORE_GRID, grid_sensitivity, noise_units
from privzo.privacy.discrete_rdp import subsampled_discrete_gaussian_rdp
from privzo.privacy.dp_accounting_adapter import RDP_ORDERS, repeat_and_select_rdp

GEOMETRIC_SHAPE = 1.0  # RepeatAndSelectDpEvent's shape for a geometric number of trials


@dataclass(frozen=True)
class TrialEvent:
    """One trial's privacy event: T Poisson-subsampled Gaussian steps plus score releases."""

    steps: int
    sample_rate: float
    noise_multiplier: float
    score_releases: int = 0
    score_noise_multiplier: float | None = None
    noise_grid: int | None = None  # the trial's noise is discrete on this grid
    directions: int = 1  # directions per step: on a grid, a rounded vector of this many
    score_grid: int = DEFAULT_SCORE_GRID  # the scores' discrete noise is on the grid 1/m
    # that any of the trial's Poisson draws exceeds its padded bound and is truncated
    # (privzo.privacy.truncation): the curve bounds the untruncated trial
    exceed_probability: float = 0.0

    @property
    def effective_noise_multiplier(self) -> float:
        """σ, or on a grid K/Δ with Δ = ⌈K/σ⌉ (≤ σ): the noise-to-sensitivity ratio of the
        discrete Gaussian the trial draws (see ``curve`` for how its RDP is bounded)."""
        if self.noise_grid is None:
            return self.noise_multiplier
        if self.directions > 1:
            return vector_grid_noise_multiplier(
                self.noise_grid, self.noise_multiplier, self.directions
            )
        return self.noise_grid / grid_sensitivity(self.noise_grid, self.noise_multiplier)

    @property
    def effective_score_noise_multiplier(self) -> float:
        """s/m with s = ⌈σ_s·m⌉ (≥ σ_s): the noise-to-sensitivity ratio of a score release,
        N_Z(0, s²) added to a sum of sensitivity m grid units. Its RDP at every order α > 1 is
        at most the continuous Gaussian's at that ratio, αm²/(2s²) (Canonne, Kamath & Steinke
        2020: for integer means the discrete Gaussians' Rényi divergence is at most the
        continuous closed form), so a GaussianDpEvent at s/m bounds it."""
        assert self.score_noise_multiplier is not None
        return noise_units(self.score_noise_multiplier, self.score_grid) / self.score_grid

    def dp_event(self) -> dp_accounting.DpEvent:
        """The event as continuous Gaussians at the effective ratios (what dp-accounting can
        compose; ``curve`` adds what the discrete training noise needs beyond it)."""
        training = dp_accounting.SelfComposedDpEvent(self._step_event(), self.steps)
        if not self.score_releases:
            return training
        return dp_accounting.ComposedDpEvent([training, self._scores_event()])

    def curve(self) -> np.ndarray:
        """The trial's RDP at ``RDP_ORDERS``: T steps plus the score releases.

        A gridded step takes, order by order, the larger of the continuous closed form at K/Δ
        (exactly the discrete remove direction at integer orders) and the discrete step's own
        divergences summed on the lattice (``privzo.privacy.discrete_rdp``: the add direction
        at every order, the remove direction at fractional ones). A gridded vector of several
        directions takes the closed form at K/√N at ⌈α⌉, its proven bound (D_α ≤ D_⌈α⌉)."""
        if self.noise_grid is not None and self.directions > 1:
            step = rdp_curve(self._step_event(), np.ceil(RDP_ORDERS))
        else:
            step = rdp_curve(self._step_event())
        if self.noise_grid is not None and self.directions == 1:
            sensitivity = grid_sensitivity(self.noise_grid, self.noise_multiplier)
            lattice = subsampled_discrete_gaussian_rdp(
                self.noise_grid, sensitivity, self.sample_rate, RDP_ORDERS
            )
            step = np.maximum(step, lattice)
        curve = self.steps * step
        if self.score_releases:
            curve = curve + rdp_curve(self._scores_event())
        return curve

    def _step_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.PoissonSampledDpEvent(
            self.sample_rate, dp_accounting.GaussianDpEvent(self.effective_noise_multiplier)
        )

    def _scores_event(self) -> dp_accounting.DpEvent:
        return dp_accounting.SelfComposedDpEvent(
            dp_accounting.GaussianDpEvent(self.effective_score_noise_multiplier),
            self.score_releases,
        )


def rdp_curve(event: dp_accounting.DpEvent, orders: np.ndarray | None = None) -> np.ndarray:
    """``event``'s RDP at ``orders`` (default ``RDP_ORDERS``)."""
    accountant = dp_accounting.rdp.RdpAccountant(None if orders is None else list(orders))
    with quiet_absl():  # per-order convergence notes; such an order is excluded (infinite)
        accountant.compose(event)
    return np.asarray(accountant.rdp, dtype=np.float64)


def worst_curve(events: Sequence[TrialEvent]) -> np.ndarray:
    """Pointwise maximum of the events' RDP curves: bounds any mixture of them."""
    if not events:
        raise ValueError("no trial events")
    return np.max(np.stack([event.curve() for event in events]), axis=0)


def epsilon_of_curve(curve: np.ndarray, delta: float) -> float:
    epsilon, _ = rdp_privacy_accountant.compute_epsilon(RDP_ORDERS, curve, delta)
    return float(epsilon)


def composition_epsilon(curve: np.ndarray, trials: int, delta: float) -> float:
    """ε of ``trials`` trials, each bounded by ``curve`` (adaptive composition holds in RDP)."""
    return epsilon_of_curve(trials * curve, delta) if trials else 0.0


def repeat_and_select_epsilon(curve: np.ndarray, mean_trials: float, delta: float) -> float:
    """ε of releasing only the best of a geometric number (mean ``mean_trials``) of trials.

    dp-accounting computes this for a single event (``RepeatAndSelectDpEvent``); here the base
    curve is the space's worst curve, so its internal transform is applied to that curve
    (checked against the event API in the tests).
    """
    selected = repeat_and_select_rdp(curve, mean_trials, GEOMETRIC_SHAPE)
    return epsilon_of_curve(selected, delta)


def draw_geometric_count(mean: float) -> int:
    """A trial count K ≥ 1 with P(K = k) = p(1 − p)^(k−1), p = 1/mean, from OS entropy.

    Secret on purpose: the repeat-and-select bound assumes nobody can predict K.
    """
    import secrets

    if mean < 1:
        raise ValueError(f"mean={mean} must be at least 1")
    if mean == 1:
        return 1
    uniform = (secrets.randbits(53) + 0.5) / 2**53  # in (0, 1)
    success = 1.0 / mean
    return 1 + math.floor(math.log(uniform) / math.log1p(-success))
