"""Start a distributed run on Ray Train and write its records like a single-process run.

Everything that can be wrong with the layout is checked before any worker starts (the checks
below are called by preflight, ``privzo.preflight``, except the cluster's size and a built-in
model's fit, checked here once Ray is up): more workers than the cluster's CPUs (or GPUs), an
expected batch smaller than the number of workers (some
workers would almost always idle, and a private run's partitions could not all be sampled), a
model the planner says cannot fit the strategy, and options the strategy does not support.
"""

from __future__ import annotations

import json
import shutil
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from privzo.config import ConfigError, RunConfig, dump_config
from privzo.distributed.storage import alive_nodes, check_cluster_storage
from privzo.layouts.record import (
    CONFIG_FILE,
    PRIVACY_FILE,
    RAY_STATE_DIR,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    prepare_output_dir,
)
from privzo.models.loading import pretrained_kwargs, resolve_source
from privzo.privacy.plan import PrivacyPlan
from privzo.tracking import Tracker, connect_tracker, make_tracker
from privzo.tracking.tags import config_tags, layout_tags


def run_distributed(
    config: RunConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    overwrite: bool = False,
    tracking_root: Path | None = None,
    tracking_uri: str | None = None,
    tags: Mapping[str, str] | None = None,
    after_window: Callable[..., None] | None = None,
    final_scores: Callable[..., dict[str, float]] | None = None,
    plan: PrivacyPlan,
) -> dict[str, Any]:
    """What ``privzo.run.run`` dispatches to for ``parallel.strategy`` 'replica' or 'zero3'
    (the same records), once its preflight (``privzo.preflight``) passed with ``plan``.

    ``after_window`` and ``final_scores`` are the caller's ``RunHooks``, run by the ranks that
    evaluate (rank 0; every rank under zero3), rank 0's final scores going into the summary.
    """
    source = resolve_source(config.model, cache_dir, progress)  # builds a built-in model once
    check_fit(config, source)
    _init_ray(config)
    check_cluster_storage(
        alive_nodes(),
        ray_storage(config, output_dir),
        config.tracking.uri or tracking_uri,
        storage_setting="parallel.storage_path",
        tracking=config.tracking.backend != "none",
    )
    check_resources(config, _cluster_resources())
    tracker = _launch_tracker(
        config, plan.private, output_dir, tracking_root, tracking_uri, tags or {}
    )
    prepare_output_dir(output_dir)
    (output_dir / CONFIG_FILE).write_text(dump_config(config))
    with tracker:
        params = config.model_dump(mode="json")
        params["tracking"].pop("uri")
        tracker.log_params(params)
        settings = worker_settings(config, cache_dir, output_dir, tracker, tracking_root)
        # callables: Ray pickles them with cloudpickle (together: they may share state)
        settings.update(after_window=after_window, final_scores=final_scores)
        result = fit(config, settings, output_dir)
        (output_dir / TRAJECTORY_FILE).write_bytes(result["trajectory"])
        (output_dir / PRIVACY_FILE).write_text(json.dumps(result["privacy"], indent=2) + "\n")
        summary = result["summary"]
        (output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2) + "\n")
        for name in (CONFIG_FILE, TRAJECTORY_FILE, PRIVACY_FILE, SUMMARY_FILE):
            tracker.log_artifact(output_dir / name)
    return summary


def _launch_tracker(
    config: RunConfig,
    private: bool,
    output_dir: Path,
    tracking_root: Path | None,
    tracking_uri: str | None,
    tags: Mapping[str, str],
) -> Tracker:
    """Like the run pipeline's tracker, without the model (not loaded by the launcher): rank 0
    adds the model's tags (sizes, metric) once it has built its model."""
    tracking = config.tracking
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=(tracking_root or output_dir.parent).resolve(),
        run_name=tracking.run_name or output_dir.name,
        tags={**config_tags(config, private), **layout_tags(config), **tags},
        release_timing=config.releases_diagnostics,
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def check_layout(config: RunConfig) -> None:
    """Options a strategy cannot honour, before anything is loaded."""
    parallel = config.parallel
    if parallel.strategy == "zero3":
        if config.model.dtype != "float32":
            raise ConfigError(
                f"model.dtype={config.model.dtype!r} with parallel.strategy='zero3': each rank "
                "perturbs its partition in place, which needs float32; allowed: 'float32' (or "
                "strategy 'replica' for half precision)"
            )
        if config.model.trainable != "full":
            raise ConfigError(
                f"model.trainable={config.model.trainable!r} with parallel.strategy='zero3'; "
                "allowed: 'full' (adapters are small: use strategy 'replica')"
            )
    if parallel.use_gpu and config.model.device == "cpu":
        raise ConfigError(
            "parallel.use_gpu=true with model.device='cpu'; set model.device='auto' or 'cuda'"
        )


