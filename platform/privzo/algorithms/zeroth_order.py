"""The zeroth-order stepper (DPZero, DP-ZO, MeZO, DP-AggZO): sample, two forwards per direction,
one released scalar per direction.

Each step is ``privzo.zo.step.zo_step``: its record (seed, projected gradient, learning rate,
batch size) is a trajectory row, from which replay and a resumed run rebuild θ. A Ray Train
rank uses the same stepper with its own sampler and all-reducing estimator.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa
import torch

from privzo.algorithms.stepper import StepMeter, StepOutcome, Stepper
from privzo.layouts.context import RunContext
from privzo.privacy.plan import make_sampler
from privzo.privacy.sampling import Sampler
from privzo.tasks.interface import ScoringTask
from privzo.tasks.micro_batches import (
    PublicShape,
    losses_in_micro_batches,
    padded_batch,
    public_shape,
)
from privzo.zo.directions import step_seed
from privzo.zo.estimators import GradientEstimator, estimator_for
from privzo.zo.integrity import check_finite_weights
from privzo.zo.schedules import make_schedule
from privzo.zo.step import zo_step
from privzo.zo.trajectory import TrajectoryMeta, replay_steps


class ZerothOrderStepper(Stepper):
    """Two forwards at θ ± εz per step; the estimator turns their differences into g."""

    records_trajectory = True
    nonfinite_metric = "nonfinite_differences"

    def __init__(
        self,
        context: RunContext,
        meter: StepMeter,
        *,
        sampler: Sampler | None = None,
        estimator: GradientEstimator | None = None,
        forward_on_empty: bool = False,
    ) -> None:
        """``sampler`` and ``estimator`` let a distributed worker take its share of batches
        and all-reduce; the defaults are the single-process run's. ``forward_on_empty``: an
        empty local batch still runs both forwards on the task's public example (built from
        the template, no record), whose loss is discarded (ZeRO-3 gathers weights collectively
        in every forward)."""
        super().__init__(context, meter)
        config, plan = context.config, context.plan
        self.sampler = sampler or make_sampler(config, plan, len(context.train))
        self.estimator = estimator or estimator_for(config, plan)
        self.forward_on_empty = forward_on_empty
        self.shape: PublicShape | None = None
        if config.pad_to == "max_length":
            optimizer = config.optimizer
            self.shape = public_shape(
                plan.max_batch_size, optimizer.physical_batch_size, context.task.max_length
            )
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )

    def step(self, step: int) -> StepOutcome:
        context = self.context
        task: ScoringTask = context.task
        indices = self.sampler.next_batch()
        batch, batch_size = self.batch(task, indices)
        keep = len(indices)  # the real rows come first; the others' losses are dropped
        with self.meter.measure():
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
                directions=context.config.optimizer.directions_per_step,
            )
        self.nonfinite += record.nonfinite
        return StepOutcome(record.learning_rate, record.mean_loss, not len(indices), record)

    def batch(self, task: ScoringTask, indices: Any) -> tuple[Any, int]:
        """The step's batch and its rows: of the public shape when there is one; else the
        drawn examples, a public example when an empty share must still forward, or none."""
        if self.shape is not None:
            return padded_batch(task, self.context.train, indices, self.shape), self.shape.rows
        if len(indices):
            return task.collate(self.context.train, indices), len(indices)
        if self.forward_on_empty:  # a public input: no record is read
            return task.collate(task.public_example(), [0]), 1
        return None, 0

    def per_example_losses(self, batch: Any) -> torch.Tensor:
        """The task's per-example losses at the current weights, in micro-batches of at most
        ``optimizer.physical_batch_size`` examples (all at the same perturbation); of exactly
        the public shape's micro-batch when batches have one."""
        context = self.context
        micro_batch = context.config.optimizer.physical_batch_size
        return losses_in_micro_batches(
            lambda chunk: context.task.per_example_loss(context.scoring_model, chunk),
            batch,
            micro_batch if self.shape is None else self.shape.micro_batch,
        )

    def end_window(self, steps_done: int) -> None:
        shards = self.context.shards
        check_finite_weights([(shard.name, shard.tensor) for shard in shards], steps_done)

    def public_metrics(self, window: list[StepOutcome]) -> dict[str, float]:
        """The mean |g| over the window's steps (over each step's directions)."""
        gradients = [
            sum(map(abs, outcome.record.projected_gradients))
            / len(outcome.record.projected_gradients)
            for outcome in window
            if outcome.record
        ]
        return {"projected_gradient_abs": sum(gradients) / len(window)}

    def restore(self, table: pa.Table, meta: TrajectoryMeta) -> None:
        """θ rebuilt by replaying the rows; the public shuffle sampler moved past their
        batches (a Poisson sampler's fresh draws need no replay)."""
        replay_steps(self.context.perturber, table, meta)
        if self.context.config.privacy.sampler == "shuffle":  # public and seeded: replay it
            for _ in range(table.num_rows):
                self.sampler.next_batch()
