"""Memory planning for zeroth-order fine-tuning: will a model fit, and how should it be placed?

:func:`plan` turns the memory of one forward (``privzo.forward_memory``: weights plus the
activations of one inference forward, all a ZO step holds) into a placement ("replica": a full
copy per GPU; "zero3": weights sharded across GPUs, or kept in host memory or NVMe files with
``offload``); :func:`cpu_worker_bytes` is the same arithmetic for a CPU worker process.

This is only the estimate of a later scale-out feature; nothing here places anything yet.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from privzo.forward_memory import dtype_bytes, estimate_activation_bytes
from privzo.layouts.config import MAX_MEMORY_GB
from privzo.models.architecture import DecoderArch, count_parameters, layer_parameters
from privzo.models.shapes import resolve_shape

if TYPE_CHECKING:
    from privzo.config.run import RunConfig

_GIB = 2**30
# Share of a GPU's memory the plan leaves free for fragmentation and estimate error.
SAFETY_MARGIN = 0.10
# Fixed per-GPU cost outside the tensors the formula counts: the CUDA context and kernels
# (typically 0.3-0.5 GiB) plus cuBLAS/attention workspaces. A round, stated number, not fitted.
GPU_OVERHEAD_BYTES = 1 * _GIB
# Where ZeRO-3's partitions live between forwards (``parallel.offload``).
OFFLOADS = ("none", "cpu", "nvme")
# Host memory of each worker process beyond the partitions it holds: torch, transformers,
# DeepSpeed and the CUDA host libraries, and the load path's buffers. A round, stated number.
HOST_OVERHEAD_BYTES = 4 * _GIB
# Memory of a CPU worker process beyond the tensors the formula counts: the interpreter with
# torch, transformers, DeepSpeed and Ray imported (611 MiB on Linux, torch 2.13). A round number.
CPU_PROCESS_BYTES = int(0.6 * _GIB)
# gloo's all-gather on CPU stages the gathered tensor in a buffer of its own before copying it
# out: gathering a 393 MiB parameter over 2 ranks raised each rank's peak by 787 MiB.
GLOO_GATHER_COPIES = 2
# DeepSpeed's NVMe swap buffers in pinned host memory, per worker: buffer_count (5) buffers of
# the largest parameter (``privzo.distributed.zero3`` sizes them so).
NVME_BUFFERS = 5


def resolve_arch(model: str | DecoderArch) -> tuple[str, DecoderArch]:
    """``(name, arch)`` for a named shape, a hub id known as one, a local model directory (its
    config.json), or an arch (named "custom")."""
    if isinstance(model, DecoderArch):
        return "custom", model
    return resolve_shape(model)


# Tokens per example where a plan is not told its length: a long few-shot prompt.
SEQ_LEN = 256


def forward_shape(config: RunConfig, padded_rows: int | None, arch: DecoderArch) -> tuple[int, int]:
    """The batch and length of one of ``config``'s forwards on one worker, the one owner of
    the rows and tokens a worker runs: its share of the batch, at most one micro-batch
    (``optimizer.physical_batch_size``), of prompts of ``task.max_length`` tokens at most.
    Without ``task.max_length`` a padded run (``task.pad_to='max_length'``) pads every batch to
    the model's positions, as the task does; an unpadded one plans the default ``SEQ_LEN``.

    ``padded_rows``: the privacy plan's bound of a padded batch (``PrivacyPlan.max_batch_size``,
    set where ``task.pad_to='max_length'``, a private run's default; None otherwise). Every
    worker then forwards that public shape, whatever its share, so a worker's forward has that
    many rows (at most a micro-batch), not its share. It has no default so that no fit check
    plans the unpadded share by leaving it out."""
    rows = padded_rows or max(1, config.optimizer.batch_size // config.parallel.workers)
    forward_batch = min(rows, config.optimizer.physical_batch_size or rows)
    unset = arch.max_positions if config.pad_to == "max_length" else SEQ_LEN
    return forward_batch, min(config.task.max_length or unset, arch.max_positions)


def planned_step_bytes(config: RunConfig, arch: DecoderArch, padded_rows: int | None) -> int:
    """What one zeroth-order step of ``config`` needs above the weights, by the formula: the
    activations of one forward (``forward_shape``) of prompts no longer than the model's
    positions (eager attention, the upper bound; no key/value cache, as privzo's scoring
    forwards keep none)."""
    batch, seq_len = forward_shape(config, padded_rows, arch)
    return estimate_activation_bytes(arch, batch, seq_len, config.model.dtype)


@dataclass(frozen=True)
class Plan:
    """Where the weights go and whether one ZO step fits in each GPU's memory."""

    model: str
    parameters: int
    parameter_bytes: int
    activation_bytes: int
    overhead_bytes: int
    dtype: str
    attention: str
    kv_cache: bool
    strategy: str
    gpus: int
    bytes_per_gpu: int
    gpu_memory_bytes: int
    fits: bool
    offload: str = "none"
    # host memory the offloaded partitions (all GPUs' workers on one host) and processes need
    host_bytes: int = 0
    nvme_bytes: int = 0  # the partitions' files under parallel.nvme_path
    # bytes copied from the offload device to each GPU per step (2 forwards per direction)
    offload_bytes_per_step: int = 0
    host_memory_bytes: int | None = None  # the host's memory, where given
    host_fits: bool | None = None  # None: no host memory given, or nothing offloaded

    def to_json(self) -> dict[str, Any]:
        """A plain dict for logs and the CLI."""
        return asdict(self)


