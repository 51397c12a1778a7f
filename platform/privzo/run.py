"""One fine-tuning run, end to end: validate → plan privacy → load → train → evaluate → record.

Everything that can be wrong with the input (config, files, model, an unreachable budget) is
checked before the first forward pass and before anything is written, so a bad run costs nothing
and erases nothing.
"""

from __future__ import annotations

import json
import logging
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from privzo.algorithms.loop import TrainingLoop
from privzo.algorithms.registry import check_built, make_loop, writes_trajectory
from privzo.config import ConfigError, RunConfig, dump_config
from privzo.dirlock import locks_output_dir
from privzo.layouts.context import PlannedData, RunContext, RunHooks, build_context
from privzo.layouts.record import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    RESOURCE_FIGURES,
    RUN_FILES,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    check_output_dir,
    final_metrics,
    prepare_output_dir,
    summary_record,
)
from privzo.layouts.resume import (
    ResumePoint,
    clear_resume_point,
    find_resume_point,
    save_progress,
    write_json_atomically,
)
from privzo.memory import PeakMemory
from privzo.models.loading import model_parameters, save_weights
from privzo.preflight import preflight
from privzo.privacy.plan import PrivacyPlan, mechanism_parameters, plan_privacy, privacy_record
from privzo.replay import MODEL_LOADER, write_model_data
from privzo.tasks.evaluation import Evaluation, timed_evaluation, validation_metrics
from privzo.tracking import Tracker, connect_tracker, make_tracker
from privzo.tracking.tags import MODEL_URI
from privzo.zo.integrity import check_fingerprint
from privzo.zo.trajectory import TrajectoryRecorder, read_trajectory, trajectory_meta

# The run pipeline's public names, most now defined in the layers below it and kept importable
# from here for callers (searches, studies, the CLI, tests).
__all__ = [
    "CONFIG_FILE",
    "MODEL_DIR",
    "PRIVACY_FILE",
    "RESOURCE_FIGURES",
    "RUN_FILES",
    "SUMMARY_FILE",
    "TRAJECTORY_FILE",
    "PrivacyPlan",
    "RunContext",
    "RunHooks",
    "TrainingLoop",
    "build_context",
    "can_resume",
    "check_output_dir",
    "make_loop",
    "mechanism_parameters",
    "model_parameters",
    "plan_privacy",
    "prepare_output_dir",
    "run",
]

logger = logging.getLogger(__name__)


@locks_output_dir  # one run per directory, held before anything is checked or loaded
def run(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    overwrite: bool = False,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    hooks: RunHooks | None = None,
) -> dict[str, Any]:
    """Fine-tune, evaluate and record one run; returns the summary written to summary.json.

    ``tracking_uri`` (e.g. from the environment, read by the CLI) is used when the config sets
    none; it is not written to the config, and no tracking URI is logged (it may hold secrets).
    ``tags`` are added to the run's own (e.g. ``mlflow.parentRunId`` for a search's trial).
    """
    output_dir = Path(output_dir).resolve()
    resume = None if overwrite else _resume_point(config, output_dir)
    checked = preflight(  # everything that can refuse the run, before any weights load
        config,
        output_dir=output_dir if resume is None else None,  # a resumed run goes on there
        overwrite=overwrite,
        tracking_uri=tracking_uri,
        tracking_root=tracking_root or output_dir.parent,
    )
    if config.parallel.strategy != "single":  # Ray Train workers (privzo.distributed)
        from privzo.distributed.launch import run_distributed

        if hooks is not None and hooks.training_rows is not None:
            raise ConfigError(
                f"parallel.strategy={config.parallel.strategy!r}: an audit's canaries need the "
                "data in this process; use strategy 'single'"
            )
        return run_distributed(
            config,
            output_dir,
            cache_dir=cache_dir,
            progress=progress,
            overwrite=overwrite,
            tracking_root=tracking_root,
            tracking_uri=tracking_uri,
            tags=tags,
            after_window=hooks.after_window if hooks is not None else None,
            final_scores=hooks.final_scores if hooks is not None else None,
            plan=checked.privacy,
        )
    planned = PlannedData(checked.task_config, checked.splits, checked.privacy)
    context = build_context(config, cache_dir, progress, hooks or RunHooks(), planned)
    check_built(context)  # the algorithm's own checks (DPGD-0th's noise size): nothing written yet
    tracker = _connect_tracker(context, output_dir, tracking_root, tracking_uri, tags)
    if resume is None:
        prepare_output_dir(output_dir)
        (output_dir / CONFIG_FILE).write_text(dump_config(config))
    elif resume.tracking_run_id is not None:
        tracker.attach(resume.tracking_run_id)  # the same MLflow run goes on
    with tracker:
        if resume is None:
            params = config.model_dump(mode="json")
            params["tracking"].pop("uri")
            tracker.log_params(params)
            tracker.log_inputs(context.data_lineage())
        summary = _train_and_evaluate(context, tracker, output_dir, progress, resume)
        for name in (CONFIG_FILE, TRAJECTORY_FILE, PRIVACY_FILE, SUMMARY_FILE):
            if (output_dir / name).exists():  # first-order baselines write no trajectory
                tracker.log_artifact(output_dir / name)
        if writes_trajectory(config):
            _log_replayable_model(tracker, config, output_dir, cache_dir)
    return summary


