"""What every accountant shares: validation, the mechanism names, the search range of σ, the
one-step dp_accounting event and the ``Accountant`` base class."""

from __future__ import annotations

import contextlib
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import dp_accounting
import numpy as np

from privzo.privacy.discrete import check_grid
from privzo.privacy.sampling import check_count, check_sample_rate

__all__ = [
    "CALIBRATION_RTOL",
    "MAX_NOISE_MULTIPLIER",
    "MECHANISM_NAMES",
    "MIN_NOISE_MULTIPLIER",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "UnsupportedNoiseError",
    "check_delta",
    "check_mechanism_name",
    "check_positive",
    "quiet_absl",
    "run_event",
    "step_event",
]

MECHANISM_NAMES: tuple[str, ...] = ("gaussian", "laplace", "lmo")
# The ε-grid spacing of the PLD accountants (pld, numeric) unless a caller sets its own.
PLD_VALUE_DISCRETIZATION = 1e-4
# Calibration searches σ in [MIN, MAX]: above MAX the target is called unattainable; below MIN
# the PLD of one step gets so wide that each evaluation takes tens of seconds.
MIN_NOISE_MULTIPLIER = 0.05
MAX_NOISE_MULTIPLIER = 1e4
# Calibrated σ is within this relative distance above the smallest σ meeting the target.
CALIBRATION_RTOL = 1e-3
_EPSILON_CACHE_SIZE = 256


# --- validation -------------------------------------------------------------------------------


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


class UnsupportedNoiseError(ValueError):
    """An accountant's refusal of noise it cannot bound (a mechanism, or a grid).

    The full message also names the accountants that *can* bound the noise. Only the registry
    knows them, and it imports every accountant, each of which imports this module; so the
    accountant raises this with what it knows, and the registry, around each accountant it
    builds or calibrates, re-raises it completed by ``naming``. (Handing the registry to the
    accountants instead would reach them only on some paths, or reorder their validation.) An
    accountant built directly, not through the registry, refuses without the list. The fields
    are plain data, so the error pickles (a Ray worker may raise it).
    """

    reason: str = ""
    noise: str = ""  # what is refused, as the message names it
    mechanism: str | None = None  # the refused mechanism; None: the refused grid
    advice: str = ""

    @classmethod
    def refusing(
        cls,
        reason: str,
        noise: str,
        mechanism: str | None,
        advice: str = "",
        able: list[str] | None = None,
    ) -> UnsupportedNoiseError:
        """The refusal, listing ``able`` (the accountants that can) where given."""
        listed = "" if able is None else f"; accountants for {noise}: {able}"
        error = cls(f"{reason}{listed}{advice}")
        error.reason, error.noise, error.mechanism, error.advice = reason, noise, mechanism, advice
        return error

    def can_bound(self, accountant: type[Accountant]) -> bool:
        """Whether ``accountant`` bounds the refused noise."""
        if self.mechanism is None:
            return accountant.supports_grid
        return self.mechanism in accountant.mechanisms

    def naming(self, accountants: Mapping[str, type[Accountant]]) -> UnsupportedNoiseError:
        """The same refusal, naming the accountants in ``accountants`` that can bound it."""
        able = [name for name, accountant in accountants.items() if self.can_bound(accountant)]
        return self.refusing(self.reason, self.noise, self.mechanism, self.advice, able)


# --- dp_accounting helpers ---------------------------------------------------------------------


def step_event(mechanism: str, noise_multiplier: float, sample_rate: float) -> Any:
    """One Poisson-subsampled step with sensitivity 1 and noise σ (scale-free: σ·C over C)."""
    if mechanism == "gaussian":
        inner: Any = dp_accounting.GaussianDpEvent(noise_multiplier)
    else:
        inner = dp_accounting.LaplaceDpEvent(noise_multiplier)
    return dp_accounting.PoissonSampledDpEvent(sample_rate, inner)


def run_event(mechanism: str, noise_multiplier: float, sample_rate: float, steps: int) -> Any:
    """``steps`` self-composed steps of ``step_event``."""
    return dp_accounting.SelfComposedDpEvent(
        step_event(mechanism, noise_multiplier, sample_rate), steps
    )


