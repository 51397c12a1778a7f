"""Tune's automatic timing fields are withheld from the records of a private search's trials.

Tune stamps every reported result with how long the trial has run (``time_this_iter_s``,
``time_total_s``, ``time_since_restore``) and when (``timestamp``, ``date``). For a private
trial those durations depend on which records were sampled (an empty Poisson batch skips both
forwards; batches are padded to their longest example), and the guarantee does not cover them.
Tune lets a callback edit a result in place before it is logged (``result.json``,
``progress.csv``) or kept as the trial's last result and metric summary (the experiment state),
so the first callback of a private search removes them there.

Tune also keeps when each trial started and last reported (its experiment state) and names each
trial's folder after the moment it was created; at one trial at a time either gives the trials'
durations. A private search's trials start and report at the public time
(``privzo.tracking.clock``) instead, and their folders are named by trial id alone.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback

from privzo.tracking.clock import PUBLIC_TIME_MS

__all__ = ["TIMING_FIELDS", "WithholdTiming", "public_trial_dirname", "withhold_timing"]

PUBLIC_TIME_S = PUBLIC_TIME_MS / 1000

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

    def on_trial_start(self, iteration: int, trials: list, trial: Any, **info):
        # Tune marks the trial RUNNING after this and keeps a start time already set
        trial.run_metadata.start_time = PUBLIC_TIME_S

    def on_step_begin(self, iteration: int, trials: list, **info):
        public_report_times(trials)

    def on_trial_complete(self, iteration: int, trials: list, trial: Any, **info):
        public_report_times(trials)

    def on_trial_error(self, iteration: int, trials: list, trial: Any, **info):
        public_report_times(trials)

    def on_experiment_end(self, trials: list, **info):
        public_report_times(trials)


def public_report_times(trials: list) -> None:
    """Give every trial's start and last report the public time: Tune stamps the last report
    with the clock after the callbacks have seen it, so this runs again at each step and at
    each trial's end, before the experiment state is written for good."""
    for trial in trials:
        metadata = trial.run_metadata  # setting a field clears its cached JSON
        if metadata.start_time is not None:
            metadata.start_time = PUBLIC_TIME_S
        if metadata.last_result_time != float("-inf"):  # -inf: no report yet
            metadata.last_result_time = PUBLIC_TIME_S


def public_trial_dirname(trial: Any) -> str:
    """A trial's folder name without Tune's creation date: the trainable and the trial id."""
    return f"{trial.trainable_name}_{trial.trial_id}"
