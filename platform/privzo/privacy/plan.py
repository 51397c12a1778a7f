"""A run's privacy plan, settled before any compute, and the sampler and ledger it calls for.

Here, in ``privacy/``, because every layout and algorithm draws its batches and books its steps
from the same plan: the single-process run, the Ray Train workers and the baselines alike.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from privzo.config.run import RunConfig
from privzo.privacy.accountants import Accountant, AccountingQuery, calibrate, make_accountant
from privzo.privacy.adjacency import ADD_REMOVE, replace_one
from privzo.privacy.curve import EpsilonCurve
from privzo.privacy.ledger import BudgetLedger, feasible_epsilon
from privzo.privacy.sampling import PoissonSampler, Sampler, ShuffleSampler
from privzo.privacy.truncation import (
    DEFAULT_SHARE,
    MAX_SHARE,
    NON_PRIVATE_EXCEED,
    BatchBound,
    ceil_div,
    default_bound,
    delta_of_exceeding,
    exceed_probability,
    round_up,
)
from privzo.section import ConfigError


@dataclass(frozen=True)
class PrivacyPlan:
    """How a run meets its guarantee; settled before any compute."""

    private: bool
    sample_rate: float
    expected_batch_size: float
    noise_multiplier: float | None = None
    epsilon: float | None = None  # what T steps at this σ spend (≤ the budget)
    delta: float | None = None
    mechanism: str | None = None
    accountant: str | None = None
    noise_parameters: dict[str, Any] | None = None  # lmo's, or {"grid": K} of discrete noise
    # task.pad_to='max_length': the rows each worker's batch is filled to (the whole batch's
    # on one process), and the part of δ that truncating a larger Poisson draw takes
    # (privzo.privacy.truncation)
    max_batch_size: int | None = None
    truncation_delta: float = 0.0
    run_exceed_probability: float = 0.0  # that any share of the T draws exceeds max_batch_size

    @property
    def mechanism_delta(self) -> float | None:
        """The δ the accountant evaluates ε at: the stated δ less what truncation takes."""
        return None if self.delta is None else self.delta - self.truncation_delta


def plan_privacy(config: RunConfig, dataset_size: int) -> PrivacyPlan:
    """Calibrate σ to (ε, δ) for this sampling rate and T, or check a fixed σ meets it."""
    batch_size = config.optimizer.batch_size
    if batch_size > dataset_size:
        raise ConfigError(
            f"optimizer.batch_size={batch_size} exceeds the {dataset_size} training examples; "
            f"allowed: 1..{dataset_size}"
        )
    sample_rate = batch_size / dataset_size
    bound = batch_bound(config, dataset_size, sample_rate)
    if not config.optimizer.is_private:
        return PrivacyPlan(
            private=False,
            sample_rate=sample_rate,
            expected_batch_size=batch_size,
            max_batch_size=bound.rows if bound else None,
        )
    privacy, steps = config.privacy, config.optimizer.steps
    mechanism = config.mechanism
    assert mechanism is not None, "every private algorithm has a mechanism"
    truncation = bound.truncation_delta if bound else 0.0
    query = AccountingQuery(
        sample_rate=sample_rate,
        steps=steps,
        delta=privacy.delta - truncation,
        mechanism=mechanism,
        accountant=privacy.accountant,
        noise_parameters=mechanism_parameters(config),
    )
    noise_multiplier = privacy.noise_multiplier
    try:
        if noise_multiplier is None:
            noise_multiplier = calibrate(query, privacy.epsilon)
        epsilon = feasible_epsilon(query, noise_multiplier, privacy.epsilon)
    except ValueError as error:  # the accountant's reason, reported as a config error
        field = "privacy.noise_multiplier" if privacy.noise_multiplier else "privacy"
        value = f"={privacy.noise_multiplier}" if privacy.noise_multiplier else ""
        raise ConfigError(f"{field}{value}: settings cannot be met: {error}") from None
    return PrivacyPlan(
        private=True,
        sample_rate=sample_rate,
        expected_batch_size=float(batch_size),
        noise_multiplier=noise_multiplier,
        epsilon=epsilon,
        delta=privacy.delta,
        mechanism=config.mechanism,
        accountant=privacy.accountant,
        noise_parameters=mechanism_parameters(config),
        max_batch_size=bound.rows if bound else None,
        truncation_delta=truncation,
        run_exceed_probability=bound.run_exceed_probability if bound else 0.0,
    )


def batch_bound(config: RunConfig, dataset_size: int, sample_rate: float) -> BatchBound | None:
    """The public rows of each worker's padded batch (None unless
    ``task.pad_to='max_length'``), a multiple of the micro-batch so every forward has the same
    shape, and its truncation δ. Each of ``parallel.workers`` workers draws and pads its own
    share, so the bound is a share's (``privzo.privacy.truncation``): a worker's forwards do
    not grow with the worker count.

    Raises ConfigError for a bound whose truncation takes more than half of δ."""
    if config.pad_to != "max_length":
        return None
    optimizer, privacy = config.optimizer, config.privacy
    multiple = optimizer.physical_batch_size or 1
    shares = config.parallel.workers
    if privacy.sampler == "shuffle":  # a worker's strided slice of a fixed-size batch
        return BatchBound(round_up(ceil_div(optimizer.batch_size, shares), multiple), 0.0)
    steps, epsilon = optimizer.steps, privacy.epsilon
    private = optimizer.is_private
    budget = DEFAULT_SHARE * privacy.delta / (1 + math.exp(min(epsilon, 700)))
    exceed_budget = budget if private else NON_PRIVATE_EXCEED
    suggested = default_bound(dataset_size, sample_rate, steps, exceed_budget, multiple, shares)
    rows = round_up(privacy.max_batch_size or suggested, multiple)  # whole micro-batches
    exceed = steps * exceed_probability(dataset_size, sample_rate, rows, shares)
    truncation = delta_of_exceeding(exceed, epsilon)
    if private and truncation > MAX_SHARE * privacy.delta:
        drawn = f"the {dataset_size} examples" if shares == 1 else f"each of {shares} shares"
        raise ConfigError(
            f"privacy.max_batch_size={rows}: a Poisson batch of {drawn} at rate "
            f"{sample_rate:.4g} exceeds it often enough over {steps} steps that truncating "
            f"it would add {truncation:.3g} to delta, more than half of privacy.delta="
            f"{privacy.delta:g}; allowed: "
            f"max_batch_size ≥ {suggested} (the default, null), or task.pad_to='batch'"
        )
    return BatchBound(rows, truncation if private else 0.0, exceed)


def mechanism_parameters(config: RunConfig) -> dict[str, Any] | None:
    """The configured parameters of a parametrised mechanism (lmo's) and the grid of gridded
    scalar noise ({"grid": K}, with ``"directions": J`` for a step of J ≥ 2 directions, whose
    rounded vector the accountants bound); None for continuous noise without parameters."""
    parameters: dict[str, Any] = {}
    if config.mechanism == "lmo":
        parameters |= config.privacy.lmo.model_dump(mode="json")
    if config.noise_grid is not None:
        parameters["grid"] = config.noise_grid
        if config.optimizer.directions_per_step > 1:
            parameters["directions"] = config.optimizer.directions_per_step
    return parameters or None


def make_sampler(config: RunConfig, plan: PrivacyPlan, dataset_size: int) -> Sampler:
    """The single-process sampler of ``privacy.sampler``: Poisson at the plan's rate (secret
    generator), or public seeded shuffling."""
    if config.privacy.sampler == "poisson":
        return PoissonSampler(dataset_size, plan.sample_rate, plan.max_batch_size)
    return ShuffleSampler(dataset_size, config.optimizer.batch_size, seed=config.task.data_seed)


def make_ledger(config: RunConfig, plan: PrivacyPlan) -> BudgetLedger | None:
    """The plan's accountant behind the ε budget (None for a non-private run)."""
    if not plan.private:
        return None
    assert plan.mechanism_delta is not None
    ledger = BudgetLedger(plan_accountant(plan), config.privacy.epsilon, plan.mechanism_delta)
    ledger.authorize(config.optimizer.steps)  # once: windows are then booked without PLD
    return ledger


