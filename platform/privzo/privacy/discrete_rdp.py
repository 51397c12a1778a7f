"""Rényi divergences of one Poisson-subsampled discrete Gaussian step, summed on the lattice.

A gridded step releases the integer sum plus k ~ N_Z(0, s²) (s = K grid units), and one record
moves the sum by Δ grid units with probability q. Its pair is p₀ = N_Z(0, s²) and
p_q = (1 − q)·p₀ + q·N_Z(Δ, s²). For integer orders α, D_α(p_q‖p₀) equals the continuous
Gaussian's at the ratio s/Δ exactly: its binomial expansion needs the moments E_{p₀}[(p₁/p₀)^k],
and with kΔ an integer the shifted lattice sum equals the unshifted one, so they are the
continuous closed form e^{k(k−1)Δ²/2s²}. No such identity covers the other direction
D_α(p₀‖p_q) or fractional orders; this module sums those on the lattice, with the truncated
tails bounded from above, so each value is an upper bound up to float64 rounding.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.special import logsumexp

__all__ = ["MAX_LATTICE_SCALE", "subsampled_discrete_gaussian_rdp"]

TAIL_SCALES = 12  # the lattice sums span ±12 s around their bulk; the rest is bounded (e^{-72})
MAX_LATTICE_SCALE = 2**16  # s beyond this makes the sums too long (≈ 1.6M points an order)


def subsampled_discrete_gaussian_rdp(
    scale: int, sensitivity: int, sample_rate: float, orders: np.ndarray
) -> np.ndarray:
    """max(D_α(p_q‖p₀), D_α(p₀‖p_q)) at each order for fractional orders, and D_α(p₀‖p_q) for
    integer ones (whose other direction is the continuous closed form: take the maximum with it).

    q = 1 is the plain discrete Gaussian: αΔ²/2s² in both directions for every order (Canonne,
    Kamath & Steinke 2020, Proposition 5: the shifted lattice sum is at most the unshifted).
    """
    if not (1 <= scale <= MAX_LATTICE_SCALE and sensitivity >= 1):
        raise ValueError(f"scale={scale} must be in [1, {MAX_LATTICE_SCALE}], sensitivity ≥ 1")
    orders = np.asarray(orders, dtype=np.float64)
    if sample_rate == 0:
        return np.zeros_like(orders)
    if sample_rate == 1:
        return orders * sensitivity**2 / (2.0 * scale**2)
    lattice = _Lattice(scale, sensitivity, sample_rate)
    values = [lattice.add_direction(alpha) for alpha in orders]
    for index, alpha in enumerate(orders):
        if alpha != math.floor(alpha):
            values[index] = max(values[index], lattice.remove_direction(alpha))
    return np.asarray(values)


class _Lattice:
    """log p₀ and log(p_q/p₀) on integer ranges, with the tail bound of the truncated sums."""

    def __init__(self, scale: int, sensitivity: int, sample_rate: float) -> None:
        self.scale, self.sensitivity = scale, sensitivity
        self.log_q, self.log_keep = math.log(sample_rate), math.log1p(-sample_rate)
        self.reach = TAIL_SCALES * scale
        # Z summed over [−L, L] only: smaller than the full sum, so every p₀ here is overstated
        self.log_norm = float(logsumexp(self._log_weight(np.arange(-self.reach, self.reach + 1))))
        # over any shifted lattice, Σ_{y > L} e^{−y²/2s²} ≤ e^{−L²/2s²} (the first point) +
        # ∫_L^∞ e^{−t²/2s²} dt ≤ (1 + s²/L)·e^{−L²/2s²}; divided by Z
        self.log_tail = math.log1p(scale**2 / self.reach) - TAIL_SCALES**2 / 2 - self.log_norm

    def _log_weight(self, points: np.ndarray) -> np.ndarray:
        return -(points.astype(np.float64) ** 2) / (2.0 * self.scale**2)

    def _log_ratio(self, points: np.ndarray) -> np.ndarray:
        """log(p_q/p₀) = log(1 − q + q·e^{ℓ}), ℓ = (2xΔ − Δ²)/2s² (computed without cancelling)."""
        loss = (2.0 * points * self.sensitivity - self.sensitivity**2) / (2.0 * self.scale**2)
        return np.logaddexp(self.log_keep, self.log_q + loss)

    def add_direction(self, alpha: float) -> float:
        """D_α(p₀‖p_q) = log Σ p₀·(p₀/p_q)^{α−1} / (α − 1). Left of −L the ratio factor is at most
        (1 − q)^{−(α−1)}, right of Δ + L at most 1."""
        points = np.arange(-self.reach, self.sensitivity + self.reach + 1)
        terms = self._log_weight(points) - (alpha - 1) * self._log_ratio(points)
        bulk = float(logsumexp(terms)) - self.log_norm
        left = self.log_tail - (alpha - 1) * self.log_keep
        return float(np.logaddexp.reduce([bulk, left, self.log_tail])) / (alpha - 1)

    def remove_direction(self, alpha: float) -> float:
        """D_α(p_q‖p₀) = log Σ p₀·(p_q/p₀)^α / (α − 1), summed over [−L, ⌈α⌉Δ + L]. Left of it
        the factor is at most 1; right of it (1 − q + q·e^{ℓ})^α ≤ 2^α·(1 + q^α·e^{αℓ}), and
        p₀·e^{αℓ} sums to a Gaussian tail centred at αΔ times e^{α(α−1)Δ²/2s²}. (Meant for the
        fractional orders below 11, where 2^α costs little.)"""
        top = math.ceil(alpha) * self.sensitivity + self.reach
        points = np.arange(-self.reach, top + 1)
        terms = self._log_weight(points) + alpha * self._log_ratio(points)
        bulk = float(logsumexp(terms)) - self.log_norm
        shift = alpha * (alpha - 1) * self.sensitivity**2 / (2.0 * self.scale**2)
        right = alpha * math.log(2.0) + np.logaddexp(0.0, alpha * self.log_q + shift)
        tails = [self.log_tail, self.log_tail + right]
        return float(np.logaddexp.reduce([bulk, *tails])) / (alpha - 1)