def _log_replayable_model(
    tracker: Tracker, config: RunConfig, output_dir: Path, cache_dir: Path
) -> None:
    """The run's fine-tuned model as a backend model (MLflow: ``runs:/<id>/model``): the base
    reference and the trajectory, rebuilt by replay when loaded. Its URI is tagged."""
    with tempfile.TemporaryDirectory() as scratch:
        data = write_model_data(
            Path(scratch) / "replay",
            config.model.name_or_path,
            output_dir / TRAJECTORY_FILE,
            cache_dir,
        )
        uri = tracker.log_model(data, MODEL_LOADER)
    if uri is not None:
        tracker.set_tags({MODEL_URI: uri})


def _connect_tracker(
    context: RunContext,
    output_dir: Path,
    tracking_root: Path | None,
    tracking_uri: str | None,
    tags: Mapping[str, str] | None = None,
) -> Tracker:
    """Build the tracker and reach its store now, so a bad store fails before training."""
    tracking = context.config.tracking
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=(tracking_root or output_dir.parent).resolve(),
        run_name=tracking.run_name or output_dir.name,
        tags={**context.tracking_tags(), **(tags or {})},
        release_timing=context.config.releases_diagnostics,
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def can_resume(config: RunConfig, output_dir: Path) -> bool:
    """Whether ``run(config, output_dir)`` would go on with an unfinished run there: a
    single-process zeroth-order run (its trajectory rebuilds θ) of exactly this config."""
    return _find_resume_point(config, Path(output_dir)) is not None


def _find_resume_point(config: RunConfig, output_dir: Path) -> ResumePoint | None:
    if config.parallel.strategy != "single" or not writes_trajectory(config):
        return None
    return find_resume_point(output_dir, config, CONFIG_FILE, SUMMARY_FILE)


def _resume_point(config: RunConfig, output_dir: Path) -> ResumePoint | None:
    point = _find_resume_point(config, output_dir)
    if point is not None:
        logger.warning("resuming the unfinished run in %s", output_dir)
    return point


def _train_and_evaluate(
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
    summary.update({f"validation_{name}": value for name, value in validation.items()})
    if context.hooks is not None and context.hooks.final_scores is not None:
        summary.update(context.hooks.final_scores(context))
    tracker.log_metrics(final_metrics(summary), step=config.optimizer.steps)
    write_json_atomically(output_dir / PRIVACY_FILE, privacy_record(context.plan, loop.ledger))
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    clear_resume_point(output_dir)  # finished: nothing to resume
    return summary


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