def plan_accountant(plan: PrivacyPlan) -> Accountant:
    """A fresh accountant of the plan's mechanism, σ and sampling rate, at 0 steps."""
    assert plan.mechanism and plan.accountant and plan.noise_multiplier
    options = {"noise_parameters": plan.noise_parameters} if plan.noise_parameters else {}
    return make_accountant(
        plan.accountant, plan.mechanism, plan.noise_multiplier, plan.sample_rate, **options
    )


def make_epsilon_curve(plan: PrivacyPlan, step_counts: list[int]) -> EpsilonCurve | None:
    """ε after each of ``step_counts`` computed off the training thread (None if non-private)."""
    if not plan.private or not step_counts:
        return None
    assert plan.mechanism_delta is not None
    return EpsilonCurve(lambda: plan_accountant(plan), plan.mechanism_delta, step_counts)


def privacy_record(
    plan: PrivacyPlan, ledger: BudgetLedger | None, *, final: bool = True
) -> dict[str, Any]:
    """What ``privacy.json`` holds: the mechanism, σ, q, the steps accounted, ε spent at δ and
    the ledger's state (budget and accountant settings), from which a resumed run goes on.

    δ is the stated one: the accountant's δ plus what truncating Poisson draws above
    ``max_batch_size`` takes (``privzo.privacy.truncation``).
    ε spent and δ hold under add/remove adjacency given the training set's size N; the
    replace-one pair covers the whole release, N included (``privzo.privacy.adjacency``).
    A run in progress saves it at every window with ``final=False``: ε spent is then left out
    (null), since evaluating it there would put a (slow) PLD evaluation on each window.
    """
    record: dict[str, Any] = {
        "private": plan.private,
        "final": final,
        "sample_rate": plan.sample_rate,
        "expected_batch_size": plan.expected_batch_size,
    }
    if ledger is None:
        return record
    spent = ledger.epsilon_spent if final else None
    delta = ledger.delta + plan.truncation_delta  # ε spent holds at this δ, truncation included
    grouped = replace_one(spent, delta) if spent is not None else None
    return record | {
        "mechanism": plan.mechanism,
        "noise_multiplier": plan.noise_multiplier,
        "noise_parameters": plan.noise_parameters,
        "accountant": plan.accountant,
        "delta": delta,
        "mechanism_delta": ledger.delta,  # what the accountant evaluates ε spent at
        "max_batch_size": plan.max_batch_size,  # each worker's rows with task.pad_to=max_length
        "truncation_delta": plan.truncation_delta,  # δ taken by truncating larger draws
        "epsilon_budget": ledger.epsilon_budget,
        "steps_accounted": ledger.accountant.steps,
        "epsilon_spent": spent,
        "adjacency": ADD_REMOVE,  # what epsilon_spent and delta hold under
        "replace_one_epsilon": grouped.epsilon if grouped else None,  # the whole release
        "replace_one_delta": grouped.delta if grouped else None,
        "ledger": ledger.state_dict(),
    }
