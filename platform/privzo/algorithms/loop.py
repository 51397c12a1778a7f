"""The one training loop: every algorithm's steps run in its windows.

Windows of ``tracking.log_every`` steps; each window's privacy cost is booked in the ledger
before it runs (so no step can overspend), its ε comes from a curve computed off the training
thread, and its metrics are logged after it, public ones always, data-dependent ones only where
the run releases diagnostics. After a window, in this order: the saver keeps its steps, its
metrics are logged, then the caller's ``after_window`` hook runs; all are given at construction.
The algorithm supplies a stepper (``privzo.algorithms.stepper``); a Ray Train rank drives the
same loop with a stepper that samples its share and all-reduces.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
from tqdm.auto import tqdm

from privzo.algorithms.stepper import StepMeter, StepOutcome, Stepper
from privzo.layouts.context import RunContext
from privzo.memory import PeakMemory
from privzo.privacy.curve import EpsilonCurve
from privzo.privacy.plan import make_epsilon_curve, make_ledger
from privzo.tracking import Tracker
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder

StepperFactory = Callable[[RunContext, StepMeter], Stepper]
AfterWindow = Callable[[RunContext, int, dict[str, float]], None]

EPSILON_METRIC = "epsilon_spent"
WINDOW_METRIC = "learning_rate"  # logged at every window's end, private run or not


class WindowSaver(Protocol):
    """What keeps a run's steps as it goes, so a window is kept before anything of it is
    released: the run directory (``privzo.rundir.progress``) or a Ray Train checkpoint
    (``privzo.distributed.worker``)."""

    def start(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        """Before the first step of this attempt (after an earlier one's are restored)."""

    def window(self, end: WindowEnd) -> None:
        """After a window's steps, before its metrics are logged."""


@dataclass(frozen=True)
class WindowEnd:
    """A window just run: the loop and its trajectory so far, the steps done, its metrics."""

    loop: TrainingLoop
    recorder: TrajectoryRecorder
    steps_done: int
    metrics: dict[str, float]


class TrainingLoop:
    """Windows, privacy booking, hooks and metrics around an algorithm's stepper; holds the
    figures the run's record reads (``privzo.rundir.summary``)."""

    def __init__(
        self,
        context: RunContext,
        tracker: Tracker,
        memory: PeakMemory,
        make_stepper: StepperFactory,
        *,
        saver: WindowSaver | None = None,
    ) -> None:
        """``saver`` keeps the steps (a single run's directory, a distributed rank's
        checkpoints); the caller's ``after_window`` hook comes with the context's hooks."""
        self.context = context
        self.tracker = tracker
        self.memory = memory
        self.meter = StepMeter(memory)
        self.stepper = make_stepper(context, self.meter)
        self.saver = saver
        hooks = context.hooks
        self.after_window: AfterWindow | None = hooks.after_window if hooks is not None else None
        self.ledger = make_ledger(context.config, context.plan)
        self.private = context.plan.private
        self.peak_mb = 0.0  # of the whole run: steps and evaluations
        self.empty_batches = 0
        self.resumed_steps = 0  # replayed from an earlier attempt (``restore``)
        self.windows_done = 0  # steps done at the end of the last finished window
        self.latest_epsilon: float | None = None  # the ε curve's newest value, for the bar

    @property
    def records_trajectory(self) -> bool:
        return self.stepper.records_trajectory

    @property
    def step_times(self) -> list[float]:
        return self.meter.step_times

    @property
    def step_peak_mb(self) -> float:
        return self.meter.step_peak_mb

    @property
    def nonfinite(self) -> int:
        return self.stepper.nonfinite

    @property
    def log_diagnostics(self) -> bool:
        """Whether data-dependent diagnostics may be logged (see ``_window_metrics``)."""
        return self.context.config.releases_diagnostics

    def run(self, recorder: TrajectoryRecorder, progress: bool, start: int = 0) -> None:
        """All steps from ``start`` (> 0: resumed after that many, already in ``recorder`` and
        the ledger), between the stepper's ``start`` and ``finish``. A resumed run's curve
        first computes the ε its record lacks up to ``start`` (``lacking_epsilon``), logged as
        the live values are, on the curve's thread, so no step waits for it."""
        if self.saver is not None:  # a resumed attempt's unsent metrics are stored first
            self.saver.start(self, recorder)
        config = self.context.config
        steps, window_size = config.optimizer.steps, config.tracking.log_every
        algorithm = config.optimizer.algorithm
        bar = tqdm(total=steps, initial=start, desc=algorithm, disable=not progress)
        ends = [min(first + window_size, steps) for first in range(start, steps, window_size)]
        curve = make_epsilon_curve(self.context.plan, self._record_gaps(start) + ends)
        self.stepper.start()
        try:
            self._run_windows(recorder, bar, curve, start)
        finally:  # stopped or not, every finished window's ε is logged (its value is public)
            self.stepper.finish()
            if curve is not None:
                try:
                    self._add_epsilons(curve.take_through(self.windows_done), {}, -1)
                finally:
                    curve.close()
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
                outcome = self.step(step)
                if outcome.record is not None:
                    recorder.append(outcome.record)
                window.append(outcome)
                bar.update(1)
            end = window_steps[-1] + 1
            self.stepper.end_window(end)
            metrics = self._window_metrics(window)
            if curve is not None:
                self._add_epsilons(curve.take_ready(through=end), metrics, end)
            if self.saver is not None:  # kept before logging: no released window is lost
                self.saver.window(WindowEnd(self, recorder, end, metrics))
            self.tracker.log_metrics(metrics, step=end)
            self.tracker.flush()  # stored now: a store that stops taking them stops the run
            # released: a stop from here on still logs this window's ε (see ``run``), even
            # when the curve's thread had not computed it yet when the metrics went out
            self.windows_done = end
            if self.after_window is not None:
                self.after_window(self.context, end, metrics)
            bar.set_postfix(bar_postfix(metrics, self.latest_epsilon))

    def _record_gaps(self, start: int) -> list[int]:
        """The step counts up to ``start`` at which the tracking run lacks ε: an earlier
        attempt stopped (a kill, a store lost) before its curve's thread handed them out.
        Empty for a fresh run, a non-private one and a tracker that records nothing."""
        if start == 0 or not self.private or self.tracker.run_id is None:
            return []
        return lacking_epsilon(
            start,
            self.context.config.tracking.log_every,
            window_ends=self.tracker.metric_steps(WINDOW_METRIC),
            logged=self.tracker.metric_steps(EPSILON_METRIC),
        )

    def step(self, step: int) -> StepOutcome:
        outcome = self.stepper.step(step)
        self.peak_mb = max(self.peak_mb, self.meter.step_peak_mb)
        self.empty_batches += int(outcome.empty)
        return outcome

    def _add_epsilons(
        self, epsilons: list[tuple[int, float]], metrics: dict[str, float], end: int
    ) -> None:
        """The ε curve's values: this window's into ``metrics``, earlier windows' (computed
        while later steps ran) logged now at their own steps."""
        for step_count, epsilon in epsilons:
            self.latest_epsilon = epsilon  # the curve hands them out in step order
            if step_count == end:
                metrics[EPSILON_METRIC] = epsilon
            else:
                self.tracker.log_metrics({EPSILON_METRIC: epsilon}, step=step_count)

    def restore(
        self,
        recorder: TrajectoryRecorder,
        table: pa.Table,
        meta: TrajectoryMeta,
        ledger_state: dict[str, Any] | None = None,
    ) -> int:
        """Continue an earlier attempt from its trajectory: the stepper rebuilds its state
        (θ, the public sampler's position), the rows go back in ``recorder`` and each of them
        is booked once in the ledger. Returns the steps done (where ``run`` starts).

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
        self.stepper.restore(table, meta)
        recorder.append_rows(table)
        done = self.resumed_steps = table.num_rows
        if self.ledger is not None and done > accounted:
            self.ledger.book(done - accounted)
        return done

    def _window_metrics(self, window: list[StepOutcome]) -> dict[str, float]:
        """Public metrics always; diagnostics only where they release nothing private.

        In a private run the training loss, the step time (an empty Poisson batch skips both
        forwards, so per-window time reveals batch sizes) and the non-finite count all depend on
        the private data and are not covered by the accountant.
        """
        metrics: dict[str, Any] = {WINDOW_METRIC: window[-1].learning_rate}
        metrics.update(self.stepper.public_metrics(window))
        if self.log_diagnostics:
            metrics["step_time_s"] = sum(self.step_times[-len(window) :]) / len(window)
            metrics[self.stepper.nonfinite_metric] = float(self.nonfinite)
            losses = [o.mean_loss for o in window if not math.isnan(o.mean_loss)]
            if losses:
                metrics["train_loss"] = sum(losses) / len(losses)
        return metrics


def lacking_epsilon(
    start: int, log_every: int, window_ends: Iterable[int], logged: Iterable[int]
) -> list[int]:
    """The step counts up to ``start`` at which a resumed run's record lacks ε (not in
    ``logged``), in order: ``start`` and every window end of its earlier attempts, which are
    on the ``log_every`` grid of an attempt from step 0 or, for one resumed inside a window,
    in the record (``window_ends``), so a new record standing in for a lost one gets the grid."""
    if start <= 0:
        return []
    wanted = {*range(log_every, start, log_every), start}
    wanted.update(end for end in window_ends if 0 < end <= start)
    return sorted(wanted.difference(logged))


_SHOWN = (EPSILON_METRIC, "train_loss", "step_time_s")


def bar_postfix(metrics: dict[str, float], latest_epsilon: float | None) -> dict[str, str]:
    """The progress bar's figures after a window. The ε curve computes on its own thread, so a
    window's ε is often not ready when the window ends: the bar keeps the newest ε there is
    rather than dropping it."""
    shown = {key: f"{value:.3g}" for key, value in metrics.items() if key in _SHOWN}
    if EPSILON_METRIC not in shown and latest_epsilon is not None:
        shown[EPSILON_METRIC] = f"{latest_epsilon:.3g}"
    return shown
