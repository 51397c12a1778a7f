"""One fine-tuning run, end to end: validate → plan privacy → load → train → evaluate → record.

Everything that can be wrong with the input (config, files, model, an unreachable budget) is
checked before the first forward pass and before anything is written, so a bad run costs nothing
and erases nothing. Every layout goes through the same steps here (preflight, the tracker, the
run directory, params, records, artifacts); what differs is where it trains: in this process
(``InProcess``) or on Ray Train workers (``OnRayTrain``), both through
``privzo.layouts.train.train_and_evaluate``.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol

from privzo.algorithms.registry import check_built, writes_trajectory
from privzo.config.run import RunConfig
from privzo.dirlock import locks_output_dir
from privzo.distributed.cluster import RayTarget
from privzo.layouts.context import PlannedData, RunContext, RunHooks, build_context
from privzo.layouts.layout import get_layout
from privzo.layouts.train import train_and_evaluate
from privzo.preflight import Preflight, preflight
from privzo.privacy import keep_epsilons_in
from privzo.privacy.plan import privacy_record
from privzo.replay import MODEL_LOADER, write_model_data
from privzo.rundir import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    ResumePoint,
    RunDirectoryProgress,
    RunRecords,
    RunSummary,
    finished,
    mark_tracked,
    prepare_output_dir,
    released_nothing,
    resume_point,
    unfinished_steps,
    untracked,
    write_config,
    write_records,
    write_resume_point,
)
from privzo.section import ConfigError
from privzo.tracking import (
    Tracker,
    TrackingRunLostError,
    TrackingStoreError,
    connect_tracker,
    keep_blank_stores_in,
    make_tracker,
)
from privzo.tracking.tags import (
    CONTINUES_FROM_STEP,
    MODEL_URI,
    config_tags,
    layout_tags,
    run_label,
)

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
    on_checked: Callable[[Preflight], None] | None = None,
    cluster: RayTarget | None = None,
    run_name: str | None = None,
) -> RunSummary:
    """Fine-tune, evaluate and record one run; returns the summary written to summary.json.

    ``tracking_uri`` (e.g. from the environment, read by the CLI) is used when the config sets
    none; it is not written to the config, and no tracking URI is logged (it may hold secrets).
    ``tags`` are added to the run's own (e.g. ``mlflow.parentRunId`` for a search's trial).
    ``on_checked`` receives the preflight's findings before anything loads (the CLI prints which
    rows the run trains on). ``cluster`` says which Ray a distributed layout joins or starts
    (``privzo.distributed.cluster``; default: a new local one). ``run_name`` names the
    MLflow run when the config sets none (default: ``run_label``, algorithm, ε, model, seed, task).
    """
    output_dir = Path(output_dir).resolve()
    keep_epsilons_in(cache_dir)  # a rerun, a resume or a search's next trial calibrates anew
    keep_blank_stores_in(cache_dir)  # a new output directory's MLflow store, without migrations
    stopped = None if overwrite else untracked(output_dir, config)
    if stopped is not None:  # trained and recorded: only its tracking run is left to end
        return _end_tracking(
            config, output_dir, stopped, cache_dir, (tracking_root, tracking_uri), run_name
        )
    resume = None if overwrite else resume_point(config, output_dir)
    overwrite = overwrite or (resume is None and _starts_again(config, output_dir))
    checked = preflight(  # everything that can refuse the run, before any weights load
        config,
        output_dir=output_dir if resume is None else None,  # a resumed run goes on there
        overwrite=overwrite,
        tracking_uri=tracking_uri,
        tracking_root=tracking_root or output_dir.parent,
    )
    if on_checked is not None:
        on_checked(checked)
    training = _training(
        config,
        checked,
        output_dir,
        cache_dir,
        progress,
        hooks,
        resume,
        (tracking_root, tracking_uri),
        cluster,
    )
    tracker = connect_run_tracker(
        config,
        output_dir,
        tracking_root,
        tracking_uri,
        {**training.tags(), **(tags or {})},
        run_name,
    )
    if resume is None:
        prepare_output_dir(output_dir)
        write_config(output_dir, config)
    try:
        records = _train_tracked(tracker, training, config, output_dir, cache_dir, resume)
    except TrackingStoreError as error:
        raise TrackingStoreError(
            f"{error}. The run in {output_dir} keeps its steps: once the store takes writes "
            "again (free its disk, fix its permissions, or, where the config sets no "
            "tracking.uri, point MLFLOW_TRACKING_URI at another store), the same command goes "
            "on from them"
        ) from error
    mark_tracked(output_dir)
    return records.summary


def _train_tracked(
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
            params = config.model_dump(mode="json")
            params["tracking"].pop("uri")
            tracker.log_params(params)
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


def _starts_again(config: RunConfig, output_dir: Path) -> bool:
    """Whether an earlier attempt at ``config`` in ``output_dir`` kept no step, so the run
    starts there again (``released_nothing``), saying so."""
    if not released_nothing(output_dir, config):
        return False
    logger.warning(
        "the earlier attempt in %s stopped before it kept any step (its MLflow run stays as "
        "it ended): the run starts again from step 0",
        output_dir,
    )
    return True


def finished_run(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
) -> RunSummary | None:
    """The summary of a finished run of exactly ``config`` in ``output_dir``, else None; a run
    killed after its summary first has its tracking run ended (as ``run`` would): what
    searches, studies and the demo ask before a trial, a cell or an arm trains."""
    if untracked(Path(output_dir), config) is None:
        return finished(Path(output_dir), config)
    return run(  # under the directory's lock, ``run`` ends the tracking run and trains nothing
        config,
        output_dir,
        cache_dir=cache_dir,
        tracking_root=tracking_root,
        tracking_uri=tracking_uri,
    )


def _end_tracking(
    config: RunConfig,
    output_dir: Path,
    summary: RunSummary,
    cache_dir: Path,
    tracking: tuple[Path | None, str | None],
    run_name: str | None = None,
) -> RunSummary:
    """End the tracking run of a run killed after its summary was written: its records and
    model logged (again, where they were), FINISHED; nothing trains. Its final metrics were
    stored before the summary was written."""
    logger.warning("the run in %s is finished; ending its tracking run", output_dir)
    if summary.tracking_run_id is not None:
        tracker = connect_run_tracker(config, output_dir, *tracking, {}, run_name)
        tracker.attach(summary.tracking_run_id)
        with tracker:
            _log_records(tracker, config, output_dir, cache_dir, writes_trajectory(config))
    mark_tracked(output_dir)
    return summary


def _log_records(
    tracker: Tracker, config: RunConfig, output_dir: Path, cache_dir: Path, logs_model: bool
) -> None:
    """A finished run's files as artifacts, and its replayable model where it has one."""
    for name in (CONFIG_FILE, TRAJECTORY_FILE, PRIVACY_FILE, SUMMARY_FILE):
        if (output_dir / name).exists():  # first-order baselines write no trajectory
            tracker.log_artifact(output_dir / name)
    if logs_model:
        _log_replayable_model(tracker, config, output_dir, cache_dir)


