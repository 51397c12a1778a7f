"""One-dimensional noise mechanisms whose noise nobody can reproduce.

Gaussian and Laplace noise are drawn on a grid by default: with ``grid`` = K, the noise of scale
σC is γ·k with γ = σC/K and k an exact discrete Gaussian N_Z(0, K²) or discrete Laplace of scale
K (``privzo.privacy.discrete``), so floating-point artefacts of a sampler cannot reveal the
un-noised value (Mironov, 2012). LMO's noise on the grid is round(X/γ) for X its continuous
Laplace(σC/R) noise, drawn exactly given R (``privzo.privacy.discrete.rounded_laplace``).
``grid=None`` keeps numpy's float samplers; it is chosen only explicitly
(``privacy.noise_grid: null``).

DPZero / DP-ZO privatize a single scalar per step, so a mechanism here draws one value at a time.
The noise must be unpredictable to anyone holding the run's logs: perturbation seeds and data
seeds are public, so the noise comes from a ``SecretGenerator`` seeded from the operating
system's entropy. There is deliberately no way to pass a seed, and the generator's state is never
pickled (a copy gets fresh entropy), so it cannot leak into checkpoints.
"""

from __future__ import annotations

import math
import secrets
from abc import ABC, abstractmethod
from fractions import Fraction
from typing import Any, ClassVar

import numpy as np

from privzo.privacy.accountants.numeric import LmoNoise
from privzo.privacy.discrete import (
    check_grid,
    discrete_gaussian,
    discrete_laplace,
    grid_sensitivity,
    rounded_laplace,
)

__all__ = [
    "MECHANISMS",
    "GaussianMechanism",
    "LaplaceMechanism",
    "LmoMechanism",
    "Mechanism",
    "SecretGenerator",
    "get_mechanism",
    "grid_sensitivity",
    "secure_gaussian_",
    "units_as_float",
]


class SecretGenerator:
    """A PCG64 generator seeded with 128 bits from ``secrets`` (the OS's entropy source).

    Anything that must stay secret (privacy noise, which examples a Poisson batch holds) draws
    from one of these. Copies and unpickled instances are reseeded rather than cloned: a clone
    would replay the same "secret" stream, and a pickled state would leak it.
    """

    def __init__(self) -> None:
        self._rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def normal(self, scale: float) -> float:
        """One draw from N(0, scale²)."""
        return float(self._rng.normal(0.0, scale))

    def laplace(self, scale: float) -> float:
        """One draw from Laplace(0, b=scale)."""
        return float(self._rng.laplace(0.0, scale))

    def gamma(self, shape: float, scale: float) -> float:
        return float(self._rng.gamma(shape, scale))

    def exponential(self, scale: float) -> float:
        return float(self._rng.exponential(scale))

    def uniform_between(self, low: float, high: float) -> float:
        return float(self._rng.uniform(low, high))

    def uniform(self, size: int) -> np.ndarray:
        """``size`` independent draws from U[0, 1)."""
        return self._rng.random(size)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from fresh entropy instead of serialising the state.
        return (type(self), ())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<secret>)"


def units_as_float(units: int) -> float:
    """An integer number of grid units as the nearest float, ±inf beyond the float range
    (LMO's k can exceed it when R is tiny); a function of the integer alone."""
    try:
        return float(units)
    except OverflowError:
        return math.copysign(math.inf, units)


