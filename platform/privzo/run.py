"""One fine-tuning run, end to end: validate → plan privacy → load → train → evaluate → record.

Everything that can be wrong with the input (config, files, model, an unreachable budget) is
checked before the first forward pass and before anything is written, so a bad run costs nothing
and erases nothing.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from privzo.baselines.dpgd import check_dpgd_size
from privzo.config import FIRST_ORDER_ALGORITHMS, ConfigError, RunConfig, dump_config
from privzo.dirlock import locks_output_dir
from privzo.memory import PeakMemory
from privzo.models.loading import (
    LoadedModel,
    apply_view,
    load_model,
    peek_kind,
    position_limit,
    save_weights,
)
from privzo.models.peft_views import unwrap_for_scoring
from privzo.privacy import (
    BudgetLedger,
    PoissonSampler,
    Sampler,
    ShuffleSampler,
    calibrate_noise_multiplier,
    check_feasible,
    make_accountant,
)
from privzo.tasks import (
    Task,
    build_task,
    load_splits,
    resolve_task_config,
)
from privzo.tracking import Tracker, connect_tracker, make_tracker
from privzo.zo.directions import DirectionSampler, resolve_generator, step_seed
from privzo.zo.estimators import GradientEstimator, make_estimator
from privzo.zo.perturbation import Perturber, make_perturber
from privzo.zo.schedules import make_schedule
from privzo.zo.step import StepRecord, zo_step
from privzo.zo.sweeps import ParameterShard, full_shards
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder

logger = logging.getLogger(__name__)
SUMMARY_FILE = "summary.json"
TRAJECTORY_FILE = "trajectory.parquet"
CONFIG_FILE = "config.yaml"
MODEL_DIR = "model"


@dataclass(frozen=True)
class PrivacyPlan:
    """How a run meets its guarantee; settled before any compute."""

    private: bool
    sample_rate: float
    expected_batch_size: float
    noise_multiplier: float | None = None
    epsilon: float | None = None  # what T steps at this σ spend (≤ the budget)
    delta: float | None = None
    mechanism: str | None = None
    accountant: str | None = None
    noise_parameters: dict[str, Any] | None = None  # a parametrised mechanism's (lmo)


def plan_privacy(config: RunConfig, dataset_size: int) -> PrivacyPlan:
    """Calibrate σ to (ε, δ) for this sampling rate and T, or check a fixed σ meets it."""
    batch_size = config.optimizer.batch_size
    if batch_size > dataset_size:
        raise ConfigError(
            f"optimizer.batch_size={batch_size} exceeds the {dataset_size} training examples; "
            f"allowed: 1..{dataset_size}"
        )
    sample_rate = batch_size / dataset_size
    if not config.optimizer.is_private:
        return PrivacyPlan(private=False, sample_rate=sample_rate, expected_batch_size=batch_size)
    privacy, steps = config.privacy, config.optimizer.steps
    common = dict(
        sample_rate=sample_rate,
        steps=steps,
        delta=privacy.delta,
        mechanism=config.mechanism,
        accountant=privacy.accountant,
        noise_parameters=mechanism_parameters(config),
    )
    noise_multiplier = privacy.noise_multiplier
    try:
        if noise_multiplier is None:
            noise_multiplier = calibrate_noise_multiplier(epsilon=privacy.epsilon, **common)
        epsilon = check_feasible(
            noise_multiplier=noise_multiplier, epsilon=privacy.epsilon, **common
        )
    except ValueError as error:  # the accountant's reason, reported as a config error
        field = "privacy.noise_multiplier" if privacy.noise_multiplier else "privacy"
        value = f"={privacy.noise_multiplier}" if privacy.noise_multiplier else ""
        raise ConfigError(f"{field}{value}: settings cannot be met: {error}") from None
    return PrivacyPlan(
        private=True,
        sample_rate=sample_rate,
        expected_batch_size=float(batch_size),
        noise_multiplier=noise_multiplier,
        epsilon=epsilon,
        delta=privacy.delta,
        mechanism=config.mechanism,
        accountant=privacy.accountant,
        noise_parameters=mechanism_parameters(config),
    )


def mechanism_parameters(config: RunConfig) -> dict[str, Any] | None:
    """The configured parameters of a parametrised mechanism (lmo), else None."""
    if config.mechanism != "lmo":
        return None
    return config.privacy.lmo.model_dump(mode="json")


RUN_FILES = (SUMMARY_FILE, TRAJECTORY_FILE, CONFIG_FILE)


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run's records (finished or not) unless asked to."""
    existing = [name for name in RUN_FILES if (output_dir / name).exists()]
    if existing and not overwrite:
        raise ConfigError(
            f"--output-dir {str(output_dir)!r} already holds a run ({', '.join(existing)}); "
            "choose another directory (or pass --overwrite)"
        )


