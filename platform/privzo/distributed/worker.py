"""The Ray Train worker: one rank of a distributed run, driven by its config argument only.

Each rank builds the model (a whole replica, or its ZeRO-3 partition), draws its share of every
batch, all-reduces three scalars per step and applies the same (seed, g) as every other rank.
Every ``tracking.log_every`` steps all ranks call ``ray.train.report`` (a barrier) and rank 0
attaches a checkpoint; rank 0 alone logs to MLflow and returns the run's summary and trajectory.
Training, evaluation and the summary are the single-process run's
(``privzo.layouts.train.train_and_evaluate``); this module supplies what a rank does
differently: its stepper, its progress store (Ray Train's checkpoints) and its layout figures.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa

from privzo.algorithms.loop import StepperFactory, TrainingLoop, WindowEnd, WindowSaver
from privzo.algorithms.stepper import StepMeter
from privzo.algorithms.zeroth_order import ZerothOrderStepper
from privzo.config.loading import build_config
from privzo.distributed.checkpoint import RunState, read_checkpoint, write_checkpoint
from privzo.distributed.collectives import WorkerGroup
from privzo.distributed.estimators import distribute_estimator
from privzo.distributed.resume import CHECKPOINT_PREFIX
from privzo.distributed.sampling import worker_sampler
from privzo.layouts.context import RunContext
from privzo.layouts.layout import Layout, get_layout
from privzo.layouts.train import LayoutFigures, train_and_evaluate
from privzo.privacy.plan import privacy_record
from privzo.rundir.files import MODEL_DIR, TRAJECTORY_FILE
from privzo.rundir.summary import RunRecords
from privzo.tasks.evaluation import Evaluation
from privzo.tracking import MetricPoint, NoopTracker, Tracker, make_tracker
from privzo.zo.estimators import estimator_for
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder, read_trajectory


def train_worker(settings: dict[str, Any]) -> RunRecords | None:
    """Ray Train's per-worker function; ``settings`` comes from ``launch.worker_settings``."""
    quiet_worker_console()
    config = build_config(settings["config"], source="parallel worker")
    group = WorkerGroup.current()
    layout = get_layout(config.parallel.strategy)
    context, keep_alive = layout.build(config, Path(settings["cache_dir"]))
    context.hooks = layout.rank_hooks(settings.get("hooks"), group.rank)  # shipped by cloudpickle
    tracker = _rank_tracker(layout, group, settings["tracking"], config.releases_diagnostics)
    tracker.set_tags(context.tracking_tags())  # sizes and metric: known once the model is built
    tracker.log_inputs(context.data_lineage())
    trained = train_and_evaluate(
        context,
        tracker,
        layout,
        group.rank,
        RayTrainCheckpoints(layout, group, settings.get("salvaged")),
        model_dir=Path(settings["output_dir"]) / MODEL_DIR,
        make_stepper=_rank_stepper(context, group, layout),
        figures=_layout_figures(context, group),
    )
    del keep_alive
    if trained.summary is None:  # not the reporting rank
        return None
    tracker.flush()
    privacy = privacy_record(context.plan, trained.loop.ledger)
    return RunRecords(trained.summary, privacy, trained.recorder.to_bytes())


def quiet_worker_console() -> None:
    """Keep a worker's console to privzo's own logs and warnings (what the CLI does for the
    driver unless ``--verbose``; workers are separate processes).

    Ray Train sets a worker's root logger to INFO, and logs every ``ray.train.report`` at INFO
    ("Reporting training result ...", once per window and rank) on a logger that is not under
    ``ray.train``, so the run's ``LoggingConfig`` does not reach it. Libraries' INFO lines are
    dropped here; privzo's loggers keep INFO, and warnings and errors of all still show.
    """
    from transformers.utils import logging as transformers_logging

    logging.getLogger().setLevel(logging.WARNING)
    logging.getLogger("privzo").setLevel(logging.INFO)
    transformers_logging.disable_progress_bar()  # "Loading weights" on every rank


def _rank_tracker(
    layout: Layout, group: WorkerGroup, tracking: dict[str, Any], release_timing: bool
) -> Tracker:
    """The reporting rank logs into the run the launcher created; the other ranks nowhere."""
    if not layout.reports(group.rank) or tracking["backend"] == "none":
        tracker: Tracker = NoopTracker()
        tracker.start()
        return tracker
    tracker = make_tracker(
        tracking["backend"],
        uri=tracking["uri"],
        experiment=tracking["experiment"],
        output_root=Path(tracking["output_root"]),
        run_name=tracking["run_name"],
        release_timing=release_timing,
    )
    tracker.attach(tracking["run_id"])
    return tracker


