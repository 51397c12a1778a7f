"""Evaluating a model on a task's splits, as every layout does it.

Here, below the layouts, so the single-process run and a Ray Train rank measure and withhold
the same way.
"""

from __future__ import annotations

import time
from typing import Any

import torch

from privzo.memory import PeakMemory

Evaluation = tuple[dict[str, float], float]  # (test metrics, seconds)


def timed_evaluation(
    task: Any, model: torch.nn.Module, examples: Any, batch_size: int, memory: PeakMemory
) -> Evaluation:
    """The task's metrics on ``examples`` and their time; resets the peak mark first so the
    evaluation's own peak can be read after it."""
    memory.reset()
    started = time.perf_counter()
    metrics = task.evaluate(model, examples, batch_size)
    return metrics, time.perf_counter() - started


def validation_metrics(
    task: Any, model: torch.nn.Module, validation: Any, batch_size: int, releases: bool
) -> dict[str, float]:
    """Metrics on the validation split, where releasing them costs no privacy.

    The split is part of the private training data, so a private run reports it only with
    ``tracking.log_private_diagnostics`` (outside the guarantee): ``releases`` says whether it
    may (``RunConfig.releases_diagnostics``).
    """
    if validation is None or not releases:
        return {}
    return task.evaluate(model, validation, batch_size)
