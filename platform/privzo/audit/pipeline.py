"""``privzo audit``: one run with canaries, their scores, the ε lower bound and a verdict.

The run is the ordinary run pipeline (``privzo.run.run``) with two hooks (``training``):
``training_rows`` adds the canaries whose secret coin came up "in" to the private training rows,
and ``final_scores`` measures every canary's loss on the fine-tuned model (and returns nothing to
the summary). The audit then scores the canaries (``scoring``: black-box, and white-box from the
trajectory for zeroth-order runs); ``bounds`` guesses, counts, bounds ε and gives the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np

from privzo.algorithms.registry import get_algorithm
from privzo.audit.bounds import audit_record, guess_and_bound
from privzo.audit.canaries import CanaryInjection, tokenizer_words
from privzo.audit.config import (
    DEFAULT_SCORE,
    DEFAULT_WHITE_BOX_SCORE,
    WHITE_BOX_SCORES,
    AuditConfig,
    ScoreName,
)
from privzo.audit.probe import BaseModelProbe
from privzo.audit.record import AUDIT_FILE, AuditRecord
from privzo.audit.report import plot_scores, record_child_run
from privzo.audit.scoring import PublicNoise, score_canaries
from privzo.audit.training import TunedLosses, train_audited
from privzo.config.run import RunConfig
from privzo.config.tasks import TaskConfig
from privzo.models.loading import (
    load_model,
    load_tokenizer,
    peek_kind,
    position_limit,
    resolve_source,
)
from privzo.rundir import write_json_atomically
from privzo.section import ConfigError
from privzo.tasks import is_generation, resolve_task_config
from privzo.tasks.build import build_task
from privzo.tasks.classification import PromptClassificationTask
from privzo.tracking.tags import AUDIT, PARENT_RUN

VIOLATED_EXIT_CODE = 4


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

    A stopped audit goes on like a run: its run from its own trajectory with the same canaries
    and coins (``privzo.audit.draw``), or, where the run had finished, scored from it;
    ``overwrite`` starts it over with a new draw.

    ``public_noise`` is for auditing a deliberately broken run only (tests): given the number of
    draws and the noise scale σC it regenerates the noise each released value got, as anyone
    can when noise is drawn from a public seed, and the white-box scores read g without it. No
    config or command reaches it."""
    output_dir = Path(output_dir).resolve()
    check_audit(config, audit, output_dir, overwrite)
    scores, note = audit_scores(config, audit)
    started = time.perf_counter()
    probe = _probe(config, cache_dir) if audit.canary_design == "large-gradient" else None
    injection = CanaryInjection(
        audit.canaries, audit.canary_words, _alphabet(config, cache_dir), probe
    )
    tuned = TunedLosses(injection, audit.score_batch_size)
    summary = train_audited(
        config,
        audit,
        output_dir,
        (injection, tuned),
        cache_dir=cache_dir,
        progress=progress,
        overwrite=overwrite,
        tracking_uri=tracking_uri,
        tags={**(tags or {}), AUDIT: "true"},
    )
    values, ratio = score_canaries(
        config, audit, scores, summary, tuned, output_dir, cache_dir, public_noise
    )
    results = guess_and_bound(config, audit, values, injection)
    record = audit_record(config, audit, summary, results, values, injection, note, ratio)
    if config.releases_diagnostics:  # a private run's duration follows its sampled batches
        record.audit_time_s = round(time.perf_counter() - started, 1)
    child_tags = {key: value for key, value in (tags or {}).items() if key != PARENT_RUN}
    write_outputs(config, record, values, injection, output_dir, tracking_uri, child_tags)
    return record


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


def _probe(config: RunConfig, cache_dir: Path) -> Callable[[TaskConfig], BaseModelProbe]:
    """The base model's answers for the large-gradient canaries (loaded when the run asks)."""

    def probe(task_config: TaskConfig) -> BaseModelProbe:
        loaded = load_model(config.model, cache_dir, progress=False)
        limit = position_limit(loaded.model.config, config.model)
        task = build_task(task_config, loaded.tokenizer, loaded.kind, limit)
        assert isinstance(task, PromptClassificationTask), "check_audit refuses generation"
        return BaseModelProbe(loaded.model, task)

    return probe
