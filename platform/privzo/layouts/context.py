"""What a run trains on, and how every layout builds it (``build_context``).

Below the run pipeline because every layout and every algorithm works on it: the single-process
run, each Ray Train rank (``privzo.distributed.worker``) and the algorithms' loops. The one
layout-specific part, how the model is loaded and which of its elements a process trains, is
a ``ModelLoader``: the whole model here, a ZeRO-3 partition in ``privzo.distributed.zero3``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from privzo.config.run import RunConfig
from privzo.config.tasks import TaskConfig
from privzo.memory import map_large_blocks, return_freed_memory
from privzo.models.architecture import arch_from_config
from privzo.models.loading import (
    LoadedModel,
    apply_view,
    load_model,
    model_parameters,
    peek_kind,
    position_limit,
    resolve_device,
)
from privzo.models.peft_views import unwrap_for_scoring
from privzo.planner import planned_step_bytes
from privzo.privacy.plan import PrivacyPlan, plan_privacy
from privzo.tasks import (
    Task,
    TaskSplits,
    build_task,
    data_lineage,
    load_splits,
    resolve_task_config,
    warn_cut_prompts,
    warn_unknown_tokens,
)
from privzo.tasks.data import Row
from privzo.tracking import DatasetLineage
from privzo.tracking.tags import config_tags, model_tags
from privzo.zo.directions import DirectionSampler, resolve_generator
from privzo.zo.integrity import weights_fingerprint
from privzo.zo.perturbation import Perturber, make_perturber
from privzo.zo.sweeps import ParameterShard, full_shards
from privzo.zo.trajectory import TrajectoryMeta, trajectory_meta


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
    base_fingerprint: dict[str, list] | None = None  # privzo.zo.integrity, None under zero3

    @property
    def trainable_parameters(self) -> int:
        """Elements the run trains (a shard's full size, also under zero3's partitions)."""
        return sum(shard.size for shard in self.shards)

    def trajectory_meta(self) -> TrajectoryMeta:
        """The replay metadata of this run's trajectory (``privzo.zo.trajectory``)."""
        return trajectory_meta(
            self.config,
            self.loaded.device.type,
            self.perturber,
            self.base_fingerprint,
            self.loaded.revision,
        )

    def data_lineage(self) -> list[DatasetLineage]:
        """Where the task's rows came from, by public identifiers (``log_inputs``)."""
        return data_lineage(resolve_task_config(self.config.task, self.loaded.kind))

    def tracking_tags(self) -> dict[str, str]:
        """The run's tags (``privzo.tracking.tags``), sizes and metric included."""
        return {
            **config_tags(self.config, self.plan.private),
            **model_tags(
                self.task.metric,
                model_parameters(self.scoring_model),
                self.trainable_parameters,
                self.loaded.revision,
                self.loaded.device.type,
                self.planned_step_mb(),
            ),
        }

    def planned_step_mb(self) -> float | None:
        """The planner's figure for one step above the weights (MiB), for a decoder it models
        (None for another architecture): what the report shows where no CUDA peak was taken."""
        try:
            arch = arch_from_config(getattr(self.scoring_model, "config", None))
        except ValueError:
            return None
        return planned_step_bytes(self.config, arch, self.plan.max_batch_size) / 2**20


@dataclass(frozen=True)
class PlannedData:
    """The resolved task config, its rows and the privacy plan for them, as preflight found
    them: reused by ``build_context`` so nothing is read or calibrated twice."""

    task_config: TaskConfig
    splits: TaskSplits
    plan: PrivacyPlan


class ModelLoader(Protocol):
    """How a layout holds the model: loads it, and picks the elements this process trains."""

    def load(self, config: RunConfig, cache_dir: Path, progress: bool) -> LoadedModel:
        """The model and its tokenizer (as this layout holds them)."""

    def shards(self, pairs: list[tuple[str, torch.nn.Parameter]]) -> list[ParameterShard]:
        """The trainable elements this process perturbs, of the view's (name, parameter)s."""

    def fingerprint(self, loaded: LoadedModel) -> dict[str, list] | None:
        """The base weights' fingerprint (``privzo.zo.integrity``), where they are whole."""

    def perturber(
        self, model: torch.nn.Module, shards: list[ParameterShard], sampler: DirectionSampler
    ) -> Perturber:
        """How the shards are evaluated at θ + c·z and updated (``privzo.zo.perturbation``)."""


