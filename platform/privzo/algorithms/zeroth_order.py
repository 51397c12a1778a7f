"""The zeroth-order training loop (DPZero, DP-ZO, MeZO): sample, step, account, log.

Below the run pipeline and beside the layouts: a Ray Train rank drives the same loop as the
single-process run, with its own sampler and all-reducing estimator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import pyarrow as pa
import torch
from tqdm.auto import tqdm

from privzo.layouts.context import RunContext
from privzo.memory import PeakMemory
from privzo.privacy.curve import EpsilonCurve
from privzo.privacy.plan import make_epsilon_curve, make_ledger, make_sampler
from privzo.privacy.sampling import Sampler
from privzo.tasks.micro_batches import losses_in_micro_batches
from privzo.tracking import Tracker
from privzo.zo.directions import step_seed
from privzo.zo.estimators import GradientEstimator, estimator_for
from privzo.zo.integrity import check_finite_weights
from privzo.zo.schedules import make_schedule
from privzo.zo.step import StepRecord, zo_step
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder, replay_steps


class TrainingLoop:
    """Samples, steps, accounts and logs; holds the per-run state the step function does not."""

    records_trajectory = True

    def __init__(
        self,
        context: RunContext,
        tracker: Tracker,
        memory: PeakMemory,
        *,
        sampler: Sampler | None = None,
        estimator: GradientEstimator | None = None,
        on_window: Callable[[int, dict[str, float]], None] | None = None,
        forward_on_empty: bool = False,
    ) -> None:
        """``sampler``, ``estimator`` and ``on_window`` (called with the steps done and the
        window's metrics, before they are logged) let a distributed worker take its share of
        batches, all-reduce, and report / checkpoint; the defaults are the single-process run's.
        ``forward_on_empty``: an empty local batch still runs both forwards on the task's public
        example (built from the template, no record), whose loss is discarded (ZeRO-3 gathers
        weights collectively in every forward)."""
        self.context = context
        self.tracker = tracker
        self.memory = memory
        config, plan = context.config, context.plan
        self.sampler = sampler or make_sampler(config, plan, len(context.train))
        self.estimator = estimator or estimator_for(config, plan)
        self.on_window = on_window
        self.forward_on_empty = forward_on_empty
        self.ledger = make_ledger(config, plan)
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )
        self.private = context.plan.private
        self.step_times: list[float] = []
        self.step_peak_mb = 0.0
        self.peak_mb = 0.0  # of the whole run: steps and evaluations
        self.nonfinite = 0
        self.empty_batches = 0
        self.resumed_steps = 0  # replayed from an earlier attempt (``restore``)
        self.windows_done = 0  # steps done at the end of the last finished window

    def run(self, recorder: TrajectoryRecorder, progress: bool, start: int = 0) -> None:
        """Steps in windows of ``log_every``: each window's privacy cost is booked before it runs
        (so no step can overspend) and its metrics are logged after it. ``start`` > 0 resumes
        after that many steps (already in ``recorder`` and the ledger)."""
        config = self.context.config
        steps, window_size = config.optimizer.steps, config.tracking.log_every
        algorithm = config.optimizer.algorithm
        bar = tqdm(total=steps, initial=start, desc=algorithm, disable=not progress)
        ends = [min(first + window_size, steps) for first in range(start, steps, window_size)]
        curve = make_epsilon_curve(self.context.plan, ends)
        try:
            self._run_windows(recorder, bar, curve, start)
        finally:  # stopped or not, every finished window's ε is logged (its value is public)
            if curve is not None:
                self._add_epsilons(curve.take_through(self.windows_done), {}, -1)
        bar.close()

    def _run_windows(
        self, recorder: TrajectoryRecorder, bar: tqdm, curve: EpsilonCurve | None, start: int
    ) -> None:
        config = self.context.config
        steps, window_size = config.optimizer.steps, config.tracking.log_every
        self.windows_done = start
        for first in range(start, steps, window_size):
            window_steps = range(first, min(first + window_size, steps))
            if self.ledger is not None:  # authorized up front: no ε evaluation here
                self.ledger.book(len(window_steps))
            window = []
            for step in window_steps:
                record = self.step(step)
                recorder.append(record)
                window.append(record)
                bar.update(1)
            end = window_steps[-1] + 1
            shards = self.context.shards
            check_finite_weights([(shard.name, shard.tensor) for shard in shards], end)
            metrics = self._window_metrics(window)
            if curve is not None:
                self._add_epsilons(curve.take_ready(), metrics, end)
            if self.on_window is not None:  # checkpoint before logging: no released window is lost
                self.on_window(end, metrics)
            self.tracker.log_metrics(metrics, step=end)
            # released: a stop from here on still logs this window's ε (see ``run``), even
            # when the curve's thread had not computed it yet when the metrics went out
            self.windows_done = end
            hooks = self.context.hooks
            if hooks is not None and hooks.after_window is not None:
                hooks.after_window(self.context, end, metrics)
            bar.set_postfix({k: f"{v:.3g}" for k, v in metrics.items() if k in _SHOWN})

    def _add_epsilons(
        self, epsilons: list[tuple[int, float]], metrics: dict[str, float], end: int
    ) -> None:
        """The ε curve's values: this window's into ``metrics``, earlier windows' (computed
        while later steps ran) logged now at their own steps."""
        for step_count, epsilon in epsilons:
            if step_count == end:
                metrics["epsilon_spent"] = epsilon
            else:
                self.tracker.log_metrics({"epsilon_spent": epsilon}, step=step_count)

    def restore(
        self,
        recorder: TrajectoryRecorder,
        table: pa.Table,
        meta: TrajectoryMeta,
        ledger_state: dict[str, Any] | None = None,
    ) -> int:
        """Continue an earlier attempt: θ rebuilt by replaying its rows, the rows put back in
        ``recorder``, each of them booked once in the ledger, the public shuffle sampler moved
        past their batches. Returns the steps done (where ``run`` starts).

        ``ledger_state`` (the attempt's ``BudgetLedger.state_dict``) is restored through the
        accountant's state API, which refuses another budget or accountant setting; rows run
        after it was saved (a stop inside a window) are booked on top. Without it, every row
        is booked afresh."""
        if self.ledger is not None and ledger_state is not None:
            self.ledger.load_state_dict(ledger_state)
        accounted = self.ledger.accountant.steps if self.ledger is not None else 0
        if accounted > table.num_rows:
            raise ValueError(
                f"the privacy state books {accounted} steps but the trajectory holds "
                f"{table.num_rows}: the files are not of one attempt"
            )
        replay_steps(self.context.perturber, table, meta)
        recorder.append_rows(table)
        done = self.resumed_steps = table.num_rows
        if self.ledger is not None and done > accounted:
            self.ledger.book(done - accounted)
        if self.context.config.privacy.sampler == "shuffle":  # public and seeded: replay it
            for _ in range(done):
                self.sampler.next_batch()
        return done

    def step(self, step: int) -> StepRecord:
        context = self.context
        indices = self.sampler.next_batch()
        batch = context.task.collate(context.train, indices) if len(indices) else None
        batch_size, keep = len(indices), len(indices)
        if self.forward_on_empty and not len(indices):  # a public input: no record is read
            batch, batch_size = context.task.collate(context.task.public_example(), [0]), 1
        self.memory.reset()
        started = time.perf_counter()
        record = zo_step(
            step=step,
            seed=step_seed(context.config.seed, step),
            perturber=context.perturber,
            batch=batch,
            batch_size=batch_size,
            loss_fn=lambda b: self.per_example_losses(b)[:keep],
            estimator=self.estimator,
            learning_rate=self.schedule(step),
            perturbation_scale=context.config.optimizer.perturbation_scale,
        )
        self.step_times.append(time.perf_counter() - started)
        self.step_peak_mb = max(self.step_peak_mb, self.memory.peak_mb())
        self.peak_mb = max(self.peak_mb, self.step_peak_mb)
        self.nonfinite += record.nonfinite
        self.empty_batches += int(len(indices) == 0)
        return record

    def per_example_losses(self, batch: Any) -> torch.Tensor:
        """The task's per-example losses at the current weights, in micro-batches of at most
        ``optimizer.physical_batch_size`` examples (all at the same perturbation)."""
        context = self.context
        return losses_in_micro_batches(
            lambda chunk: context.task.per_example_loss(context.scoring_model, chunk),
            batch,
            context.config.optimizer.physical_batch_size,
        )

    @property
    def log_diagnostics(self) -> bool:
        """Whether data-dependent diagnostics may be logged (see ``_window_metrics``)."""
        return self.context.config.releases_diagnostics

    def _window_metrics(self, window: list[StepRecord]) -> dict[str, float]:
        """Public metrics always; diagnostics only where they release nothing private.

        In a private run the training loss, the step time (an empty Poisson batch skips both
        forwards, so per-window time reveals batch sizes) and the non-finite count all depend on
        the private data and are not covered by the accountant.
        """
        metrics = {
            "learning_rate": window[-1].learning_rate,
            "projected_gradient_abs": sum(abs(r.projected_gradient) for r in window) / len(window),
        }
        if self.log_diagnostics:
            metrics["step_time_s"] = sum(self.step_times[-len(window) :]) / len(window)
            metrics["nonfinite_differences"] = float(self.nonfinite)
            losses = [r.mean_loss for r in window if not math.isnan(r.mean_loss)]
            if losses:
                metrics["train_loss"] = sum(losses) / len(losses)
        return metrics


_SHOWN = ("epsilon_spent", "train_loss", "step_time_s")
