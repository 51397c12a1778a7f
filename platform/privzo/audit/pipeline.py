"""``privzo audit``: one run with canaries, their scores, the ε lower bound and a verdict.

The run is the ordinary run pipeline (``privzo.run.run``) with two hooks: ``training_rows`` adds
the canaries whose secret coin came up "in" to the private training rows, and ``final_scores``
measures every canary's loss on the fine-tuned model (and returns nothing to the summary). The
audit then scores the canaries (black-box, and white-box from the trajectory for zeroth-order
runs), guesses, counts and bounds ε with ``privzo.privacy.audit``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from privzo.algorithms.registry import get_algorithm
from privzo.audit.canaries import CanaryInjection, tokenizer_words
from privzo.audit.config import (
    DEFAULT_SCORE,
    DEFAULT_WHITE_BOX_SCORE,
    WHITE_BOX_SCORES,
    AuditConfig,
    ScoreName,
)
from privzo.audit.power import UNBOUNDED_SCORES, AuditPower, audit_power
from privzo.audit.record import (
    ESTIMATOR_KINDS,
    VIOLATED,
    AuditRecord,
    BestGuess,
    EstimatorResult,
)
from privzo.audit.report import plot_scores, record_child_run, score_distribution
from privzo.audit.scores import (
    WhiteBoxTrace,
    canary_losses,
    centre_by_label,
    correlation_scores,
    data_directions,
    directional_scores,
    likelihood_scores,
    match_scores,
    replay_differences,
    without_noise,
)
from privzo.config.run import RunConfig
from privzo.config.tasks import TaskConfig
from privzo.models.loading import load_model, load_tokenizer, peek_kind, resolve_source
from privzo.privacy.audit import BOUNDS, GuessResult, TprAtFpr, audit_guesses, tpr_at_fpr
from privzo.run import RunContext, RunHooks, run
from privzo.rundir import TRAJECTORY_FILE, RunSummary, write_json_atomically
from privzo.section import ConfigError
from privzo.tasks import is_generation, resolve_task_config
from privzo.tracking.tags import AUDIT

AUDIT_FILE = "audit.json"
RUN_DIR = "run"
VIOLATED_EXIT_CODE = 4
# A match is exact or not whatever the canary's label: standardising per label would only mix
# the two labels' exact matches with the other label's near misses.
UNCENTRED_SCORES = ("white-box-match",)
PARENT_TAG = "mlflow.parentRunId"  # the child's parent is the audited run, not the caller's
# (draws, noise scale σC) → the noise a broken run added, regenerated from its seed: one draw per
# released value (K a step with K directions), in the order drawn
PublicNoise = Callable[[int, float], np.ndarray]


def audit_scores(config: RunConfig, audit: AuditConfig) -> tuple[list[ScoreName], str | None]:
    """The scores to use, and a note when the algorithm allows only the black-box one."""
    algorithm = get_algorithm(config.optimizer.algorithm)
    white_box = algorithm.writes_trajectory  # a trajectory of seeds and scalars to replay
    if audit.scores is not None:
        wanted = [name for name in audit.scores if name in WHITE_BOX_SCORES]
        if wanted and not white_box:
            raise ConfigError(
                f"scores={wanted}: optimizer.algorithm={config.optimizer.algorithm!r} writes no "
                "trajectory to replay; audit it with the black-box score"
            )
        return list(dict.fromkeys(audit.scores)), None
    if white_box:
        return [DEFAULT_WHITE_BOX_SCORE], None
    kind = "first-order" if algorithm.family == "first-order" else "vector"
    note = (
        f"{config.optimizer.algorithm} is a {kind} algorithm: no trajectory of seeds and "
        "scalars to replay, so it is audited black-box only (loss under the base model minus "
        "under the fine-tuned one)"
    )
    return [DEFAULT_SCORE], note


def check_audit(config: RunConfig, audit: AuditConfig, output_dir: Path, overwrite: bool) -> None:
    """Everything the audit can refuse before the run loads data or a model."""
    if config.parallel.strategy != "single":
        raise ConfigError(
            f"parallel.strategy={config.parallel.strategy!r}: the audit adds canaries to the "
            "data and scores them in this process; allowed: 'single'"
        )
    if is_generation(resolve_task_config(config.task, peek_kind(config.model))):
        raise ConfigError(
            f"task.name={config.task.name!r} generates answers; the audit's canaries are "
            "mislabelled classification records: use a classification task"
        )
    too_large = [k for k in audit.k_values() if 2 * k > audit.canaries]
    if too_large:
        raise ConfigError(
            f"ks={too_large}: each k guesses k canaries 'in' and k 'out', so 2k ≤ canaries="
            f"{audit.canaries}"
        )
    audit_scores(config, audit)
    if (output_dir / AUDIT_FILE).exists() and not overwrite:
        raise ConfigError(f"{output_dir / AUDIT_FILE} exists; pass --overwrite to replace it")


@dataclass
class TunedLosses:
    """The run's ``final_scores`` hook: each canary's loss under the fine-tuned model; it also
    keeps the run's task to encode and score the canaries again."""

    injection: CanaryInjection
    batch_size: int
    task: Any = None
    encoded: Any = None
    replayed: Any = None  # the canaries, then the reference rows: what the replay scores
    losses: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __call__(self, context: RunContext) -> dict[str, float]:
        self.task = context.task
        self.encoded = context.task.encode(self.injection.canaries)
        self.replayed = context.task.encode([*self.injection.canaries, *self.injection.references])
        self.losses = canary_losses(
            context.task, context.scoring_model, self.encoded, self.batch_size
        )
        return {}  # nothing about the canaries goes into the run's summary