def prepare_output_dir(output_dir: Path) -> None:
    """Create the directory and clear an overwritten run's files, once the inputs are good,
    so a failing new run never sits next to an old summary that makes it look finished."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (output_dir / name).unlink(missing_ok=True)


@dataclass
class RunContext:
    """What the training loop works on, built once the inputs are known to be good."""

    config: RunConfig
    plan: PrivacyPlan
    loaded: LoadedModel
    task: Task
    train: Any  # the task's encoded examples
    test: Any
    shards: list[ParameterShard]
    perturber: Perturber
    model: torch.nn.Module  # the model with its PEFT view applied (peft wrapper for lora/prefix)
    scoring_model: torch.nn.Module  # what the task scores with (the wrapper's HF body)
    skipped_rows: int = 0  # invalid rows skipped (task.skip_invalid_rows)
    validation: Any = None  # encoded validation split (held out of the private training data)
    hooks: RunHooks | None = None


def build_context(config: RunConfig, cache_dir: Path, progress: bool) -> RunContext:
    task_config = resolve_task_config(config.task, peek_kind(config.model))
    splits = load_splits(task_config)
    plan = plan_privacy(config, len(splits.train))
    loaded = load_model(config.model, cache_dir, progress=progress)
    limit = position_limit(loaded.model.config, config.model)
    task = build_task(task_config, loaded.tokenizer, loaded.kind, limit)
    model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
    shards = full_shards(pairs)
    directions = DirectionSampler(
        config.optimizer.direction,
        loaded.device,
        resolve_generator(config.optimizer.generator, loaded.device),
    )
    perturber = make_perturber(model, shards, directions)
    train, test = task.encode(splits.train), task.encode(splits.test)
    return RunContext(
        config,
        plan,
        loaded,
        task,
        train,
        test,
        shards,
        perturber,
        model,
        unwrap_for_scoring(model),
        splits.skipped_rows,
        task.encode(splits.validation) if splits.validation else None,
    )


@dataclass(frozen=True)
class RunHooks:
    """What a caller (a search trial) adds to a run without a second training loop.

    ``after_window(context, step, metrics)`` runs after each logging window (e.g. to report to
    Ray Tune); in a distributed run it runs on rank 0, after that window's checkpoint, so it is
    shipped to the worker and must pickle (cloudpickle). ``final_scores(context)`` runs on the
    trained model before the summary is written and returns extra summary values (e.g. a noised
    selection score); single-process runs only.
    """

    after_window: Callable[[RunContext, int, dict[str, float]], None] | None = None
    final_scores: Callable[[RunContext], dict[str, float]] | None = None


@locks_output_dir  # one run per directory, held before anything is checked or loaded
def run(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    overwrite: bool = False,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    hooks: RunHooks | None = None,
) -> dict[str, Any]:
    """Fine-tune, evaluate and record one run; returns the summary written to summary.json.

    ``tracking_uri`` (e.g. from the environment, read by the CLI) is used when the config sets
    none; it is not written to the config, and no tracking URI is logged (it may hold secrets).
    ``tags`` are added to the run's own (e.g. ``mlflow.parentRunId`` for a search's trial).
    """
    output_dir = Path(output_dir).resolve()
    if config.parallel.strategy != "single":  # Ray Train workers (privzo.distributed)
        from privzo.distributed.launch import run_distributed

        if hooks is not None and hooks.final_scores is not None:
            raise ConfigError(
                f"parallel.strategy={config.parallel.strategy!r}: a search trial's final scores "
                "need the model in this process; use strategy 'single'"
            )
        return run_distributed(
            config,
            output_dir,
            cache_dir=cache_dir,
            progress=progress,
            overwrite=overwrite,
            tracking_root=tracking_root,
            tracking_uri=tracking_uri,
            tags=tags,
            after_window=hooks.after_window if hooks is not None else None,
        )
    check_output_dir(output_dir, overwrite)
    context = build_context(config, cache_dir, progress)
    context.hooks = hooks or RunHooks()
    check_dpgd_size(context)  # its d-dim noise must fit: refuse before anything is written
    tracker = _connect_tracker(context, output_dir, tracking_root, tracking_uri, tags)
    prepare_output_dir(output_dir)
    (output_dir / CONFIG_FILE).write_text(dump_config(config))
    with tracker:
        params = config.model_dump(mode="json")
        params["tracking"].pop("uri")
        tracker.log_params(params)
        summary = _train_and_evaluate(context, tracker, output_dir, progress)
        for name in (CONFIG_FILE, TRAJECTORY_FILE, SUMMARY_FILE):
            if (output_dir / name).exists():  # first-order baselines write no trajectory
                tracker.log_artifact(output_dir / name)
    return summary


def _connect_tracker(
    context: RunContext,
    output_dir: Path,
    tracking_root: Path | None,
    tracking_uri: str | None,
    tags: Mapping[str, str] | None = None,
) -> Tracker:
    """Build the tracker and reach its store now, so a bad store fails before training."""
    tracking = context.config.tracking
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=(tracking_root or output_dir.parent).resolve(),
        run_name=tracking.run_name or output_dir.name,
        tags={**_run_tags(context), **(tags or {})},
        release_timing=context.config.releases_diagnostics,
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def _run_tags(context: RunContext) -> dict[str, str]:
    """Tags the MLflow UI groups and compares runs by (model size, ε, algorithm, task)."""
    config, plan = context.config, context.plan
    parameters = sum(shard.size for shard in context.shards)
    tags = {
        "privzo.model": config.model.name_or_path,
        "privzo.model_parameters": str(model_parameters(context.scoring_model)),
        "privzo.task": config.task.name,
        "privzo.metric": context.task.metric,
        "privzo.algorithm": config.optimizer.algorithm,
        "privzo.trainable_parameters": str(parameters),
        "privzo.private": str(plan.private).lower(),
    }
    if plan.private:
        tags["privzo.epsilon"] = f"{config.privacy.epsilon:g}"
    return tags


def model_parameters(model: torch.nn.Module) -> int:
    """Parameter count of the model (tied weights counted once; a ZeRO-3 partitioned parameter
    by its full size, ``ds_numel``, not its empty local placeholder)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def _train_and_evaluate(
    context: RunContext, tracker: Tracker, output_dir: Path, progress: bool
) -> dict[str, Any]:
    config = context.config
    memory = PeakMemory(context.loaded.device)
    evaluate = _evaluator(context, memory)
    started = time.perf_counter()
    before = evaluate() if config.eval_before else None
    if before is not None:
        tracker.log_metrics({f"test_{name}": value for name, value in before[0].items()}, step=0)
    loop = make_loop(context, tracker, memory)
    loop.peak_mb = memory.peak_mb()
    recorder = TrajectoryRecorder(_trajectory_meta(context), release_batch_size=not loop.private)
    try:
        loop.run(recorder, progress)
    finally:  # a failed run keeps the steps it made
        if loop.records_trajectory:
            recorder.write(output_dir / TRAJECTORY_FILE)
    after = evaluate()
    validation = _validation_metrics(context, loop)
    if loop.nonfinite and loop.log_diagnostics:  # the count is data-dependent: a diagnostic
        logger.warning(
            "%d per-example loss differences were non-finite and counted as 0", loop.nonfinite
        )
    if config.save_model or not loop.records_trajectory:  # no trajectory: save the weights
        save_weights(context.model, context.loaded.tokenizer, output_dir / MODEL_DIR)
    loop.peak_mb = max(loop.peak_mb, memory.peak_mb())
    summary = _summary(context, loop, tracker, before, after, started)
    summary.update({f"validation_{name}": value for name, value in validation.items()})
    if context.hooks is not None and context.hooks.final_scores is not None:
        summary.update(context.hooks.final_scores(context))
    tracker.log_metrics(_final_metrics(summary), step=config.optimizer.steps)
    (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
    return summary


Evaluation = tuple[dict[str, float], float]  # (test metrics, seconds)


def _validation_metrics(context: RunContext, loop: TrainingLoop) -> dict[str, float]:
    """Metrics on the validation split, where releasing them costs no privacy.

    The split is part of the private training data, so a private run reports it only with
    ``tracking.log_private_diagnostics`` (outside the guarantee).
    """
    if context.validation is None or not loop.log_diagnostics:
        return {}
    batch_size = context.config.optimizer.eval_batch_size
    return context.task.evaluate(context.scoring_model, context.validation, batch_size)


def _evaluator(context: RunContext, memory: PeakMemory) -> Callable[[], Evaluation]:
    """Test metrics and their time; resets the peak mark so the evaluation's peak can be read
    after it."""
    batch_size = context.config.optimizer.eval_batch_size

    def evaluate() -> Evaluation:
        memory.reset()
        started = time.perf_counter()
        metrics = context.task.evaluate(context.scoring_model, context.test, batch_size)
        return metrics, time.perf_counter() - started

    return evaluate


def _trajectory_meta(context: RunContext) -> TrajectoryMeta:
    config = context.config
    return TrajectoryMeta(
        perturbation_scale=config.optimizer.perturbation_scale,
        direction=config.optimizer.direction,
        device_type=context.loaded.device.type,
        trainable=config.model.trainable,
        view_options=config.model.peft.model_dump(mode="json"),
        view_seed=config.seed,
        model=config.model.name_or_path,
        dtype=config.model.dtype,
        perturbation=context.perturber.mode,
        generator=context.perturber.sampler.generator,
    )


def make_loop(context: RunContext, tracker: Tracker, memory: PeakMemory) -> Any:
    """The loop of the algorithm's family: zeroth-order (``TrainingLoop``) or a baseline."""
    algorithm = context.config.optimizer.algorithm
    if algorithm in FIRST_ORDER_ALGORITHMS:
        from privzo.baselines.first_order import FirstOrderLoop

        return FirstOrderLoop(context, tracker, memory)
    if algorithm == "dpgd-0th":
        from privzo.baselines.dpgd import DpgdLoop

        return DpgdLoop(context, tracker, memory)
    return TrainingLoop(context, tracker, memory)


class TrainingLoop:
    """Samples, steps, accounts and logs; holds the per-run state the step function does not."""

    records_trajectory = True

    def __init__(
        self,
        context: RunContext,
        tracker: Tracker,
        memory: PeakMemory,
        *,
        sampler: Sampler | None = None,
        estimator: GradientEstimator | None = None,
        on_window: Callable[[int, dict[str, float]], None] | None = None,
        forward_on_empty: bool = False,
    ) -> None:
        """``sampler``, ``estimator`` and ``on_window`` (called with the steps done and the
        window's metrics, before they are logged) let a distributed worker take its share of
        batches, all-reduce, and report / checkpoint; the defaults are the single-process run's.
        ``forward_on_empty``: an empty local batch still runs both forwards on the task's public
        example (built from the template, no record), whose loss is discarded (ZeRO-3 gathers
        weights collectively in every forward)."""
        self.context = context
        self.tracker = tracker
        self.memory = memory
        config, plan = context.config, context.plan
        self.sampler = sampler or _make_sampler(config, plan, len(context.train))
        self.estimator = estimator or _make_estimator(config, plan)
        self.on_window = on_window
        self.forward_on_empty = forward_on_empty
        self.ledger = _make_ledger(config, plan)
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )
        self.private = context.plan.private
        self.step_times: list[float] = []
        self.step_peak_mb = 0.0
        self.peak_mb = 0.0  # of the whole run: steps and evaluations
        self.nonfinite = 0
        self.empty_batches = 0

    def run(self, recorder: TrajectoryRecorder, progress: bool, start: int = 0) -> None:
        """Steps in windows of ``log_every``: each window's privacy cost is booked before it runs
        (so no step can overspend) and its metrics are logged after it. ``start`` > 0 resumes
        after that many steps (already in ``recorder`` and the ledger)."""
        config = self.context.config
        steps, window_size = config.optimizer.steps, config.tracking.log_every
        algorithm = config.optimizer.algorithm
        bar = tqdm(total=steps, initial=start, desc=algorithm, disable=not progress)
        for first in range(start, steps, window_size):
            window_steps = range(first, min(first + window_size, steps))
            if self.ledger is not None:
                self.ledger.spend(len(window_steps))
            window = []
            for step in window_steps:
                record = self.step(step)
                recorder.append(record)
                window.append(record)
                bar.update(1)
            metrics = self._window_metrics(window)
            if self.on_window is not None:  # checkpoint before logging: no released window is lost
                self.on_window(window_steps[-1] + 1, metrics)
            self.tracker.log_metrics(metrics, step=window_steps[-1] + 1)
            hooks = self.context.hooks
            if hooks is not None and hooks.after_window is not None:
                hooks.after_window(self.context, window_steps[-1] + 1, metrics)
            bar.set_postfix({k: f"{v:.3g}" for k, v in metrics.items() if k in _SHOWN})
        bar.close()

    def step(self, step: int) -> StepRecord:
        context = self.context
        indices = self.sampler.next_batch()
        batch = context.task.collate(context.train, indices) if len(indices) else None
        batch_size, keep = len(indices), len(indices)
        if self.forward_on_empty and not len(indices):  # a public input: no record is read
            batch, batch_size = context.task.collate(context.task.public_example(), [0]), 1
        self.memory.reset()
        started = time.perf_counter()
        record = zo_step(
            step=step,
            seed=step_seed(context.config.seed, step),
            perturber=context.perturber,
            batch=batch,
            batch_size=batch_size,
            loss_fn=lambda b: context.task.per_example_loss(context.scoring_model, b)[:keep],
            estimator=self.estimator,
            learning_rate=self.schedule(step),
            perturbation_scale=context.config.optimizer.perturbation_scale,
        )
        self.step_times.append(time.perf_counter() - started)
        self.step_peak_mb = max(self.step_peak_mb, self.memory.peak_mb())
        self.peak_mb = max(self.peak_mb, self.step_peak_mb)
        self.nonfinite += record.nonfinite
        self.empty_batches += int(len(indices) == 0)
        return record

    @property
    def log_diagnostics(self) -> bool:
        """Whether data-dependent diagnostics may be logged (see ``_window_metrics``)."""
        return self.context.config.releases_diagnostics

    def _window_metrics(self, window: list[StepRecord]) -> dict[str, float]:
        """Public metrics always; diagnostics only where they release nothing private.

        In a private run the training loss, the step time (an empty Poisson batch skips both
        forwards, so per-window time reveals batch sizes) and the non-finite count all depend on
        the private data and are not covered by the accountant.
        """
        metrics = {
            "learning_rate": window[-1].learning_rate,
            "projected_gradient_abs": sum(abs(r.projected_gradient) for r in window) / len(window),
        }
        if self.ledger is not None:
            metrics["epsilon_spent"] = self.ledger.epsilon_spent
        if self.log_diagnostics:
            metrics["step_time_s"] = sum(self.step_times[-len(window) :]) / len(window)
            metrics["nonfinite_differences"] = float(self.nonfinite)
            losses = [r.mean_loss for r in window if not math.isnan(r.mean_loss)]
            if losses:
                metrics["train_loss"] = sum(losses) / len(losses)
        return metrics


