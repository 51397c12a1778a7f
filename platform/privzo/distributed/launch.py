"""Start a distributed run on Ray Train; the run pipeline (``privzo.run``) writes its records.

The layout is checked before any worker starts (``privzo.distributed.checks``, called by
preflight); the cluster's size and a built-in model's fit are checked here, once Ray is up.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privzo.config.run import RunConfig
from privzo.distributed.checks import check_fit, check_resources
from privzo.distributed.cluster import (
    RayCluster,
    RayFailedError,
    RayTarget,
    connect_ray,
    error_line,
)
from privzo.distributed.console import WORKER_SETUP_HOOK
from privzo.distributed.resume import committed, ray_run_path, remove_uncommitted, salvaged_rows
from privzo.distributed.storage import alive_nodes, check_cluster_storage
from privzo.layouts.context import RunHooks
from privzo.models.loading import resolve_source
from privzo.rundir.files import RAY_STATE_DIR, TRAJECTORY_FILE
from privzo.rundir.summary import RunRecords
from privzo.rundir.trajectory import read_run_trajectory, write_trajectory
from privzo.section import ConfigError
from privzo.tracking import Tracker

if TYPE_CHECKING:
    pass


def start_cluster(
    config: RunConfig,
    output_dir: Path,
    cache_dir: Path,
    progress: bool,
    tracking_uri: str | None,
    padded_rows: int | None,
    cluster: RayTarget | None = None,
) -> RayCluster:
    """Reach Ray (``cluster``: which one, ``privzo.distributed.cluster``) and check what
    preflight (``privzo.preflight``) could not, before the run pipeline (``privzo.run``) writes
    anything: a built-in model's fit on GPUs (at ``padded_rows``, the privacy plan's bound of a
    padded batch, which every worker forwards), the cluster's storage and its size. Returns the
    Ray used, for the line that names it."""
    source = resolve_source(config.model, cache_dir, progress)  # builds a built-in model once
    check_fit(config, source, padded_rows)
    used = _init_ray(config, cluster)
    check_cluster_storage(
        alive_nodes(),
        ray_storage(config, output_dir),
        config.tracking.uri or tracking_uri,
        storage_setting="parallel.storage_path",
        tracking=config.tracking.backend != "none",
    )
    check_resources(config, _cluster_resources())
    return used


def train_on_ray(
    config: RunConfig,
    output_dir: Path,
    cache_dir: Path,
    tracker: Tracker,
    tracking_root: Path | None,
    hooks: RunHooks | None,
    ray_run: str,
) -> RunRecords:
    """Train on Ray Train workers, rank 0 logging into ``tracker``'s run; rank 0's records
    (the summary, the privacy state, the trajectory as parquet bytes) for the run pipeline to
    write.

    ``ray_run`` names the Ray Train run: a new one (``ray_run_name``) for a new run, the
    earlier launch's to resume it (``privzo.distributed.resume``). ``hooks`` are the caller's
    (``after_window``, ``final_scores``), shipped to the workers and run where the layout says
    (``Layout.rank_hooks``)."""
    settings = worker_settings(config, cache_dir, output_dir, tracker, tracking_root)
    settings["hooks"] = hooks  # callables: Ray pickles them with cloudpickle
    return fit(config, settings, output_dir, ray_run)


def resumed_steps(config: RunConfig, output_dir: Path, ray_run: str) -> int:
    """The steps an earlier launch of the run left to resume from: the newest checkpoint Ray
    Train committed, or the trajectory a failed launch kept in the run directory if that holds
    more (Ray's storage lost). Raises ``ConfigError`` where the checkpoints cannot be read."""
    path = ray_run_path(ray_storage(config, output_dir), ray_run)
    return max(committed(path).steps, salvaged_rows(output_dir / TRAJECTORY_FILE))


def ray_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The job-level runtime env for ``ray.init``: this process's privzo package is shipped to
    the workers (``py_modules``), so they run the code the driver validated with, not whatever
    privzo a node may have installed; plus the configured environment variables."""
    import privzo

    runtime_env: dict[str, Any] = {
        "py_modules": [str(Path(privzo.__file__).parent)],
        "worker_process_setup_hook": WORKER_SETUP_HOOK,  # Ray's own noise off every console
    }
    if env_vars:
        runtime_env["env_vars"] = dict(env_vars)
    return runtime_env


def _init_ray(config: RunConfig, cluster: RayTarget | None) -> RayCluster:
    """Join the cluster ``cluster`` points to (``ray job submit`` sets ``RAY_ADDRESS``, which
    the CLI passes on) or start a local one; a caller that already started Ray keeps its
    session (and its runtime env)."""
    return connect_ray(cluster, ray_runtime_env(config.parallel.env_vars))


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
            "run_name": getattr(tracker, "run_name", None) or tracking.run_name,
            "run_id": tracker.run_id,
        },
    }


CHECKPOINTS_KEPT = 2


def fit(config: RunConfig, settings: dict[str, Any], output_dir: Path, ray_run: str) -> RunRecords:
    """Run the workers under a TorchTrainer and return rank 0's result."""
    # Train v2's classes from their own modules: ``ray.train`` re-exports them only when v2 is
    # on (Ray's default), which a type checker cannot follow; rank 0's return value and the
    # logging config exist only in v2, which the run needs anyway
    from ray.train.torch import TorchConfig
    from ray.train.v2.api.config import (
        CheckpointConfig,
        FailureConfig,
        LoggingConfig,
        ScalingConfig,
    )
    from ray.train.v2.api.config import RunConfig as RayRunConfig
    from ray.train.v2.api.exceptions import TrainingFailedError
    from ray.train.v2.api.result import Result
    from ray.train.v2.torch.torch_trainer import TorchTrainer

    from privzo.distributed.worker import train_worker

    parallel = config.parallel
    run_path = ray_run_path(ray_storage(config, output_dir), ray_run)
    settings["salvaged"] = _resume_from(run_path, output_dir)
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
            # one Ray Train run per privzo run, every launch under its name: Ray restores the
            # checkpoints earlier launches committed (a new run gets a new name, and never
            # continues an old run's checkpoints, whose noise was already drawn)
            name=ray_run,
            storage_path=ray_storage(config, output_dir),
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
    except TrainingFailedError as error:
        _keep_checkpointed_steps(run_path, output_dir)
        raise training_failed(error, parallel.max_failures, output_dir) from None
    except Exception:
        _keep_checkpointed_steps(run_path, output_dir)
        raise
    # fit() is annotated with the name ``ray.train.Result``, which a type checker reads as v1's
    assert isinstance(result, Result), "Train v2 returns its own Result"
    records: RunRecords | None = result.return_value
    assert records is not None, "rank 0 returns the run's summary and trajectory"
    remove_uncommitted(run_path, committed(run_path).registered)  # only Ray's newest stay
    return records


def training_failed(error: Exception, max_failures: int, output_dir: Path) -> RayFailedError:
    """Ray Train's failure (a worker lost or raising, beyond ``max_failures`` restarts) as one
    line: what failed first and how the run goes on."""
    failures = getattr(error, "worker_failures", None) or {}
    controller = getattr(error, "controller_failure", None)  # Ray's own first line says nothing
    if failures:
        rank, cause = min(failures.items())
        what = f"worker {rank}: {error_line(cause)}"
    elif isinstance(controller, BaseException):
        what = f"Ray Train's controller: {error_line(controller)}"
    else:
        what = error_line(error)
    return RayFailedError(
        f"the distributed run failed after {max_failures} worker restarts ({what}); "
        f"{output_dir} keeps the steps of its newest checkpoint: the same command resumes from "
        "them (a higher parallel.max_failures lets Ray restart lost workers within the run)"
    )


def _resume_from(run_path: str, output_dir: Path) -> bytes | None:
    """Before a launch: remove checkpoints no launch committed, and return the trajectory a
    failed launch kept in the run directory where it holds more steps than Ray's newest
    checkpoint (the workers resume from the newer; None: Ray's, or a fresh start)."""
    newest = committed(run_path)
    remove_uncommitted(run_path, newest.registered)
    salvaged = output_dir / TRAJECTORY_FILE
    if salvaged_rows(salvaged) > newest.steps:
        read_run_trajectory(salvaged)  # checked as a single run's resume checks it: its key
        return salvaged.read_bytes()
    return None


def ray_storage(config: RunConfig, output_dir: Path) -> str:
    """Where Ray Train keeps the run's checkpoints: ``parallel.storage_path`` (a URI as given,
    a path made absolute) or ``<output-dir>/ray``."""
    path = config.parallel.storage_path
    if path is not None and "://" in path:
        return path
    return str((Path(path).expanduser() if path else output_dir / RAY_STATE_DIR).resolve())


def ray_run_name(output_dir: Path) -> str:
    """A new run's Ray Train run name: the output directory's, plus a fresh suffix (a run in
    another directory of the same name, in shared storage, never meets it)."""
    return f"{output_dir.name}-{uuid.uuid4().hex[:8]}"


def _keep_checkpointed_steps(run_path: str, output_dir: Path) -> None:
    """A failed run keeps the steps it made (as a single-process run does): the trajectory of
    the newest checkpoint Ray Train committed, read through ``Result.from_path`` so that
    checkpoints in cloud storage are found as well as local ones."""
    try:
        checkpoint = committed(run_path).checkpoint
    except ConfigError:  # unreadable: the same command says so when it tries to resume
        return
    if checkpoint is None:
        return
    with checkpoint.as_directory() as directory:
        kept = (Path(directory) / TRAJECTORY_FILE).read_bytes()
    write_trajectory(output_dir, kept)
