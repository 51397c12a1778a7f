"""Validation of the counts and rates that sampling and accounting take.

A leaf, so the accountants (which the run config consults at load) need nothing that imports
the config.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["check_count", "check_sample_rate"]


def check_count(name: str, value: Any, minimum: int, maximum: int | None = None) -> int:
    """An integer argument within [minimum, maximum]; bools are not counts."""
    allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}={value!r} must be an integer {allowed}")
    if value < minimum or (maximum is not None and value > maximum):
        raise ValueError(f"{name}={value!r} is out of range; allowed: integer {allowed}")
    return int(value)


def check_sample_rate(sample_rate: float) -> float:
    """A Poisson sampling rate p in (0, 1]; p = 0 would train on nothing and claim no cost."""
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, (int, float, np.floating)):
        raise ValueError(f"sample_rate={sample_rate!r} must be a number in (0, 1]")
    if not (math.isfinite(sample_rate) and 0 < sample_rate <= 1):
        raise ValueError(f"sample_rate={sample_rate!r} is out of range; allowed: (0, 1]")
    return float(sample_rate)