def check_batch(config: RunConfig, expected_batch_size: float) -> None:
    workers = config.parallel.workers
    if expected_batch_size < workers:
        raise ConfigError(
            f"optimizer.batch_size={config.optimizer.batch_size} (expected batch size "
            f"{expected_batch_size:g}) is smaller than parallel.workers={workers}; allowed: "
            f"batch_size >= {workers}, or fewer workers"
        )


def check_resources(config: RunConfig, resources: dict[str, float]) -> None:
    """Each worker takes one CPU (and one GPU with use_gpu); the cluster must hold them all."""
    parallel = config.parallel
    needed = {"CPU": parallel.workers, **({"GPU": parallel.workers} if parallel.use_gpu else {})}
    for kind, count in needed.items():
        available = int(resources.get(kind, 0))
        if count > available:
            raise ConfigError(
                f"parallel.workers={parallel.workers} needs {count} {kind}s but the Ray cluster "
                f"has {available}; allowed: workers <= {available}"
            )


def check_fit(config: RunConfig, source: str) -> None:
    """On GPUs, the planner's verdict for this OPT model, strategy and GPU count."""
    parallel = config.parallel
    if not parallel.use_gpu:
        return
    from transformers import AutoConfig

    from privzo.planner import arch_from_config, plan

    hf_config = AutoConfig.from_pretrained(source, **pretrained_kwargs(config.model))
    if hf_config.model_type != "opt":
        return  # the planner models OPT decoders only
    per_worker = max(1, config.optimizer.batch_size // parallel.workers)
    # a forward holds the activations of one micro-batch (optimizer.physical_batch_size) at most
    forward_batch = min(per_worker, config.optimizer.physical_batch_size or per_worker)
    verdict = plan(
        arch_from_config(hf_config),
        gpus=parallel.workers,
        gpu_memory_gb=parallel.gpu_memory_gb,
        dtype=config.model.dtype,
        batch_size=forward_batch,
    )
    check_verdict(config, verdict)


def check_verdict(config: RunConfig, verdict: Any) -> None:
    """Refuse what the planner's verdict (``privzo.planner.Plan``) says cannot fit."""
    parallel = config.parallel
    if parallel.strategy == "replica" and verdict.strategy != "replica":
        raise ConfigError(
            f"parallel.strategy='replica': {config.model.name_or_path} does not fit whole in one "
            f"{parallel.gpu_memory_gb:g} GiB GPU (planner); allowed: strategy 'zero3'"
        )
    if not verdict.fits:
        need = verdict.bytes_per_gpu / 2**30
        raise ConfigError(
            f"parallel.workers={parallel.workers}: {config.model.name_or_path} needs about "
            f"{need:.1f} GiB per GPU under {verdict.strategy} (planner), over "
            f"parallel.gpu_memory_gb={parallel.gpu_memory_gb:g}; use more GPUs"
        )


def ray_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The job-level runtime env for ``ray.init``: this process's privzo package is shipped to
    the workers (``py_modules``), so they run the code the driver validated with, not whatever
    privzo a node may have installed; plus the configured environment variables."""
    import privzo

    runtime_env: dict[str, Any] = {"py_modules": [str(Path(privzo.__file__).parent)]}
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return runtime_env


def _init_ray(config: RunConfig) -> None:
    """Connect to the cluster (``ray job submit`` sets its address) or start a local one;
    a caller that already started Ray keeps its session (and its runtime env)."""
    import ray

    if not ray.is_initialized():
        ray.init(runtime_env=ray_runtime_env(config.parallel.env_vars))


def _cluster_resources() -> dict[str, float]:
    import ray

    return dict(ray.cluster_resources())


def worker_settings(
    config: RunConfig,
    cache_dir: Path,
    output_dir: Path,
    tracker: Any,
    tracking_root: Path | None,
) -> dict[str, Any]:
    """The worker function's only input: plain data Ray can ship to any node."""
    tracking = config.tracking
    return {
        "config": config.model_dump(mode="json"),
        "cache_dir": str(Path(cache_dir).resolve()),
        "output_dir": str(output_dir),
        "tracking": {
            "backend": tracking.backend,
            "uri": getattr(tracker, "uri", None),
            "experiment": tracking.experiment,
            "output_root": str((tracking_root or output_dir.parent).resolve()),
            "run_name": tracking.run_name or output_dir.name,
            "run_id": tracker.run_id,
        },
    }


CHECKPOINTS_KEPT = 2


def fit(config: RunConfig, settings: dict[str, Any], output_dir: Path) -> dict[str, Any]:
    """Run the workers under a TorchTrainer and return rank 0's result."""
    from ray.train import CheckpointConfig, FailureConfig, LoggingConfig, ScalingConfig
    from ray.train import RunConfig as RayRunConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    from privzo.distributed.worker import train_worker

    parallel = config.parallel
    storage = ray_storage(config, output_dir)
    # a name of its own per launch: Ray Train resumes a run whose name it finds in storage, and
    # a new run must never continue an old one's checkpoints (their noise was already drawn)
    ray_run = ray_run_name(output_dir)
    trainer = TorchTrainer(
        train_worker,
        train_loop_config=settings,
        torch_config=TorchConfig(backend="nccl" if parallel.use_gpu else "gloo"),
        scaling_config=ScalingConfig(
            num_workers=parallel.workers,
            use_gpu=parallel.use_gpu,
            resources_per_worker={"CPU": 1, **({"GPU": 1} if parallel.use_gpu else {})},
        ),
        run_config=RayRunConfig(
            name=ray_run,
            storage_path=storage,
            failure_config=FailureConfig(max_failures=parallel.max_failures),
            # the newest checkpoint is what a restart resumes from; one more in case the newest
            # is incomplete when a worker dies (each holds the whole trajectory so far)
            checkpoint_config=CheckpointConfig(num_to_keep=CHECKPOINTS_KEPT),
            # Ray Train's own INFO lines ("Checkpoint successfully created", per window and
            # rank) stay in its log files; privzo prints the run's progress itself
            logging_config=LoggingConfig(log_level="WARNING"),
        ),
    )
    try:
        result = trainer.fit()
    except Exception:
        _keep_checkpointed_steps(f"{storage.rstrip('/')}/{ray_run}", output_dir)
        raise
    value = result.return_value
    assert value is not None, "rank 0 returns the run's summary and trajectory"
    if "://" not in storage:  # remote storage is Ray's to manage
        _prune_checkpoints(Path(storage) / ray_run)
    return value


def ray_storage(config: RunConfig, output_dir: Path) -> str:
    """Where Ray Train keeps the run's checkpoints: ``parallel.storage_path`` (a URI as given,
    a path made absolute) or ``<output-dir>/ray``."""
    path = config.parallel.storage_path
    if path is not None and "://" in path:
        return path
    return str((Path(path).expanduser() if path else output_dir / RAY_STATE_DIR).resolve())


def ray_run_name(output_dir: Path) -> str:
    """The Ray Train run's name: the output directory's, plus a fresh suffix per launch."""
    return f"{output_dir.name}-{uuid.uuid4().hex[:8]}"


def _prune_checkpoints(checkpoints: Path) -> None:
    """Ray keeps the newest registered checkpoints, but not one a killed attempt uploaded and
    never registered: after a finished run, only the newest ``CHECKPOINTS_KEPT`` stay."""
    if not checkpoints.is_dir():  # remote storage (a URI) is Ray's to manage
        return
    found = sorted(path for path in checkpoints.glob("checkpoint_*") if path.is_dir())
    for stale in found[:-CHECKPOINTS_KEPT]:
        shutil.rmtree(stale)


def _keep_checkpointed_steps(run_path: str, output_dir: Path) -> None:
    """A failed run keeps the steps it made (as a single-process run does): the trajectory of
    the latest checkpoint Ray Train registered, read through ``Result.from_path`` so that
    checkpoints in cloud storage are found as well as local ones."""
    from ray.train import Result

    try:
        checkpoint = Result.from_path(run_path).checkpoint
    except RuntimeError:  # no run directory or no checkpoint registered: no steps to keep
        return
    if checkpoint is None:
        return
    with checkpoint.as_directory() as directory:
        shutil.copyfile(Path(directory) / TRAJECTORY_FILE, output_dir / TRAJECTORY_FILE)
