"""Privacy accounting for T steps of a Poisson-subsampled 1-D Gaussian or Laplace mechanism.

Every step of DPZero / DP-ZO releases one noisy sum of clipped scalars with sensitivity C under
add/remove adjacency and noise scale σ·C, so the noise multiplier σ is exactly the
``noise_multiplier`` of dp_accounting's ``GaussianDpEvent`` / ``LaplaceDpEvent`` and one step is
``PoissonSampledDpEvent(p, GaussianDpEvent(σ) | LaplaceDpEvent(σ))``.

Accountants (``ACCOUNTANTS``):

- ``pld``: privacy loss distributions (dp_accounting's PLD code, value discretization 1e-4):
  tight, both mechanisms. Its cost is dominated by building the one-step PLD (up to ~1 s at
  σ≈0.6) and self-composing it (0.02-0.5 s at T ≤ 10⁴), so the stateful accountant builds the
  one-step PLD once and caches ε per (steps, δ).
- ``rdp``: Rényi DP, Gaussian only (dp_accounting rejects the subsampled Laplace event);
  conservative (≈7-10 % more noise than PLD) but cheap: ε(T) is a conversion of T times one
  cached RDP vector.
- ``pure``: pure ε-DP of the Laplace mechanism, ε = T·log(1 + p(e^{1/σ} − 1)) (amplification by
  subsampling, then basic composition); loose, but valid at δ = 0.

Discrete noise (``noise_parameters={"grid": K}``, see ``privzo.privacy.mechanisms``): the noise
is γ·k with γ = σC/K, k ~ N_Z(0, K²) or discrete Laplace of scale K, and the clipped sum is
rounded to the grid with sensitivity Δ = ⌈K/σ⌉ grid units. ``pld`` then composes
dp_accounting's discrete Gaussian / discrete Laplace PLDs at (K, Δ) and ``pure`` uses the
discrete Laplace's Δ/K per step; ``rdp`` and ``numeric`` bound only continuous noise and refuse
a grid, except that ``numeric`` accounts LMO on the grid (a rounding of the continuous LMO
output, see ``privzo.privacy.numeric``). Since Δ/K ≥ 1/σ, the discrete mechanism's ε is at or
slightly above the continuous one.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import dp_accounting
import numpy as np
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from dp_accounting.pld import privacy_loss_distribution as dp_pld_dist
from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp_impl
from scipy import optimize, stats

from privzo.privacy.discrete import check_grid, grid_sensitivity
from privzo.privacy.sampling import check_count, check_sample_rate

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATION_RTOL",
    "MAX_NOISE_MULTIPLIER",
    "MECHANISM_NAMES",
    "MIN_NOISE_MULTIPLIER",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "PldAccountant",
    "PureLaplaceAccountant",
    "RdpAccountant",
    "accountant_from_state",
    "calibrate_noise_multiplier",
    "check_delta",
    "check_positive",
    "compute_epsilon",
    "get_accountant",
    "make_accountant",
]

MECHANISM_NAMES: tuple[str, ...] = ("gaussian", "laplace", "lmo")
PLD_VALUE_DISCRETIZATION = 1e-4
# Calibration searches σ in [MIN, MAX]: above MAX the target is called unattainable; below MIN
# the PLD of one step gets so wide that each evaluation takes tens of seconds.
MIN_NOISE_MULTIPLIER = 0.05
MAX_NOISE_MULTIPLIER = 1e4
# Calibrated σ is within this relative distance above the smallest σ meeting the target.
CALIBRATION_RTOL = 1e-3
_COARSE_FACTOR = 10.0  # coarse PLD search discretizes 10x coarser (≈10x cheaper per probe)
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


def _check_mechanism_name(mechanism: str) -> str:
    if mechanism not in MECHANISM_NAMES:
        raise ValueError(f"mechanism={mechanism!r} is unknown; allowed: {list(MECHANISM_NAMES)}")
    return mechanism


# --- dp_accounting helpers ---------------------------------------------------------------------


def _step_event(mechanism: str, noise_multiplier: float, sample_rate: float) -> Any:
    """One Poisson-subsampled step with sensitivity 1 and noise σ (scale-free: σ·C over C)."""
    if mechanism == "gaussian":
        inner: Any = dp_accounting.GaussianDpEvent(noise_multiplier)
    else:
        inner = dp_accounting.LaplaceDpEvent(noise_multiplier)
    return dp_accounting.PoissonSampledDpEvent(sample_rate, inner)


def _run_event(mechanism: str, noise_multiplier: float, sample_rate: float, steps: int) -> Any:
    return dp_accounting.SelfComposedDpEvent(
        _step_event(mechanism, noise_multiplier, sample_rate), steps
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


class _MemoizedAccountant(dp_accounting.PrivacyAccountant):
    """Computes ε with a fresh dp_accounting accountant, remembering it per (event, δ).

    ``calibrate_dp_mechanism`` re-evaluates the bracket endpoints our own search has just
    evaluated; one PLD evaluation near σ≈1 costs about half a second, so repeats come from the
    shared memo instead.
    """

    def __init__(
        self,
        make_fresh: Callable[[], dp_accounting.PrivacyAccountant],
        memo: dict[tuple[Any, float], float],
    ) -> None:
        super().__init__(dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE)
        self._make_fresh = make_fresh
        self._memo = memo
        self._events: list[Any] = []

    def _maybe_compose(self, event: Any, count: int, do_compose: bool) -> Any:
        if do_compose:
            self._events.append(
                event if count == 1 else dp_accounting.SelfComposedDpEvent(event, count)
            )
        return None

    def get_epsilon(self, target_delta: float) -> float:
        event = (
            self._events[0]
            if len(self._events) == 1
            else dp_accounting.ComposedDpEvent(list(self._events))
        )
        key = (event, target_delta)
        if key not in self._memo:
            with quiet_absl():
                fresh = self._make_fresh().compose(event)
                self._memo[key] = float(fresh.get_epsilon(target_delta))
        return self._memo[key]


# --- accountants -------------------------------------------------------------------------------


class Accountant(ABC):
    """Tracks the steps a run has taken at fixed (mechanism, σ, p) and the ε they cost.

    ε only ever grows with the step count, and ``epsilon_at`` answers "what would ε be after n
    steps" without stepping, which the budget ledger uses to refuse a step before taking it.
    """

    name: ClassVar[str]
    mechanisms: ClassVar[tuple[str, ...]]
    allows_zero_delta: ClassVar[bool] = False
    supports_grid: ClassVar[bool] = False  # bounds the discrete (gridded) mechanisms

    def __init__(self, mechanism: str, noise_multiplier: float, sample_rate: float) -> None:
        self._mechanism = type(self).check_mechanism(mechanism)
        self._noise_multiplier = check_positive("noise_multiplier", noise_multiplier)
        self._sample_rate = check_sample_rate(sample_rate)
        self._steps = 0
        self._cache: dict[tuple[int, float], float] = {}

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
    def steps(self) -> int:
        """Steps accounted so far."""
        return self._steps

    @classmethod
    def check_mechanism(cls, mechanism: str) -> str:
        """Reject mechanisms this accountant cannot bound, saying which accountants can."""
        _check_mechanism_name(mechanism)
        if mechanism not in cls.mechanisms:
            able = [name for name, acc in ACCOUNTANTS.items() if mechanism in acc.mechanisms]
            raise ValueError(
                f"accountant={cls.name!r} cannot account mechanism={mechanism!r}: it supports "
                f"only {list(cls.mechanisms)}; accountants for {mechanism!r}: {able}"
            )
        return mechanism

    @classmethod
    def check_delta(cls, delta: float) -> float:
        return check_delta(delta, allow_zero=cls.allows_zero_delta)

    @classmethod
    def grid_of(cls, noise_parameters: dict[str, Any] | None) -> int | None:
        """The grid K of discrete noise in ``noise_parameters`` (None: continuous), refused by
        an accountant that bounds only continuous noise."""
        grid = check_grid((noise_parameters or {}).get("grid"))
        if grid is not None and not cls.supports_grid:
            able = [name for name, acc in ACCOUNTANTS.items() if acc.supports_grid]
            raise ValueError(
                f"accountant={cls.name!r} bounds only continuous noise, and this noise is "
                f"discrete (grid={grid}); accountants for discrete noise: {able} (numeric for "
                "lmo only; or draw "
                "continuous noise: privacy.noise_grid=null)"
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
        cls, *, epsilon: float, delta: float, sample_rate: float, steps: int, mechanism: str
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

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(mechanism={self._mechanism!r}, "
            f"noise_multiplier={self._noise_multiplier}, sample_rate={self._sample_rate}, "
            f"steps={self._steps})"
        )


class PldAccountant(Accountant):
    """Privacy loss distributions: the tight accountant, for both mechanisms.

    The one-step PLD is built once (the costly part, up to ~1 s at σ≈0.6) and self-composed for
    each new step count; this matches ``dp_accounting.pld.PLDAccountant`` composing the
    ``SelfComposedDpEvent`` to ~1e-9 relative. A new step count costs ~0.05-0.5 s at T ≤ 10⁴
    (smaller σ costs more); repeats are cached. Extending the previous count's PLD by composition
    was measured to be no cheaper (one FFT over the composed support either way).
    """

    name: ClassVar[str] = "pld"
    mechanisms: ClassVar[tuple[str, ...]] = ("gaussian", "laplace")
    supports_grid: ClassVar[bool] = True

    def __init__(
        self,
        mechanism: str,
        noise_multiplier: float,
        sample_rate: float,
        noise_parameters: dict[str, Any] | None = None,
        value_discretization_interval: float = PLD_VALUE_DISCRETIZATION,
    ) -> None:
        super().__init__(mechanism, noise_multiplier, sample_rate)
        self._grid = type(self).grid_of(noise_parameters)
        if noise_multiplier < MIN_NOISE_MULTIPLIER:
            raise ValueError(
                f"noise_multiplier={noise_multiplier} is below {MIN_NOISE_MULTIPLIER}: the PLD "
                "of so little noise is too wide to compute in reasonable time (and gives almost "
                "no privacy); use a larger noise multiplier, or the rdp accountant (Gaussian)"
            )
        self._interval = check_positive(
            "value_discretization_interval", value_discretization_interval
        )
        self._one_step: Any = None

    @property
    def noise_parameters(self) -> dict[str, Any] | None:
        return None if self._grid is None else {"grid": self._grid}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {
            "value_discretization_interval": self._interval,
            "noise_parameters": self.noise_parameters,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("noise_parameters") != self.noise_parameters:
            raise ValueError(
                f"accountant state has noise_parameters={state.get('noise_parameters')!r} but "
                f"this accountant has {self.noise_parameters!r}; build it with "
                "accountant_from_state"
            )
        saved = state.get("value_discretization_interval", PLD_VALUE_DISCRETIZATION)
        if saved != self._interval:
            raise ValueError(
                f"accountant state has value_discretization_interval={saved!r} but this "
                f"accountant has {self._interval!r}; build it with accountant_from_state"
            )
        super().load_state_dict(state)

    def _one_step_pld(self) -> Any:
        if self._one_step is None:
            self._one_step = _one_step_pld(
                self._mechanism,
                self._noise_multiplier,
                self._sample_rate,
                self._interval,
                self._grid,
            )
        return self._one_step

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        known = _known_pld_epsilon(self._pld_key(steps, delta))
        if known is not None:
            return known
        composed = self._one_step_pld().self_compose(steps)
        return _remember_pld_epsilon(
            self._pld_key(steps, delta), composed.get_epsilon_for_delta(delta)
        )

    def _pld_key(self, steps: int, delta: float) -> tuple[Any, ...]:
        return (
            self._mechanism,
            self._noise_multiplier,
            self._sample_rate,
            self._interval,
            self._grid,
            steps,
            delta,
        )

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
        hint = noise_hint(mechanism, epsilon, delta, sample_rate, steps)
        if cls.grid_of(noise_parameters) is not None:
            problem = (cls, mechanism, delta, sample_rate, steps, noise_parameters)
            return calibrate_by_probes(
                AccountantEvaluator(*problem, PLD_VALUE_DISCRETIZATION * _COARSE_FACTOR),
                AccountantEvaluator(*problem, PLD_VALUE_DISCRETIZATION),
                epsilon,
                hint,
            )
        problem = (mechanism, delta, sample_rate, steps)
        fine = _Evaluator(_pld_factory(PLD_VALUE_DISCRETIZATION), cls.name, *problem)
        coarse = _Evaluator(
            _pld_factory(PLD_VALUE_DISCRETIZATION * _COARSE_FACTOR), cls.name, *problem
        )
        return _calibrate_numeric(fine, coarse, epsilon, hint)


class RdpAccountant(Accountant):
    """Rényi DP with dp_accounting's default orders; Gaussian only.

    RDP composes additively, so ε after T steps converts T times the one-step RDP vector,
    which is computed once: ε costs microseconds at any T.
    """

    name: ClassVar[str] = "rdp"
    mechanisms: ClassVar[tuple[str, ...]] = ("gaussian",)

    def __init__(
        self,
        mechanism: str,
        noise_multiplier: float,
        sample_rate: float,
        noise_parameters: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(mechanism, noise_multiplier, sample_rate)
        type(self).grid_of(noise_parameters)  # refuses discrete noise
        self._orders: np.ndarray | None = None
        self._one_step_rdp: np.ndarray | None = None

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        if self._one_step_rdp is None:
            with quiet_absl():
                one = dp_rdp.RdpAccountant().compose(
                    _step_event(self._mechanism, self._noise_multiplier, self._sample_rate)
                )
            self._orders, self._one_step_rdp = one.orders, one.rdp
        assert self._orders is not None
        epsilon, _ = dp_rdp_impl.compute_epsilon(self._orders, steps * self._one_step_rdp, delta)
        return float(epsilon)

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
        cls.grid_of(noise_parameters)  # refuses discrete noise
        fine = _Evaluator(dp_rdp.RdpAccountant, cls.name, mechanism, delta, sample_rate, steps)
        hint = noise_hint(mechanism, epsilon, delta, sample_rate, steps)
        return _calibrate_numeric(fine, None, epsilon, hint)


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

    def __init__(
        self,
        mechanism: str,
        noise_multiplier: float,
        sample_rate: float,
        noise_parameters: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(mechanism, noise_multiplier, sample_rate)
        self._grid = type(self).grid_of(noise_parameters)

    @property
    def noise_parameters(self) -> dict[str, Any] | None:
        return None if self._grid is None else {"grid": self._grid}

    def state_dict(self) -> dict[str, Any]:
        return super().state_dict() | {"noise_parameters": self.noise_parameters}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("noise_parameters") != self.noise_parameters:
            raise ValueError(
                f"accountant state has noise_parameters={state.get('noise_parameters')!r} but "
                f"this accountant has {self.noise_parameters!r}; build it with "
                "accountant_from_state"
            )
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
        sigma = _pure_laplace_sigma(epsilon, sample_rate, steps)
        grid = cls.grid_of(noise_parameters)
        if grid is not None and math.isfinite(sigma):
            sigma = _pure_grid_sigma(sigma, grid)
            assert not steps * cls.step_epsilon(sigma, sample_rate, grid) > epsilon
        _check_attainable(sigma, epsilon, delta, sample_rate, steps, mechanism, cls.name)
        return sigma


ACCOUNTANTS: dict[str, type[Accountant]] = {
    PldAccountant.name: PldAccountant,
    RdpAccountant.name: RdpAccountant,
    PureLaplaceAccountant.name: PureLaplaceAccountant,
}


def get_accountant(name: str) -> type[Accountant]:
    """The accountant class registered as ``name``."""
    try:
        return ACCOUNTANTS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"accountant={name!r} is unknown; allowed: {sorted(ACCOUNTANTS)}"
        ) from None


def make_accountant(
    name: str, mechanism: str, noise_multiplier: float, sample_rate: float, **options: Any
) -> Accountant:
    """A fresh accountant at 0 steps (``options``: e.g. the PLD's value_discretization_interval)."""
    return get_accountant(name)(mechanism, noise_multiplier, sample_rate, **options)


def accountant_from_state(state: dict[str, Any]) -> Accountant:
    """Rebuild an accountant (settings and steps) from ``Accountant.state_dict()``."""
    missing = {"name", "mechanism", "noise_multiplier", "sample_rate", "steps"} - set(state)
    if missing:
        raise ValueError(f"accountant state is missing {sorted(missing)}; got keys {sorted(state)}")
    options = {
        key: state[key]
        for key in ("value_discretization_interval", "noise_parameters")
        if state.get(key) is not None
    }
    accountant = make_accountant(
        state["name"],
        state["mechanism"],
        state["noise_multiplier"],
        state["sample_rate"],
        **options,
    )
    accountant.load_state_dict(state)
    return accountant


# --- one-shot functions ------------------------------------------------------------------------


def compute_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    mechanism: str = "gaussian",
    accountant: str = "pld",
    noise_parameters: dict[str, Any] | None = None,
) -> float:
    """ε of ``steps`` steps at noise multiplier σ and sampling rate p, at ``delta``.

    ``noise_parameters``: a parametrised mechanism's settings (lmo), for the numeric accountant.
    """
    steps = check_count("steps", steps, 1)
    options = {"noise_parameters": noise_parameters} if noise_parameters else {}
    return make_accountant(
        accountant, mechanism, noise_multiplier, sample_rate, **options
    ).epsilon_at(steps, delta)


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    mechanism: str = "gaussian",
    accountant: str = "pld",
    noise_parameters: dict[str, Any] | None = None,
) -> float:
    """The smallest σ (within ``CALIBRATION_RTOL``) for which ``steps`` steps cost ≤ ``epsilon``.

    Raises ValueError if no σ ≤ ``MAX_NOISE_MULTIPLIER`` meets the target, or if even
    σ = ``MIN_NOISE_MULTIPLIER`` already does (the target is too loose to pin σ down cheaply).
    """
    cls = get_accountant(accountant)
    mechanism = cls.check_mechanism(mechanism)
    epsilon = check_positive("epsilon", epsilon)
    delta = cls.check_delta(delta)
    sample_rate = check_sample_rate(sample_rate)
    steps = check_count("steps", steps, 1)
    ever_sampled = -math.expm1(steps * math.log1p(-sample_rate)) if sample_rate < 1 else 1.0
    if not cls.allows_zero_delta and ever_sampled <= delta:
        raise ValueError(
            f"epsilon={epsilon}, delta={delta} with {steps} steps at sample_rate={sample_rate} "
            f"is met even at noise_multiplier=0: an example is sampled at all with probability "
            f"{ever_sampled:.3g} <= delta, so no σ is pinned down; tighten delta"
        )
    options = {"noise_parameters": noise_parameters} if noise_parameters else {}
    return float(
        cls.calibrate(
            epsilon=epsilon,
            delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            mechanism=mechanism,
            **options,
        )
    )


