"""Tune's automatic timing fields are withheld from the records of a private search's trials.

Tune stamps every reported result with how long the trial has run (``time_this_iter_s``,
``time_total_s``, ``time_since_restore``) and when (``timestamp``, ``date``). For a private
trial those durations depend on which records were sampled (an empty Poisson batch skips both
forwards; batches are padded to their longest example), and the guarantee does not cover them.
Tune lets a callback edit a result in place before it is logged (``result.json``,
``progress.csv``) or kept as the trial's last result and metric summary (the experiment state),
so the first callback of a private search removes them there.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

__all__ = ["TIMING_FIELDS", "WithholdTiming", "withhold_timing"]

TIMING_FIELDS = ("time_this_iter_s", "time_total_s", "time_since_restore", "timestamp", "date")


def withhold_timing(result: dict[str, Any]) -> dict[str, Any]:
    """Remove Tune's timing fields from ``result`` in place (and return it)."""
    for field in TIMING_FIELDS:
        result.pop(field, None)
    return result


class WithholdTiming(Callback):
    """Strips the timing fields from every result before Tune's loggers and the trial see it.

    It must come first in ``RunConfig(callbacks=[...])``: callbacks run in list order, and the
    trial keeps the result (edited) after all of them."""

    def on_trial_result(self, iteration: int, trials: list, trial: Any, result: dict, **info):
        withhold_timing(result)
