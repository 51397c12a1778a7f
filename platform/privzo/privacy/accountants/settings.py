"""The settings every accountant shares and their checks: the mechanism names, the default ε
grid of the PLD accountants, and the validators of ε, δ, σ and the directions of a gridded
vector, which the run config also calls before any accountant is built."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

__all__ = [
    "MECHANISM_NAMES",
    "PLD_VALUE_DISCRETIZATION",
    "check_delta",
    "check_mechanism_name",
    "check_positive",
    "directions_of",
]

MECHANISM_NAMES: tuple[str, ...] = ("gaussian", "laplace", "lmo")
# The ε-grid spacing of the PLD accountants (pld, numeric) unless a caller sets its own.
PLD_VALUE_DISCRETIZATION = 1e-4


def check_positive(name: str, value: float) -> float:
    """A finite number > 0 (ε budgets, noise multipliers)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name}={value!r} must be a finite number > 0")
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"{name}={value!r} is out of range; allowed: finite and > 0")
    return float(value)


def check_delta(delta: float, *, allow_zero: bool = False) -> float:
    """δ in (0, 1), or [0, 1) where pure ε-DP makes δ = 0 meaningful."""
    allowed = "[0, 1)" if allow_zero else "(0, 1)"
    if isinstance(delta, bool) or not isinstance(delta, (int, float, np.integer, np.floating)):
        raise ValueError(f"delta={delta!r} must be a number in {allowed}")
    low_ok = delta >= 0 if allow_zero else delta > 0
    if not (math.isfinite(delta) and low_ok and delta < 1):
        why = "" if allow_zero else " (δ = 0 needs a pure-DP accountant: 'pure', Laplace only)"
        raise ValueError(f"delta={delta!r} is out of range; allowed: {allowed}{why}")
    return float(delta)


def check_mechanism_name(mechanism: str) -> str:
    """One of ``MECHANISM_NAMES``, whichever accountant bounds it."""
    if mechanism not in MECHANISM_NAMES:
        raise ValueError(f"mechanism={mechanism!r} is unknown; allowed: {list(MECHANISM_NAMES)}")
    return mechanism


def directions_of(noise_parameters: Mapping[str, Any] | None) -> int:
    """The J of a gridded J-vector in ``noise_parameters`` (1 when absent): an integer ≥ 2
    that comes with a grid, since only discrete noise makes the privacy depend on it."""
    parameters = noise_parameters or {}
    if "directions" not in parameters:
        return 1
    directions = parameters["directions"]
    if isinstance(directions, bool) or not isinstance(directions, int) or directions < 2:
        raise ValueError(f"directions={directions!r} must be an integer ≥ 2 (absent for 1)")
    if parameters.get("grid") is None:
        raise ValueError(
            f"directions={directions} without a grid: continuous Gaussian noise costs the "
            "same for any number of directions; drop it"
        )
    return directions