# --- calibration internals ---------------------------------------------------------------------


# ε of a PLD evaluation by its public parameters (mechanism, σ, q, discretization, grid, T, δ),
# kept for the process: calibrating σ probes about ten σ, each a one-step PLD of up to a few
# seconds, and a run's preflight, a study's cells and a search's trials repeat the same ones.
# Floats only, never a PLD's arrays, so it costs kilobytes.
_PLD_EPSILONS: dict[tuple[Any, ...], float] = {}
_PLD_EPSILONS_SIZE = 4096
_PLD_EPSILONS_LOCK = threading.Lock()  # the run's ε-curve thread evaluates too


def _known_pld_epsilon(key: tuple[Any, ...]) -> float | None:
    with _PLD_EPSILONS_LOCK:
        return _PLD_EPSILONS.get(key)


def _remember_pld_epsilon(key: tuple[Any, ...], epsilon: float) -> float:
    with _PLD_EPSILONS_LOCK:
        if len(_PLD_EPSILONS) >= _PLD_EPSILONS_SIZE:
            _PLD_EPSILONS.pop(next(iter(_PLD_EPSILONS)))  # the oldest
        _PLD_EPSILONS[key] = float(epsilon)
    return float(epsilon)


def _one_step_pld(
    mechanism: str, sigma: float, sample_rate: float, interval: float, grid: int | None = None
) -> Any:
    """The one-step PLD exactly as ``dp_accounting.pld.PLDAccountant`` builds it; with a grid,
    the discrete mechanism's (noise K, sensitivity Δ = ⌈K/σ⌉ in grid units)."""
    if grid is not None:
        return _one_step_discrete_pld(mechanism, sigma, sample_rate, interval, grid)
    if mechanism == "gaussian":
        return dp_pld_dist.from_gaussian_mechanism(
            standard_deviation=sigma,
            value_discretization_interval=interval,
            sampling_prob=sample_rate,
            neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
        )
    return dp_pld_dist.from_laplace_mechanism(
        parameter=sigma, value_discretization_interval=interval, sampling_prob=sample_rate
    )