def _check_resources(
    gpus: int, gpu_memory_gb: float, shape: tuple[int, int], host_memory_gb: float | None
) -> None:
    """Refuse what no machine or run has, before an answer is computed from it."""
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    _check_memory("gpu_memory_gb", gpu_memory_gb)
    if host_memory_gb is not None:
        _check_memory("host_memory_gb", host_memory_gb)
    for name, value in zip(("batch_size", "seq_len"), shape, strict=True):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")


def _check_memory(name: str, gib: float) -> None:
    if not (math.isfinite(gib) and 0 < gib <= MAX_MEMORY_GB):
        raise ValueError(
            f"{name} must be a finite number > 0 and ≤ {MAX_MEMORY_GB} (GiB; no machine has "
            f"more), got {gib}"
        )


def plan(
    model: str | DecoderArch,
    *,
    gpus: int,
    gpu_memory_gb: float,
    dtype: str = "float16",
    batch_size: int = 16,
    seq_len: int = SEQ_LEN,
    attention: str = "eager",
    kv_cache: bool = False,
    offload: str = "none",
    host_memory_gb: float | None = None,
    forwards_per_step: int = 2,
) -> Plan:
    """Choose the simplest placement that fits.

    "replica" (each GPU holds all weights and runs its own data shard) when weights +
    activations + overhead fit in one GPU with a 10% margin: no communication inside a forward.
    Otherwise "zero3": weights sharded over the GPUs (each holds 1/gpus of them, plus the one
    layer being gathered), activations and overhead still whole on every GPU.
    ``gpu_memory_gb`` is in GiB. The defaults (eager attention, key/value cache kept) are the
    conservative upper bound; see ``privzo.forward_memory.estimate_activation_bytes``.

    ``offload`` "cpu" or "nvme" is zero3 whatever fits: the partitions stay in host memory (or
    NVMe files) and a GPU holds only the layer being gathered, its activations and overhead
    (:func:`_offloaded`); ``host_memory_gb`` then judges the host too (``host_fits``).
    """
    _check_resources(gpus, gpu_memory_gb, (batch_size, seq_len), host_memory_gb)
    if offload not in OFFLOADS:
        raise ValueError(f"unknown offload {offload!r}; known: {', '.join(OFFLOADS)}")
    name, arch = resolve_arch(model)
    parameters = count_parameters(arch)
    parameter_bytes = parameters * dtype_bytes(dtype)
    activation_bytes = estimate_activation_bytes(
        arch, batch_size, seq_len, dtype, attention=attention, kv_cache=kv_cache
    )
    budget = int(gpu_memory_gb * _GIB * (1 - SAFETY_MARGIN))
    per_gpu_rest = activation_bytes + GPU_OVERHEAD_BYTES
    # ZeRO-3 all-gathers each layer's full weights just before using it: one whole layer (the
    # largest unit) is resident on top of the shard.
    gathered = layer_parameters(arch) * dtype_bytes(dtype)
    if offload == "none" and parameter_bytes + per_gpu_rest <= budget:
        strategy, bytes_per_gpu = "replica", parameter_bytes + per_gpu_rest
    else:
        shard = 0 if offload != "none" else -(-parameter_bytes // gpus)
        strategy, bytes_per_gpu = "zero3", shard + gathered + per_gpu_rest
    result = Plan(
        model=name,
        parameters=parameters,
        parameter_bytes=parameter_bytes,
        activation_bytes=activation_bytes,
        overhead_bytes=GPU_OVERHEAD_BYTES,
        dtype=dtype,
        attention=attention,
        kv_cache=kv_cache,
        strategy=strategy,
        gpus=gpus,
        bytes_per_gpu=bytes_per_gpu,
        gpu_memory_bytes=int(gpu_memory_gb * _GIB),
        fits=bytes_per_gpu <= budget,
    )
    if offload == "none":
        return result
    return _offloaded(result, arch, offload, host_memory_gb, forwards_per_step)


def cpu_worker_bytes(
    model: str | DecoderArch,
    *,
    strategy: str,
    workers: int,
    dtype: str,
    batch_size: int,
    seq_len: int,
    attention: str = "eager",
) -> int:
    """Peak memory of one worker process of a CPU run, where the process's memory is the
    device's: the weights it holds (all of them, or under "zero3" its 1/workers partition, offloaded
    or not: host memory is its own, plus the largest unit DeepSpeed gathers, a layer or the token
    embedding, twice: gloo's staging buffer and the gathered tensor), the activations of one
    forward of ``batch_size`` (its share of a batch) and ``CPU_PROCESS_BYTES``."""
    if strategy not in ("single", "replica", "zero3"):
        raise ValueError(f"unknown strategy {strategy!r}; known: single, replica, zero3")
    _, arch = resolve_arch(model)
    d = dtype_bytes(dtype)
    weights = count_parameters(arch) * d
    if strategy == "zero3":
        gathered = max(layer_parameters(arch), largest_parameter(arch)) * d
        weights = -(-weights // workers) + GLOO_GATHER_COPIES * gathered
    activations = estimate_activation_bytes(arch, batch_size, seq_len, dtype, attention=attention)
    return weights + activations + CPU_PROCESS_BYTES


def _offloaded(
    result: Plan, arch: DecoderArch, offload: str, host_memory_gb: float | None, forwards: int
) -> Plan:
    """The offload figures of a zero3 plan. Host: the partitions of every GPU's worker (all on
    one host: a one-node run, the upper bound) in host memory for "cpu", or DeepSpeed's swap
    buffers of the largest parameter for "nvme", plus ``HOST_OVERHEAD_BYTES`` per worker; the
    host keeps the same 10% margin as a GPU. Moved: each forward copies every partition to its
    GPU once (then all-gathered between GPUs), so a step moves forwards × partition per GPU."""
    d = dtype_bytes(result.dtype)
    partition = -(-result.parameter_bytes // result.gpus)
    if offload == "cpu":
        held = result.parameter_bytes
    else:
        held = result.gpus * NVME_BUFFERS * largest_parameter(arch) * d
    host_bytes = held + result.gpus * HOST_OVERHEAD_BYTES
    host_fits = None
    if host_memory_gb is not None:
        host_fits = host_bytes <= int(host_memory_gb * _GIB * (1 - SAFETY_MARGIN))
    return replace(
        result,
        offload=offload,
        host_bytes=host_bytes,
        nvme_bytes=result.parameter_bytes if offload == "nvme" else 0,
        offload_bytes_per_step=forwards * partition,
        host_memory_bytes=None if host_memory_gb is None else int(host_memory_gb * _GIB),
        host_fits=host_fits,
        fits=result.fits and host_fits is not False,
    )


def largest_parameter(arch: DecoderArch) -> int:
    """Elements of the largest single parameter: the token embedding (vocab × embed_dim), or a
    feed-forward matrix where that is larger."""
    return max(arch.vocab * arch.embed_dim, arch.hidden * arch.ffn)
