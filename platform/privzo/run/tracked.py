"""A run's tracking run: its tracker reached before training, the training inside it (a new
tracking run, or an earlier attempt's taken up again), and a finished run's files and replayable
model logged to it, also for a run killed after its summary, whose tracking run is then ended."""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Mapping
from pathlib import Path

from privzo.algorithms.registry import writes_trajectory
from privzo.config.run import RunConfig
from privzo.layouts.train import FINAL_METRICS_STEP
from privzo.replay import MODEL_LOADER, write_model_data
from privzo.run.training import Training
from privzo.rundir import (
    CONFIG_FILE,
    PRIVACY_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    ResumePoint,
    RunRecords,
    RunSummary,
    mark_tracked,
    record_tracking_run,
    unfinished_steps,
    write_records,
)
from privzo.tracking import Tracker, TrackingRunLostError, connect_tracker, make_tracker
from privzo.tracking.tags import (
    CONTINUES_FROM_STEP,
    MODEL_URI,
    config_tags,
    layout_tags,
    model_tags,
    run_label,
)

__all__ = ["connect_run_tracker", "end_tracking", "train_tracked"]

logger = logging.getLogger(__name__)


def connect_run_tracker(
    config: RunConfig,
    output_dir: Path,
    tracking_root: Path | None,
    tracking_uri: str | None,
    tags: Mapping[str, str],
    run_name: str | None = None,
) -> Tracker:
    """Build the run's tracker and reach its store now, so a bad store fails before training.
    Its name: the config's ``tracking.run_name``, else ``run_name``, else ``run_label``."""
    tracking = config.tracking
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=(tracking_root or output_dir.parent).resolve(),
        run_name=tracking.run_name or run_name or run_label(config),
        tags=dict(tags),
        release_timing=config.releases_diagnostics,
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def train_tracked(
    tracker: Tracker,
    training: Training,
    config: RunConfig,
    output_dir: Path,
    cache_dir: Path,
    resume: ResumePoint | None,
) -> RunRecords:
    """Train inside the run's tracking run: a new one, or the earlier attempt's, into which
    the metrics that attempt had not stored yet go first."""
    new_run = resume is None or not _reattached(tracker, resume)
    with tracker:
        if new_run:
            _log_config(tracker, config)
            training.log_inputs(tracker)
        if resume is not None:
            _continue_records(tracker, resume, new_run, config, output_dir)
        records = training.train(tracker)
        tracker.flush()  # the final metrics are stored before the summary says it finished
        write_records(output_dir, records)
        _log_records(tracker, config, output_dir, cache_dir, training.logs_model)
    return records


def _reattached(tracker: Tracker, resume: ResumePoint) -> bool:
    """Whether the earlier attempt's tracking run goes on: not where it had none, nor where the
    store no longer holds it (deleted or replaced since), which a new run stands in for."""
    if resume.tracking_run_id is None:
        return False
    try:
        tracker.attach(resume.tracking_run_id)
    except TrackingRunLostError as lost:
        logger.warning("%s: the resumed run records into a new MLflow run", lost)
        return False
    return True


def _continue_records(
    tracker: Tracker, resume: ResumePoint, new_run: bool, config: RunConfig, output_dir: Path
) -> None:
    """A new tracking run of a resumed run says which steps it continues; the earlier
    attempt's unsent metrics are stored where the run lacks them."""
    if new_run:
        tracker.set_tags({CONTINUES_FROM_STEP: str(unfinished_steps(config, output_dir))})
    tracker.log_missing(resume.unsent)


def end_tracking(
    config: RunConfig,
    output_dir: Path,
    summary: RunSummary,
    cache_dir: Path,
    tracking: tuple[Path | None, str | None],
    run_name: str | None = None,
    tags: Mapping[str, str] | None = None,
) -> RunSummary:
    """End the tracking run of a run killed after its summary was written: its records and
    model logged (again, where they were), FINISHED; nothing trains. Its final metrics were
    stored before the summary was written. Where the store no longer holds that run, a new
    one stands in (``_stand_in``), tagged as the run was, with the caller's ``tags``."""
    logger.warning("the run in %s is finished; ending its tracking run", output_dir)
    if summary.tracking_run_id is not None:
        run_tags = {**_finished_run_tags(config, summary), **(tags or {})}  # a new run's only
        tracker = connect_run_tracker(config, output_dir, *tracking, run_tags, run_name)
        lost = not _reattached(tracker, ResumePoint(summary.tracking_run_id, None))
        with tracker:
            if lost:
                summary = _stand_in(tracker, config, output_dir, summary)
            _log_records(tracker, config, output_dir, cache_dir, writes_trajectory(config))
    mark_tracked(output_dir)
    return summary


def _finished_run_tags(config: RunConfig, summary: RunSummary) -> dict[str, str]:
    """The tags a finished run had (``privzo.tracking.tags``), from its config and summary: the
    sizes and metric the analysis reads, the layout's where it ran on workers."""
    tags = {
        **config_tags(config, summary.private),
        **model_tags(
            summary.metric,
            summary.model_parameters,
            summary.trainable_parameters,
            device=summary.device,
        ),
    }
    if config.parallel.strategy != "single":
        tags.update(layout_tags(config))
    return tags


def _stand_in(
    tracker: Tracker, config: RunConfig, output_dir: Path, summary: RunSummary
) -> RunSummary:
    """A new tracking run for a finished run whose own the store lost: tagged as continuing
    from its last step (no step of it trains again), and named in the rewritten summary."""
    _log_config(tracker, config)
    tracker.set_tags({CONTINUES_FROM_STEP: str(summary.steps)})
    tracker.log_metrics(summary.final_metrics(), step=FINAL_METRICS_STEP)
    tracker.flush()  # stored before the summary names this run
    return record_tracking_run(output_dir, summary, tracker.run_id)


def _log_config(tracker: Tracker, config: RunConfig) -> None:
    """The resolved config as the run's parameters (its tracking URI left out)."""
    params = config.model_dump(mode="json")
    params["tracking"].pop("uri")
    tracker.log_params(params)


def _log_records(
    tracker: Tracker, config: RunConfig, output_dir: Path, cache_dir: Path, logs_model: bool
) -> None:
    """A finished run's files as artifacts, and its replayable model where it has one."""
    for name in (CONFIG_FILE, TRAJECTORY_FILE, PRIVACY_FILE, SUMMARY_FILE):
        if (output_dir / name).exists():  # first-order baselines write no trajectory
            tracker.log_artifact(output_dir / name)
    if logs_model:
        _log_replayable_model(tracker, config, output_dir, cache_dir)


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