def _one_step_discrete_pld(
    mechanism: str, sigma: float, sample_rate: float, interval: float, grid: int
) -> Any:
    """dp_accounting's discrete Gaussian N_Z(0, K²) / discrete Laplace P(k) ∝ e^{−|k|/K} PLD,
    by pessimistic connect-the-dots as its continuous ones (privacy buckets read 1.6 % more ε).

    The discrete Gaussian's PLD truncates the noise where its mass beyond is below 1e-30
    (dp_accounting's default), which changes δ by about that per step."""
    sensitivity = grid_sensitivity(grid, sigma)
    if mechanism == "gaussian":
        return dp_pld_dist.from_discrete_gaussian_mechanism(
            sigma=grid,
            sensitivity=sensitivity,
            value_discretization_interval=interval,
            sampling_prob=sample_rate,
            use_connect_dots=True,
        )
    return dp_pld_dist.from_discrete_laplace_mechanism(
        parameter=1.0 / grid,
        sensitivity=sensitivity,
        value_discretization_interval=interval,
        sampling_prob=sample_rate,
        use_connect_dots=True,
    )


def _pld_factory(interval: float) -> Callable[[], dp_accounting.PrivacyAccountant]:
    return lambda: dp_pld.PLDAccountant(value_discretization_interval=interval)