def run_audit(
    config: RunConfig,
    audit: AuditConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    overwrite: bool = False,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    public_noise: PublicNoise | None = None,
) -> AuditRecord:
    """Train once with canaries, score, guess and bound ε; writes ``DIR/audit.json`` and an
    MLflow child of the audited run. Returns the audit record. ``tags`` go on the audited run
    (a study's: its parent run, study and cell) and, but for its parent, on the child.

    ``public_noise`` is for auditing a deliberately broken run only (tests): given the number of
    draws and the noise scale σC it regenerates the noise each released value got, as anyone
    can when noise is drawn from a public seed, and the white-box scores read g without it. No
    config or command reaches it."""
    output_dir = Path(output_dir).resolve()
    check_audit(config, audit, output_dir, overwrite)
    scores, note = audit_scores(config, audit)
    started = time.perf_counter()
    injection = CanaryInjection(audit.canaries, audit.canary_words, _alphabet(config, cache_dir))
    tuned = TunedLosses(injection, audit.score_batch_size)
    summary = run(
        config,
        output_dir / RUN_DIR,
        cache_dir=cache_dir,
        progress=progress,
        overwrite=overwrite,
        tracking_root=output_dir,
        tracking_uri=tracking_uri,
        tags={**(tags or {}), AUDIT: "true"},
        hooks=RunHooks(training_rows=injection, final_scores=tuned),
    )
    values = score_canaries(
        config, audit, scores, summary, tuned, output_dir, cache_dir, public_noise
    )
    results = guess_and_bound(config, audit, values, injection)
    record = audit_record(config, audit, summary, results, values, injection, note)
    if config.releases_diagnostics:  # a private run's duration follows its sampled batches
        record.audit_time_s = round(time.perf_counter() - started, 1)
    child_tags = {key: value for key, value in (tags or {}).items() if key != PARENT_TAG}
    write_outputs(config, record, values, injection, output_dir, tracking_uri, child_tags)
    return record


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
            delta=_audit_delta(config),
            alpha=audit.alpha / len(values),
        )
        for name, scores in values.items()
    }


