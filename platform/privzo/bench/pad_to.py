"""``privzo bench pad-to``: CPU time per step of a run config with ``task.pad_to`` either way.

Batches of a public shape (``max_length``) cost the forwards of the whole bound at the task's
full length in every step; padding to the batch's longest member (``batch``) costs what was
drawn. Both cases run the real stepper of the config (its model, task, plan and sampler), one
after the other in this process, and each step's CPU time (``time.process_time``: every thread
of the process) is measured after a warm-up.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privzo.algorithms.config import PADDED_SHAPE_ALGORITHMS
from privzo.algorithms.stepper import StepMeter
from privzo.algorithms.zeroth_order import ZerothOrderStepper
from privzo.config.run import RunConfig
from privzo.memory import PeakMemory
from privzo.run import build_context

WARM_UP_STEPS = 2


@dataclass(frozen=True)
class PadToCase:
    """One padding's measured steps."""

    pad_to: str
    rows: int | None  # rows of every batch (max_length), None: as drawn
    length: int | None  # tokens of every row (max_length), None: the batch's longest
    steps: int
    median_cpu_s: float
    min_cpu_s: float
    max_cpu_s: float


@dataclass(frozen=True)
class PadToResult:
    """Both paddings of one config and the ratio of their median CPU times per step."""

    model: str
    expected_batch_size: float
    cases: tuple[PadToCase, ...]

    @property
    def ratio(self) -> float:
        """Median CPU time per step of max_length ÷ that of batch."""
        by_name = {case.pad_to: case.median_cpu_s for case in self.cases}
        return by_name["max_length"] / by_name["batch"]

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "max_length_over_batch": self.ratio}

    def table(self) -> str:
        lines = [
            f"{self.model}, expected batch size {self.expected_batch_size:g}: CPU time per step",
            f"{'pad_to':<11} {'rows':>5} {'length':>6} {'steps':>5} {'median s':>9} "
            f"{'min s':>8} {'max s':>8}",
        ]
        for case in self.cases:
            rows = "drawn" if case.rows is None else str(case.rows)
            length = "longest" if case.length is None else str(case.length)
            lines.append(
                f"{case.pad_to:<11} {rows:>5} {length:>6} {case.steps:>5} "
                f"{case.median_cpu_s:>9.4f} {case.min_cpu_s:>8.4f} {case.max_cpu_s:>8.4f}"
            )
        lines.append(f"max_length / batch (medians): {self.ratio:.2f}")
        return "\n".join(lines)


def pad_to_benchmark(config: RunConfig, cache_dir: Path, steps: int) -> PadToResult:
    """Time ``steps`` steps of ``config`` with ``task.pad_to`` = max_length, then batch."""
    if steps < 1:
        raise ValueError(f"--steps={steps}: allowed: 1 or more")
    if config.optimizer.algorithm not in PADDED_SHAPE_ALGORITHMS:
        raise ValueError(
            f"optimizer.algorithm={config.optimizer.algorithm!r} cannot pad to max_length; "
            f"allowed: {list(PADDED_SHAPE_ALGORITHMS)}"
        )
    cases = []
    expected = 0.0
    for pad_to in ("max_length", "batch"):
        case_config = _with_padding(config, pad_to)
        context = build_context(case_config, cache_dir, progress=False)
        expected = context.plan.expected_batch_size
        cases.append(_measure(context, pad_to, steps))
    return PadToResult(config.model.name_or_path, expected, tuple(cases))


def _with_padding(config: RunConfig, pad_to: str) -> RunConfig:
    """``config`` with ``task.pad_to`` set, untracked (a benchmark records nothing)."""
    values = config.model_dump()
    values["task"]["pad_to"] = pad_to
    values["tracking"]["backend"] = "none"
    if pad_to == "batch":
        values["privacy"]["max_batch_size"] = None
    return RunConfig.model_validate(values)


def _measure(context: Any, pad_to: str, steps: int) -> PadToCase:
    stepper = ZerothOrderStepper(context, StepMeter(PeakMemory()))
    stepper.start()
    times = []
    try:
        for step in range(WARM_UP_STEPS + steps):
            started = time.process_time()
            stepper.step(step)
            if step >= WARM_UP_STEPS:
                times.append(time.process_time() - started)
    finally:
        stepper.finish()
    shape = stepper.shape
    return PadToCase(
        pad_to=pad_to,
        rows=shape.rows if shape else None,
        length=shape.length if shape else None,
        steps=steps,
        median_cpu_s=statistics.median(times),
        min_cpu_s=min(times),
        max_cpu_s=max(times),
    )
