"""Which neighbouring training sets a released (ε, δ) holds for.

The accountants bound one record added or removed (add/remove adjacency, sensitivity C), and
σ is calibrated to the sampling rate q = B/N. A private run's records also state the training
set's size N (``train_examples``, q, and σ calibrated to it), and add/remove neighbours differ
in N, so the add/remove figure covers the trajectory and weights given N, not the whole release.
Under replace-one adjacency (one record swapped for another) neighbours share N, so stating it
costs nothing; a replacement is a removal followed by an addition, and group privacy over those
two add/remove steps turns (ε, δ) into (2ε, (1 + e^ε)·δ) for everything the run releases.
dp-accounting composes the Poisson-subsampled events under add/remove only, so this bound is
derived from the accounted figure rather than accounted directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TypedDict

__all__ = [
    "ADD_REMOVE",
    "REPLACE_ONE",
    "Guarantee",
    "GuaranteeFields",
    "record_fields",
    "replace_one",
]

ADD_REMOVE = "add-remove"
REPLACE_ONE = "replace-one"


@dataclass(frozen=True)
class Guarantee:
    """An (ε, δ) and the adjacency it holds under."""

    epsilon: float
    delta: float
    adjacency: str


class GuaranteeFields(TypedDict):
    """What a record states beside its add/remove ``epsilon`` and ``delta``."""

    adjacency: str | None
    replace_one_epsilon: float | None
    replace_one_delta: float | None


def replace_one(epsilon: float, delta: float) -> Guarantee:
    """The replace-one guarantee of a mechanism that is (ε, δ)-DP under add/remove adjacency:
    (2ε, (1 + e^ε)·δ) by group privacy over the removal and the addition (δ capped at 1)."""
    if epsilon < 0 or not 0 <= delta <= 1:
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got ({epsilon}, {delta})")
    grouped = 1.0 if epsilon > 700 else min(1.0, (1.0 + math.exp(epsilon)) * delta)
    return Guarantee(epsilon=2.0 * epsilon, delta=grouped, adjacency=REPLACE_ONE)


def record_fields(epsilon: float | None, delta: float | None) -> GuaranteeFields:
    """The keys a record adds beside its add/remove ``epsilon`` and ``delta``: the adjacency
    they hold under, and the replace-one pair that covers the whole release, the training set's
    size included; None for each where there is no guarantee (a non-private run)."""
    if epsilon is None or delta is None:
        return GuaranteeFields(adjacency=None, replace_one_epsilon=None, replace_one_delta=None)
    grouped = replace_one(epsilon, delta)
    return GuaranteeFields(
        adjacency=ADD_REMOVE, replace_one_epsilon=grouped.epsilon, replace_one_delta=grouped.delta
    )
