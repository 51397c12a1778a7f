"""One-dimensional noise mechanisms whose noise nobody can reproduce.

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
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "MECHANISMS",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "SecretGenerator",
    "get_mechanism",
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

    def uniform(self, size: int) -> np.ndarray:
        """``size`` independent draws from U[0, 1)."""
        return self._rng.random(size)

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuild from fresh entropy instead of serialising the state.
        return (type(self), ())

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<secret>)"


def _check_scale(scale: float) -> float:
    """Reject scales that would silently produce no noise (0) or NaN noise."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise ValueError(f"scale={scale!r} must be a positive finite number")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale={scale!r} must be a positive finite number (> 0)")
    return float(scale)


class Mechanism(ABC):
    """A 1-D additive noise mechanism; each instance owns its own secret generator."""

    name: ClassVar[str]

    def __init__(self) -> None:
        self._generator = SecretGenerator()

    def sample(self, scale: float) -> float:
        """Draw one noise value at ``scale`` (σ·C for noise multiplier σ and clip C)."""
        return self._draw(_check_scale(scale))

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

    def _draw(self, scale: float) -> float:
        return self._generator.normal(scale)

    def variance(self, scale: float) -> float:
        return _check_scale(scale) ** 2


class LaplaceMechanism(Mechanism):
    """Laplace(0, b=scale) noise: pure ε-DP per step, used by DP-ZO's Laplace variant."""

    name: ClassVar[str] = "laplace"

    def _draw(self, scale: float) -> float:
        return self._generator.laplace(scale)

    def variance(self, scale: float) -> float:
        return 2.0 * _check_scale(scale) ** 2


MECHANISMS: dict[str, type[Mechanism]] = {
    GaussianMechanism.name: GaussianMechanism,
    LaplaceMechanism.name: LaplaceMechanism,
}


def get_mechanism(name: str) -> Mechanism:
    """A fresh instance (with its own secret generator) of the mechanism called ``name``."""
    try:
        cls = MECHANISMS[name]
    except (KeyError, TypeError):
        raise ValueError(f"mechanism={name!r} is unknown; allowed: {sorted(MECHANISMS)}") from None
    return cls()


def secret_torch_generator(device: str | object = "cpu") -> Any:
    """A torch generator seeded with 63 bits from ``secrets``, for vector noise (DP-SGD,
    DPGD-0th) drawn with torch on the weights' device. Never seeded from anything logged."""
    import torch  # local: the scalar mechanisms above need only numpy

    generator = torch.Generator(device=device)  # type: ignore[arg-type]
    generator.manual_seed(secrets.randbits(63))
    return generator
