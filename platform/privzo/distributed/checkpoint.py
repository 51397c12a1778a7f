"""A run's checkpoint: the base-model reference, the trajectory so far and the ledger's state.

No weights: the trajectory replayed on the base weights rebuilds them bit for bit, in a few
kilobytes. No secret generator state either (a deliberate deviation from saving "generator
states"): whoever held a checkpoint with the noise generator's state could regenerate the noise
and subtract it. A resumed run draws its noise and Poisson batches from fresh OS entropy, which
is what a private run needs anyway; the public shuffle sampler is advanced to where it was.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from privzo.tracking import MetricPoint, is_metric_point
from privzo.zo.trajectory import (
    TrajectoryMeta,
    TrajectoryRecorder,
    read_trajectory,
)

TRAJECTORY = "trajectory.parquet"
STATE = "state.json"


@dataclass(frozen=True)
class RunState:
    """Where a run stands: steps done (all in the trajectory), the privacy ledger's state
    (``BudgetLedger.state_dict``: budget, accountant settings, steps accounted) and the metrics
    rank 0 had logged but not stored yet, this window's included (its tracker's buffer, which a
    kill drops): the attempt that resumes from the checkpoint stores those its run lacks."""

    model: str  # the base-model reference the trajectory applies to
    steps_done: int
    ledger: dict[str, Any] | None  # None for a non-private run
    unsent: tuple[MetricPoint, ...] = ()


def write_checkpoint(directory: Path, recorder: TrajectoryRecorder, state: RunState) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    assert len(recorder) == state.steps_done, "a checkpoint holds every step it claims"
    recorder.write(directory / TRAJECTORY)
    data = {**state.__dict__, "unsent": [asdict(point) for point in state.unsent]}
    (directory / STATE).write_text(json.dumps(data))


def read_checkpoint(directory: Path) -> tuple[pa.Table, TrajectoryMeta, RunState]:
    table, meta = read_trajectory(directory / TRAJECTORY)
    data = json.loads((directory / STATE).read_text())
    unsent = data.pop("unsent", [])  # none in a checkpoint written before it was kept
    if not isinstance(unsent, list) or not all(is_metric_point(point) for point in unsent):
        raise ValueError(
            f"checkpoint {str(directory)!r}: unsent must be a list of {{key, value, step}} "
            f"metrics, got {unsent!r}"
        )
    points = tuple(MetricPoint(p["key"], float(p["value"]), p["step"]) for p in unsent)
    state = RunState(**data, unsent=points)
    if table.num_rows != state.steps_done:
        raise ValueError(
            f"checkpoint {str(directory)!r}: {table.num_rows} trajectory rows for "
            f"{state.steps_done} steps"
        )
    return table, meta, state
