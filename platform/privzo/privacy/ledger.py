"""A privacy budget that refuses a step before it is taken, not after.

``feasible_epsilon`` (by keywords ``check_feasible``) runs before training starts (does the
whole plan fit?); ``BudgetLedger`` guards each step while it runs, so a resumed or extended run
cannot silently overspend.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from privzo.privacy.accountants import (
    Accountant,
    AccountingQuery,
    check_positive,
    epsilon_of,
    get_accountant,
)
from privzo.privacy.checks import check_count

__all__ = [
    "BUDGET_RTOL",
    "BudgetExceededError",
    "BudgetLedger",
    "check_feasible",
    "feasible_epsilon",
]

# Calibration leaves ε a hair under the target, but the stateful PLD path (cached one-step PLD)
# and dp_accounting's PLDAccountant round differently in the last digits; this absorbs that.
BUDGET_RTOL = 1e-9


class BudgetExceededError(RuntimeError):
    """Taking the requested steps would spend more than the ε budget."""


def _within(epsilon: float, budget: float) -> bool:
    return epsilon <= budget * (1.0 + BUDGET_RTOL)


class BudgetLedger:
    """Guards an accountant with an (ε, δ) budget.

    Each check costs one ε evaluation at the prospective step count, cached by the accountant,
    so ``can_spend(n)`` followed by ``spend(n)`` costs one evaluation. With PLD that is
    0.02-0.5 s at T ≤ 10⁴; to amortise, authorise several steps at once (``spend(10)``
    before running 10 steps).
    """

    def __init__(self, accountant: Accountant, epsilon_budget: float, delta: float) -> None:
        if not isinstance(accountant, Accountant):
            raise ValueError(f"accountant={accountant!r} must be a privzo Accountant")
        self.accountant = accountant
        self.epsilon_budget = check_positive("epsilon_budget", epsilon_budget)
        self.delta = type(accountant).check_delta(delta)
        self.authorized_steps = 0  # ε at this many steps was checked against the budget

    def authorize(self, total_steps: int) -> float:
        """Check once that ``total_steps`` steps in all stay within the budget; returns their ε.

        ε only grows with the step count, so every ``book`` up to ``total_steps`` is then within
        the budget without evaluating ε again: a training loop books its windows without a PLD
        evaluation (slow) on the step's critical path.
        """
        total_steps = check_count("total_steps", total_steps, 1)
        spent = self.accountant.epsilon_at(total_steps, self.delta)
        if not _within(spent, self.epsilon_budget):
            raise BudgetExceededError(
                f"{total_steps} steps would spend epsilon={spent:.6g} > budget "
                f"{self.epsilon_budget:g} at delta={self.delta:g}; no steps were recorded"
            )
        self.authorized_steps = max(self.authorized_steps, total_steps)
        return spent

    def book(self, num_steps: int) -> None:
        """Step the accountant for ``num_steps`` steps about to run: free within the authorized
        steps, checked like ``spend`` past them."""
        num_steps = check_count("num_steps", num_steps, 1)
        if self.accountant.steps + num_steps <= self.authorized_steps:
            self.accountant.step(num_steps)
        else:
            self.spend(num_steps)

    def epsilon_after(self, num_steps: int = 1) -> float:
        """ε if ``num_steps`` more steps were taken (the accountant is not stepped)."""
        num_steps = check_count("num_steps", num_steps, 0)
        return self.accountant.epsilon_at(self.accountant.steps + num_steps, self.delta)

    def can_spend(self, num_steps: int = 1) -> bool:
        """Whether ``num_steps`` more steps keep ε within the budget."""
        check_count("num_steps", num_steps, 1)
        return _within(self.epsilon_after(num_steps), self.epsilon_budget)

    def spend(self, num_steps: int = 1) -> float:
        """Step the accountant and return ε spent; refuses (without stepping) past the budget."""
        num_steps = check_count("num_steps", num_steps, 1)
        after = self.epsilon_after(num_steps)
        if not _within(after, self.epsilon_budget):
            raise BudgetExceededError(
                f"{num_steps} more step(s) after {self.accountant.steps} would spend "
                f"epsilon={after:.6g} > budget {self.epsilon_budget:g} at delta={self.delta:g} "
                f"(accountant {self.accountant.name!r}, noise_multiplier="
                f"{self.accountant.noise_multiplier:g}, sample_rate="
                f"{self.accountant.sample_rate:g}); no steps were recorded"
            )
        self.accountant.step(num_steps)
        return after

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state: the budget, δ, and the accountant's settings and steps booked."""
        return {
            "epsilon_budget": self.epsilon_budget,
            "delta": self.delta,
            "accountant": self.accountant.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take over the steps an earlier attempt booked. Refuses another budget, δ or
        accountant setting: continuing under them would account the run wrongly."""
        for key in ("epsilon_budget", "delta"):
            if state.get(key) != getattr(self, key):
                raise ValueError(
                    f"privacy state has {key}={state.get(key)!r} but this run has "
                    f"{key}={getattr(self, key)!r}; a run resumes only under its own budget"
                )
        self.accountant.load_state_dict(state["accountant"])

    @property
    def epsilon_spent(self) -> float:
        """ε spent by the steps taken so far."""
        return self.accountant.epsilon(self.delta)

    @property
    def remaining(self) -> float:
        """ε budget left (never negative)."""
        return max(0.0, self.epsilon_budget - self.epsilon_spent)

    def __repr__(self) -> str:
        return (
            f"BudgetLedger(epsilon_budget={self.epsilon_budget:g}, delta={self.delta:g}, "
            f"steps={self.accountant.steps}, accountant={self.accountant.name!r})"
        )


def feasible_epsilon(query: AccountingQuery, noise_multiplier: float, epsilon: float) -> float:
    """ε of the planned run; ValueError before any training if it would exceed ``epsilon``."""
    epsilon = check_positive("epsilon", epsilon)
    query = replace(query, delta=get_accountant(query.accountant).check_delta(query.delta))
    spent = epsilon_of(query, noise_multiplier)
    if not _within(spent, epsilon):
        raise ValueError(
            f"{query.steps} steps at noise_multiplier={noise_multiplier:g}, sample_rate="
            f"{query.sample_rate:g} ({query.mechanism} mechanism, accountant "
            f"{query.accountant!r}) spend epsilon={spent:.6g} at delta={query.delta:g}, over the "
            f"budget epsilon={epsilon:g}; use calibrate_noise_multiplier(...) to pick the noise "
            "for this budget, or take fewer steps or a smaller sample_rate"
        )
    return spent


def check_feasible(*, noise_multiplier: float, epsilon: float, **query: Any) -> float:
    """``feasible_epsilon`` by keywords: ``query`` holds ``AccountingQuery``'s fields."""
    return feasible_epsilon(AccountingQuery(**query), noise_multiplier, epsilon)
