"""Training and evaluating a single-process run, with its resume point saved on disk."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from privzo.algorithms.loop import TrainingLoop
from privzo.algorithms.registry import make_loop
from privzo.config import ConfigError
from privzo.layouts.context import RunContext
from privzo.layouts.record import (
    MODEL_DIR,
    PRIVACY_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    summary_record,
)
from privzo.layouts.resume import (
    ResumePoint,
    clear_resume_point,
    save_progress,
    write_json_atomically,
)
from privzo.memory import PeakMemory
from privzo.models.loading import save_weights
from privzo.privacy.plan import privacy_record
from privzo.tasks.evaluation import Evaluation, timed_evaluation, validation_metrics
from privzo.tracking import Tracker
from privzo.zo.integrity import check_fingerprint
from privzo.zo.trajectory import TrajectoryRecorder, read_trajectory, trajectory_meta

logger = logging.getLogger(__name__)


def train_and_evaluate(
    context: RunContext,
    tracker: Tracker,
    output_dir: Path,
    progress: bool,
    resume: ResumePoint | None = None,
) -> dict[str, Any]:
    config = context.config
    memory = PeakMemory(context.loaded.device)
    evaluate = _evaluator(context, memory)
    started = time.perf_counter()
    before = _before(context, tracker, evaluate, resume)
    loop = make_loop(context, tracker, memory)
    loop.peak_mb = memory.peak_mb()
    recorder = TrajectoryRecorder(
        trajectory_meta(
            config,
            context.loaded.device.type,
            context.perturber,
            context.base_fingerprint,
            context.loaded.revision,
        ),
        release_batch_size=not loop.private,
    )
    start = _restore(context, loop, recorder, output_dir) if resume is not None else 0
    if loop.records_trajectory:  # every window's rows and resume point, before its metrics
        point = ResumePoint(tracker.run_id, before)
        save, loop.on_window = _progress_saver(output_dir, recorder, point, loop)
        save()  # resumable from the first step on
    try:
        loop.run(recorder, progress, start=start)
    finally:  # a failed run keeps the steps it made (and a killed one resumes from them)
        if loop.records_trajectory:
            recorder.write(output_dir / TRAJECTORY_FILE)
    after = evaluate()
    validation = validation_metrics(
        context.task,
        context.scoring_model,
        context.validation,
        config.optimizer.eval_batch_size,
        loop.log_diagnostics,
    )
    if loop.nonfinite and loop.log_diagnostics:  # the count is data-dependent: a diagnostic
        logger.warning(
            "%d per-example loss differences were non-finite and counted as 0", loop.nonfinite
        )
    if config.save_model or not loop.records_trajectory:  # no trajectory: save the weights
        save_weights(context.model, context.loaded.tokenizer, output_dir / MODEL_DIR)
    loop.peak_mb = max(loop.peak_mb, memory.peak_mb())
    summary = summary_record(context, loop, tracker, before, after, started)
    summary.add({f"validation_{name}": value for name, value in validation.items()})
    if context.hooks is not None and context.hooks.final_scores is not None:
        summary.add(context.hooks.final_scores(context))
    tracker.log_metrics(summary.final_metrics(), step=config.optimizer.steps)
    write_json_atomically(output_dir / PRIVACY_FILE, privacy_record(context.plan, loop.ledger))
    record = summary.to_dict()
    (output_dir / SUMMARY_FILE).write_text(json.dumps(record, indent=2) + "\n")
    clear_resume_point(output_dir)  # finished: nothing to resume
    return record


def _before(
    context: RunContext,
    tracker: Tracker,
    evaluate: Callable[[], Evaluation],
    resume: ResumePoint | None,
) -> Evaluation | None:
    """Test metrics before training: measured and logged at step 0, or an earlier attempt's."""
    if resume is not None:
        return resume.before
    before = evaluate() if context.config.eval_before else None
    if before is not None:
        tracker.log_metrics({f"test_{name}": value for name, value in before[0].items()}, step=0)
    return before


def _restore(
    context: RunContext, loop: TrainingLoop, recorder: TrajectoryRecorder, output_dir: Path
) -> int:
    """Rebuild an earlier attempt's state from its trajectory (checked: rows and base) and
    its privacy state (checked: the same budget and accountant settings)."""
    table, meta = read_trajectory(output_dir / TRAJECTORY_FILE)
    if meta.base_fingerprint is not None and context.base_fingerprint is not None:
        check_fingerprint(meta.base_fingerprint, context.base_fingerprint, str(output_dir))
    privacy = output_dir / PRIVACY_FILE
    saved = json.loads(privacy.read_text()) if privacy.is_file() else {}
    try:
        done = loop.restore(recorder, table, meta, ledger_state=saved.get("ledger"))
    except ValueError as error:
        raise ConfigError(f"cannot resume the run in {str(output_dir)!r}: {error}") from None
    logger.warning("replayed %d steps; training goes on from step %d", done, done)
    return done


def _progress_saver(
    output_dir: Path, recorder: TrajectoryRecorder, point: ResumePoint, loop: TrainingLoop
) -> tuple[Callable[[], None], Callable[[int, dict[str, float]], None]]:
    """``save()`` writes the rows so far, the privacy state and the resume point; the window
    callback saves, then calls the loop's own ``on_window``."""
    inner = loop.on_window

    def save() -> None:
        privacy = privacy_record(loop.context.plan, loop.ledger, final=False)
        save_progress(output_dir, recorder, point, (TRAJECTORY_FILE, PRIVACY_FILE), privacy)

    def on_window(steps_done: int, metrics: dict[str, float]) -> None:
        save()
        if inner is not None:
            inner(steps_done, metrics)

    return save, on_window


def _evaluator(context: RunContext, memory: PeakMemory) -> Callable[[], Evaluation]:
    """Test metrics and their time (see ``timed_evaluation``)."""
    batch_size = context.config.optimizer.eval_batch_size

    def evaluate() -> Evaluation:
        return timed_evaluation(
            context.task, context.scoring_model, context.test, batch_size, memory
        )

    return evaluate
