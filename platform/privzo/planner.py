"""Memory planning for zeroth-order fine-tuning: will a model fit, and how should it be placed?

A zeroth-order step is two inference forwards and no backward pass, so its memory is that of
inference: the weights plus the activations of *one* forward (no gradients, no optimizer
state, nothing kept for a backward). That makes the estimate simple enough to write down and
check: :func:`estimate_forward_bytes` is the formula (for every decoder family of
``privzo.models.architecture``: OPT, Llama, Mistral, Qwen2, Qwen3), :func:`plan` turns it into
a placement ("replica": a full copy per GPU; "zero3": weights sharded across GPUs, or kept
in host memory or NVMe files with ``offload``), and
:func:`measure_forward_peak_mb` checks the formula against a real forward on CPU.

This is only the estimate of a later scale-out feature; nothing here places anything yet.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from privzo.memory import PeakMemory
from privzo.models.architecture import (
    DecoderArch,
    arch_from_config,
    count_parameters,
    layer_parameters,
)
from privzo.models.shapes import DTYPE_BYTES, random_model, resolve_shape

_MIB = 2**20
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


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


ATTENTION = ("eager", "sdpa")
# Tokens per example where a plan is not told its length: a long few-shot prompt.
SEQ_LEN = 256


@dataclass(frozen=True)
class _Units:
    """Bytes of the tensors one forward makes: U = B·L·hidden, Q = B·L·heads·head_dim,
    KV = B·L·kv_heads·head_dim, F = B·L·ffn, S = B·heads·L² elements (scores) and the mask."""

    unit: int
    query: int
    key_value: int
    ffn: int
    scores: int
    mask: int
    dtype_bytes: int


def _units(arch: DecoderArch, batch_size: int, seq_len: int, d: int, eager: bool) -> _Units:
    rows = batch_size * seq_len
    return _Units(
        unit=rows * arch.hidden * d,
        query=rows * arch.query_width * d,
        key_value=rows * arch.key_value_width * d,
        ffn=rows * arch.ffn * d,
        scores=batch_size * arch.heads * seq_len * seq_len,
        mask=batch_size * seq_len * seq_len * (d if eager else 1),
        dtype_bytes=d,
    )


def _opt_layer_peak(u: _Units, eager: bool) -> tuple[int, int]:
    """OPT: attention holds the layer input, its normed copy, q, k, v (5U) plus the masked
    scores and their fp32 softmax (S·(bytes + 4)), or for sdpa (fused) the output instead (6U);
    the feed-forward the layer input, the residual, fc1's output and its activation (2U + 2F),
    plus, for eager, the attention weights the layer still holds (S)."""
    d = u.dtype_bytes
    attention = 5 * u.unit + u.scores * (d + 4) if eager else 6 * u.unit
    ffn = 2 * u.unit + 2 * u.ffn + (u.scores * d if eager else 0)
    return attention, ffn


def _rotary_layer_peak(u: _Units, eager: bool, grouped: bool) -> tuple[int, int]:
    """The Llama family: attention holds the normed input, q, k, v and the rotary embedding's
    two temporaries of the queries (Q + 2KV + 2Q), the keys and values repeated to every query
    head where they are grouped (2Q), and for eager the masked scores, their fp32 softmax and
    its cast back to the model's dtype (S·(2·bytes + 4)); the gated MLP holds
    the post-attention residual, its normed copy and three F-sized tensors (the activated gate,
    up, and their product).
    The attention weights are dropped on return, so the MLP does not hold them."""
    d = u.dtype_bytes
    attention = u.unit + 3 * u.query + 2 * u.key_value + (2 * u.query if grouped else 0)
    attention += u.scores * (2 * d + 4) if eager else u.query
    return attention, 2 * u.unit + 3 * u.ffn


def estimate_activation_bytes(
    arch: DecoderArch,
    batch_size: int,
    seq_len: int,
    dtype: str,
    *,
    attention: str = "eager",
    kv_cache: bool = False,
) -> int:
    """Peak activation memory of one inference forward of a Hugging Face decoder, in bytes.

    Without a backward pass nothing is kept for later, so the peak is what is alive at the
    worst moment inside one layer, read off the forward code of ``transformers``' OPT and
    Llama-family models (the per-layer terms are in ``_opt_layer_peak`` and
    ``_rotary_layer_peak``):

    * alive through all layers: the token embeddings and the current hidden states (2U; OPT's
      position embeddings are the second U, the Llama family keeps the embeddings' name while
      it loops and its rotary cos/sin), and the attention mask (B·L², bool for sdpa);
    * only with ``kv_cache=True`` (a plain HF forward's default): the key/value cache, 2KV per
      layer, all layers at the last one; privzo's scoring forwards pass ``use_cache=False``;
    * the head: privzo scores one position per example, so logits are B·vocab, not B·L·vocab.

    Weights and build-time transients are not included; on GPU flash/mem-efficient sdpa is
    the usual path, and eager is the upper bound.
    """
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; known: {', '.join(ATTENTION)}")
    d = _dtype_bytes(dtype)
    eager = attention == "eager"
    u = _units(arch, batch_size, seq_len, d, eager)
    kept = 2 * u.unit + u.mask
    if kv_cache:
        kept += 2 * arch.layers * u.key_value
    if arch.traits.learned_positions:
        attention_peak, ffn_peak = _opt_layer_peak(u, eager)
    else:
        kept += 2 * batch_size * seq_len * arch.head_width * d  # rotary cos and sin
        grouped = arch.key_value_heads != arch.heads
        attention_peak, ffn_peak = _rotary_layer_peak(u, eager, grouped)
    head_peak = 2 * u.unit + batch_size * (arch.embed_dim + arch.vocab) * d
    return kept + max(attention_peak, ffn_peak, head_peak)


def estimate_forward_bytes(
    arch: DecoderArch,
    batch_size: int,
    seq_len: int,
    dtype: str,
    *,
    attention: str = "eager",
    kv_cache: bool = False,
    overhead_bytes: int = 0,
) -> int:
    """Weights + activations of one forward + a fixed overhead: the memory of a ZO step."""
    weights = count_parameters(arch) * _dtype_bytes(dtype)
    activations = estimate_activation_bytes(
        arch, batch_size, seq_len, dtype, attention=attention, kv_cache=kv_cache
    )
    return weights + activations + overhead_bytes


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


def _check_resources(gpus: int, gpu_memory_gb: float) -> None:
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb must be > 0, got {gpu_memory_gb}")


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
    conservative upper bound; see :func:`estimate_activation_bytes`.

    ``offload`` "cpu" or "nvme" is zero3 whatever fits: the partitions stay in host memory (or
    NVMe files) and a GPU holds only the layer being gathered, its activations and overhead
    (:func:`_offloaded`); ``host_memory_gb`` then judges the host too (``host_fits``).
    """
    _check_resources(gpus, gpu_memory_gb)
    if offload not in OFFLOADS:
        raise ValueError(f"unknown offload {offload!r}; known: {', '.join(OFFLOADS)}")
    name, arch = resolve_arch(model)
    parameters = count_parameters(arch)
    parameter_bytes = parameters * _dtype_bytes(dtype)
    activation_bytes = estimate_activation_bytes(
        arch, batch_size, seq_len, dtype, attention=attention, kv_cache=kv_cache
    )
    budget = int(gpu_memory_gb * _GIB * (1 - SAFETY_MARGIN))
    per_gpu_rest = activation_bytes + GPU_OVERHEAD_BYTES
    # ZeRO-3 all-gathers each layer's full weights just before using it: one whole layer (the
    # largest unit) is resident on top of the shard.
    gathered = layer_parameters(arch) * _dtype_bytes(dtype)
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
    d = _dtype_bytes(dtype)
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
    d = _dtype_bytes(result.dtype)
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


def _one_forward(
    arch: DecoderArch, batch_size: int, seq_len: int, dtype: str, attention: str
) -> None:
    """Build the model and score one batch the way privzo does (one position per example)."""
    from privzo.tasks.classification import Batch, score_label_logits

    model = random_model(arch, dtype, attn_implementation=attention)
    generator = torch.Generator().manual_seed(0)
    input_ids = torch.randint(4, arch.vocab, (batch_size, seq_len), generator=generator)
    mask = torch.ones_like(input_ids)
    mask[::2, seq_len // 2 :] = 0  # padding, as in real batches: forces an explicit mask
    batch = Batch(
        input_ids=input_ids,
        attention_mask=mask,
        positions=mask.sum(dim=1) - 1,
        labels=torch.zeros(batch_size, dtype=torch.long),
    )
    score_label_logits(model, batch, torch.tensor([4, 5]))


def _measure_here(
    arch: DecoderArch, batch_size: int, seq_len: int, dtype: str, attention: str
) -> float:
    """Peak RSS increase (MiB) of building ``arch`` and one forward, in this process."""
    _one_forward(replace(arch, layers=1), 2, 8, dtype, attention)  # one-time library set-up
    gc.collect()
    memory = PeakMemory("cpu")
    memory.reset()
    _one_forward(arch, batch_size, seq_len, dtype, attention)
    return memory.peak_increase_mb()


def measure_forward_peak_mb(
    arch_or_config: DecoderArch | Any,
    batch_size: int,
    seq_len: int,
    dtype: str = "float32",
    *,
    attention: str = "eager",
) -> tuple[float, float]:
    """``(measured, estimated)`` MiB of building a tiny decoder and one scoring forward on CPU.

    The window opens (``PeakMemory.reset``) *before* the model is built, so the measured
    peak increase counts weights + activations, what :func:`estimate_forward_bytes` predicts
    (with no overhead term: a throwaway 1-layer forward runs first, so one-time library set-up
    is not billed to the model). The build's own transient (an untied LM head, vocab x embed)
    is smaller than the forward's activations at the shapes this is meant for.

    It runs in a fresh Python process with glibc's mmap threshold pinned at 64 KiB: otherwise
    malloc reuses memory freed earlier in the process (and the threshold grows after frees),
    so RSS under-reports new tensors by an amount that depends on what ran before.
    Linux CPU only, and needs ``/proc/self/clear_refs``.
    """
    arch = arch_or_config
    if not isinstance(arch, DecoderArch):
        arch = arch_from_config(arch_or_config)
    _dtype_bytes(dtype)
    args = json.dumps([asdict(arch), batch_size, seq_len, dtype, attention])
    code = (
        "import json, sys; from privzo.planner import DecoderArch, _measure_here; "
        "a, b, n, d, at = json.loads(sys.argv[1]); "
        "print(_measure_here(DecoderArch(**a), b, n, d, at))"
    )
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    package_root = str(Path(__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", code, args], env=env, capture_output=True, text=True, check=True
    )
    measured = float(result.stdout.strip().splitlines()[-1])
    estimated = estimate_forward_bytes(arch, batch_size, seq_len, dtype, attention=attention)
    return measured, estimated / _MIB
