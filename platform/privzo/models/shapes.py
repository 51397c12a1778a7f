"""Named OPT shapes, from a tiny one for CPU to OPT-66B, and randomly initialised models of them.

The OPT sizes are the planner's (the published facebook/opt-* config values); ``tiny`` is the
5.3M-parameter model the zero-order step benchmark has always used on CPU. A shape is all a
benchmark or ``privzo models init`` needs: no checkpoint is downloaded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from transformers import OPTConfig, OPTForCausalLM

from privzo.planner import DTYPE_BYTES, OPT_SIZES, OPTArch, count_parameters

TINY = OPTArch(layers=4, hidden=256, ffn=1024, heads=4, vocab=8192, max_positions=256)
SHAPES: dict[str, OPTArch] = {"tiny": TINY, **OPT_SIZES}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_shape(name: str) -> OPTArch:
    """The shape called ``name`` (``opt-1.3b`` or ``facebook/opt-1.3b``)."""
    key = name.removeprefix("facebook/")
    if key not in SHAPES:
        raise ValueError(f"unknown shape {name!r}; known: {', '.join(SHAPES)}")
    return SHAPES[key]


def resolve_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def weight_bytes(arch: OPTArch, dtype: str) -> int:
    """Bytes of the weights of ``arch`` in ``dtype`` (the LM head tied to the embeddings)."""
    resolve_dtype(dtype)
    return count_parameters(arch) * DTYPE_BYTES[dtype]


def opt_config(arch: OPTArch, **token_ids: Any) -> OPTConfig:
    """The ``OPTConfig`` of ``arch``; dropout off, as privzo scores and trains without it.

    OPT-350m is the one post-norm size (``do_layer_norm_before=False``), which is also what
    drops its final layer norm in ``transformers``; its token embeddings are narrower than the
    hidden size and projected in and out.
    """
    return OPTConfig(
        vocab_size=arch.vocab,
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        ffn_dim=arch.ffn,
        num_attention_heads=arch.heads,
        max_position_embeddings=arch.max_positions,
        word_embed_proj_dim=arch.embed_dim,
        do_layer_norm_before=arch.final_layer_norm,
        dropout=0.0,
        attention_dropout=0.0,
        **token_ids,
    )


@contextlib.contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def _cuda_ids(device: str | torch.device) -> list[int]:
    """The CUDA device id ``fork_rng`` must save and restore for ``device`` (none off CUDA)."""
    where = torch.device(device)
    if where.type != "cuda":
        return []
    return [torch.cuda.current_device() if where.index is None else where.index]


def random_model(
    arch: OPTArch,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
    **token_ids: Any,
) -> OPTForCausalLM:
    """A randomly initialised OPT of ``arch``, built directly in ``dtype`` on ``device`` (no
    fp32 copy first, so a half-precision model needs only its own bytes), frozen and in eval
    mode; seeded without touching the global generator."""
    with torch.random.fork_rng(devices=_cuda_ids(device)), _default_dtype(resolve_dtype(dtype)):
        torch.manual_seed(seed)
        with torch.device(device):
            model = OPTForCausalLM(opt_config(arch, **token_ids))
    return model.eval().requires_grad_(False)
