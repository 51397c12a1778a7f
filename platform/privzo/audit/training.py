"""The audited run: trained with the canaries ``CanaryInjection`` adds to its rows, gone on with
from its trajectory after a stop, or read back once finished; ``TunedLosses`` keeps each
canary's loss under the fine-tuned model, and the run's task to score them again."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from privzo.audit.canaries import CanaryInjection
from privzo.audit.config import AuditConfig
from privzo.audit.draw import DRAW_FILE, CanaryDraw, draw_digest, load_draw, save_draw
from privzo.audit.record import AUDIT_FILE, RUN_DIR
from privzo.audit.scores import canary_losses
from privzo.config.run import RunConfig
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
from privzo.rundir import RunSummary
from privzo.section import ConfigError


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
        """The canaries and reference rows in the run's task, encoded once; the canaries'
        encoding (the first rows)."""
        self.task = context.task
        self.replayed = context.task.encode([*self.injection.canaries, *self.injection.references])
        self.encoded = self.replayed.head(len(self.injection.canaries))
        return self.encoded


@dataclass(frozen=True)
class SavedAudit:
    """The saved draw an unfinished audit goes on with, and whether its run finished (then it
    is scored from that run, nothing trained)."""

    draw: CanaryDraw
    finished: bool


def check_audit_resumes(
    config: RunConfig, audit: AuditConfig, output_dir: Path, overwrite: bool = False
) -> SavedAudit | None:
    """What an unfinished audit in ``output_dir`` goes on with (None: it starts, or starts
    over); refused before anything loads where its run kept steps or finished but the draw is
    missing or another config's."""
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
        return SavedAudit(draw, finished=True)
    if can_resume(config, run_dir):
        steps = unfinished_steps(config, run_dir)
        why = f"going on with the audited run's {steps} released steps"
        return SavedAudit(load_draw(output_dir, draw_digest(config, audit), why), finished=False)
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
    saved = check_audit_resumes(config, audit, output_dir, overwrite)
    injection.saved = None if saved is None else saved.draw
    if saved is not None and saved.finished:
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