def _pure_laplace_sigma(epsilon: float, sample_rate: float, steps: int) -> float:
    """Invert ε = T·log(1 + p(e^{1/σ} − 1)) exactly, rounding σ up so ε never exceeds target."""
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


def _gdp_mu(epsilon: float, delta: float) -> float:
    """μ of the μ-GDP trade-off curve passing through (ε, δ) (Dong, Roth & Su 2019)."""

    def delta_of(mu: float) -> float:
        upper = stats.norm.cdf(-epsilon / mu + mu / 2)
        lower = math.exp(epsilon + stats.norm.logcdf(-epsilon / mu - mu / 2))
        return upper - lower - delta

    # At μ = ε/40 the curve's δ is ~Φ(−40) ≈ 0; at μ = 2ε + 80 it is ~1.
    return float(optimize.brentq(delta_of, epsilon / 40, 2 * epsilon + 80, xtol=1e-12))


def noise_hint(
    mechanism: str, epsilon: float, delta: float, sample_rate: float, steps: int
) -> float:
    """A closed-form first guess of σ from the central limit theorem for composed DP.

    Composing T steps behaves like μ-GDP with μ = p·sqrt(T·χ²(σ)), χ² the divergence between the
    noise and its unit shift (Bu et al. 2020). Good within ~10 % for large p·T and off further for
    few steps, which the bracket search absorbs. For Laplace the pure-DP σ is also a valid
    answer, so the hint never exceeds it.
    """
    target = _gdp_mu(epsilon, delta) ** 2 / (sample_rate**2 * steps)
    if mechanism == "gaussian":
        return float(np.clip(1.0 / math.sqrt(math.log1p(target)), MIN_NOISE_MULTIPLIER, 1e3))

    def chi2_gap(x: float) -> float:  # x = 1/b; χ² of Laplace(1, b) vs Laplace(0, b)
        return 2 / 3 * math.exp(x) + 1 / 3 * math.exp(-2 * x) - 1 - target

    x = optimize.brentq(chi2_gap, 0.0, math.log1p(target) + 2.0)
    clt = 1.0 / x if x > 0 else 1e3
    pure = _pure_laplace_sigma(epsilon, sample_rate, steps)
    return float(np.clip(min(clt, pure), MIN_NOISE_MULTIPLIER, 1e3))


