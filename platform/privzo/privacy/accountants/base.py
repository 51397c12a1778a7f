"""The ``Accountant`` base class, which states what each accountant bounds and holds the code
they all run (the grid, the saved state, calibration); the settings it checks are in
``settings``, its refusal of noise it cannot bound in ``refusal``."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import Any, ClassVar

from privzo.privacy.accountants.calibration import COARSE_FACTOR, Curve, search_sigma
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.accountants.refusal import UnsupportedNoiseError
from privzo.privacy.accountants.settings import (
    PLD_VALUE_DISCRETIZATION,
    check_delta,
    check_mechanism_name,
    check_positive,
    directions_of,
)
from privzo.privacy.checks import check_count, check_sample_rate
from privzo.privacy.discrete import check_grid

__all__ = ["Accountant"]

_EPSILON_CACHE_SIZE = 256


class Accountant(ABC):
    """Tracks the steps a run has taken at fixed (mechanism, σ, p) and the ε they cost.

    ε only ever grows with the step count, and ``epsilon_at`` answers "what would ε be after n
    steps" without stepping, which the budget ledger uses to refuse a step before taking it.
    ``noise_parameters`` may hold the grid K of discrete noise (``{"grid": K}``), which an
    accountant refuses for a mechanism not in its ``grid_mechanisms``, and with it the J ≥ 2
    directions of a step that releases a rounded J-vector (``"directions": J``), refused for a
    mechanism not in its ``vector_grid_mechanisms``.

    What an accountant bounds is stated here, by its class attributes, and read by everyone
    else (the registry's refusals, the run config's validation): ``mechanisms`` (continuous
    noise), ``grid_mechanisms`` (discrete noise, one direction per step),
    ``vector_grid_mechanisms`` (discrete noise on a vector of several directions),
    ``allows_zero_delta`` (pure ε-DP), and ``discretized`` (a PLD on an ε grid of
    ``value_discretization_interval``).
    """

    name: ClassVar[str]
    title: ClassVar[str]  # its method, as messages name it
    mechanisms: ClassVar[tuple[str, ...]]
    grid_mechanisms: ClassVar[tuple[str, ...]] = ()
    vector_grid_mechanisms: ClassVar[tuple[str, ...]] = ()
    allows_zero_delta: ClassVar[bool] = False
    discretized: ClassVar[bool] = False

    def __init__(
        self,
        mechanism: str,
        noise_multiplier: float,
        sample_rate: float,
        noise_parameters: dict[str, Any] | None = None,
        value_discretization_interval: float | None = None,
    ) -> None:
        self._mechanism = type(self).check_mechanism(mechanism)
        self._noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self._sample_rate = check_sample_rate(sample_rate)
        self._steps = 0
        self._cache: dict[tuple[int, float], float] = {}
        self._grid = type(self).grid_of(noise_parameters, mechanism)
        self._directions = directions_of(noise_parameters)
        self._interval = type(self).interval_of(value_discretization_interval)
        self._given_parameters = dict(noise_parameters) if noise_parameters else None
        self._prepare()

    def _prepare(self) -> None:  # noqa: B027 (a hook: most accountants need nothing more)
        """Check and set up what this accountant needs beyond the shared settings (nothing
        computed yet: ε is computed when first asked)."""

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
        """The noise settings beyond σ this accountant bounds: the grid, if any, and the
        directions of a gridded vector."""
        if self._grid is None:
            return None
        if self._directions == 1:
            return {"grid": self._grid}
        return {"grid": self._grid, "directions": self._directions}

    @property
    def steps(self) -> int:
        """Steps accounted so far."""
        return self._steps

    @classmethod
    def bounds(cls, mechanism: str, *, grid: bool = False, directions: int = 1) -> bool:
        """Whether this accountant bounds ``mechanism``'s noise, discrete if ``grid`` (on a
        vector of ``directions`` coordinates, each rounded, when that is above 1)."""
        if not grid:
            return mechanism in cls.mechanisms
        return mechanism in (cls.vector_grid_mechanisms if directions > 1 else cls.grid_mechanisms)

    @classmethod
    def check_mechanism(cls, mechanism: str) -> str:
        """Reject mechanisms this accountant cannot bound (the registry adds which can)."""
        check_mechanism_name(mechanism)
        if not cls.bounds(mechanism):
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
    def grid_of(cls, noise_parameters: dict[str, Any] | None, mechanism: str) -> int | None:
        """The grid K of discrete noise in ``noise_parameters`` (None: continuous), refused by
        an accountant that does not bound ``mechanism`` on a grid (the registry adds which do)."""
        grid = check_grid((noise_parameters or {}).get("grid"))
        directions = directions_of(noise_parameters)
        if grid is None or cls.bounds(mechanism, grid=True, directions=directions):
            return grid
        if directions > 1 and cls.bounds(mechanism, grid=True):
            raise UnsupportedNoiseError.refusing(
                f"accountant={cls.name!r} bounds the discrete {mechanism} noise of one "
                f"direction per step, and this step releases a rounded vector of {directions} "
                f"directions (grid={grid}), whose discrete privacy loss it does not bound",
                f"a gridded {mechanism} vector of several directions",
                mechanism,
                " (or one direction per step; or continuous noise: privacy.noise_grid=null)",
                grid=True,
                directions=directions,
            )
        if directions == 1 and cls.bounds(mechanism, grid=True, directions=2):
            raise UnsupportedNoiseError.refusing(
                f"accountant={cls.name!r} bounds discrete {mechanism} noise only on the rounded "
                f"vector of several directions per step, and this step releases one discrete "
                f"value (grid={grid})",
                f"discrete {mechanism} noise",
                mechanism,
                " (or draw continuous noise: privacy.noise_grid=null)",
                grid=True,
            )
        if not cls.grid_mechanisms and not cls.vector_grid_mechanisms:
            raise UnsupportedNoiseError.refusing(
                f"accountant={cls.name!r} bounds only continuous noise, and this noise is "
                f"discrete (grid={grid})",
                "discrete noise",
                None,
                " (numeric for lmo only; or draw continuous noise: privacy.noise_grid=null)",
            )
        raise UnsupportedNoiseError.refusing(
            f"accountant={cls.name!r} bounds the {mechanism} mechanism's continuous noise only, "
            f"and this noise is discrete (grid={grid})",
            f"discrete {mechanism} noise",
            mechanism,
            " (or draw continuous noise: privacy.noise_grid=null)",
            grid=True,
            directions=directions,
        )

    @classmethod
    def interval_of(cls, value_discretization_interval: float | None) -> float | None:
        """The ε-grid spacing of a ``discretized`` accountant (default
        ``PLD_VALUE_DISCRETIZATION``); None for the others, which take none."""
        if not cls.discretized:
            if value_discretization_interval is not None:
                raise TypeError(f"accountant={cls.name!r} takes no value_discretization_interval")
            return None
        if value_discretization_interval is None:
            return PLD_VALUE_DISCRETIZATION
        return check_positive("value_discretization_interval", value_discretization_interval)

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

    # --- calibration ---------------------------------------------------------------------------

    @classmethod
    def calibrate(cls, query: AccountingQuery, epsilon: float) -> float:
        """Smallest σ (to ``CALIBRATION_RTOL``) whose ε after ``query.steps`` is ≤ ``epsilon``.

        Raises ValueError if no σ ≤ ``MAX_NOISE_MULTIPLIER`` meets the target, or if even
        σ = ``MIN_NOISE_MULTIPLIER`` already does (the target is too loose to pin σ down
        cheaply).
        """
        assert query.accountant == cls.name, f"{cls.name!r} asked {query.accountant!r}'s query"
        mechanism = cls.check_mechanism(query.mechanism)
        epsilon = check_positive("epsilon", epsilon)
        delta = cls.check_delta(query.delta)
        sample_rate = check_sample_rate(query.sample_rate)
        steps = check_count("steps", query.steps, 1)
        ever_sampled = -math.expm1(steps * math.log1p(-sample_rate)) if sample_rate < 1 else 1.0
        if not cls.allows_zero_delta and ever_sampled <= delta:
            raise ValueError(
                f"epsilon={epsilon}, delta={delta} with {steps} steps at sample_rate="
                f"{sample_rate} is met even at noise_multiplier=0: an example is sampled at all "
                f"with probability {ever_sampled:.3g} <= delta, so no σ is pinned down; tighten "
                "delta"
            )
        cls.grid_of(query.noise_parameters, mechanism)
        checked = AccountingQuery(
            sample_rate, steps, delta, mechanism, cls.name, query.noise_parameters or None
        )
        return float(cls._solve(checked, epsilon))

    @classmethod
    def _solve(cls, query: AccountingQuery, epsilon: float) -> float:
        """The one search (``calibration.search_sigma``) over this accountant's ε(σ) curves; an
        accountant with a closed form overrides this instead of ``_curves``."""
        return search_sigma(query, epsilon, *cls._curves(query))

    @classmethod
    def _curves(cls, query: AccountingQuery) -> tuple[Curve, Curve | None]:
        """The fine ε(σ) curve of ``query`` and, where one is cheaper, a coarse one."""
        raise NotImplementedError(f"accountant={cls.name!r} has no ε(σ) curve to search")

    @classmethod
    def _accountant_curves(cls, query: AccountingQuery) -> tuple[Curve, Curve]:
        """ε(σ) of ``query`` from fresh accountants of this (``discretized``) class, on the
        default ε grid and on one ``COARSE_FACTOR`` coarser."""

        def curve(interval: float) -> Curve:
            def epsilon_of(sigma: float) -> float:
                fresh = cls(
                    query.mechanism,
                    sigma,
                    query.sample_rate,
                    query.noise_parameters,
                    value_discretization_interval=interval,
                )
                return fresh.epsilon_at(query.steps, query.delta)

            return Curve(query.curve_key("accountant", interval), epsilon_of)

        return curve(PLD_VALUE_DISCRETIZATION), curve(PLD_VALUE_DISCRETIZATION * COARSE_FACTOR)

    # --- saved state ---------------------------------------------------------------------------

    def options(self) -> dict[str, Any]:
        """The settings beyond (mechanism, σ, p) that rebuild this accountant: the ε grid of a
        ``discretized`` one, and the noise parameters of one that bounds discrete noise."""
        options: dict[str, Any] = {}
        if self._interval is not None:
            options["value_discretization_interval"] = self._interval
        if type(self).grid_mechanisms or type(self).vector_grid_mechanisms:
            options["noise_parameters"] = self.noise_parameters
        return options

    def state_dict(self) -> dict[str, Any]:
        """Plain JSON-able state, saved with a run's checkpoint."""
        return {
            "name": self.name,
            "mechanism": self._mechanism,
            "noise_multiplier": self._noise_multiplier,
            "sample_rate": self._sample_rate,
            "steps": self._steps,
            **self.options(),
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
        for key, value in self.options().items():
            saved = state.get(key, _SAVED_DEFAULTS[key])  # states saved before the key existed
            if saved != value:
                raise ValueError(
                    f"accountant state has {key}={saved!r} but this accountant has {value!r}; "
                    "build it with accountant_from_state"
                )
        self._steps = check_count("steps", state.get("steps"), 0)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mechanism={self._mechanism!r}, "
            f"noise_multiplier={self._noise_multiplier}, sample_rate={self._sample_rate}, "
            f"steps={self._steps})"
        )


_SAVED_DEFAULTS: dict[str, Any] = {
    "value_discretization_interval": PLD_VALUE_DISCRETIZATION,
    "noise_parameters": None,
}
