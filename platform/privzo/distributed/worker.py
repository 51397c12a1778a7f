"""The Ray Train worker: one rank of a distributed run, driven by its config argument only.

Each rank builds the model (a whole replica, or its ZeRO-3 partition), draws its share of every
batch, all-reduces three scalars per step and applies the same (seed, g) as every other rank.
Every ``tracking.log_every`` steps all ranks call ``ray.train.report`` (a barrier) and rank 0
attaches a checkpoint; rank 0 alone logs to MLflow and returns the run's summary and trajectory.
"""

from __future__ import annotations

import io
import logging
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from privzo.algorithms.loop import TrainingLoop
from privzo.algorithms.registry import make_loop
from privzo.algorithms.stepper import StepMeter
from privzo.algorithms.zeroth_order import ZerothOrderStepper
from privzo.config import build_config
from privzo.distributed.checkpoint import (
    RunState,
    read_checkpoint,
    write_checkpoint,
)
from privzo.distributed.collectives import WorkerGroup
from privzo.distributed.estimators import distribute_estimator
from privzo.distributed.sampling import worker_sampler
from privzo.layouts.context import RunContext, RunHooks
from privzo.layouts.layout import Layout, get_layout
from privzo.layouts.record import final_metrics, summary_record
from privzo.memory import PeakMemory
from privzo.privacy.plan import privacy_record
from privzo.tasks.evaluation import Evaluation, timed_evaluation, validation_metrics
from privzo.tracking import NoopTracker, Tracker, make_tracker
from privzo.zo.estimators import estimator_for
from privzo.zo.trajectory import (
    TrajectoryMeta,
    TrajectoryRecorder,
    trajectory_meta,
)


def train_worker(settings: dict[str, Any]) -> dict[str, Any] | None:
    """Ray Train's per-worker function; ``settings`` comes from ``launch.worker_settings``."""
    quiet_worker_console()
    config = build_config(settings["config"], source="parallel worker")
    group = WorkerGroup.current()
    layout = get_layout(config.parallel.strategy)
    context, keep_alive = layout.build(config, Path(settings["cache_dir"]))
    if layout.reports(group.rank):  # the caller's hook acts where the run reports, as its tracker
        context.hooks = RunHooks(after_window=settings.get("after_window"))
    tracker = _rank_tracker(layout, group, settings["tracking"], config.releases_diagnostics)
    tracker.set_tags(context.tracking_tags())  # sizes and metric: known once the model is built
    tracker.log_inputs(context.data_lineage())
    outcome = _train_and_evaluate(context, tracker, group, layout)
    reduced_bytes = group.reduced_bytes  # the steps' all-reduces, before the gathers below
    peaks = group.all_gather_float(max(outcome.loop.step_peak_mb, outcome.loop.memory.peak_mb()))
    held = group.all_gather_float(_local_parameter_bytes(context))
    if config.save_model:
        layout.save_model(context, group, Path(settings["output_dir"]) / "model")
    del keep_alive
    if not layout.reports(group.rank):
        return None
    summary = _rank0_summary(outcome, tracker, group, peaks)
    summary.update(_communication_summary(context, outcome.loop, reduced_bytes, held))
    tracker.log_metrics(final_metrics(summary), step=config.optimizer.steps)
    tracker.flush()
    return {
        "summary": summary,
        "trajectory": _table_bytes(outcome.recorder.to_table()),
        "privacy": privacy_record(context.plan, outcome.loop.ledger),
    }


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


@dataclass
class _Outcome:
    loop: TrainingLoop
    recorder: TrajectoryRecorder
    before: Evaluation | None
    after: Evaluation | None
    validation: dict[str, float]
    started: float


def _train_and_evaluate(
    context: RunContext, tracker: Tracker, group: WorkerGroup, layout: Layout
) -> _Outcome:
    """Evaluate, train (resuming from a checkpoint if there is one), evaluate again, on the
    ranks the layout says evaluate."""
    config = context.config
    memory = PeakMemory(context.loaded.device)
    evaluate_here = layout.evaluates(group.rank)
    started = time.perf_counter()
    before = _evaluate(context, memory) if config.eval_before and evaluate_here else None
    private = context.plan.private
    recorder = TrajectoryRecorder(_meta(context), release_batch_size=not private)
    loop = _worker_loop(context, tracker, memory, group, recorder, layout)
    start = _resume(loop, recorder)
    if before is not None and start == 0:
        tracker.log_metrics({f"test_{k}": v for k, v in before[0].items()}, step=0)
    loop.run(recorder, progress=False, start=start)
    after = _evaluate(context, memory) if evaluate_here else None
    validation = _validation(context, loop) if evaluate_here else {}
    return _Outcome(loop, recorder, before, after, validation, started)


def _rank0_summary(
    outcome: _Outcome, tracker: Tracker, group: WorkerGroup, peaks: list[float]
) -> dict[str, Any]:
    loop = outcome.loop
    assert outcome.after is not None, "rank 0 always evaluates"
    summary = summary_record(
        loop.context, loop, tracker, outcome.before, outcome.after, outcome.started
    )
    summary.update({f"validation_{k}": v for k, v in outcome.validation.items()})
    summary.update(_layout_summary(loop.context.config, group, loop, outcome.recorder, peaks))
    return summary


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
    tracker.attach(tracking["run_id"])  # type: ignore[attr-defined]
    return tracker