class _Evaluator:
    """ε(σ) of one calibration problem, memoized in a memo shared with calibrate_dp_mechanism."""

    def __init__(
        self,
        make_fresh: Callable[[], dp_accounting.PrivacyAccountant],
        label: str,
        mechanism: str,
        delta: float,
        sample_rate: float,
        steps: int,
    ) -> None:
        self.make_fresh, self.label, self.mechanism = make_fresh, label, mechanism
        self.delta, self.sample_rate, self.steps = delta, sample_rate, steps
        self.memo: dict[tuple[Any, float], float] = {}

    def event(self, sigma: float) -> Any:
        return _run_event(self.mechanism, sigma, self.sample_rate, self.steps)

    def accountant(self) -> _MemoizedAccountant:
        return _MemoizedAccountant(self.make_fresh, self.memo)

    def __call__(self, sigma: float) -> float:
        return self.accountant().compose(self.event(sigma)).get_epsilon(self.delta)


def _calibrate_numeric(
    fine: _Evaluator, coarse: _Evaluator | None, epsilon: float, hint: float
) -> float:
    """Search near ``hint``, then let ``calibrate_dp_mechanism`` finish on an explicit bracket.

    Every ε evaluation of the fine accountant is expensive (PLD: 0.05-1.5 s), so the search
    first runs on a cheap coarse accountant when given, then needs about three fine probes;
    it usually hands calibrate_dp_mechanism a bracket already within ``CALIBRATION_RTOL``,
    which it then only verifies (ε ≤ target at the returned σ) from the shared memo.
    """
    guess, slope = hint, -1.5
    if coarse is not None:
        _, guess, slope = bracket_sigma(coarse, epsilon, guess, slope, rtol=CALIBRATION_RTOL / 10)
    lo, hi, _ = bracket_sigma(fine, epsilon, guess, slope, rtol=CALIBRATION_RTOL)
    tight = hi - lo <= CALIBRATION_RTOL * lo
    sigma = dp_accounting.calibrate_dp_mechanism(
        fine.accountant,
        fine.event,
        epsilon,
        fine.delta,
        bracket_interval=dp_accounting.ExplicitBracketInterval(lo, hi),
        tol=(hi - lo) if tight else CALIBRATION_RTOL * lo,
    )
    return float(sigma)