def _check_scale(scale: float) -> float:
    """Reject scales that would silently produce no noise (0) or NaN noise."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale={scale!r} must be a positive finite number")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale={scale!r} must be a positive finite number (> 0)")
    return float(scale)


class Mechanism(ABC):
    """A 1-D additive noise mechanism; each instance owns its own secret generator.

    ``grid`` (K points per noise scale) selects the discrete sampler where the mechanism has
    one; ``sample_units`` then draws the integer k of the noise γ·k.
    """

    name: ClassVar[str]
    has_grid: ClassVar[bool] = False

    def __init__(self, grid: int | None = None) -> None:
        self._generator = SecretGenerator()
        if grid is not None and not self.has_grid:
            raise ValueError(f"mechanism {self.name!r} has no discrete sampler; use grid=None")
        self.grid = check_grid(grid)

    def sample(self, scale: float) -> float:
        """Draw one noise value at ``scale`` (σ·C for noise multiplier σ and clip C): γ·k on
        the grid γ = scale/K when the mechanism has one, a float draw otherwise."""
        scale = _check_scale(scale)
        if self.grid is not None:
            return scale / self.grid * units_as_float(self.sample_units())
        return self._draw(scale)

    @classmethod
    def from_parameters(cls, **parameters: Any) -> Mechanism:
        """An instance from a run's ``noise_parameters`` (``get_mechanism``'s keywords)."""
        return cls(**parameters)

    def sample_units(self) -> int:
        """The integer k of one gridded draw (noise γ·k at scale Kγ)."""
        raise NotImplementedError(f"{self.name} has no grid")

    @abstractmethod
    def _draw(self, scale: float) -> float: ...

    @abstractmethod
    def variance(self, scale: float) -> float:
        """Variance of one draw at ``scale``: what the noise costs in gradient accuracy."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class GaussianMechanism(Mechanism):
    """N(0, scale²) noise: the DPZero mechanism."""

    name: ClassVar[str] = "gaussian"
    has_grid: ClassVar[bool] = True

    def _draw(self, scale: float) -> float:
        return self._generator.normal(scale)

    def sample_units(self) -> int:
        assert self.grid is not None
        return discrete_gaussian(self.grid)

    def variance(self, scale: float) -> float:
        """scale² (the discrete Gaussian's variance is below σ² by less than 1e-300 at K ≥ 16)."""
        return _check_scale(scale) ** 2


class LaplaceMechanism(Mechanism):
    """Laplace(0, b=scale) noise: pure ε-DP per step, used by DP-ZO's Laplace variant."""

    name: ClassVar[str] = "laplace"
    has_grid: ClassVar[bool] = True

    def _draw(self, scale: float) -> float:
        return self._generator.laplace(scale)

    def sample_units(self) -> int:
        assert self.grid is not None
        return discrete_laplace(self.grid)

    def variance(self, scale: float) -> float:
        """2·scale² continuous; on the grid 2e^{−1/K}/(1 − e^{−1/K})²·γ² (within 1/(12K²))."""
        scale = _check_scale(scale)
        if self.grid is None:
            return 2.0 * scale**2
        ratio = math.exp(-1.0 / self.grid)
        return 2.0 * ratio / (1.0 - ratio) ** 2 * (scale / self.grid) ** 2


class LmoMechanism(Mechanism):
    """LMO-DP noise: Laplace(0, scale/R), R drawn per release from a weighted mixture of
    Gamma(gamma_shape, gamma_scale), Exponential(rate) and Uniform(low, high).

    The random inverse scale R is part of the noise (secret, from the same generator); the
    mixture is the numeric accountant's ``LmoNoise``, the law it bounds, so the parameters drawn
    from and the parameters accounted are one object.

    On a grid of K points per σC, the noise is the integer k = round(X/γ), X ~ Laplace(σC/R),
    drawn exactly given R: X/γ is Laplace of scale b = K/R, an exact rational since R is a
    float. R itself is numpy's float draw: it does not depend on the data, so it carries no
    secret low bits, and the released γ·(S + k) = γ·round((γS + X)/γ) rounds the continuous
    LMO output of the gridded sum γS to the grid, a post-processing of what the numeric
    accountant bounds (at R's float law, which approximates the mixture's to float64).
    """

    name: ClassVar[str] = "lmo"
    has_grid: ClassVar[bool] = True

    def __init__(self, noise: LmoNoise, grid: int | None = None) -> None:
        super().__init__(grid)
        self.noise = noise

    @classmethod
    def from_parameters(cls, **parameters: Any) -> LmoMechanism:
        """The mixture's six parameters (``privacy.lmo``) and the optional ``grid``."""
        grid = parameters.pop("grid", None)
        return cls(LmoNoise(**parameters), grid=grid)

    def draw_inverse_scale(self) -> float:
        """One R from the mixture."""
        noise, pick = self.noise, float(self._generator.uniform(1)[0])
        if pick < noise.weights[0]:
            return self._generator.gamma(noise.gamma_shape, noise.gamma_scale)
        if pick < noise.weights[0] + noise.weights[1]:
            return self._generator.exponential(1.0 / noise.exponential_rate)
        return self._generator.uniform_between(noise.uniform_low, noise.uniform_high)

    def positive_inverse_scale(self) -> float:
        """One R > 0: a draw that underflowed to 0 (< 1e-16 at a valid shape) is redrawn, as
        an infinite noise scale would make the release meaningless (and divide by zero)."""
        inverse_scale = self.draw_inverse_scale()
        while inverse_scale == 0.0:
            inverse_scale = self.draw_inverse_scale()
        return inverse_scale

    def _draw(self, scale: float) -> float:
        return self._generator.laplace(scale / self.positive_inverse_scale())

    def sample_units(self) -> int:
        """k = round(X/γ), X ~ Laplace(0, σC/R): X/γ has scale b = K/R (exact: R is a float)."""
        assert self.grid is not None
        return rounded_laplace(Fraction(self.grid) / Fraction(self.positive_inverse_scale()))

    def variance(self, scale: float) -> float:
        """scale²·2·E[1/R²]: infinite when any part with weight > 0 has E[1/R²] = ∞
        (the Exponential always; Gamma with shape ≤ 2). On the grid the rounding moves each
        draw by at most γ/2, so the standard deviation by at most γ/2 = scale/2K."""
        scale, noise = _check_scale(scale), self.noise
        w_gamma, w_exp, w_uniform = noise.weights
        if w_exp > 0 or (w_gamma > 0 and noise.gamma_shape <= 2):
            return math.inf
        inverse_square = w_uniform / (noise.uniform_low * noise.uniform_high)
        if w_gamma > 0:
            k, theta = noise.gamma_shape, noise.gamma_scale
            inverse_square += w_gamma / (theta**2 * (k - 1) * (k - 2))
        return 2.0 * scale**2 * inverse_square


