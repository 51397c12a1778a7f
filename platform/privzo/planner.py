"""Memory planning for zeroth-order fine-tuning: will a model fit, and how should it be placed?

A zeroth-order step is two inference forwards and no backward pass, so its memory is that of
inference: the weights plus the activations of *one* forward (no gradients, no optimizer
state, nothing kept for a backward). That makes the estimate simple enough to write down and
check: :func:`estimate_forward_bytes` is the formula, :func:`plan` turns it into a placement
("replica": a full copy per GPU; "zero3": weights sharded across GPUs), and
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

_MIB = 2**20
_GIB = 2**30
DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
# Share of a GPU's memory the plan leaves free for fragmentation and estimate error.
SAFETY_MARGIN = 0.10
# Fixed per-GPU cost outside the tensors the formula counts: the CUDA context and kernels
# (typically 0.3-0.5 GiB) plus cuBLAS/attention workspaces. A round, stated number, not fitted.
GPU_OVERHEAD_BYTES = 1 * _GIB


@dataclass(frozen=True)
class OPTArch:
    """The sizes of an OPT decoder that determine its parameter count and activation memory."""

    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int = 50272
    max_positions: int = 2048
    # Width of the token embeddings; differs from ``hidden`` only for OPT-350m, which then
    # projects in (word -> hidden) and out (hidden -> word) with bias-free linears.
    word_embed_proj_dim: int | None = None
    # OPT-350m normalises after each sublayer and so has no final layer norm.
    final_layer_norm: bool = True

    @property
    def embed_dim(self) -> int:
        return self.hidden if self.word_embed_proj_dim is None else self.word_embed_proj_dim


# Published config values of the facebook/opt-* checkpoints (config.json on the Hugging Face
# hub / the OPT paper's table 1): num_hidden_layers, hidden_size, ffn_dim, num_attention_heads;
# all share vocab_size 50272 and max_position_embeddings 2048.
OPT_SIZES: dict[str, OPTArch] = {
    "opt-125m": OPTArch(layers=12, hidden=768, ffn=3072, heads=12),
    "opt-350m": OPTArch(
        layers=24, hidden=1024, ffn=4096, heads=16, word_embed_proj_dim=512, final_layer_norm=False
    ),
    "opt-1.3b": OPTArch(layers=24, hidden=2048, ffn=8192, heads=32),
    "opt-2.7b": OPTArch(layers=32, hidden=2560, ffn=10240, heads=32),
    "opt-6.7b": OPTArch(layers=32, hidden=4096, ffn=16384, heads=32),
    "opt-13b": OPTArch(layers=40, hidden=5120, ffn=20480, heads=40),
    "opt-30b": OPTArch(layers=48, hidden=7168, ffn=28672, heads=56),
    "opt-66b": OPTArch(layers=64, hidden=9216, ffn=36864, heads=72),
}


def resolve_arch(model: str | OPTArch) -> tuple[str, OPTArch]:
    """``(name, arch)`` for a known name (``opt-1.3b`` or ``facebook/opt-1.3b``) or an arch."""
    if isinstance(model, OPTArch):
        return "custom", model
    key = model.removeprefix("facebook/")
    if key not in OPT_SIZES:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(OPT_SIZES)}")
    return key, OPT_SIZES[key]


def arch_from_config(config: Any) -> OPTArch:
    """The :class:`OPTArch` of a ``transformers.OPTConfig`` (so tests and checks share shapes)."""
    return OPTArch(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        ffn=config.ffn_dim,
        heads=config.num_attention_heads,
        vocab=config.vocab_size,
        max_positions=config.max_position_embeddings,
        word_embed_proj_dim=config.word_embed_proj_dim,
        final_layer_norm=config.do_layer_norm_before and not config._remove_final_layer_norm,
    )


def _layer_parameters(arch: OPTArch) -> int:
    """One decoder layer: q/k/v/out and fc1/fc2 with biases, two layer norms."""
    h, f = arch.hidden, arch.ffn
    return 4 * (h * h + h) + (h * f + f + f * h + h) + 2 * (2 * h)


def count_parameters(arch: OPTArch) -> int:
    """Exact parameter count of an ``OPTForCausalLM`` whose LM head is tied to the embeddings.

    Counted once: token embeddings (tied head), learned positions (OPT offsets them by 2, so
    the table has ``max_positions + 2`` rows), per layer q/k/v/out projections with biases, two
    layer norms, fc1/fc2 with biases; the final layer norm and the bias-free project_in/out
    only where the architecture has them.
    """
    h, e = arch.hidden, arch.embed_dim
    total = arch.vocab * e + (arch.max_positions + 2) * h + arch.layers * _layer_parameters(arch)
    if arch.final_layer_norm:
        total += 2 * h
    if e != h:
        total += 2 * e * h
    return total


def _dtype_bytes(dtype: str) -> int:
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


ATTENTION = ("eager", "sdpa")


def estimate_activation_bytes(
    arch: OPTArch,
    batch_size: int,
    seq_len: int,
    dtype: str,
    *,
    attention: str = "eager",
    kv_cache: bool = False,
) -> int:
    """Peak activation memory of one inference forward of a Hugging Face OPT, in bytes.

    Without a backward pass nothing is kept for later, so the peak is what is alive at the
    worst moment inside one layer. With U = B·L·hidden, F = B·L·ffn and S = B·heads·L²
    elements, read off the forward code of ``transformers``' OPT:

    * alive through all layers: the token and the position embeddings (2U; the decoder keeps
      both names while it loops) and the attention mask (B·L², bool for sdpa);
    * only with ``kv_cache=True`` (a plain HF forward's default): the key/value cache, 2U per
      layer, all layers at the last one; privzo's scoring forwards pass ``use_cache=False``;
    * attention, eager: the layer input, its normed copy, q, k, v (5U) plus the masked scores
      and their fp32 softmax (S·(bytes + 4)); sdpa (fused): no S, but the output as well (6U);
    * feed-forward: the layer input, the post-attention residual, fc1's output and its
      activation (2U + 2F), plus, for eager, the attention weights the layer still holds (S);
    * the head: privzo scores one position per example, so logits are B·vocab, not B·L·vocab.

    Weights and build-time transients are not included; on GPU flash/mem-efficient sdpa is
    the usual path, and eager is the upper bound.
    """
    if attention not in ATTENTION:
        raise ValueError(f"unknown attention {attention!r}; known: {', '.join(ATTENTION)}")
    d = _dtype_bytes(dtype)
    eager = attention == "eager"
    b, n = batch_size, seq_len
    unit = b * n * arch.hidden * d
    ffn = b * n * arch.ffn * d
    scores = b * arch.heads * n * n
    kept = 2 * unit + b * n * n * (d if eager else 1)
    if kv_cache:
        kept += 2 * arch.layers * unit
    attention_peak = 5 * unit + scores * (d + 4) if eager else 6 * unit
    ffn_peak = 2 * unit + 2 * ffn + (scores * d if eager else 0)
    head_peak = 2 * unit + b * (arch.embed_dim + arch.vocab) * d
    return kept + max(attention_peak, ffn_peak, head_peak)


def estimate_forward_bytes(
    arch: OPTArch,
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

    def to_json(self) -> dict[str, Any]:
        """A plain dict for logs and the CLI."""
        return asdict(self)


def _check_resources(gpus: int, gpu_memory_gb: float) -> None:
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if gpu_memory_gb <= 0:
        raise ValueError(f"gpu_memory_gb must be > 0, got {gpu_memory_gb}")


def plan(
    model: str | OPTArch,
    *,
    gpus: int,
    gpu_memory_gb: float,
    dtype: str = "float16",
    batch_size: int = 16,
    seq_len: int = 256,
    attention: str = "eager",
    kv_cache: bool = False,
) -> Plan:
    """Choose the simplest placement that fits.

    "replica" (each GPU holds all weights and runs its own data shard) when weights +
    activations + overhead fit in one GPU with a 10% margin: no communication inside a forward.
    Otherwise "zero3": weights sharded over the GPUs (each holds 1/gpus of them, plus the one
    layer being gathered), activations and overhead still whole on every GPU.
    ``gpu_memory_gb`` is in GiB. The defaults (eager attention, key/value cache kept) are the
    conservative upper bound; see :func:`estimate_activation_bytes`.
    """
    _check_resources(gpus, gpu_memory_gb)
    name, arch = resolve_arch(model)
    parameters = count_parameters(arch)
    parameter_bytes = parameters * _dtype_bytes(dtype)
    activation_bytes = estimate_activation_bytes(
        arch, batch_size, seq_len, dtype, attention=attention, kv_cache=kv_cache
    )
    budget = int(gpu_memory_gb * _GIB * (1 - SAFETY_MARGIN))
    per_gpu_rest = activation_bytes + GPU_OVERHEAD_BYTES
    if parameter_bytes + per_gpu_rest <= budget:
        strategy, bytes_per_gpu = "replica", parameter_bytes + per_gpu_rest
    else:
        shard = -(-parameter_bytes // gpus)
        # ZeRO-3 all-gathers each layer's full weights just before using it: one whole
        # layer (the largest unit) is resident on top of the shard.
        gathered = _layer_parameters(arch) * _dtype_bytes(dtype)
        strategy, bytes_per_gpu = "zero3", shard + gathered + per_gpu_rest
    return Plan(
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


def _opt_config(arch: OPTArch, attention: str) -> Any:
    from transformers import OPTConfig

    config = OPTConfig(
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        ffn_dim=arch.ffn,
        num_attention_heads=arch.heads,
        vocab_size=arch.vocab,
        max_position_embeddings=arch.max_positions,
        word_embed_proj_dim=arch.embed_dim,
        do_layer_norm_before=arch.final_layer_norm,
        dropout=0.0,
        attention_dropout=0.0,
    )
    config._attn_implementation = attention
    return config


def _one_forward(arch: OPTArch, batch_size: int, seq_len: int, dtype: str, attention: str) -> None:
    """Build the model and score one batch the way privzo does (one position per example)."""
    from transformers import OPTForCausalLM

    from privzo.tasks.classification import Batch, score_label_logits

    model = OPTForCausalLM(_opt_config(arch, attention)).to(getattr(torch, dtype)).eval()
    model.requires_grad_(False)
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
    arch: OPTArch, batch_size: int, seq_len: int, dtype: str, attention: str
) -> float:
    """Peak RSS increase (MiB) of building ``arch`` and one forward, in this process."""
    _one_forward(replace(arch, layers=1), 2, 8, dtype, attention)  # one-time library set-up
    gc.collect()
    memory = PeakMemory("cpu")
    memory.reset()
    _one_forward(arch, batch_size, seq_len, dtype, attention)
    return memory.peak_increase_mb()


def measure_forward_peak_mb(
    arch_or_config: OPTArch | Any,
    batch_size: int,
    seq_len: int,
    dtype: str = "float32",
    *,
    attention: str = "eager",
) -> tuple[float, float]:
    """``(measured, estimated)`` MiB of building a tiny OPT and one scoring forward on CPU.

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
    if not isinstance(arch, OPTArch):
        arch = arch_from_config(arch_or_config)
    _dtype_bytes(dtype)
    args = json.dumps([asdict(arch), batch_size, seq_len, dtype, attention])
    code = (
        "import json, sys; from privzo.planner import OPTArch, _measure_here; "
        "a, b, n, d, at = json.loads(sys.argv[1]); "
        "print(_measure_here(OPTArch(**a), b, n, d, at))"
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