class AccountantEvaluator:
    """ε(σ) of one calibration problem from fresh accountants of one class (memoized), with the
    attributes ``bracket_sigma``'s error messages read."""

    def __init__(
        self,
        accountant: type[Accountant],
        mechanism: str,
        delta: float,
        sample_rate: float,
        steps: int,
        noise_parameters: dict[str, Any] | None,
        interval: float,
    ) -> None:
        self.accountant, self.label = accountant, accountant.name
        self.mechanism, self.delta, self.sample_rate, self.steps = (
            mechanism,
            delta,
            sample_rate,
            steps,
        )
        self.noise_parameters, self.interval = noise_parameters, interval
        self.memo: dict[float, float] = {}

    def __call__(self, sigma: float) -> float:
        if sigma not in self.memo:
            accountant = self.accountant(
                self.mechanism,
                sigma,
                self.sample_rate,
                self.noise_parameters,
                value_discretization_interval=self.interval,
            )
            self.memo[sigma] = accountant.epsilon_at(self.steps, self.delta)
        return self.memo[sigma]


def calibrate_by_probes(
    coarse: AccountantEvaluator, fine: AccountantEvaluator, epsilon: float, hint: float
) -> float:
    """Secant probes on the coarse evaluator, then on the fine one, then bisection to
    ``CALIBRATION_RTOL``; returns the upper end, whose ε is within the target. (ε(σ) of discrete
    noise is a step function of σ through Δ = ⌈K/σ⌉; bisection needs only monotonicity.)"""
    _, guess, slope = bracket_sigma(coarse, epsilon, hint, -1.5, rtol=CALIBRATION_RTOL / 10)  # type: ignore[arg-type]
    lo, hi, _ = bracket_sigma(fine, epsilon, guess, slope, rtol=CALIBRATION_RTOL)  # type: ignore[arg-type]
    while hi - lo > CALIBRATION_RTOL * lo:
        middle = math.sqrt(lo * hi)
        if fine(middle) > epsilon:
            lo = middle
        else:
            hi = middle
    return hi