_SHOWN = ("epsilon_spent", "train_loss", "step_time_s")


def _make_sampler(config: RunConfig, plan: PrivacyPlan, dataset_size: int) -> Sampler:
    if config.privacy.sampler == "poisson":
        return PoissonSampler(dataset_size, plan.sample_rate)
    return ShuffleSampler(dataset_size, config.optimizer.batch_size, seed=config.task.data_seed)


def _make_estimator(config: RunConfig, plan: PrivacyPlan) -> GradientEstimator:
    return make_estimator(
        config.optimizer.algorithm,
        mechanism=plan.mechanism,
        clip=config.privacy.clip,
        noise_multiplier=plan.noise_multiplier,
        expected_batch_size=plan.expected_batch_size,
        noise_parameters=plan.noise_parameters,
    )


def _make_ledger(config: RunConfig, plan: PrivacyPlan) -> BudgetLedger | None:
    if not plan.private:
        return None
    assert plan.mechanism and plan.accountant and plan.noise_multiplier and plan.delta is not None
    options = {"noise_parameters": plan.noise_parameters} if plan.noise_parameters else {}
    accountant = make_accountant(
        plan.accountant, plan.mechanism, plan.noise_multiplier, plan.sample_rate, **options
    )
    return BudgetLedger(accountant, config.privacy.epsilon, plan.delta)


