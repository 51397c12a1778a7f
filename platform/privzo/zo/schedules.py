"""Learning-rate schedules, by name."""

from __future__ import annotations

from collections.abc import Callable

Schedule = Callable[[int], float]


def constant(base: float, total_steps: int) -> Schedule:
    return lambda step: base


def linear(base: float, total_steps: int) -> Schedule:
    """Linear decay from ``base`` at step 0 to 0 after the last step."""
    return lambda step: base * (1.0 - step / total_steps)


SCHEDULES: dict[str, Callable[[float, int], Schedule]] = {"constant": constant, "linear": linear}


def make_schedule(name: str, base: float, total_steps: int) -> Schedule:
    if name not in SCHEDULES:
        raise ValueError(f"lr_schedule={name!r} is unknown; allowed: {sorted(SCHEDULES)}")
    return SCHEDULES[name](base, total_steps)