def _worker_loop(
    context: RunContext,
    tracker: Tracker,
    memory: PeakMemory,
    group: WorkerGroup,
    recorder: TrajectoryRecorder,
    layout: Layout,
) -> TrainingLoop:
    config, plan = context.config, context.plan
    sampler = worker_sampler(
        config.privacy.sampler,
        len(context.train),
        config.optimizer.batch_size,
        plan.sample_rate,
        config.task.data_seed,
        group,
    )
    estimator = distribute_estimator(estimator_for(config, plan), group)

    def stepper(context: RunContext, meter: StepMeter) -> ZerothOrderStepper:
        """The rank's share of each batch, all-reduced (forwards on an empty share as the
        layout says: ZeRO-3's forwards are collectives)."""
        return ZerothOrderStepper(
            context,
            meter,
            sampler=sampler,
            estimator=estimator,
            forward_on_empty=layout.forward_on_empty,
        )

    loop = make_loop(context, tracker, memory, stepper)
    loop.on_window = _Reporter(loop, group, recorder, layout)
    return loop


class _Reporter:
    """After each window: ``ray.train.report`` on every rank (a barrier), with rank 0's
    checkpoint attached and committed by Ray, before the window's metrics are logged anywhere."""

    def __init__(
        self,
        loop: TrainingLoop,
        group: WorkerGroup,
        recorder: TrajectoryRecorder,
        layout: Layout,
    ):
        self.loop, self.group, self.recorder, self.layout = loop, group, recorder, layout

    def __call__(self, steps_done: int, metrics: dict[str, float]) -> None:
        import ray.train

        payload = {**metrics, "steps_done": steps_done}
        if self.loop.log_diagnostics:  # a window's peak memory follows its (private) batch sizes
            payload["peak_memory_mb"] = self.loop.step_peak_mb
        if not self.layout.reports(self.group.rank):
            ray.train.report(payload)
            return
        ledger = self.loop.ledger
        state = RunState(
            model=self.loop.context.config.model.name_or_path,
            steps_done=steps_done,
            ledger=ledger.state_dict() if ledger else None,
        )
        with tempfile.TemporaryDirectory() as directory:
            write_checkpoint(Path(directory), self.recorder, state)
            ray.train.report(payload, checkpoint=ray.train.Checkpoint.from_directory(directory))
        # The controller registers a report when it next polls the workers, after ``report``
        # returned: a worker killed before then restarts the run from the checkpoint before,
        # and the steps in between, whose window rank 0 is about to log, would be drawn again.
        # Nothing of the window goes out until Ray has committed its checkpoint.
        ray.train.get_all_reported_checkpoints(
            consistency_mode=ray.train.CheckpointConsistencyMode.COMMITTED
        )


def _resume(loop: TrainingLoop, recorder: TrajectoryRecorder) -> int:
    """Steps already done by an earlier attempt (0 on a fresh run); rebuilds θ, the trajectory,
    the ledger and the public sampler's position from the latest checkpoint."""
    import ray.train

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        return 0
    with checkpoint.as_directory() as directory:
        table, meta, state = read_checkpoint(Path(directory))
    expected = _meta(loop.context)
    if meta != expected or state.model != loop.context.config.model.name_or_path:
        raise ValueError(f"checkpoint is for another run: {meta} != {expected}")
    return loop.restore(recorder, table, meta, ledger_state=state.ledger)


def _evaluate(context: RunContext, memory: PeakMemory) -> Evaluation:
    batch_size = context.config.optimizer.eval_batch_size
    return timed_evaluation(context.task, context.scoring_model, context.test, batch_size, memory)


def _validation(context: RunContext, loop: TrainingLoop) -> dict[str, float]:
    batch_size = context.config.optimizer.eval_batch_size
    releases = loop.log_diagnostics
    return validation_metrics(
        context.task, context.scoring_model, context.validation, batch_size, releases
    )


def _meta(context: RunContext) -> TrajectoryMeta:
    return trajectory_meta(
        context.config,
        context.loaded.device.type,
        context.perturber,
        context.base_fingerprint,
        context.loaded.revision,
    )


def _layout_summary(
    config: Any,
    group: WorkerGroup,
    loop: TrainingLoop,
    recorder: TrajectoryRecorder,
    peaks: list[float],
) -> dict[str, Any]:
    return {
        "strategy": config.parallel.strategy,
        "workers": group.world_size,
        "steps": len(recorder),  # including the steps of an attempt that failed and resumed
        "resumed_steps": len(recorder) - len(loop.step_times),
        # withheld when private, as the run's own (privzo.layouts.record.resource_figures)
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


def _table_bytes(table: pa.Table) -> bytes:
    sink = io.BytesIO()
    pq.write_table(table, sink)
    return sink.getvalue()