def _rank_stepper(context: RunContext, group: WorkerGroup, layout: Layout) -> StepperFactory:
    """The rank's zeroth-order stepper: its share of each batch, all-reduced (forwards on an
    empty share as the layout says: ZeRO-3's forwards are collectives)."""
    config, plan = context.config, context.plan
    sampler = worker_sampler(
        config.privacy.sampler,
        len(context.train),
        config.optimizer.batch_size,
        plan.sample_rate,
        config.task.data_seed,
        group,
        plan.max_batch_size,
    )
    estimator = distribute_estimator(estimator_for(config, plan), group)

    def stepper(context: RunContext, meter: StepMeter) -> ZerothOrderStepper:
        return ZerothOrderStepper(
            context,
            meter,
            sampler=sampler,
            estimator=estimator,
            forward_on_empty=layout.forward_on_empty,
        )

    return stepper


class RayTrainCheckpoints:
    """A rank's progress store (``privzo.layouts.train.ProgressStore``): after each window,
    ``ray.train.report`` on every rank (a barrier), with the reporting rank's checkpoint
    attached, before the window's metrics are logged anywhere. A restarted worker group, and a
    later launch of the same run (``privzo.distributed.resume``), resume from the newest
    checkpoint Ray Train committed, or from ``salvaged`` (the trajectory a failed launch kept in
    the run directory, where the driver found it newer)."""

    def __init__(self, layout: Layout, group: WorkerGroup, salvaged: bytes | None = None):
        self.layout, self.group, self.salvaged = layout, group, salvaged
        # the metrics the newest checkpoint kept unsent, which its attempt's kill may have lost
        self.unsent: tuple[MetricPoint, ...] = ()

    def before(self, measure: Callable[[], Evaluation | None]) -> tuple[Evaluation | None, bool]:
        """Measured on every attempt (the summary's), logged with the first window (``watch``):
        an attempt that resumes after it never logs them again."""
        return measure(), False

    def restore(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> int:
        """Rebuild θ, the trajectory, the ledger and the public sampler's position from the
        newest of Ray's checkpoint and the salvaged trajectory (0 steps on a fresh run)."""
        model = loop.context.config.model.name_or_path
        found = [c for c in (self._checkpointed(model), self._salvaged()) if c is not None]
        if not found:
            return 0
        table, meta, ledger = max(found, key=lambda candidate: candidate[0].num_rows)
        expected = loop.context.trajectory_meta()
        if meta != expected:
            raise ValueError(f"checkpoint is for another run: {meta} != {expected}")
        return loop.restore(recorder, table, meta, ledger_state=ledger)

    def _checkpointed(
        self, model: str
    ) -> tuple[pa.Table, TrajectoryMeta, dict[str, Any] | None] | None:
        """Ray's newest committed checkpoint, its unsent metrics kept for the saver."""
        import ray.train

        checkpoint = ray.train.get_checkpoint()
        if checkpoint is None:
            return None
        with checkpoint.as_directory() as directory:
            table, meta, state = read_checkpoint(Path(directory))
        if state.model != model:
            raise ValueError(f"checkpoint is for another model: {state.model!r} != {model!r}")
        self.unsent = state.unsent
        return table, meta, state.ledger

    def _salvaged(self) -> tuple[pa.Table, TrajectoryMeta, None] | None:
        if self.salvaged is None:
            return None
        with tempfile.TemporaryDirectory() as directory:
            path = Path(directory) / TRAJECTORY_FILE
            path.write_bytes(self.salvaged)
            table, meta = read_trajectory(path)  # checked: checksum, columns
        return table, meta, None  # no ledger state: every row is booked once on restore

    def saver(self, tracker: Tracker, before: Evaluation | None) -> WindowSaver:
        first = before if self.layout.reports(self.group.rank) else None
        return _Reporter(self.group, self.layout, tracker, first, lambda: self.unsent)

    def stopped(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        """Nothing to write: the driver keeps the latest checkpoint's steps of a failed run."""


class _Reporter:
    """After each window: ``ray.train.report`` on every rank (a barrier), with rank 0's
    checkpoint attached and committed by Ray, before the window's metrics are logged anywhere."""

    def __init__(
        self,
        group: WorkerGroup,
        layout: Layout,
        tracker: Tracker,
        before: Evaluation | None,
        kept: Callable[[], tuple[MetricPoint, ...]] = tuple,
    ):
        """``before``: the test metrics before training, logged (at step 0) to the run's
        ``tracker`` after the first window's checkpoint is committed; None: not to be logged.
        ``kept``: the metrics the checkpoint resumed from kept unsent (once it is restored)."""
        self.group, self.layout, self.tracker, self.before = group, layout, tracker, before
        self.kept = kept

    def start(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        if loop.resumed_steps:  # an attempt that resumes logged them with its first window
            self.before = None
            if self.layout.reports(self.group.rank):  # stored where the run lacks them
                self.tracker.log_missing(self.kept())

    def window(self, end: WindowEnd) -> None:
        import ray.train

        loop, steps_done = end.loop, end.steps_done
        payload = {**end.metrics, "steps_done": steps_done}
        if loop.log_diagnostics:  # a window's peak memory follows its (private) batch sizes
            payload["peak_memory_mb"] = loop.step_peak_mb
        if not self.layout.reports(self.group.rank):
            ray.train.report(payload)
            return
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(Path(directory), end.recorder, self.state(end))
            ray.train.report(
                payload,
                checkpoint=ray.train.Checkpoint.from_directory(directory),
                checkpoint_dir_name=checkpoint_name(steps_done),
            )
        # The controller registers a report when it next polls the workers, after ``report``
        # returned: a worker killed before then restarts the run from the checkpoint before,
        # and the steps in between, whose window rank 0 is about to log, would be drawn again.
        # Nothing of the window goes out until Ray has committed its checkpoint.
        ray.train.get_all_reported_checkpoints(
            consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
        )
        if self.before is not None:  # a launch that resumes from here never logs them again
            metrics_before, self.before = self.before[0], None
            self.tracker.log_metrics({f"test_{k}": v for k, v in metrics_before.items()}, step=0)

    def state(self, end: WindowEnd) -> RunState:
        """The reporting rank's checkpoint state at the window's end, with the metrics that
        go out once it is committed: the tracker's buffer, the window's own and, with the
        first window, the test metrics before training."""
        loop, ledger = end.loop, end.loop.ledger
        return RunState(
            model=loop.context.config.model.name_or_path,
            steps_done=end.steps_done,
            ledger=ledger.state_dict() if ledger else None,
            unsent=unsent_at(self.tracker, end.metrics, end.steps_done, self.before),
        )


def unsent_at(
    tracker: Tracker, metrics: dict[str, float], steps_done: int, before: Evaluation | None
) -> tuple[MetricPoint, ...]:
    """The metrics a window's checkpoint keeps: what ``tracker`` holds unsent, the window's
    ``metrics`` and the test metrics ``before`` training (step 0, with the first window), all
    logged only once the checkpoint is committed."""
    unsent = tracker.unsent_with(metrics, steps_done)
    if before is None:
        return unsent
    return unsent + tuple(MetricPoint(f"test_{k}", float(v), 0) for k, v in before[0].items())


def checkpoint_name(steps_done: int) -> str:
    """A checkpoint's folder under the run's Ray storage, named by its step: Ray Train's own
    names carry the time of the report, so two kept ones would give a window's duration."""
    return f"{CHECKPOINT_PREFIX}{steps_done:09d}"


def _layout_figures(context: RunContext, group: WorkerGroup) -> LayoutFigures:
    """The layout's summary fields (every rank's peak memory and trainable bytes held, the
    all-reduces' payload): gathered from every rank, so every rank calls it."""

    def figures(loop: TrainingLoop) -> dict[str, Any]:
        reduced_bytes = group.reduced_bytes  # the steps' all-reduces, before the gathers below
        peaks = group.all_gather_float(max(loop.step_peak_mb, loop.memory.peak_mb()))
        held = group.all_gather_float(_local_parameter_bytes(context))
        return {
            **_layout_summary(context.config, group, loop, peaks),
            **_communication_summary(context, loop, reduced_bytes, held),
        }

    return figures


def _layout_summary(
    config: Any,
    group: WorkerGroup,
    loop: TrainingLoop,
    peaks: list[float],
) -> dict[str, Any]:
    """Beside the run's own figures (``steps`` and ``resumed_steps`` count a resumed
    attempt's steps as a single run's do)."""
    return {
        "strategy": config.parallel.strategy,
        "workers": group.world_size,
        # withheld when private, as the run's own (privzo.rundir.summary.resource_figures)
        "peak_memory_mb_per_worker": peaks if loop.log_diagnostics else None,
        "peak_memory_mb": max(peaks) if loop.log_diagnostics else None,
    }


def _communication_summary(
    context: RunContext, loop: TrainingLoop, reduced_bytes: int, held: list[float]
) -> dict[str, Any]:
    shards = context.shards
    return {
        # payload of the steps' all-reduces ([sum (noised by rank 0), count] in fp64), per step
        "allreduce_bytes_per_step": reduced_bytes / max(1, len(loop.step_times)),
        "parameter_bytes_per_worker": held,
        "parameter_bytes_full": sum(s.size * s.tensor.element_size() for s in shards),
    }


def _local_parameter_bytes(context: RunContext) -> float:
    """Bytes of trainable weights this rank holds: a partition under zero3, all of them else."""
    return float(sum(s.tensor.numel() * s.tensor.element_size() for s in context.shards))
