"""Preflight: everything that can refuse a run, checked in one place before any weights load.

``preflight(config, ...)`` runs, in order: the schema (pydantic, already at load), the
algorithm × layout × mechanism × view capabilities from the algorithm registry, the layout's
own options, the output directory and the tracking store (cheap, so first), the files (model
directory or hub id, dataset files) and the training rows, the privacy plan (σ calibrated to
(ε, δ), or a fixed σ checked against it), a distributed layout's batch, the directions'
generator, and the planner's memory verdict where it can be given without weights. It loads
no weights and writes nothing. ``run()`` calls it first (and hands a distributed run its plan);
``privzo check CONFIG`` prints what it found (``Preflight.describe``). A config that passes it
starts (the Ray cluster's size, and a built-in model's fit on GPUs, are checked when the run
starts).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import Algorithm, check_capabilities, get_algorithm
from privzo.config.run import RunConfig
from privzo.config.tasks import TaskConfig
from privzo.distributed.checks import (
    check_batch,
    check_layout,
    check_offload,
    check_offload_runs,
    check_verdict,
    config_plan,
)
from privzo.layouts.context import direction_sampler
from privzo.models.builtin import is_builtin
from privzo.models.loading import check_model, is_hub_id, peek_kind
from privzo.planner import Plan, resolve_arch
from privzo.privacy.adjacency import record_fields, replace_one
from privzo.privacy.plan import PrivacyPlan, plan_privacy
from privzo.rundir.files import check_output_dir
from privzo.section import ConfigError
from privzo.tasks import (
    TaskSplits,
    data_lines,
    describe_source,
    load_splits,
    resolve_task_config,
)
from privzo.tracking import probe_tracking_store


@dataclass(frozen=True)
class Preflight:
    """What a run of ``config`` will do, found without loading weights."""

    config: RunConfig
    algorithm: Algorithm
    task_config: TaskConfig
    splits: TaskSplits
    privacy: PrivacyPlan
    memory: Plan | None  # the planner's verdict, where it applies (OPT shapes known up front)

    def describe(self) -> list[str]:
        """Lines for ``privzo check``: algorithm, layout, mechanism, σ, (ε, δ), steps, q,
        batch and memory plan."""
        config, algorithm, privacy = self.config, self.algorithm, self.privacy
        parallel = config.parallel
        lines = [
            f"algorithm   {algorithm.name} ({algorithm.family}, "
            f"{'private' if algorithm.private else 'not private'}, "
            f"{'writes a trajectory' if algorithm.writes_trajectory else 'saves its weights'})",
            f"layout      {parallel.strategy}, {parallel.workers} worker(s)"
            f"{' on GPUs' if parallel.use_gpu else ''}",
            f"model       {config.model.name_or_path} ({config.model.trainable} view, "
            f"{config.model.dtype})",
            *self.data_lines(),
            f"steps       {config.optimizer.steps}, batch {config.optimizer.batch_size}, "
            f"sample rate q = {privacy.sample_rate:.6g} ({config.privacy.sampler})",
        ]
        lines.append(f"batches     {self.batch_shape()}")
        forwards = self.forwards_per_step
        if forwards is not None:
            count = config.optimizer.directions_per_step
            lines.append(
                f"cost        {forwards} forwards per step ({count} direction(s) × 2, "
                "each over the batch)"
            )
        if privacy.private:
            assert privacy.epsilon is not None and privacy.delta is not None
            grouped = replace_one(privacy.epsilon, privacy.delta)
            lines += [
                f"mechanism   {privacy.mechanism}, accountant {privacy.accountant}, "
                f"clip {config.privacy.clip:g}",
                f"noise       σ = {privacy.noise_multiplier:.6g}"
                f"{' (fixed)' if config.privacy.noise_multiplier else ' (calibrated)'}",
                f"privacy     ε target {config.privacy.epsilon:g}, spends ε = "
                f"{privacy.epsilon:.6g} at δ = {privacy.delta:g} (add/remove adjacency, given N)",
                f"            the records state N = {len(self.splits.train)}: the whole release "
                f"is ({grouped.epsilon:.6g}, {grouped.delta:.3g})-DP under replace-one adjacency",
            ]
        else:
            lines.append("privacy     none (a non-private run: no noise, no ε)")
        lines.append(f"memory      {_describe_memory(self.memory, config)}")
        return lines

    def batch_shape(self) -> str:
        """How training batches are padded, in words (``task.pad_to``)."""
        config, privacy = self.config, self.privacy
        if config.pad_to == "batch":
            return "padded to each batch's longest member (task.pad_to=batch)"
        length = config.task.max_length or "(the model's limit)"
        micro = config.optimizer.physical_batch_size or privacy.max_batch_size
        workers = config.parallel.workers
        each = f" on each of {workers} workers" if workers > 1 else ""
        shape = (
            f"{privacy.max_batch_size} rows × {length} tokens{each}, {micro} rows per forward "
            "(task.pad_to=max_length)"
        )
        if not privacy.private:
            return shape
        return f"{shape}; truncation takes δ {privacy.truncation_delta:.3g}"

    def data_lines(self) -> list[str]:
        """Which rows the run trains on: their source, counts and label words (a run prints
        them first, ``privzo check`` among its lines)."""
        return data_lines(self.task_config, self.splits)

    @property
    def forwards_per_step(self) -> int | None:
        """2K for a zeroth-order step of K directions (θ ± εz_k); None for first-order ones."""
        if self.algorithm.family != "zeroth-order":
            return None
        return 2 * self.config.optimizer.directions_per_step

    def to_json(self) -> dict[str, Any]:
        privacy = self.privacy
        return {
            "algorithm": self.algorithm.name,
            "family": self.algorithm.family,
            "private": privacy.private,
            "strategy": self.config.parallel.strategy,
            "workers": self.config.parallel.workers,
            "data_source": describe_source(self.task_config),
            "training_examples": len(self.splits.train),
            "test_examples": len(self.splits.test),
            "steps": self.config.optimizer.steps,
            "directions_per_step": self.config.optimizer.directions_per_step,
            "forwards_per_step": self.forwards_per_step,
            "batch_size": self.config.optimizer.batch_size,
            "sample_rate": privacy.sample_rate,
            "pad_to": self.config.pad_to,
            "max_batch_size": privacy.max_batch_size,
            "truncation_delta": privacy.truncation_delta if privacy.private else None,
            "mechanism": privacy.mechanism,
            "accountant": privacy.accountant,
            "noise_multiplier": privacy.noise_multiplier,
            "epsilon_target": self.config.privacy.epsilon if privacy.private else None,
            "epsilon": privacy.epsilon,
            "delta": privacy.delta,
            **record_fields(privacy.epsilon, privacy.delta),
            "memory_plan": self.memory.to_json() if self.memory is not None else None,
        }


def preflight(
    config: RunConfig,
    *,
    output_dir: Path | None = None,
    overwrite: bool = False,
    tracking_uri: str | None = None,
    tracking_root: Path | None = None,
) -> Preflight:
    """Every check a run makes before it loads weights; raises ``ConfigError`` with the field,
    the value and what is allowed. ``output_dir`` None skips the directory check (a resumed run
    goes on in its own directory); ``tracking_uri`` is the caller's when the config sets none, and
    ``tracking_root`` holds the default store (None with neither: the store is not probed, as for
    a study's cells, whose store the study opens itself)."""
    check_capabilities(config)
    algorithm = get_algorithm(config.optimizer.algorithm)
    distributed = config.parallel.strategy != "single"
    if distributed:
        check_layout(config)
    if output_dir is not None:  # the cheap refusals first: σ's calibration can take seconds
        check_output_dir(Path(output_dir), overwrite)
    uri = config.tracking.uri or tracking_uri
    if uri is not None or tracking_root is not None:
        root = Path(tracking_root or ".").resolve()
        probe_tracking_store(config.tracking.backend, uri, root)
    task_config = resolve_task_config(config.task, model_kind(config))  # model dir or id
    splits = load_splits(task_config)  # dataset files
    privacy = plan_privacy(config, len(splits.train))
    if distributed:
        check_batch(config, privacy.expected_batch_size)
    direction_sampler(config)  # a missing Triton for the fused CUDA kernels is refused now
    memory = memory_plan(config, privacy.max_batch_size)
    if memory is not None and distributed and config.parallel.use_gpu:
        check_verdict(config, memory)
    elif memory is not None and config.parallel.offload != "none":
        check_offload(config, memory)  # the host holds the partitions, GPUs or not
    check_offload_runs(config)
    return Preflight(config, algorithm, task_config, splits, privacy, memory)


def memory_plan(config: RunConfig, padded_rows: int | None) -> Plan | None:
    """The planner's verdict (``privzo.planner``) for this model on ``parallel.workers`` GPUs
    of ``parallel.gpu_memory_gb``, where the model's shape is known without its weights: a
    hub id of a named shape (facebook/opt-*, meta-llama/Llama-3.1-8B, ...) or a local
    directory's config.json of a decoder family the planner models. None for built-in models
    (their tokenizer's vocabulary is made when they are built) and other architectures.
    ``padded_rows``: the privacy plan's bound, the rows of every forward of a padded run."""
    name = config.model.name_or_path
    if is_builtin(name):
        return None
    try:
        _, arch = resolve_arch(name)  # a named shape, its hub id, or a directory's config.json
    except ValueError:
        return None
    return config_plan(config, arch, padded_rows)


def _describe_memory(memory: Plan | None, config: RunConfig) -> str:
    if memory is None:
        return "no plan (the planner models decoder shapes given by hub id or config.json)"
    gib = 2**30
    verdict = "fits" if memory.fits else "does NOT fit"
    offloaded = ""
    if memory.offload != "none" and memory.host_memory_bytes is not None:
        nvme = f", {memory.nvme_bytes / gib:.1f} GiB on NVMe" if memory.nvme_bytes else ""
        offloaded = (
            f"; offload {memory.offload}: {memory.host_bytes / gib:.1f} GiB of the host's "
            f"{memory.host_memory_bytes / gib:.1f} GiB{nvme}, "
            f"{memory.offload_bytes_per_step / gib:.1f} GiB copied to each GPU per step"
        )
    return (
        f"{memory.parameters:,} parameters; {memory.strategy} on {memory.gpus} GPU(s) of "
        f"{config.parallel.gpu_memory_gb:g} GiB: {memory.bytes_per_gpu / gib:.2f} GiB per GPU"
        f"{offloaded} ({verdict}; planner estimate)"
    )


__all__ = ["ConfigError", "Preflight", "memory_plan", "preflight"]


def model_kind(config: RunConfig) -> str:
    """The model's kind, its source checked without weights: a built-in name or a local
    directory always; a hub id's config is read only when ``model.kind`` is auto, so a cluster
    config is checked offline as well (the hub is reached when the run loads it)."""
    if is_hub_id(config.model.name_or_path):
        return peek_kind(config.model)
    return check_model(config.model)
