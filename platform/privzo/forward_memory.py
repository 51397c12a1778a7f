"""The memory of one inference forward of a decoder: the formula, and its check on CPU.

A zeroth-order step is two inference forwards and no backward pass, so its memory is that of
inference: the weights plus the activations of *one* forward (no gradients, no optimizer
state, nothing kept for a backward). :func:`estimate_forward_bytes` is the formula (for every
decoder family of ``privzo.models.architecture``: OPT, Llama, Mistral, Qwen2, Qwen3) that
``privzo.planner`` places, and :func:`measure_forward_peak_mb` checks it against a real forward
on CPU.
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
from privzo.models.architecture import DecoderArch, arch_from_config, count_parameters
from privzo.models.shapes import DTYPE_BYTES, random_model

_MIB = 2**20
ATTENTION = ("eager", "sdpa")


def dtype_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype``, or a clear error for a dtype privzo does not know."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    return DTYPE_BYTES[dtype]


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
    d = dtype_bytes(dtype)
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
    weights = count_parameters(arch) * dtype_bytes(dtype)
    activations = estimate_activation_bytes(
        arch, batch_size, seq_len, dtype, attention=attention, kv_cache=kv_cache
    )
    return weights + activations + overhead_bytes


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
    dtype_bytes(dtype)
    args = json.dumps([asdict(arch), batch_size, seq_len, dtype, attention])
    code = (
        "import json, sys; from privzo.forward_memory import DecoderArch, _measure_here; "
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
