"""``pure``: pure ε-DP of the Poisson-subsampled Laplace mechanism, ε = T·log(1 + p(e^{1/σ} − 1))
(amplification by subsampling, then basic composition); loose, but valid at δ = 0."""

from __future__ import annotations

import math
from typing import ClassVar

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.calibration import (
    MAX_NOISE_MULTIPLIER,
    laplace_sigma_for_pure_dp,
    subsampled_pure_epsilon,
)
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.discrete import grid_sensitivity

__all__ = ["PureLaplaceAccountant"]


class PureLaplaceAccountant(Accountant):
    """Pure ε-DP of the Poisson-subsampled Laplace mechanism under basic composition.

    One Laplace step with b = σ·C is (1/σ)-DP; Poisson subsampling at rate p makes it
    log(1 + p(e^{1/σ} − 1))-DP; T steps add up. δ plays no role (any δ ≥ 0 is accepted).
    The discrete Laplace of scale K on the grid γ = σC/K with sensitivity Δ = ⌈K/σ⌉ grid units
    is (Δ/K)-DP, so 1/σ becomes Δ/K.
    """

    name: ClassVar[str] = "pure"
    title: ClassVar[str] = "pure ε-DP"
    mechanisms: ClassVar[tuple[str, ...]] = ("laplace",)
    grid_mechanisms: ClassVar[tuple[str, ...]] = ("laplace",)
    allows_zero_delta: ClassVar[bool] = True

    @staticmethod
    def step_epsilon(noise_multiplier: float, sample_rate: float, grid: int | None = None) -> float:
        if grid is None:
            per_step = 1.0 / noise_multiplier
        else:
            per_step = grid_sensitivity(grid, noise_multiplier) / grid
        return subsampled_pure_epsilon(per_step, sample_rate)

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        return steps * self.step_epsilon(self._noise_multiplier, self._sample_rate, self._grid)

    @classmethod
    def _solve(cls, query: AccountingQuery, epsilon: float) -> float:
        """The exact inverse of ε(σ), on the grid the smallest σ keeping Δ/K within it."""
        sigma = laplace_sigma_for_pure_dp(epsilon, query.sample_rate, query.steps)
        grid = cls.grid_of(query.noise_parameters, query.mechanism)
        if grid is not None and math.isfinite(sigma):
            sigma = _pure_grid_sigma(sigma, grid)
            assert not query.steps * cls.step_epsilon(sigma, query.sample_rate, grid) > epsilon
        if not sigma <= MAX_NOISE_MULTIPLIER:
            raise ValueError(
                f"cannot meet epsilon={epsilon} (delta={query.delta}) with "
                f"{query.steps} steps of the {query.mechanism} mechanism at sample_rate="
                f"{query.sample_rate} (accountant {cls.name!r}): it needs noise_multiplier="
                f"{sigma:.4g} > {MAX_NOISE_MULTIPLIER:g}; allow a larger epsilon, or use fewer "
                "steps or a smaller sample_rate"
            )
        return sigma


def _pure_grid_sigma(continuous: float, grid: int) -> float:
    """The smallest σ whose grid sensitivity Δ = ⌈K/σ⌉ keeps Δ/K ≤ 1/``continuous`` (∞ if
    none: the noise would be coarser than the grid)."""
    most = math.floor(grid / continuous)
    if most < 1:
        return math.inf
    sigma = grid / most
    while grid_sensitivity(grid, sigma) > most:
        sigma = math.nextafter(sigma, math.inf)
    return sigma
