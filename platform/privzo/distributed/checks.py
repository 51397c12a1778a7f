"""The checks of a distributed layout, each a ``ConfigError`` before any worker starts.

Preflight (``privzo.preflight``) calls them, and the launch (``privzo.distributed.launch``)
the cluster's size and a built-in model's fit once Ray is up: more workers than the cluster's
CPUs (or GPUs), an expected batch smaller than the number of workers (some workers would almost
always idle, and a private run's partitions could not all be sampled), a model the planner says
cannot fit the strategy (or the host its offloaded partitions), and options the strategy does
not support (offload settings included).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from privzo.config.run import RunConfig
from privzo.layouts.config import ParallelConfig
from privzo.models.loading import pretrained_kwargs
from privzo.section import ConfigError

if TYPE_CHECKING:
    from privzo.models.architecture import DecoderArch
    from privzo.planner import Plan


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


def config_plan(config: RunConfig, arch: DecoderArch, padded_rows: int | None) -> Plan:
    """The planner's verdict (``privzo.planner.Plan``) for ``arch`` laid out as ``config``
    says: its GPUs, dtype, forward batch (of ``padded_rows`` where batches are padded to the
    privacy plan's bound) and length, offload and (offloaded) host memory."""
    from privzo.planner import forward_shape, plan

    parallel = config.parallel
    forward_batch, seq_len = forward_shape(config, padded_rows, arch)
    offloaded = parallel.offload != "none"
    return plan(
        arch,
        gpus=parallel.workers,
        gpu_memory_gb=parallel.gpu_memory_gb,
        dtype=config.model.dtype,
        batch_size=forward_batch,
        seq_len=seq_len,
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


def check_fit(config: RunConfig, source: str, padded_rows: int | None) -> None:
    """On GPUs, the planner's verdict for this model, strategy and GPU count, at the rows a
    worker forwards (``padded_rows``: ``privzo.planner.forward_shape``); a model whose family
    the planner does not model is refused, since its fit cannot be checked."""
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
    verdict = config_plan(config, arch, padded_rows)
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