class Training(Protocol):
    """Where a run trains, set up (and checked) before anything is written."""

    logs_model: bool  # whether the run's replayable model is logged to the tracker

    def tags(self) -> dict[str, str]:
        """The run's tags known here (``privzo.tracking.tags``)."""

    def log_inputs(self, tracker: Tracker) -> None:
        """The data lineage, where this process has the data."""

    def train(self, tracker: Tracker) -> RunRecords:
        """Train and evaluate; the finished run's records."""


class InProcess:
    """The single layout: this process builds the context and trains (resuming from the run
    directory where an earlier attempt stopped)."""

    def __init__(
        self,
        context: RunContext,
        output_dir: Path,
        progress: bool,
        resume: ResumePoint | None,
    ):
        self.context, self.output_dir = context, output_dir
        self.progress, self.resume = progress, resume
        self.logs_model = writes_trajectory(context.config)

    def tags(self) -> dict[str, str]:
        return self.context.tracking_tags()

    def log_inputs(self, tracker: Tracker) -> None:
        tracker.log_inputs(self.context.data_lineage())

    def train(self, tracker: Tracker) -> RunRecords:
        context, output_dir = self.context, self.output_dir
        trained = train_and_evaluate(
            context,
            tracker,
            get_layout(context.config.parallel.strategy),
            0,
            RunDirectoryProgress(output_dir, self.resume),
            model_dir=output_dir / MODEL_DIR,
            show_progress=self.progress,
        )
        assert trained.summary is not None, "a single process reports"
        privacy = privacy_record(context.plan, trained.loop.ledger)
        return RunRecords(trained.summary, privacy)


