"""From the canaries' scores to the audit's record: every (score, k) guess and its ε bounds,
each estimator's largest ε, the separation ceiling, and the verdict against the claimed ε.

Pure statistics over the scores and the coins (``privzo.privacy.audit``): no model, no file.
"""

from __future__ import annotations

import numpy as np

from privzo.audit.canaries import CanaryInjection
from privzo.audit.config import WHITE_BOX_SCORES, AuditConfig, ScoreName
from privzo.audit.power import UNBOUNDED_SCORES, AuditPower, audit_power
from privzo.audit.record import (
    ESTIMATOR_KINDS,
    RUN_DIR,
    VIOLATED,
    AuditRecord,
    BestGuess,
    EstimatorResult,
)
from privzo.audit.report import score_distribution
from privzo.config.run import RunConfig
from privzo.privacy.audit import BOUNDS, GuessResult, TprAtFpr, audit_guesses, tpr_at_fpr
from privzo.rundir import RunSummary

__all__ = ["audit_delta", "audit_record", "guess_and_bound", "verdict"]


def guess_and_bound(
    config: RunConfig,
    audit: AuditConfig,
    values: dict[ScoreName, np.ndarray],
    injection: CanaryInjection,
) -> dict[ScoreName, list[GuessResult]]:
    """Every (score, k) test at α / (scores × ks): the best bound holds at confidence 1 − α."""
    return {
        name: audit_guesses(
            scores,
            injection.included,
            audit.k_values(),
            delta=audit_delta(config),
            alpha=audit.alpha / len(values),
        )
        for name, scores in values.items()
    }


def audit_delta(config: RunConfig) -> float:
    """The δ the bound is computed at: the run's (a non-private run's config still names one)."""
    return config.privacy.delta


def verdict(claimed: float | None, bound: float) -> str:
    """'VIOLATED' when the audit proves more leakage than the accountant claims."""
    if claimed is None:
        return "not private"
    return VIOLATED if bound > claimed else "consistent"


def audit_record(
    config: RunConfig,
    audit: AuditConfig,
    summary: RunSummary,
    results: dict[ScoreName, list[GuessResult]],
    values: dict[ScoreName, np.ndarray],
    injection: CanaryInjection,
    note: str | None,
    ratio: float | None = None,
) -> AuditRecord:
    """audit.json: counts, bounds and score distributions; no canary and no coin."""
    name, best = max(
        ((name, result) for name, rows in results.items() for result in rows),
        key=lambda pair: pair[1].epsilon_lower_bound,
    )
    claimed = summary.epsilon if summary.private else None
    tests = len(results) * len(audit.k_values()) * len(BOUNDS)
    rates: dict[str, TprAtFpr] = {
        key: tpr_at_fpr(
            value, injection.included, audit.fpr, delta=audit_delta(config), alpha=audit.alpha
        )
        for key, value in values.items()
    }
    estimators = estimator_results(results, rates)
    return AuditRecord(
        verdict=verdict(claimed, best.epsilon_lower_bound),
        epsilon_claimed=claimed,
        epsilon_lower_bound=best.epsilon_lower_bound,
        tightness=best.epsilon_lower_bound / claimed if claimed else None,
        delta=audit_delta(config),
        alpha=audit.alpha,
        canaries=audit.canaries,
        canaries_in=int(injection.included.sum()),
        training_rows=injection.training_rows,
        best=BestGuess.of(name, best),
        tests=tests,
        bonferroni_level=audit.alpha / tests,
        results={name: rows for name, rows in results.items()},
        score_distributions={
            key: score_distribution(value, injection.included) for key, value in values.items()
        },
        white_box=any(key in WHITE_BOX_SCORES for key in results),
        note=note,
        algorithm=config.optimizer.algorithm,
        model=config.model.name_or_path,
        steps=summary.steps,
        noise_multiplier=summary.noise_multiplier,
        sample_rate=summary.sample_rate,
        audited_run_id=summary.tracking_run_id,
        estimators=estimators,
        tightest=tightest_bound(estimators),
        tpr_at_fpr=rates,
        run_dir=RUN_DIR,
        power=power_at(config, audit, summary, injection, list(results), ratio),
    )


def tightest_bound(estimators: list[EstimatorResult]) -> str:
    """The estimator with the largest ε among the bounds: the TPR reading is an estimate, so it
    is printed beside them but never named the tightest."""
    bounds = [row for row in estimators if row.kind.startswith("bound")]
    return max(bounds, key=lambda row: row.epsilon).estimator


def power_at(
    config: RunConfig,
    audit: AuditConfig,
    summary: RunSummary,
    injection: CanaryInjection,
    scores: list[ScoreName],
    ratio: float | None = None,
) -> AuditPower | None:
    """The run's separation ceiling and the ε_lb expected there, when some score is bound by it."""
    if all(name in UNBOUNDED_SCORES for name in scores):
        return None
    return audit_power(
        steps=summary.steps,
        directions=config.optimizer.directions_per_step,
        batch_size=config.optimizer.batch_size,
        training_rows=injection.training_rows,
        canaries_in=int(injection.included.sum()),
        canaries=audit.canaries,
        ks=audit.k_values(),
        delta=audit_delta(config),
        alpha=audit.alpha / len(scores),
        gradient_ratio=ratio,
    )


def estimator_results(
    results: dict[ScoreName, list[GuessResult]], rates: dict[str, TprAtFpr]
) -> list[EstimatorResult]:
    """Each estimator's largest ε over the scores (and k), in ``ESTIMATOR_KINDS`` order."""
    tests = [(name, row) for name, rows in results.items() for row in rows]
    one_run = max(tests, key=lambda pair: pair[1].epsilon_lower_bound)
    fdp = max(tests, key=lambda pair: pair[1].fdp_epsilon_lower_bound)
    rate = max(rates.items(), key=lambda pair: pair[1].epsilon_estimate)
    found = {
        "one-run": (one_run[1].epsilon_lower_bound, one_run[0], one_run[1].k),
        "one-run-f-dp-gaussian": (fdp[1].fdp_epsilon_lower_bound, fdp[0], fdp[1].k),
        "tpr-at-fpr": (rate[1].epsilon_estimate, rate[0], None),
    }
    return [
        EstimatorResult(estimator, epsilon, ESTIMATOR_KINDS[estimator], score, k)
        for estimator, (epsilon, score, k) in found.items()
    ]
