"""What an algorithm gives the one training loop: a stepper (start, step, finish).

The loop (``privzo.algorithms.loop``) owns everything around a step: windows, privacy booked
before each window, the ε curve, hooks, metrics and the figures the run's record reads. A
stepper owns the step itself and the state it needs (sampler, estimator, optimizer, noise).
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from privzo.memory import PeakMemory

if TYPE_CHECKING:
    import pyarrow as pa

    from privzo.layouts.context import RunContext
    from privzo.zo.step import StepRecord
    from privzo.zo.trajectory import TrajectoryMeta


@dataclass(frozen=True)
class StepOutcome:
    """What one step reports to the loop (the loss is private: a diagnostic only); ``record``
    is the trajectory row of a step that writes one (zeroth-order), else None."""

    learning_rate: float
    mean_loss: float
    empty: bool
    record: StepRecord | None = None


class StepMeter:
    """Time and peak memory of the measured part of each step (what a stepper measures is
    its own: the zeroth-order step times its two forwards and update, not the sampling)."""

    def __init__(self, memory: PeakMemory) -> None:
        self.memory = memory
        self.step_times: list[float] = []
        self.step_peak_mb = 0.0

    @contextmanager
    def measure(self) -> Iterator[None]:
        self.memory.reset()
        started = time.perf_counter()
        yield
        self.step_times.append(time.perf_counter() - started)
        self.step_peak_mb = max(self.step_peak_mb, self.memory.peak_mb())


class Stepper(ABC):
    """One algorithm's step, driven by ``TrainingLoop``."""

    records_trajectory = False  # True: each step's record is a trajectory row (replay, resume)
    nonfinite_metric = "nonfinite_losses"  # the diagnostic's name in the window metrics

    def __init__(self, context: RunContext, meter: StepMeter) -> None:
        self.context = context
        self.meter = meter
        self.nonfinite = 0  # non-finite losses (or differences) counted as 0 so far

    def start(self) -> None:
        """Prepare training state (hooks, optimizers, buffers) just before the first step."""
        return None  # nothing by default

    def finish(self) -> None:
        """Undo ``start`` so evaluation and saving see the plain model."""
        return None  # nothing by default

    @abstractmethod
    def step(self, step: int) -> StepOutcome: ...

    def public_metrics(self, window: list[StepOutcome]) -> dict[str, float]:
        """The stepper's own public metrics of a window (beyond the learning rate and ε)."""
        return {}

    def end_window(self, steps_done: int) -> None:
        """Checks at the end of each window, before its metrics are released."""
        return None  # nothing by default

    def restore(self, table: pa.Table, meta: TrajectoryMeta) -> None:
        """Rebuild the state of an earlier attempt from its trajectory rows (see
        ``TrainingLoop.restore``); only a stepper that records a trajectory can."""
        raise NotImplementedError(f"{type(self).__name__} keeps no trajectory to resume from")
