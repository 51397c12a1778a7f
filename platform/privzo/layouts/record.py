"""A run's records: the files of its output directory and the summary written to summary.json.

The summary lives here, with the layouts and below the run pipeline, because two layouts write
it: the single-process run (``privzo.run``) and rank 0 of a Ray Train run
(``privzo.distributed.worker``, which adds its layout's figures). Built from the run's context,
its loop and its evaluations, it needs nothing above this layer, so both can share one schema
while every import still points down.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from privzo.config import ConfigError
from privzo.layouts.context import RunContext
from privzo.models.loading import model_parameters
from privzo.tasks.evaluation import Evaluation
from privzo.tracking import Tracker
from privzo.tracking.tags import ADAPTER_URI

SUMMARY_FILE = "summary.json"
TRAJECTORY_FILE = "trajectory.parquet"
CONFIG_FILE = "config.yaml"
PRIVACY_FILE = "privacy.json"  # the ledger's state: mechanism, σ, q, steps accounted, ε spent
MODEL_DIR = "model"
RUN_FILES = (SUMMARY_FILE, TRAJECTORY_FILE, CONFIG_FILE, PRIVACY_FILE)
RAY_STATE_DIR = "ray"  # a distributed run's Ray Train state and checkpoints (default storage)


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run's records (finished or not) unless asked to."""
    existing = [name for name in RUN_FILES if (output_dir / name).exists()]
    if existing and not overwrite:
        unfinished = (
            ""
            if SUMMARY_FILE in existing
            else (
                " of another config, or one that cannot resume (only zeroth-order runs of the "
                "same config resume)"
            )
        )
        raise ConfigError(
            f"--output-dir {str(output_dir)!r} already holds a"
            f"{'n unfinished' if unfinished else ''} run{unfinished} ({', '.join(existing)}); "
            "choose another directory (or pass --overwrite)"
        )


def prepare_output_dir(output_dir: Path) -> None:
    """Create the directory and clear an overwritten run's files, once the inputs are good,
    so a failing new run never sits next to an old summary that makes it look finished."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (output_dir / name).unlink(missing_ok=True)
    # an earlier distributed run's Ray state: its checkpoints hold that run's noised steps
    shutil.rmtree(output_dir / RAY_STATE_DIR, ignore_errors=True)


@dataclass
class RunSummary:
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
    sample_rate: float
    expected_batch_size: float
    clip: float | None
    steps: int
    resumed_steps: int  # replayed from an earlier attempt (resume)
    train_examples: int
    test_examples: int
    skipped_rows: int
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
        epsilon=loop.ledger.epsilon_spent if loop.ledger else None,
        epsilon_target=config.privacy.epsilon if plan.private else None,
        delta=plan.delta,
        noise_multiplier=plan.noise_multiplier,
        mechanism=plan.mechanism,
        mechanism_parameters=plan.noise_parameters,
        accountant=plan.accountant,
        sample_rate=plan.sample_rate,
        expected_batch_size=plan.expected_batch_size,
        clip=config.privacy.clip if plan.private else None,
        steps=loop.resumed_steps + len(loop.step_times),
        resumed_steps=loop.resumed_steps,
        train_examples=len(context.train),
        test_examples=len(context.test),
        skipped_rows=context.skipped_rows,
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


ADAPTER_VIEWS = ("lora", "prefix")  # views whose trained tensors are a peft adapter
PIPELINE_TASKS = {"causal": "text-generation", "masked": "fill-mask"}  # by the model's kind


def log_adapter_model(context: RunContext, tracker: Tracker) -> None:
    """A LoRA / prefix run's adapter as the tracker's transformers model, tagged with its URI
    (``tracker.log_adapter_model``): a local base (a directory, built-in models' included) is
    referenced by its path, a hub base by its id and revision. The adapter is the trajectory
    replayed onto public weights, so it releases nothing the trajectory does not."""
    if context.config.model.trainable not in ADAPTER_VIEWS:
        return
    loaded = context.loaded
    base_path = loaded.source if Path(loaded.source).is_dir() else None
    uri = tracker.log_adapter_model(
        context.model, loaded.tokenizer, PIPELINE_TASKS[loaded.kind], base_path
    )
    if uri is not None:
        tracker.set_tags({ADAPTER_URI: uri})
