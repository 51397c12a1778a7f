"""Calibration: the smallest noise multiplier σ whose ε after T steps meets a target.

Every engine starts from ``noise_hint`` (a closed-form guess) and brackets the target with
``bracket_sigma`` (secant probes on log ε against log σ, then a geometric walk if need be):

- ``calibrate_by_events``: ε(σ) from fresh dp_accounting accountants composing the run's
  ``DpEvent``, finished by ``dp_accounting.calibrate_dp_mechanism`` (pld, rdp, continuous noise);
- ``calibrate_by_probes``: ε(σ) from fresh privzo accountants, finished by bisection (pld on a
  grid, numeric), which needs only that ε falls as σ grows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import dp_accounting
import numpy as np
from scipy import optimize, stats

from privzo.privacy.accountants.base import (
    CALIBRATION_RTOL,
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
    Accountant,
    quiet_absl,
    run_event,
)
from privzo.privacy.accountants.pure import pure_laplace_sigma

__all__ = [
    "AccountantEvaluator",
    "EventEvaluator",
    "bracket_sigma",
    "calibrate_by_events",
    "calibrate_by_probes",
    "noise_hint",
]


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
    pure = pure_laplace_sigma(epsilon, sample_rate, steps)
    return float(np.clip(min(clt, pure), MIN_NOISE_MULTIPLIER, 1e3))


class EventEvaluator:
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
        return run_event(self.mechanism, sigma, self.sample_rate, self.steps)

    def accountant(self) -> _MemoizedAccountant:
        return _MemoizedAccountant(self.make_fresh, self.memo)

    def __call__(self, sigma: float) -> float:
        return self.accountant().compose(self.event(sigma)).get_epsilon(self.delta)


def calibrate_by_events(
    fine: EventEvaluator, coarse: EventEvaluator | None, epsilon: float, hint: float
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
    eps_of: EventEvaluator, epsilon: float, guess: float, slope: float, rtol: float
) -> tuple[float, float, float]:
    """(lo, hi, slope): ε(lo) > target ≥ ε(hi), as tight as a few secant probes make it.

    Both engines use it: ``calibrate_by_events`` and ``calibrate_by_probes``.
    """
    lo, hi, slope = _secant_probes(eps_of, epsilon, guess, slope, rtol)
    if lo is None or hi is None:
        start = lo if lo is not None else hi
        assert start is not None  # the first probe always lands on one side
        lo, hi = _expand(eps_of, epsilon, start)
    return lo, hi, slope


def _secant_probes(
    eps_of: EventEvaluator, epsilon: float, guess: float, slope: float, rtol: float, budget: int = 8
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


def _expand(eps_of: EventEvaluator, epsilon: float, start: float) -> tuple[float, float]:
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


def _raise_unattainable(epsilon: float, eps_of: EventEvaluator) -> None:
    raise ValueError(
        f"cannot meet epsilon={epsilon}, delta={eps_of.delta} with {eps_of.steps} steps of the "
        f"{eps_of.mechanism} mechanism at sample_rate={eps_of.sample_rate} (accountant "
        f"{eps_of.label!r}): even noise_multiplier={MAX_NOISE_MULTIPLIER:g} spends more; allow "
        "a larger epsilon or delta, or use fewer steps or a smaller sample_rate"
    )


def _raise_too_loose(epsilon: float, eps_of: EventEvaluator) -> None:
    raise ValueError(
        f"epsilon={epsilon}, delta={eps_of.delta} with {eps_of.steps} steps of the "
        f"{eps_of.mechanism} mechanism at sample_rate={eps_of.sample_rate} is met even at "
        f"noise_multiplier={MIN_NOISE_MULTIPLIER} (accountant {eps_of.label!r}); calibration "
        "does not search lower, where PLD evaluations take minutes: set noise_multiplier "
        "explicitly or tighten the target"
    )
