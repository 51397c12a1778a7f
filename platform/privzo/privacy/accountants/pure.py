"""``pure``: pure ε-DP of the Poisson-subsampled Laplace mechanism, ε = T·log(1 + p(e^{1/σ} − 1))
(amplification by subsampling, then basic composition); loose, but valid at δ = 0."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from privzo.privacy.accountants.base import MAX_NOISE_MULTIPLIER, Accountant
from privzo.privacy.discrete import grid_sensitivity

__all__ = ["PureLaplaceAccountant", "pure_laplace_sigma"]


class PureLaplaceAccountant(Accountant):
    """Pure ε-DP of the Poisson-subsampled Laplace mechanism under basic composition.

    One Laplace step with b = σ·C is (1/σ)-DP; Poisson subsampling at rate p makes it
    log(1 + p(e^{1/σ} − 1))-DP; T steps add up. δ plays no role (any δ ≥ 0 is accepted).
    The discrete Laplace of scale K on the grid γ = σC/K with sensitivity Δ = ⌈K/σ⌉ grid units
    is (Δ/K)-DP, so 1/σ becomes Δ/K.
    """

    name: ClassVar[str] = "pure"
    mechanisms: ClassVar[tuple[str, ...]] = ("laplace",)
    allows_zero_delta: ClassVar[bool] = True
    supports_grid: ClassVar[bool] = True

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"noise_parameters": self.noise_parameters}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._check_saved_noise_parameters(state)
        super().load_state_dict(state)

    @staticmethod
    def step_epsilon(noise_multiplier: float, sample_rate: float, grid: int | None = None) -> float:
        if grid is None:
            per_step = 1.0 / noise_multiplier
        else:
            per_step = grid_sensitivity(grid, noise_multiplier) / grid
        return math.log1p(sample_rate * math.expm1(per_step))

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        return steps * self.step_epsilon(self._noise_multiplier, self._sample_rate, self._grid)

    @classmethod
    def calibrate(
        cls,
        *,
        epsilon: float,
        delta: float,
        sample_rate: float,
        steps: int,
        mechanism: str,
        noise_parameters: dict[str, Any] | None = None,
    ) -> float:
        sigma = pure_laplace_sigma(epsilon, sample_rate, steps)
        grid = cls.grid_of(noise_parameters)
        if grid is not None and math.isfinite(sigma):
            sigma = _pure_grid_sigma(sigma, grid)
            assert not steps * cls.step_epsilon(sigma, sample_rate, grid) > epsilon
        _check_attainable(sigma, epsilon, delta, sample_rate, steps, mechanism, cls.name)
        return sigma


def pure_laplace_sigma(epsilon: float, sample_rate: float, steps: int) -> float:
    """Invert ε = T·log(1 + p(e^{1/σ} − 1)) exactly, rounding σ up so ε never exceeds target.

    Also the ceiling of the calibration's first guess for continuous Laplace noise."""
    inner = math.log1p(math.expm1(epsilon / steps) / sample_rate)
    sigma = 1.0 / inner if inner > 0 else math.inf
    while (
        math.isfinite(sigma)
        and steps * PureLaplaceAccountant.step_epsilon(sigma, sample_rate) > epsilon
    ):
        sigma = math.nextafter(sigma, math.inf)
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


def _check_attainable(
    sigma: float,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    mechanism: str,
    accountant: str,
) -> None:
    if not sigma <= MAX_NOISE_MULTIPLIER:
        raise ValueError(
            f"cannot meet epsilon={epsilon} (delta={delta}) with {steps} steps of the "
            f"{mechanism} mechanism at sample_rate={sample_rate} (accountant {accountant!r}): "
            f"it needs noise_multiplier={sigma:.4g} > {MAX_NOISE_MULTIPLIER:g}; allow a larger "
            "epsilon, or use fewer steps or a smaller sample_rate"
        )