@contextlib.contextmanager
def quiet_absl() -> Iterator[None]:
    """Mute dp_accounting's RDP warnings that fractional orders were skipped (harmless).

    Also used where a search composes RDP over its trials (``privzo.tuning.privacy``).
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


# --- the base class ----------------------------------------------------------------------------


class Accountant(ABC):
    """Tracks the steps a run has taken at fixed (mechanism, σ, p) and the ε they cost.

    ε only ever grows with the step count, and ``epsilon_at`` answers "what would ε be after n
    steps" without stepping, which the budget ledger uses to refuse a step before taking it.
    ``noise_parameters`` may hold the grid K of discrete noise (``{"grid": K}``), which an
    accountant without ``supports_grid`` refuses.
    """

    name: ClassVar[str]
    mechanisms: ClassVar[tuple[str, ...]]
    allows_zero_delta: ClassVar[bool] = False
    supports_grid: ClassVar[bool] = False  # bounds the discrete (gridded) mechanisms

    def __init__(
        self,
        mechanism: str,
        noise_multiplier: float,
        sample_rate: float,
        noise_parameters: dict[str, Any] | None = None,
    ) -> None:
        self._mechanism = type(self).check_mechanism(mechanism)
        self._noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self._sample_rate = check_sample_rate(sample_rate)
        self._steps = 0
        self._cache: dict[tuple[int, float], float] = {}
        self._grid = type(self).grid_of(noise_parameters)

    # The settings are read-only: changing σ or p mid-run would silently misaccount past steps.
    @property
    def mechanism(self) -> str:
        return self._mechanism

    @property
    def noise_multiplier(self) -> float:
        return self._noise_multiplier

    @property
    def sample_rate(self) -> float:
        return self._sample_rate

    @property
    def noise_parameters(self) -> dict[str, Any] | None:
        """The noise settings beyond σ this accountant bounds: the grid, if any."""
        return None if self._grid is None else {"grid": self._grid}

    @property
    def steps(self) -> int:
        """Steps accounted so far."""
        return self._steps

    @classmethod
    def check_mechanism(cls, mechanism: str) -> str:
        """Reject mechanisms this accountant cannot bound (the registry adds which can)."""
        check_mechanism_name(mechanism)
        if mechanism not in cls.mechanisms:
            raise UnsupportedNoiseError.refusing(
                f"accountant={cls.name!r} cannot account mechanism={mechanism!r}: it supports "
                f"only {list(cls.mechanisms)}",
                repr(mechanism),
                mechanism,
            )
        return mechanism

    @classmethod
    def check_delta(cls, delta: float) -> float:
        return check_delta(delta, allow_zero=cls.allows_zero_delta)

    @classmethod
    def grid_of(cls, noise_parameters: dict[str, Any] | None) -> int | None:
        """The grid K of discrete noise in ``noise_parameters`` (None: continuous), refused by
        an accountant that bounds only continuous noise (the registry adds which do not)."""
        grid = check_grid((noise_parameters or {}).get("grid"))
        if grid is not None and not cls.supports_grid:
            raise UnsupportedNoiseError.refusing(
                f"accountant={cls.name!r} bounds only continuous noise, and this noise is "
                f"discrete (grid={grid})",
                "discrete noise",
                None,
                " (numeric for lmo only; or draw continuous noise: privacy.noise_grid=null)",
            )
        return grid

    def step(self, num_steps: int = 1) -> int:
        """Record ``num_steps`` more steps; returns the new total."""
        self._steps += check_count("num_steps", num_steps, 1)
        return self._steps

    def epsilon(self, delta: float) -> float:
        """ε spent by the steps taken so far at ``delta`` (0.0 before the first step)."""
        return self.epsilon_at(self._steps, delta)

    def epsilon_at(self, steps: int, delta: float) -> float:
        """ε after ``steps`` steps in total, cached per (steps, δ)."""
        steps = check_count("steps", steps, 0)
        delta = type(self).check_delta(delta)
        if steps == 0:
            return 0.0
        key = (steps, delta)
        if key not in self._cache:
            if len(self._cache) >= _EPSILON_CACHE_SIZE:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = float(self._compute_epsilon(steps, delta))
        return self._cache[key]

    @abstractmethod
    def _compute_epsilon(self, steps: int, delta: float) -> float: ...

    @classmethod
    @abstractmethod
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
        """Smallest σ (to ``CALIBRATION_RTOL``) whose ε after ``steps`` is ≤ ``epsilon``."""

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state, saved with a run's checkpoint."""
        return {
            "name": self.name,
            "mechanism": self._mechanism,
            "noise_multiplier": self._noise_multiplier,
            "sample_rate": self._sample_rate,
            "steps": self._steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the step count; the settings must match, or resuming would misaccount."""
        for key in ("name", "mechanism", "noise_multiplier", "sample_rate"):
            if key not in state:
                raise ValueError(f"accountant state is missing {key!r}; got keys {sorted(state)}")
            if state[key] != getattr(self, key):
                raise ValueError(
                    f"accountant state has {key}={state[key]!r} but this accountant has "
                    f"{key}={getattr(self, key)!r}; build the accountant from the saved state "
                    "(accountant_from_state) instead"
                )
        self._steps = check_count("steps", state.get("steps"), 0)

    def _check_saved_noise_parameters(self, state: dict[str, Any]) -> None:
        """Refuse a saved state whose noise parameters differ (for accountants that save them)."""
        if state.get("noise_parameters") != self.noise_parameters:
            raise ValueError(
                f"accountant state has noise_parameters={state.get('noise_parameters')!r} but "
                f"this accountant has {self.noise_parameters!r}; build it with "
                "accountant_from_state"
            )

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mechanism={self._mechanism!r}, "
            f"noise_multiplier={self._noise_multiplier}, sample_rate={self._sample_rate}, "
            f"steps={self._steps})"
        )
