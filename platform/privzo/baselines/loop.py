"""The run-loop shell shared by the baselines: windows, privacy booking, metrics, timing.

It has the attributes the run's record (``privzo.layouts.record``) reads from a loop
(``step_times``, ``peak_mb``, ``step_peak_mb``, ``ledger``, ``nonfinite``, ``empty_batches``,
``private``, ``log_diagnostics``, ``records_trajectory``) and the same window discipline as the
zeroth-order ``TrainingLoop``: each window's privacy cost is booked before it runs.
"""

from __future__ import annotations

import math
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from privzo.memory import PeakMemory
from privzo.privacy.plan import make_ledger, make_sampler
from privzo.tracking import Tracker
from privzo.zo.schedules import make_schedule

if TYPE_CHECKING:
    from privzo.layouts.context import RunContext


@dataclass(frozen=True)
class BaselineStep:
    """What one baseline step reports to the loop (the loss is private: a diagnostic only)."""

    learning_rate: float
    mean_loss: float
    empty: bool


def trainable_parameters(context: RunContext) -> list[torch.nn.Parameter]:
    """The view's trainable ``nn.Parameter`` objects (the shards hold flat views of them)."""
    pointers = {shard.tensor.data_ptr() for shard in context.shards}
    found, seen = [], set()
    for parameter in context.model.parameters():
        pointer = parameter.data_ptr()
        if pointer in pointers and pointer not in seen:
            found.append(parameter)
            seen.add(pointer)
    assert len(found) == len(pointers), "every trainable shard is a parameter of the model"
    return found


class BaselineLoop(ABC):
    """Samples through ``step``, books privacy per window, logs public metrics."""

    records_trajectory = False  # a baseline's update is not a seed + scalar: no replay

    def __init__(self, context: RunContext, tracker: Tracker, memory: PeakMemory) -> None:
        self.context = context
        self.tracker = tracker
        self.memory = memory
        config, plan = context.config, context.plan
        self.sampler = make_sampler(config, plan, len(context.train))
        self.ledger = make_ledger(config, plan)
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )
        self.private = plan.private
        self.step_times: list[float] = []
        self.step_peak_mb = 0.0
        self.peak_mb = 0.0
        self.nonfinite = 0
        self.empty_batches = 0
        self.resumed_steps = 0  # baselines do not resume

    @property
    def log_diagnostics(self) -> bool:
        return self.context.config.releases_diagnostics

    def run(self, recorder: Any, progress: bool, start: int = 0) -> None:
        """``recorder`` (the trajectory) stays empty: see ``records_trajectory``; a baseline
        keeps no trajectory to resume from, so it always starts at step 0."""
        assert start == 0, "baselines do not resume"
        config = self.context.config
        steps, window_size = config.optimizer.steps, config.tracking.log_every
        bar = tqdm(total=steps, desc=config.optimizer.algorithm, disable=not progress)
        self.start()
        try:
            for first in range(0, steps, window_size):
                window_steps = range(first, min(first + window_size, steps))
                if self.ledger is not None:
                    self.ledger.book(len(window_steps))
                window = [self._timed_step(step) for step in window_steps]
                bar.update(len(window))
                metrics = self._window_metrics(window)
                self.tracker.log_metrics(metrics, step=window_steps[-1] + 1)
                hooks = self.context.hooks
                if hooks is not None and hooks.after_window is not None:
                    hooks.after_window(self.context, window_steps[-1] + 1, metrics)
        finally:
            self.finish()
            bar.close()

    def _timed_step(self, step: int) -> BaselineStep:
        self.memory.reset()
        started = time.perf_counter()
        outcome = self.step(step)
        self.step_times.append(time.perf_counter() - started)
        self.step_peak_mb = max(self.step_peak_mb, self.memory.peak_mb())
        self.peak_mb = max(self.peak_mb, self.step_peak_mb)
        self.empty_batches += int(outcome.empty)
        return outcome

    @abstractmethod
    def start(self) -> None:
        """Prepare training state (hooks, optimizers) just before the first step."""

    @abstractmethod
    def finish(self) -> None:
        """Undo ``start`` so evaluation and saving see the plain model."""

    @abstractmethod
    def step(self, step: int) -> BaselineStep: ...

    def _window_metrics(self, window: list[BaselineStep]) -> dict[str, float]:
        """Public metrics always; loss and timing only where they release nothing private."""
        metrics = {"learning_rate": window[-1].learning_rate}
        if self.ledger is not None:
            metrics["epsilon_spent"] = self.ledger.epsilon_spent
        if self.log_diagnostics:
            metrics["step_time_s"] = sum(self.step_times[-len(window) :]) / len(window)
            metrics["nonfinite_losses"] = float(self.nonfinite)
            losses = [s.mean_loss for s in window if not math.isnan(s.mean_loss)]
            if losses:
                metrics["train_loss"] = sum(losses) / len(losses)
        return metrics
