"""The typed record of a finished run (``RunSummary``), written to summary.json and read back.

Two layouts build it: the single-process run and rank 0 of a Ray Train run (which adds its
layout's figures). Built from the run's context, its loop and its evaluations, so both share
one schema.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from privzo.layouts.context import RunContext
from privzo.models.loading import model_parameters
from privzo.privacy.adjacency import record_fields
from privzo.results import RecordKeys
from privzo.rundir.files import read_json_object, write_json_atomically
from privzo.tasks.evaluation import Evaluation
from privzo.tracking import Tracker


@dataclass
class RunSummary(RecordKeys):
    """The record of a finished run, written to summary.json (``to_dict``): scores before and
    after, the privacy it spent, sizes, and resource figures (None in a private run without
    diagnostics: see ``resource_figures``). ``extra`` holds what the layout and the caller add
    (validation scores, a distributed layout's figures, a search trial's selection score)."""

    model: str
    task: str
    algorithm: str
    metric: str
    metric_before: float | None
    metric_after: float
    scores: dict[str, float | None]  # every metric's "<name>_before" and "<name>_after"
    private: bool
    epsilon: float | None
    epsilon_target: float | None
    delta: float | None
    noise_multiplier: float | None
    mechanism: str | None
    mechanism_parameters: dict[str, Any] | None
    accountant: str | None
    adjacency: str | None  # what epsilon and delta hold under ("add-remove")
    replace_one_epsilon: float | None  # the whole release, N included (privacy.adjacency)
    replace_one_delta: float | None
    sample_rate: float
    expected_batch_size: float
    pad_to: str  # task.pad_to as run: "max_length" (public shapes) or "batch"
    max_batch_size: int | None  # the rows of each worker's padded batch (pad_to="max_length")
    truncation_delta: float | None  # the part of delta truncated Poisson draws take
    clip: float | None
    steps: int
    resumed_steps: int  # replayed from an earlier attempt (resume)
    train_examples: int
    test_examples: int
    skipped_rows: int | None  # None in a private run: a count over private rows
    trainable_parameters: int
    model_parameters: int
    eval_time_s: float | None
    peak_memory_mb: float | None
    step_peak_memory_mb: float | None
    mean_step_time_s: float | None  # None: resumed at the end
    wall_time_s: float | None
    nonfinite_differences: int | None
    empty_batches: int | None
    device: str
    dtype: str
    tracking_run_id: str | None
    extra: dict[str, Any] = field(default_factory=dict)

    def add(self, values: dict[str, Any]) -> None:
        """Add (or, for a field of its own such as a layout's ``peak_memory_mb``, replace)
        summary values."""
        for key, value in values.items():
            if key in _OWN_FIELDS:
                setattr(self, key, value)
            else:
                self.extra[key] = value

    def to_dict(self) -> dict[str, Any]:
        """summary.json's content: the fields in order, each score under its own key."""
        record: dict[str, Any] = {}
        for name in _FIELDS:
            value = getattr(self, name)
            if name in ("scores", "extra"):
                record.update(value)
            else:
                record[name] = value
        return record

    def final_metrics(self) -> dict[str, float]:
        return final_metrics(self.to_dict())

    def lines(self, output_dir: Path) -> list[str]:
        """The summary as the console shows it (``summary_lines``)."""
        return summary_lines(self.to_dict(), output_dir)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> RunSummary:
        """The summary ``to_dict`` wrote: its own fields, every "<name>_before" and
        "<name>_after" score, and the rest as ``extra``; a missing field is a ``KeyError``."""
        values = {name: record[name] for name in _OWN_FIELDS}
        scores = {key: value for key, value in record.items() if _is_score(key)}
        extra = {key: value for key, value in record.items() if _is_extra(key)}
        return cls(**values, scores=scores, extra=extra)


@dataclass(frozen=True)
class RunRecords:
    """What a finished run leaves besides its config: the summary, the privacy state, and the
    trajectory where a Ray Train rank returned it (a single process writes its own as it goes)."""

    summary: RunSummary
    privacy: dict[str, Any]
    trajectory: bytes | None = None


def read_summary(path: Path) -> RunSummary | None:
    """The summary in ``path``, or None when it is missing, unreadable or not a whole run's
    (an interrupted write, another file): such a directory holds no finished run."""
    record = read_json_object(path)
    if record is None:
        return None
    try:
        return RunSummary.from_dict(record)
    except (KeyError, TypeError):
        return None


def write_summary(path: Path, summary: RunSummary) -> None:
    write_json_atomically(path, summary.to_dict())


def summary_record(
    context: RunContext,
    loop: Any,  # a training loop of privzo.algorithms
    tracker: Tracker,
    before: Evaluation | None,
    after: Evaluation,
    started: float,
) -> RunSummary:
    """The summary of a finished run (``RunSummary``) from its context, loop and evaluations."""
    config, plan = context.config, context.plan
    metric = context.task.metric
    epsilon = loop.ledger.epsilon_spent if loop.ledger else None
    scores: dict[str, float | None] = {}
    for name, value in after[0].items():
        scores[f"{name}_before"] = before[0][name] if before else None
        scores[f"{name}_after"] = value
    return RunSummary(
        model=config.model.name_or_path,
        task=config.task.name,
        algorithm=config.optimizer.algorithm,
        metric=metric,
        metric_before=before[0][metric] if before else None,
        metric_after=after[0][metric],
        scores=scores,
        private=plan.private,
        epsilon=epsilon,
        epsilon_target=config.privacy.epsilon if plan.private else None,
        delta=plan.delta,
        noise_multiplier=plan.noise_multiplier,
        mechanism=plan.mechanism,
        mechanism_parameters=plan.noise_parameters,
        accountant=plan.accountant,
        **record_fields(epsilon, plan.delta),
        sample_rate=plan.sample_rate,
        expected_batch_size=plan.expected_batch_size,
        pad_to=config.pad_to,
        max_batch_size=plan.max_batch_size,
        truncation_delta=plan.truncation_delta if plan.private else None,
        clip=config.privacy.clip if plan.private else None,
        steps=loop.resumed_steps + len(loop.step_times),
        resumed_steps=loop.resumed_steps,
        train_examples=len(context.train),
        test_examples=len(context.test),
        skipped_rows=None if plan.private else context.skipped_rows,
        trainable_parameters=context.trainable_parameters,
        model_parameters=model_parameters(context.scoring_model),
        **resource_figures(loop, after, started),
        nonfinite_differences=loop.nonfinite if loop.log_diagnostics else None,
        empty_batches=loop.empty_batches if loop.log_diagnostics else None,
        device=context.loaded.device.type,
        dtype=config.model.dtype,
        tracking_run_id=tracker.run_id,
    )


_FIELDS = tuple(item.name for item in fields(RunSummary))
_OWN_FIELDS = frozenset(_FIELDS) - {"scores", "extra"}


def _is_score(key: str) -> bool:
    return key not in _OWN_FIELDS and key.endswith(("_before", "_after"))


def _is_extra(key: str) -> bool:
    return key not in _OWN_FIELDS and not _is_score(key)


RESOURCE_FIGURES = (
    "eval_time_s",
    "peak_memory_mb",
    "step_peak_memory_mb",
    "mean_step_time_s",
    "wall_time_s",
)


def resource_figures(loop: Any, after: Evaluation, started: float) -> dict[str, Any]:
    """Peak memory and times, or None for each in a private run without diagnostics.

    Batches are padded to their longest example and an empty Poisson batch skips the forwards,
    so these figures follow which (and how many) records were sampled; the accountant does not
    cover them. Generation's evaluation time follows the trained model's answers.
    """
    if not loop.log_diagnostics:
        return dict.fromkeys(RESOURCE_FIGURES)
    times = loop.step_times
    return {
        "eval_time_s": after[1],
        "peak_memory_mb": loop.peak_mb,
        "step_peak_memory_mb": loop.step_peak_mb,
        "mean_step_time_s": sum(times) / len(times) if times else None,  # None: resumed at the end
        "wall_time_s": time.perf_counter() - started,
    }


def final_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's numbers as ``final_*`` tracker metrics (scores, ε, sizes, resources)."""
    scores = [
        key
        for key in summary
        if key.endswith(("_before", "_after")) or key.startswith(("validation_", "selection_"))
    ]
    keys = (
        *scores,
        "eval_time_s",
        "epsilon",
        "delta",
        "replace_one_epsilon",
        "replace_one_delta",
        "noise_multiplier",
        "model_parameters",  # a metric too, so MLflow's charts can put model size on an axis
        "peak_memory_mb",
        "step_peak_memory_mb",
        "mean_step_time_s",
        "wall_time_s",
    )
    return {
        f"final_{key}": float(summary[key])
        for key in keys
        if isinstance(summary.get(key), (int, float)) and not isinstance(summary[key], bool)
    }


SUMMARY_HEAD = ("algorithm",)
SUMMARY_TAIL = (
    "epsilon",
    "delta",
    "adjacency",
    "replace_one_epsilon",
    "replace_one_delta",
    "noise_multiplier",
    "accountant",
    "steps",
    "mean_step_time_s",
    "peak_memory_mb",
    "tracking_run_id",
)


def summary_lines(summary: Mapping[str, Any], output_dir: Path) -> list[str]:
    """A finished run's summary as the console shows it: the task's own metrics before and
    after (accuracy, or exact match and F1), the privacy spent and the figures that were
    measured; a value the run did not record (None) is left out, not printed as None."""
    scores = [key for key in summary if _is_task_score(key)]
    keys = [*SUMMARY_HEAD, *scores, *SUMMARY_TAIL]
    shown = {key: summary[key] for key in keys if summary.get(key) is not None}
    width = max(map(len, shown), default=0)
    lines = [f"{key:<{width}}  {_show(value)}" for key, value in shown.items()]
    return [*lines, f"results in {output_dir}"]


def _is_task_score(key: str) -> bool:
    """A task metric's score before or after training (``accuracy_after``, ``f1_before``); the
    primary metric's copies (``metric_before``) and validation scores are not repeated."""
    return key.endswith(("_before", "_after")) and not key.startswith(
        ("metric_", "validation_", "selection_")
    )


def _show(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