def write_outputs(
    config: RunConfig,
    record: AuditRecord,
    values: dict[ScoreName, np.ndarray],
    injection: CanaryInjection,
    output_dir: Path,
    tracking_uri: str | None,
    tags: Mapping[str, str] | None = None,
) -> None:
    """audit.json, the scores' plot and the MLflow child run (whose id audit.json then gets)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomically(output_dir / AUDIT_FILE, record.to_dict())
    plot = plot_scores(values, injection.included, output_dir / "audit_scores.png")
    artifacts = [output_dir / AUDIT_FILE, plot]
    child = record_child_run(config, record.to_dict(), artifacts, output_dir, tracking_uri, tags)
    record.tracking_run_id, record.child_recorded = child, True
    write_json_atomically(output_dir / AUDIT_FILE, record.to_dict())


def _alphabet(config: RunConfig, cache_dir: Path) -> Callable[[TaskConfig], list[str]]:
    """The canaries' words: the model tokenizer's (loaded when the run asks, after the data and
    the canary count have passed their checks)."""

    def words(task: TaskConfig) -> list[str]:
        source = resolve_source(config.model, cache_dir, progress=False)
        tokenizer = load_tokenizer(config.model, source)
        return tokenizer_words(tokenizer, task.label_words or [])

    return words


def _audit_delta(config: RunConfig) -> float:
    """The δ the bound is computed at: the run's (a non-private run's config still names one)."""
    return config.privacy.delta


def score_canaries(
    config: RunConfig,
    audit: AuditConfig,
    scores: list[ScoreName],
    summary: RunSummary,
    tuned: TunedLosses,
    output_dir: Path,
    cache_dir: Path,
    public_noise: PublicNoise | None = None,
) -> dict[ScoreName, np.ndarray]:
    """Every requested score of every canary (in canary order)."""
    base = load_model(config.model, cache_dir, progress=False)
    base_losses = canary_losses(tuned.task, base.model, tuned.encoded, audit.score_batch_size)
    values: dict[ScoreName, np.ndarray] = {"black-box": base_losses - tuned.losses}
    if any(name in WHITE_BOX_SCORES for name in scores):
        trace = replay_differences(
            config.model.name_or_path,
            output_dir / RUN_DIR / TRAJECTORY_FILE,
            tuned.task,
            tuned.replayed,
            clip=config.privacy.clip if summary.private else None,
            batch_size=audit.score_batch_size,
            cache_dir=cache_dir,
        )
        trace, data = split_references(trace, tuned)
        batch = config.optimizer.batch_size
        if public_noise is not None and summary.noise_multiplier is not None:
            scale = summary.noise_multiplier * config.privacy.clip
            draws = public_noise(summary.steps * trace.directions, scale)
            trace = without_noise(trace, draws, batch)
        values["white-box-directional"] = directional_scores(trace, tuned.injection.labels, data)
        values["white-box-correlation"] = correlation_scores(trace)
        values["white-box-likelihood"] = likelihood_scores(trace, batch, summary.sample_rate)
        values["white-box-match"] = match_scores(trace, batch)
    labels = tuned.injection.labels
    return {
        name: values[name] if name in UNCENTRED_SCORES else centre_by_label(values[name], labels)
        for name in scores
    }


def split_references(trace: WhiteBoxTrace, tuned: TunedLosses) -> tuple[WhiteBoxTrace, np.ndarray]:
    """The canaries' trace and the data's shared directions from the reference rows' columns."""
    count = len(tuned.injection.canaries)
    references = trace.differences[:, count:]
    canaries = replace(trace, differences=trace.differences[:, :count])
    if references.shape[1] == 0:
        return canaries, np.zeros((references.shape[0], 0))
    labels = np.asarray(tuned.replayed.labels)[count:]
    return canaries, data_directions(references, labels)


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
            value, injection.included, audit.fpr, delta=_audit_delta(config), alpha=audit.alpha
        )
        for key, value in values.items()
    }
    estimators = estimator_results(results, rates)
    return AuditRecord(
        verdict=verdict(claimed, best.epsilon_lower_bound),
        epsilon_claimed=claimed,
        epsilon_lower_bound=best.epsilon_lower_bound,
        tightness=best.epsilon_lower_bound / claimed if claimed else None,
        delta=_audit_delta(config),
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
        tightest=max(estimators, key=lambda row: row.epsilon).estimator,
        tpr_at_fpr=rates,
        run_dir=RUN_DIR,
        power=power_at(config, audit, summary, injection, list(results)),
    )


def power_at(
    config: RunConfig,
    audit: AuditConfig,
    summary: RunSummary,
    injection: CanaryInjection,
    scores: list[ScoreName],
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
        delta=_audit_delta(config),
        alpha=audit.alpha / len(scores),
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
