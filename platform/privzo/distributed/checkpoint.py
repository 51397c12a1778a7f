"""A run's checkpoint: the base-model reference, the trajectory so far and the ledger's state.

No weights: the trajectory replayed on the base weights rebuilds them bit for bit, in a few
kilobytes. No secret generator state either (a deliberate deviation from saving "generator
states"): whoever held a checkpoint with the noise generator's state could regenerate the noise
and subtract it. A resumed run draws its noise and Poisson batches from fresh OS entropy, which
is what a private run needs anyway; the public shuffle sampler is advanced to where it was.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa

from privzo.zo.trajectory import (
    TrajectoryMeta,
    TrajectoryRecorder,
    read_trajectory,
)

TRAJECTORY = "trajectory.parquet"
STATE = "state.json"


@dataclass(frozen=True)
class RunState:
    """Where a run stands: steps done (all in the trajectory) and the privacy ledger's state
    (``BudgetLedger.state_dict``: budget, accountant settings, steps accounted)."""

    model: str  # the base-model reference the trajectory applies to
    steps_done: int
    ledger: dict[str, Any] | None  # None for a non-private run


def write_checkpoint(directory: Path, recorder: TrajectoryRecorder, state: RunState) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    assert len(recorder) == state.steps_done, "a checkpoint holds every step it claims"
    recorder.write(directory / TRAJECTORY)
    (directory / STATE).write_text(json.dumps(state.__dict__))


def read_checkpoint(directory: Path) -> tuple[pa.Table, TrajectoryMeta, RunState]:
    table, meta = read_trajectory(directory / TRAJECTORY)
    state = RunState(**json.loads((directory / STATE).read_text()))
    if table.num_rows != state.steps_done:
        raise ValueError(
            f"checkpoint {str(directory)!r}: {table.num_rows} trajectory rows for "
            f"{state.steps_done} steps"
        )
    return table, meta, state
