"""Where a run trains, built and checked before anything is written: in this process
(``InProcess``, the single layout) or on Ray Train workers (``OnRayTrain``, replica and zero3).
Both train through ``privzo.layouts.train.train_and_evaluate``; the run pipeline drives either
through the ``Training`` protocol."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Protocol

from privzo.algorithms.registry import check_built, writes_trajectory
from privzo.config.run import RunConfig
from privzo.distributed.cluster import RayTarget
from privzo.layouts.context import PlannedData, RunContext, RunHooks, build_context
from privzo.layouts.layout import get_layout
from privzo.layouts.train import train_and_evaluate
from privzo.preflight import Preflight
from privzo.privacy.plan import privacy_record
from privzo.rundir import (
    MODEL_DIR,
    ResumePoint,
    RunDirectoryProgress,
    RunRecords,
    write_resume_point,
)
from privzo.section import ConfigError
from privzo.tracking import Tracker
from privzo.tracking.tags import config_tags, layout_tags

__all__ = ["InProcess", "OnRayTrain", "Training", "make_training"]

logger = logging.getLogger(__name__)


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
        rows = checked.privacy.max_batch_size
        used = start_cluster(config, output_dir, cache_dir, progress, tracking[1], rows, cluster)
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


def make_training(
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
