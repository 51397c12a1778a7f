"""Start a distributed run on Ray Train; the run pipeline (``privzo.run``) writes its records.

Everything that can be wrong with the layout is checked before any worker starts (the checks
below are called by preflight, ``privzo.preflight``, except the cluster's size and a built-in
model's fit, checked here once Ray is up): more workers than the cluster's CPUs (or GPUs), an
expected batch smaller than the number of workers (some
workers would almost always idle, and a private run's partitions could not all be sampled), a
model the planner says cannot fit the strategy (or the host its offloaded partitions), and
options the strategy does not support (offload settings included).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from privzo.config.run import RunConfig
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
from privzo.layouts.config import ParallelConfig
from privzo.layouts.context import RunHooks
from privzo.models.loading import pretrained_kwargs, resolve_source
from privzo.rundir.files import RAY_STATE_DIR, TRAJECTORY_FILE
from privzo.rundir.summary import RunRecords
from privzo.rundir.trajectory import read_run_trajectory, write_trajectory
from privzo.section import ConfigError
from privzo.tracking import Tracker

if TYPE_CHECKING:
    from privzo.models.architecture import DecoderArch
    from privzo.planner import Plan


def start_cluster(
    config: RunConfig,
    output_dir: Path,
    cache_dir: Path,
    progress: bool,
    tracking_uri: str | None,
    cluster: RayTarget | None = None,
) -> RayCluster:
    """Reach Ray (``cluster``: which one, ``privzo.distributed.cluster``) and check what
    preflight (``privzo.preflight``) could not, before the run pipeline (``privzo.run``) writes
    anything: a built-in model's fit on GPUs, the cluster's storage and its size. Returns the
    Ray used, for the line that names it."""
    source = resolve_source(config.model, cache_dir, progress)  # builds a built-in model once
    check_fit(config, source)
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


def check_layout(config: RunConfig) -> None:
    """Options a strategy cannot honour, before anything is loaded."""
    parallel = config.parallel
    if parallel.strategy == "zero3" and config.model.trainable != "full":
        raise ConfigError(
            f"model.trainable={config.model.trainable!r} with parallel.strategy='zero3'; "
            "allowed: 'full' (adapters are small: use strategy 'replica')"
        )
    if parallel.use_gpu and config.model.device == "cpu":
        raise ConfigError(
            "parallel.use_gpu=true with model.device='cpu'; set model.device='auto' or 'cuda'"
        )
    offloaded_gpu = parallel.offload != "none" and parallel.use_gpu
    if offloaded_gpu and config.optimizer.generator == "torch-blocks":
        # the forwards perturb on the GPU, the update runs on the host's partitions
        raise ConfigError(
            f"optimizer.generator='torch-blocks' with parallel.offload={parallel.offload!r} on "
            "GPUs: its values differ between the GPU, where the forwards are perturbed, and the "
            "host, where the offloaded partitions are updated; allowed: 'philox' or 'auto'"
        )
    if parallel.offload == "nvme":
        check_nvme_folder(Path(parallel.nvme_path or "").expanduser())


def check_nvme_folder(folder: Path) -> None:
    """The NVMe folder exists and this process can write in it (its size is judged against the
    plan in ``check_offload``)."""
    if not folder.is_dir():
        raise ConfigError(
            f"parallel.nvme_path={str(folder)!r} is not an existing folder; create it on a local "
            "NVMe drive (on every node), or use parallel.offload='cpu'"
        )
    try:  # a file made and removed: a read-only mount refuses it even to root
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        raise ConfigError(
            f"parallel.nvme_path={str(folder)!r} is not writable ({error.strerror}); choose a "
            "folder the workers can write, or use parallel.offload='cpu'"
        ) from None


def host_memory_gb(parallel: ParallelConfig) -> float:
    """``parallel.host_memory_gb``, or this machine's physical memory."""
    if parallel.host_memory_gb is not None:
        return parallel.host_memory_gb
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def config_plan(config: RunConfig, arch: DecoderArch) -> Plan:
    """The planner's verdict (``privzo.planner.Plan``) for ``arch`` laid out as ``config``
    says: its GPUs, dtype, forward batch and length, offload and (offloaded) host memory."""
    from privzo.planner import SEQ_LEN, plan

    parallel = config.parallel
    per_worker = max(1, config.optimizer.batch_size // parallel.workers)
    # a forward holds the activations of one micro-batch (optimizer.physical_batch_size) at most
    forward_batch = min(per_worker, config.optimizer.physical_batch_size or per_worker)
    offloaded = parallel.offload != "none"
    return plan(
        arch,
        gpus=parallel.workers,
        gpu_memory_gb=parallel.gpu_memory_gb,
        dtype=config.model.dtype,
        batch_size=forward_batch,
        # a prompt is task.max_length tokens at most; without it, the planner's default length
        seq_len=config.task.max_length or SEQ_LEN,
        offload=parallel.offload,
        host_memory_gb=host_memory_gb(parallel) if offloaded else None,
        forwards_per_step=2 * config.optimizer.directions_per_step,
    )


def check_offload(config: RunConfig, verdict: Plan) -> None:
    """The host holds the offloaded partitions, and the NVMe folder their files, as planned."""
    parallel = config.parallel
    gib = 2**30
    if verdict.host_fits is False and verdict.host_memory_bytes is not None:  # judged against it
        raise ConfigError(
            f"parallel.offload={parallel.offload!r}: {config.model.name_or_path} needs about "
            f"{verdict.host_bytes / gib:.1f} GiB of host memory for {parallel.workers} "
            f"worker(s) (planner), over the host's {verdict.host_memory_bytes / gib:.1f} GiB "
            "(parallel.host_memory_gb, or this machine's) less a 10% margin; use a host with "
            "more memory, or parallel.offload='nvme'"
        )
    if parallel.offload == "nvme":
        folder = Path(parallel.nvme_path or "").expanduser()
        free = shutil.disk_usage(folder).free
        if free < verdict.nvme_bytes:
            raise ConfigError(
                f"parallel.nvme_path={str(folder)!r} has {free / gib:.1f} GiB free; the "
                f"partitions of {config.model.name_or_path} take {verdict.nvme_bytes / gib:.1f} "
                "GiB (planner); free space there, or choose a larger drive"
            )


def check_offload_runs(config: RunConfig) -> None:
    """After the NVMe folder and its size are checked: the trainer cannot run ``nvme`` yet.
    DeepSpeed keeps a partition of 1 MiB or more only in a swap buffer while its layer runs (a
    one-element placeholder otherwise), so perturbation and update, which edit ``ds_tensor``
    in place outside the forwards, would have to swap each partition in and out themselves."""
    if config.parallel.offload == "nvme":
        raise ConfigError(
            "parallel.offload='nvme': DeepSpeed holds NVMe partitions in memory only while their "
            "layer runs, and privzo's perturbation and update do not swap them in and out yet; "
            "allowed: offload 'cpu' (host memory) or 'none'"
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
    """On GPUs, the planner's verdict for this model, strategy and GPU count; a model whose
    family the planner does not model is refused, since its fit cannot be checked."""
    parallel = config.parallel
    if not parallel.use_gpu:
        return
    from transformers import AutoConfig

    from privzo.models.architecture import arch_from_config

    hf_config = AutoConfig.from_pretrained(source, **pretrained_kwargs(config.model))
    try:
        arch = arch_from_config(hf_config)
    except ValueError as error:
        raise ConfigError(f"{config.model.name_or_path}: {error}") from None
    verdict = config_plan(config, arch)
    check_verdict(config, verdict)


def check_verdict(config: RunConfig, verdict: Plan) -> None:
    """Refuse what the planner's verdict (``privzo.planner.Plan``) says cannot fit: the host
    first where the partitions are offloaded, then the GPUs."""
    parallel = config.parallel
    if parallel.offload != "none":
        check_offload(config, verdict)
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
        raise _training_failed(error, parallel.max_failures, output_dir) from None
    except Exception:
        _keep_checkpointed_steps(run_path, output_dir)
        raise
    # fit() is annotated with the name ``ray.train.Result``, which a type checker reads as v1's
    assert isinstance(result, Result), "Train v2 returns its own Result"
    records: RunRecords | None = result.return_value
    assert records is not None, "rank 0 returns the run's summary and trajectory"
    remove_uncommitted(run_path, committed(run_path).registered)  # only Ray's newest stay
    return records


def _training_failed(error: Exception, max_failures: int, output_dir: Path) -> RayFailedError:
    """Ray Train's failure (a worker lost or raising, beyond ``max_failures`` restarts) as one
    line: what failed first and how the run goes on."""
    failures = getattr(error, "worker_failures", None) or {}
    if failures:
        rank, cause = min(failures.items())
        what = f"worker {rank}: {error_line(cause)}"
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