MECHANISMS: dict[str, type[Mechanism]] = {
    GaussianMechanism.name: GaussianMechanism,
    LaplaceMechanism.name: LaplaceMechanism,
    LmoMechanism.name: LmoMechanism,
}


def get_mechanism(name: str, **parameters: Any) -> Mechanism:
    """A fresh instance (with its own secret generator) of the mechanism called ``name``;
    ``parameters`` configure a parametrised mechanism (lmo). A ``directions`` entry (the K of
    a gridded K-vector, which the accountants bound) does not change a single draw."""
    try:
        cls = MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"mechanism={name!r} is unknown; allowed: {sorted(MECHANISMS)}") from None
    parameters.pop("directions", None)
    return cls.from_parameters(**parameters)


def secret_torch_generator(device: str | object = "cpu") -> Any:
    """A torch generator seeded with 63 bits from ``secrets``, for vector noise (DP-SGD,
    DPGD-0th) drawn with torch on the weights' device. Never seeded from anything logged."""
    import torch  # local: the scalar mechanisms above need only numpy

    generator = torch.Generator(device=device)  # type: ignore[arg-type]
    generator.manual_seed(secrets.randbits(63))
    return generator


SECURE_DRAWS = 4  # ξ = (ξ₁ + ξ₂ + ξ₃ + ξ₄)/2: n = 4 draws, as Opacus' secure_mode
SECURE_BLOCK = 2**18  # elements drawn at a time: the scratch the draws are summed through (1 MiB)


def secure_gaussian_(out: Any, std: float, generator: Any) -> Any:
    """Fill the fp32 tensor ``out`` with N(0, std²) noise that resists floating-point attacks.

    One float draw's low bits show which values a sampler can return, and so a noisy value's
    un-noised part (Mironov 2012; for torch's Gaussian, arXiv 2112.05307). Holohan & Braghin
    (2021, arXiv 2107.10138) make that attack infeasible by releasing a sum of several
    independent draws, scaled back to the same variance: here four draws of N(0, std²) summed
    in fp32 and halved (exact: a power of two), block by block through a small scratch so the
    memory is ``out`` plus one block. ``generator`` must be a secret one
    (``secret_torch_generator``).
    """
    import torch  # local: the scalar mechanisms above need only numpy

    assert out.dtype == torch.float32 and out.dim() == 1, (out.dtype, out.shape)
    scratch = torch.empty(min(out.numel(), SECURE_BLOCK), dtype=out.dtype, device=out.device)
    for start in range(0, out.numel(), SECURE_BLOCK):
        block = out[start : start + SECURE_BLOCK]
        draw = scratch[: block.numel()]
        block.normal_(0.0, std, generator=generator)
        for _ in range(SECURE_DRAWS - 1):
            block.add_(draw.normal_(0.0, std, generator=generator))
        block.mul_(1.0 / math.sqrt(SECURE_DRAWS))
    return out
