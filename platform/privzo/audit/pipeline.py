"""``privzo audit``: one run with canaries, their scores, the ε lower bound and a verdict.

The run is the ordinary run pipeline (``privzo.run.run``) with two hooks: ``training_rows`` adds
the canaries whose secret coin came up "in" to the private training rows, and ``final_scores``
measures every canary's loss on the fine-tuned model (and returns nothing to the summary). The
audit then scores the canaries (black-box, and white-box from the trajectory for zeroth-order
runs); ``bounds`` guesses, counts, bounds ε and gives the verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

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
from privzo.audit.draw import DRAW_FILE, CanaryDraw, draw_digest, load_draw, save_draw
from privzo.audit.probe import BaseModelProbe
from privzo.audit.record import RUN_DIR, AuditRecord
from privzo.audit.report import plot_scores, record_child_run
from privzo.audit.scores import (
    WhiteBoxTrace,
    canary_losses,
    centre_by_label,
    correlation_scores,
    data_directions,
    directional_scores,
    gradient_ratio,
    likelihood_scores,
    match_scores,
    replay_differences,
    without_noise,
)
from privzo.config.run import RunConfig
from privzo.config.tasks import TaskConfig
from privzo.models.loading import (
    load_model,
    load_tokenizer,
    peek_kind,
    position_limit,
    resolve_source,
)
from privzo.run import (
    RunContext,
    RunHooks,
    build_context,
    can_resume,
    finished,
    finished_run,
    run,
    starts_over,
    unfinished_steps,
)
from privzo.rundir import TRAJECTORY_FILE, RunSummary, write_json_atomically
from privzo.section import ConfigError
from privzo.tasks import is_generation, resolve_task_config
from privzo.tasks.build import build_task
from privzo.tasks.classification import PromptClassificationTask
from privzo.tracking.tags import AUDIT

AUDIT_FILE = "audit.json"
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
    """The run's ``final_scores`` hook: each canary's loss under the fine-tuned model (kept by
    ``keep`` before the run's summary is written); it also keeps the run's task to encode and
    score the canaries again."""

    injection: CanaryInjection
    batch_size: int
    keep: Callable[[np.ndarray], None] | None = None
    task: Any = None
    encoded: Any = None
    replayed: Any = None  # the canaries, then the reference rows: what the replay scores
    losses: np.ndarray = field(default_factory=lambda: np.zeros(0))

    def __call__(self, context: RunContext) -> dict[str, float]:
        losses = canary_losses(
            context.task, context.scoring_model, self.encode(context), self.batch_size
        )
        if self.keep is not None:
            self.keep(losses)
        self.losses = losses
        return {}  # nothing about the canaries goes into the run's summary

    def encode(self, context: RunContext) -> Any:
        """The canaries and reference rows in the run's task; the canaries' encoding."""
        self.task = context.task
        self.encoded = context.task.encode(self.injection.canaries)
        self.replayed = context.task.encode([*self.injection.canaries, *self.injection.references])
        return self.encoded


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
    child_tags = {key: value for key, value in (tags or {}).items() if key != PARENT_TAG}
    write_outputs(config, record, values, injection, output_dir, tracking_uri, child_tags)
    return record


def check_audit_resumes(
    config: RunConfig, audit: AuditConfig, output_dir: Path, overwrite: bool = False
) -> CanaryDraw | None:
    """The saved draw an unfinished audit in ``output_dir`` goes on with (None: it starts, or
    starts over); refused before anything loads where its run kept steps or finished but the
    draw is missing or another config's."""
    run_dir = Path(output_dir) / RUN_DIR
    if overwrite:
        return None
    if finished(run_dir, config) is not None:
        draw = load_draw(output_dir, draw_digest(config, audit), "scoring its finished run")
        if draw.tuned_losses is None:
            raise ConfigError(
                f"{str(Path(output_dir) / DRAW_FILE)!r} holds no losses of the fine-tuned "
                f"model, though the run in {str(run_dir)!r} finished: privzo did not leave it "
                "this way; audit again with --overwrite (a new run)"
            )
        return draw
    if can_resume(config, run_dir):
        steps = unfinished_steps(config, run_dir)
        why = f"going on with the audited run's {steps} released steps"
        return load_draw(output_dir, draw_digest(config, audit), why)
    return None


def train_audited(
    config: RunConfig,
    audit: AuditConfig,
    output_dir: Path,
    hooks: tuple[CanaryInjection, TunedLosses],
    *,
    cache_dir: Path,
    progress: bool,
    overwrite: bool,
    tracking_uri: str | None,
    tags: dict[str, str],
) -> RunSummary:
    """The audited run's summary, the canaries' tuned losses in ``hooks``: a new run, the
    stopped one gone on with, or the finished one (its tracking run ended if a kill left it
    open) with its draw read back."""
    injection, tuned = hooks
    run_dir, digest = output_dir / RUN_DIR, draw_digest(config, audit)
    injection.saved = check_audit_resumes(config, audit, output_dir, overwrite)
    if injection.saved is not None and finished(run_dir, config) is not None:
        return _finished_audited(config, output_dir, hooks, cache_dir, tracking_uri)

    def keep_draw(draw: CanaryDraw) -> None:
        # a new draw trains a new run: an earlier audit's record (--overwrite) no longer
        # describes this directory, and a stop from here on must not leave it looking finished
        (output_dir / AUDIT_FILE).unlink(missing_ok=True)
        save_draw(output_dir, digest, draw)

    injection.keep = keep_draw

    def keep_losses(losses: np.ndarray) -> None:
        assert injection.draw is not None, "the canaries were drawn before the run trained"
        save_draw(output_dir, digest, replace(injection.draw, tuned_losses=losses))

    tuned.keep = keep_losses
    return run(
        config,
        run_dir,
        cache_dir=cache_dir,
        progress=progress,
        # a stopped run goes on from its trajectory; one that cannot (first-order) starts over
        overwrite=overwrite or starts_over(config, run_dir),
        tracking_root=output_dir,
        tracking_uri=tracking_uri,
        tags=tags,
        hooks=RunHooks(training_rows=injection, final_scores=tuned),
    )


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


def _finished_audited(
    config: RunConfig,
    output_dir: Path,
    hooks: tuple[CanaryInjection, TunedLosses],
    cache_dir: Path,
    tracking_uri: str | None,
) -> RunSummary:
    """The finished audited run's summary (its tracking run ended if a kill left it open), and
    its task and the saved tuned losses in ``hooks``: what scoring needs, nothing trained."""
    injection, tuned = hooks
    assert injection.saved is not None and injection.saved.tuned_losses is not None
    done = finished_run(
        config,
        output_dir / RUN_DIR,
        cache_dir=cache_dir,
        tracking_root=output_dir,
        tracking_uri=tracking_uri,
    )
    assert done is not None, "check_audit_resumes found it finished"
    tuned.encode(build_context(config, cache_dir, False, RunHooks(training_rows=injection)))
    tuned.losses = injection.saved.tuned_losses
    return done


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


def score_canaries(
    config: RunConfig,
    audit: AuditConfig,
    scores: list[ScoreName],
    summary: RunSummary,
    tuned: TunedLosses,
    output_dir: Path,
    cache_dir: Path,
    public_noise: PublicNoise | None = None,
) -> tuple[dict[ScoreName, np.ndarray], float | None]:
    """Every requested score of every canary (in canary order), and the canaries' gradient
    ratio ρ to the reference rows measured in the replay (None without one)."""
    base = load_model(config.model, cache_dir, progress=False)
    base_losses = canary_losses(tuned.task, base.model, tuned.encoded, audit.score_batch_size)
    values: dict[ScoreName, np.ndarray] = {"black-box": base_losses - tuned.losses}
    ratio = None
    if any(name in WHITE_BOX_SCORES for name in scores):
        clip = config.privacy.clip if summary.private else None
        trace = replay_differences(
            config.model.name_or_path,
            output_dir / RUN_DIR / TRAJECTORY_FILE,
            tuned.task,
            tuned.replayed,
            clip=clip,
            batch_size=audit.score_batch_size,
            cache_dir=cache_dir,
        )
        ratio = replay_gradient_ratio(trace, tuned)
        trace, data = split_references(trace, tuned)
        batch = config.optimizer.batch_size
        if public_noise is not None and summary.noise_multiplier is not None:
            scale = summary.noise_multiplier * config.privacy.clip
            draws = public_noise(summary.steps * trace.directions, scale)
            trace = without_noise(trace, draws, batch)
        values["white-box-directional"] = directional_scores(trace, tuned.injection.labels, data)
        values["white-box-correlation"] = correlation_scores(trace)
        values["white-box-likelihood"] = likelihood_scores(trace, batch, summary.sample_rate)
        values["white-box-match"] = match_scores(trace, batch, clip)
    labels = tuned.injection.labels
    return {
        name: values[name] if name in UNCENTRED_SCORES else centre_by_label(values[name], labels)
        for name in scores
    }, ratio


def replay_gradient_ratio(trace: WhiteBoxTrace, tuned: TunedLosses) -> float | None:
    """ρ of the replayed canaries against the replayed reference rows (``gradient_ratio``)."""
    count = len(tuned.injection.canaries)
    return gradient_ratio(
        trace.differences[:, :count],
        tuned.injection.labels,
        trace.differences[:, count:],
        np.asarray(tuned.replayed.labels)[count:],
    )


def split_references(trace: WhiteBoxTrace, tuned: TunedLosses) -> tuple[WhiteBoxTrace, np.ndarray]:
    """The canaries' trace and the data's shared directions from the reference rows' columns."""
    count = len(tuned.injection.canaries)
    references = trace.differences[:, count:]
    canaries = replace(trace, differences=trace.differences[:, :count])
    if references.shape[1] == 0:
        return canaries, np.zeros((references.shape[0], 0))
    labels = np.asarray(tuned.replayed.labels)[count:]
    return canaries, data_directions(references, labels)