def _summary(
    context: RunContext,
    loop: TrainingLoop,
    tracker: Tracker,
    before: Evaluation | None,
    after: Evaluation,
    started: float,
) -> dict[str, Any]:
    config, plan = context.config, context.plan
    times = loop.step_times
    metric = context.task.metric
    scores: dict[str, float | None] = {}
    for name, value in after[0].items():
        scores[f"{name}_before"] = before[0][name] if before else None
        scores[f"{name}_after"] = value
    return {
        "model": config.model.name_or_path,
        "task": config.task.name,
        "algorithm": config.optimizer.algorithm,
        "metric": metric,
        "metric_before": before[0][metric] if before else None,
        "metric_after": after[0][metric],
        **scores,
        "private": plan.private,
        "epsilon": loop.ledger.epsilon_spent if loop.ledger else None,
        "epsilon_target": config.privacy.epsilon if plan.private else None,
        "delta": plan.delta,
        "noise_multiplier": plan.noise_multiplier,
        "mechanism": plan.mechanism,
        "mechanism_parameters": plan.noise_parameters,
        "accountant": plan.accountant,
        "sample_rate": plan.sample_rate,
        "expected_batch_size": plan.expected_batch_size,
        "clip": config.privacy.clip if plan.private else None,
        "steps": len(times),
        "train_examples": len(context.train),
        "test_examples": len(context.test),
        "skipped_rows": context.skipped_rows,
        "trainable_parameters": sum(shard.size for shard in context.shards),
        "model_parameters": model_parameters(context.scoring_model),
        **_resource_figures(loop, after, started),
        "nonfinite_differences": loop.nonfinite if loop.log_diagnostics else None,
        "empty_batches": loop.empty_batches if loop.log_diagnostics else None,
        "device": context.loaded.device.type,
        "dtype": config.model.dtype,
        "tracking_run_id": tracker.run_id,
    }


RESOURCE_FIGURES = (
    "eval_time_s",
    "peak_memory_mb",
    "step_peak_memory_mb",
    "mean_step_time_s",
    "wall_time_s",
)


def _resource_figures(loop: TrainingLoop, after: Evaluation, started: float) -> dict[str, Any]:
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


def _final_metrics(summary: dict[str, Any]) -> dict[str, float]:
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