def bracket_sigma(
    eps_of: _Evaluator, epsilon: float, guess: float, slope: float, rtol: float
) -> tuple[float, float, float]:
    """(lo, hi, slope): ε(lo) > target ≥ ε(hi), as tight as a few secant probes make it.

    Shared with the numeric accountant (``privzo.privacy.numeric``), which calibrates σ the same
    way over its own ε(σ).
    """
    lo, hi, slope = _secant_probes(eps_of, epsilon, guess, slope, rtol)
    if lo is None or hi is None:
        start = lo if lo is not None else hi
        assert start is not None  # the first probe always lands on one side
        lo, hi = _expand(eps_of, epsilon, start)
    return lo, hi, slope


def _secant_probes(
    eps_of: _Evaluator, epsilon: float, guess: float, slope: float, rtol: float, budget: int = 8
) -> tuple[float | None, float | None, float]:
    """Safeguarded secant on log ε against log σ, which is nearly linear.

    Each probe is aimed a quarter tolerance to the side of the predicted root where no probe has
    landed yet, so a good prediction closes the bracket to ``rtol`` with the next probe. Steps
    are capped at a factor 2 and σ stays in [MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER].
    """
    tau = math.log1p(rtol)
    bounds = (math.log(MIN_NOISE_MULTIPLIER), math.log(MAX_NOISE_MULTIPLIER))
    lo: tuple[float, float] | None = None  # (log σ, log ε − log target) with ε above target
    hi: tuple[float, float] | None = None  # ... with ε at or below target
    u = _clamp(math.log(guess), *bounds)
    previous: tuple[float, float] | None = None
    for _ in range(budget):
        h = math.log(max(eps_of(math.exp(u)), 1e-300)) - math.log(epsilon)
        if h > 0 and (lo is None or u > lo[0]):
            lo = (u, h)
        if h <= 0 and (hi is None or u < hi[0]):
            hi = (u, h)
        if lo is not None and hi is not None and hi[0] - lo[0] <= tau:
            break
        if previous is not None and abs(u - previous[0]) > 4 * tau:
            measured = (h - previous[1]) / (u - previous[0])
            slope = measured if measured < 0 else slope
        previous = (u, h)
        root = _clamp(u - h / slope, u - math.log(2), u + math.log(2))
        if lo is None:
            target = root - tau / 4
        elif hi is None:
            target = root + tau / 4
        else:
            root = _clamp(root, lo[0], hi[0])
            if root - lo[0] < tau / 2:
                target = lo[0] + tau
            elif hi[0] - root < tau / 2:
                target = hi[0] - tau
            else:
                target = root
        target = _clamp(target, *bounds)
        if target == u:
            break
        u = target
    return (
        None if lo is None else math.exp(lo[0]),
        None if hi is None else math.exp(hi[0]),
        slope,
    )


