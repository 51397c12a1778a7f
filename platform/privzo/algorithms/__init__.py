"""Training algorithms, beneath the run pipeline: one loop per family, chosen by name.

``zeroth_order`` holds the loop of DPZero / DP-ZO / MeZO; the baselines (first-order with
Opacus, DPGD-0th) still live in ``privzo.baselines``, at this same layer.
"""

from __future__ import annotations

from typing import Any

from privzo.algorithms.zeroth_order import TrainingLoop
from privzo.baselines.dpgd import DpgdLoop
from privzo.baselines.first_order import FirstOrderLoop
from privzo.config import FIRST_ORDER_ALGORITHMS
from privzo.layouts.context import RunContext
from privzo.memory import PeakMemory
from privzo.tracking import Tracker

__all__ = ["TrainingLoop", "make_loop", "records_trajectory"]


def records_trajectory(algorithm: str) -> bool:
    """Whether the algorithm's run writes a trajectory (zeroth-order: DPZero, DP-ZO, MeZO),
    which replay, and a resumed run, rebuild θ from."""
    return algorithm not in FIRST_ORDER_ALGORITHMS and algorithm != "dpgd-0th"


def make_loop(context: RunContext, tracker: Tracker, memory: PeakMemory) -> Any:
    """The loop of the algorithm's family: zeroth-order (``TrainingLoop``) or a baseline."""
    algorithm = context.config.optimizer.algorithm
    if algorithm in FIRST_ORDER_ALGORITHMS:
        return FirstOrderLoop(context, tracker, memory)
    if algorithm == "dpgd-0th":
        return DpgdLoop(context, tracker, memory)
    return TrainingLoop(context, tracker, memory)