class OnRayTrain:
    """The replica and zero3 layouts: Ray Train workers build their contexts and train
    (``privzo.distributed``); rank 0 logs into this run and returns its records. The cluster
    is reached and checked when this is made, and so is what a resumed run goes on from."""

    def __init__(
        self,
        config: RunConfig,
        checked: Preflight,
        output_dir: Path,
        cache_dir: Path,
        progress: bool,
        hooks: RunHooks | None,
        tracking: tuple[Path | None, str | None],
        ray_run: str | None,
        cluster: RayTarget | None = None,
    ):
        """``tracking``: the run's tracking root and the caller's tracking URI; ``ray_run``:
        the Ray Train run an unfinished run's earlier launch started (None: a new run);
        ``cluster``: which Ray to join or start (``privzo.distributed.cluster``)."""
        from privzo.distributed.launch import ray_run_name, resumed_steps, start_cluster

        if hooks is not None and hooks.training_rows is not None:
            raise ConfigError(
                f"parallel.strategy={config.parallel.strategy!r}: an audit's canaries need the "
                "training rows in this process; use strategy 'single'"
            )
        used = start_cluster(config, output_dir, cache_dir, progress, tracking[1], cluster)
        logger.warning(used.line())
        if ray_run is not None:  # refused here, before anything is written, if unreadable
            steps = resumed_steps(config, output_dir, ray_run)
            logger.warning("the distributed run goes on from step %d", steps)
        self.ray_run = ray_run or ray_run_name(output_dir)
        self.config, self.private = config, checked.privacy.private
        self.output_dir, self.cache_dir, self.hooks = output_dir, cache_dir, hooks
        self.tracking_root = tracking[0]
        # rank 0 returns the trajectory, written here as a single run's is: the same replayable
        # model (its steps replay to the layout's weights; tests/integration/test_distributed.py)
        self.logs_model = writes_trajectory(config)

    def tags(self) -> dict[str, str]:
        """Without the model's (not loaded here): rank 0 adds them once it has built it."""
        return {**config_tags(self.config, self.private), **layout_tags(self.config)}

    def log_inputs(self, tracker: Tracker) -> None:
        """Rank 0 logs them, once its data is loaded."""

    def train(self, tracker: Tracker) -> RunRecords:
        from privzo.distributed.launch import train_on_ray

        # before any step: the same command finds this launch's Ray Train run and MLflow run
        write_resume_point(self.output_dir, ResumePoint(tracker.run_id, None, self.ray_run))
        return train_on_ray(
            self.config,
            self.output_dir,
            self.cache_dir,
            tracker,
            self.tracking_root,
            self.hooks,
            self.ray_run,
        )


def _training(
    config: RunConfig,
    checked: Preflight,
    output_dir: Path,
    cache_dir: Path,
    progress: bool,
    hooks: RunHooks | None,
    resume: ResumePoint | None,
    tracking: tuple[Path | None, str | None] = (None, None),
    cluster: RayTarget | None = None,
) -> Training:
    """Where the layout trains, built and checked; nothing written yet."""
    if config.parallel.strategy != "single":  # Ray Train workers (privzo.distributed)
        ray_run = resume.ray_run if resume is not None else None
        return OnRayTrain(
            config, checked, output_dir, cache_dir, progress, hooks, tracking, ray_run, cluster
        )
    planned = PlannedData(checked.task_config, checked.splits, checked.privacy)
    context = build_context(config, cache_dir, progress, hooks or RunHooks(), planned)
    check_built(context)  # the algorithm's own checks (DPGD-0th's noise size): nothing written yet
    return InProcess(context, output_dir, progress, resume)


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