class WholeModel:
    """The whole model in this process (the single and replica layouts)."""

    def load(self, config: RunConfig, cache_dir: Path, progress: bool) -> LoadedModel:
        return load_model(config.model, cache_dir, progress=progress)

    def shards(self, pairs: list[tuple[str, torch.nn.Parameter]]) -> list[ParameterShard]:
        return full_shards(pairs)

    def fingerprint(self, loaded: LoadedModel) -> dict[str, list] | None:
        return weights_fingerprint(loaded.model.named_parameters())  # the base, for replay

    def perturber(
        self, model: torch.nn.Module, shards: list[ParameterShard], sampler: DirectionSampler
    ) -> Perturber:
        return make_perturber(model, shards, sampler)


def build_context(
    config: RunConfig,
    cache_dir: Path,
    progress: bool,
    hooks: RunHooks | None = None,
    planned: PlannedData | None = None,
    loader: ModelLoader | None = None,
) -> RunContext:
    """Load the task and the model (``loader``'s way: whole by default, a ZeRO-3 partition in
    ``privzo.distributed.zero3``), plan privacy, apply the PEFT view and make its perturber.
    ``hooks.training_rows`` may change the training rows first (before the privacy plan, which
    depends on their number, and before any model loads); without it, ``planned``
    (preflight's) supplies the rows and the plan."""
    loader = loader or WholeModel()
    changes_rows = hooks is not None and hooks.training_rows is not None
    if planned is not None and not changes_rows:
        task_config, splits, plan = planned.task_config, planned.splits, planned.plan
    else:
        task_config = resolve_task_config(config.task, peek_kind(config.model))
        splits = load_splits(task_config)
        if hooks is not None and hooks.training_rows is not None:
            splits.train = hooks.training_rows(task_config, splits.train)
        plan = plan_privacy(config, len(splits.train))
    directions = direction_sampler(config)  # before the model: a missing Triton is refused now
    if config.parallel.strategy == "zero3":  # its gathered layers, made again every forward
        # go back to the system when freed; elsewhere small mappings would slow every step
        map_large_blocks()
    loaded = loader.load(config, cache_dir, progress)
    return_freed_memory()  # the load path's freed buffers would stay in this process
    fingerprint = loader.fingerprint(loaded)
    limit = position_limit(loaded.model.config, config.model)
    task = build_task(task_config, loaded.tokenizer, loaded.kind, limit)
    model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
    shards = loader.shards(pairs)
    perturber = loader.perturber(model, shards, directions)
    train, test = task.encode(splits.train), task.encode(splits.test)
    warn_unknown_tokens(train, loaded.tokenizer.unk_token_id, config.model.name_or_path)
    warn_cut_prompts(train, task.max_length)
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
        hooks,
        base_fingerprint=fingerprint,
    )


def direction_sampler(config: RunConfig) -> DirectionSampler:
    """The run's directions on its device: the configured generator, fused kernels for Philox
    on CUDA (``privzo.zo.kernels``; Triton required, checked here)."""
    device = resolve_device(config.model.device)
    generator = resolve_generator(config.optimizer.generator, device)
    return DirectionSampler(config.optimizer.direction, device, generator)


@dataclass(frozen=True)
class RunHooks:
    """What a caller (a search trial) adds to a run without a second training loop.

    ``after_window(context, step, metrics)`` runs after each logging window (e.g. to report to
    Ray Tune). ``final_scores(context)`` runs on the trained model before the summary is written
    and returns extra summary values (e.g. a noised selection score). In a distributed run both
    are shipped to the workers, so they must pickle (cloudpickle), and run on every rank that
    evaluates (``Layout.rank_hooks``: rank 0, or every rank under zero3, whose forwards are
    collectives), ``after_window`` after that window's checkpoint; rank 0's values go into the
    summary, and a hook that releases anything itself must do so on rank 0 only.
    ``training_rows(task_config, rows)`` returns the rows to train on instead of the task's (an
    audit adds its included canaries); it runs before the privacy plan and any model load, so
    it may refuse with a ``ConfigError``; single-process runs only.
    """

    after_window: Callable[[RunContext, int, dict[str, float]], None] | None = None
    final_scores: Callable[[RunContext], dict[str, float]] | None = None
    training_rows: Callable[[TaskConfig, list[Row]], list[Row]] | None = None
