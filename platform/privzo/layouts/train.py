"""The one ``train_and_evaluate``: what a single-process run and every Ray Train rank do.

Evaluate (where the layout says this rank evaluates), train in the one training loop (resuming
where an earlier attempt stopped), evaluate again, save the weights where asked, and on the rank
that reports: run the caller's final scores, build the summary and log its final metrics.

What differs between a single process and a Ray Train worker is passed in, not branched on:

- the **layout** and the rank (``privzo.layouts.layout``): who evaluates, who reports, which
  of the caller's hooks run here, how the weights are saved;
- the **progress store** (``ProgressStore``): where the steps of an unfinished attempt are kept
  after each window and found again (the run directory, ``privzo.rundir.progress``; or Ray
  Train's checkpoints, ``privzo.distributed.worker``);
- the **stepper** (a worker's samples its share of each batch and all-reduces) and the layout's
  own **figures** for the summary (a worker's gather every rank's peak memory and bytes held).

It lives with the layouts, below the run pipeline (``privzo.run``), because the worker
(``privzo.distributed``, this layer) calls it too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from privzo.algorithms.loop import StepperFactory, TrainingLoop, WindowSaver
from privzo.algorithms.registry import make_loop
from privzo.layouts.context import RunContext
from privzo.layouts.layout import Layout
from privzo.memory import PeakMemory
from privzo.rundir.summary import RunSummary, summary_record
from privzo.tasks.evaluation import Evaluation, timed_evaluation, validation_metrics
from privzo.tracking import Tracker
from privzo.tracking.tags import ADAPTER_URI
from privzo.zo.trajectory import TrajectoryRecorder

# One value per run: at step 0 MLflow's chart view draws each final metric as a bar per run, side
# by side (at the last step, as the line chart of one point per run it draws for curves).
FINAL_METRICS_STEP = 0

logger = logging.getLogger(__name__)


class ProgressStore(Protocol):
    """Where a run keeps the steps of an attempt and finds them again on the next one."""

    def before(self, measure: Callable[[], Evaluation | None]) -> tuple[Evaluation | None, bool]:
        """The test metrics before training, and whether they were measured now (an earlier
        attempt's, saved, were logged then)."""

    def restore(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> int:
        """Rebuild an earlier attempt's steps in ``loop`` and ``recorder``; the steps done."""

    def saver(self, tracker: Tracker, before: Evaluation | None) -> WindowSaver:
        """What keeps the steps of this attempt, given to the loop when it is built (it runs
        after each window, before the window's metrics are logged)."""

    def stopped(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        """Training ended, finished or not (a failed run keeps the steps it made)."""


LayoutFigures = Callable[[TrainingLoop], dict[str, Any]]


@dataclass
class Trained:
    """What ``train_and_evaluate`` leaves: the loop and its trajectory on every rank, and the
    summary on the rank that reports (None elsewhere)."""

    loop: TrainingLoop
    recorder: TrajectoryRecorder
    summary: RunSummary | None


def train_and_evaluate(
    context: RunContext,
    tracker: Tracker,
    layout: Layout,
    rank: int,
    progress: ProgressStore,
    *,
    model_dir: Path,
    show_progress: bool = False,
    make_stepper: StepperFactory | None = None,
    figures: LayoutFigures | None = None,
) -> Trained:
    """Evaluate, train, evaluate again and summarise on this rank (see the module docstring).

    ``figures(loop)`` runs on every rank once training and evaluation are done (it may be a
    collective), before the weights are saved; its fields go into the summary.
    """
    config = context.config
    memory = PeakMemory(context.loaded.device)
    evaluates = layout.evaluates(rank)
    evaluate = _evaluator(context, memory)
    started = time.perf_counter()
    before, measured = progress.before(
        lambda: evaluate() if config.eval_before and evaluates else None
    )
    loop = make_loop(context, tracker, memory, make_stepper, progress.saver(tracker, before))
    loop.peak_mb = memory.peak_mb()
    recorder = TrajectoryRecorder(context.trajectory_meta(), release_batch_size=not loop.private)
    start = progress.restore(loop, recorder)
    if before is not None and measured and start == 0:
        tracker.log_metrics({f"test_{name}": value for name, value in before[0].items()}, step=0)
    try:
        loop.run(recorder, show_progress, start=start)
    finally:  # a failed run keeps the steps it made (and a killed one resumes from them)
        progress.stopped(loop, recorder)
    after = evaluate() if evaluates else None
    validation = _validation(context, loop) if evaluates else {}
    layout_figures = figures(loop) if figures is not None else {}
    if config.save_model or not loop.records_trajectory:  # no trajectory: save the weights
        layout.save_whole_model(context, rank, model_dir)
    loop.peak_mb = max(loop.peak_mb, memory.peak_mb())
    summary = None
    if layout.reports(rank):  # its figures (wall time) end before the caller's final scores
        assert after is not None, "the reporting rank evaluates"
        _warn_nonfinite(loop)
        summary = summary_record(context, loop, tracker, before, after, started)
        summary.add({f"validation_{name}": value for name, value in validation.items()})
        summary.add(layout_figures)
        log_adapter_model(context, tracker)  # LoRA / prefix: the adapter as a transformers model
    scores = _final_scores(context)  # on every rank that evaluates (zero3's are collectives)
    if summary is None:
        return Trained(loop, recorder, None)
    summary.add(scores)
    tracker.log_metrics(summary.final_metrics(), step=FINAL_METRICS_STEP)
    return Trained(loop, recorder, summary)


def _evaluator(context: RunContext, memory: PeakMemory) -> Callable[[], Evaluation]:
    """Test metrics and their time (see ``timed_evaluation``)."""
    batch_size = context.config.optimizer.eval_batch_size

    def evaluate() -> Evaluation:
        return timed_evaluation(
            context.task, context.scoring_model, context.test, batch_size, memory
        )

    return evaluate


def _validation(context: RunContext, loop: TrainingLoop) -> dict[str, float]:
    return validation_metrics(
        context.task,
        context.scoring_model,
        context.validation,
        context.config.optimizer.eval_batch_size,
        loop.log_diagnostics,
    )


def _final_scores(context: RunContext) -> dict[str, float]:
    """The caller's extra summary values (a search trial's noised selection score)."""
    hooks = context.hooks
    if hooks is None or hooks.final_scores is None:
        return {}
    return hooks.final_scores(context)


def _warn_nonfinite(loop: TrainingLoop) -> None:
    if loop.nonfinite and loop.log_diagnostics:  # the count is data-dependent: a diagnostic
        logger.warning(
            "%d per-example loss differences were non-finite and counted as 0", loop.nonfinite
        )


ADAPTER_VIEWS = ("lora", "prefix")  # views whose trained tensors are a peft adapter
PIPELINE_TASKS = {"causal": "text-generation", "masked": "fill-mask"}  # by the model's kind


def log_adapter_model(context: RunContext, tracker: Tracker) -> None:
    """A LoRA / prefix run's adapter as the tracker's transformers model, tagged with its URI
    (``tracker.log_adapter_model``): a local base (a directory, built-in models' included) is
    referenced by its path, a hub base by its id and revision. The adapter is the trajectory
    replayed onto public weights, so it releases nothing the trajectory does not."""
    if context.config.model.trainable not in ADAPTER_VIEWS:
        return
    loaded = context.loaded
    base_path = loaded.source if Path(loaded.source).is_dir() else None
    uri = tracker.log_adapter_model(
        context.model, loaded.tokenizer, PIPELINE_TASKS[loaded.kind], base_path
    )
    if uri is not None:
        tracker.set_tags({ADAPTER_URI: uri})