def _clamp(value: float, low: float, high: float) -> float:
    return min(max(value, low), high)


def _expand(eps_of: _Evaluator, epsilon: float, start: float) -> tuple[float, float]:
    """Fallback: walk from ``start`` in growing geometric steps until the target is bracketed.

    Small σ is expensive for PLD (a wider loss distribution), so the walk down grows its step
    slowly; the walk up may double. Raises ValueError when σ leaves the searched range.
    """
    factor = 1.02
    sigma = _clamp(start, MIN_NOISE_MULTIPLIER, MAX_NOISE_MULTIPLIER)
    if eps_of(sigma) > epsilon:  # too little noise: walk up
        while True:
            upper = min(sigma * factor, MAX_NOISE_MULTIPLIER)
            if eps_of(upper) <= epsilon:
                return sigma, upper
            if upper >= MAX_NOISE_MULTIPLIER:
                _raise_unattainable(epsilon, eps_of)
            sigma, factor = upper, min(factor**2, 2.0)
    while True:  # enough noise: walk down
        lower = max(sigma / factor, MIN_NOISE_MULTIPLIER)
        if eps_of(lower) > epsilon:
            return lower, sigma
        if lower <= MIN_NOISE_MULTIPLIER:
            _raise_too_loose(epsilon, eps_of)
        sigma, factor = lower, min(factor**2, 1.5)


def _raise_unattainable(epsilon: float, eps_of: _Evaluator) -> None:
    raise ValueError(
        f"cannot meet epsilon={epsilon}, delta={eps_of.delta} with {eps_of.steps} steps of the "
        f"{eps_of.mechanism} mechanism at sample_rate={eps_of.sample_rate} (accountant "
        f"{eps_of.label!r}): even noise_multiplier={MAX_NOISE_MULTIPLIER:g} spends more; allow "
        "a larger epsilon or delta, or use fewer steps or a smaller sample_rate"
    )


def _raise_too_loose(epsilon: float, eps_of: _Evaluator) -> None:
    raise ValueError(
        f"epsilon={epsilon}, delta={eps_of.delta} with {eps_of.steps} steps of the "
        f"{eps_of.mechanism} mechanism at sample_rate={eps_of.sample_rate} is met even at "
        f"noise_multiplier={MIN_NOISE_MULTIPLIER} (accountant {eps_of.label!r}); calibration "
        "does not search lower, where PLD evaluations take minutes: set noise_multiplier "
        "explicitly or tighten the target"
    )


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
