"""Named decoder shapes, from a tiny one for CPU to 70B models, and randomly initialised models
of them.

Each named shape holds the published ``config.json`` values of its checkpoint on the Hugging
Face hub (hidden_size, intermediate_size or ffn_dim, num_hidden_layers, num_attention_heads,
num_key_value_heads, vocab_size, max_position_embeddings, tie_word_embeddings, rope_theta);
``tiny`` is the 5.3M-parameter OPT the zero-order step benchmark runs on CPU, and ``tiny-llama``,
``tiny-qwen2`` and ``tiny-mistral`` its sizes in the other families. A shape is all a
benchmark, the planner or ``privzo models init`` needs: no checkpoint is downloaded.
:func:`resolve_shape` also takes a shape's hub id and a local model directory (its config.json
only).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from privzo.models.architecture import (
    FAMILIES,
    DecoderArch,
    arch_from_config,
    count_parameters,
    hf_config,
)

DTYPE_BYTES: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _opt(layers: int, hidden: int, heads: int, **rest: Any) -> DecoderArch:
    return DecoderArch(layers=layers, hidden=hidden, ffn=4 * hidden, heads=heads, **rest)


def _llama_like(
    family: str, layers: int, hidden: int, ffn: int, heads: int, kv_heads: int, **rest: Any
) -> DecoderArch:
    return DecoderArch(
        family=family,
        layers=layers,
        hidden=hidden,
        ffn=ffn,
        heads=heads,
        kv_heads=kv_heads,
        tie_embeddings=rest.pop("tie_embeddings", False),
        **rest,
    )


TINY = DecoderArch(layers=4, hidden=256, ffn=1024, heads=4, vocab=8192, max_positions=256)

# ``tiny``'s sizes in each other family, for comparing the families' steps on CPU: 4 query and 2
# key/value heads, a gated MLP 688 wide (2/3 of OPT's 1024 rounded up to a multiple of 16, so its
# three matrices hold what OPT's two do), and the head tied as ``tiny``'s, so a step's sweeps
# cover the same weights and only the layers' layout differs.
_TINY_FAMILY = {"ffn": 688, "vocab": 8192, "max_positions": 256, "tie_embeddings": True}
TINY_SHAPES: dict[str, DecoderArch] = {
    "tiny": TINY,
    **{
        f"tiny-{family}": _llama_like(family, 4, 256, heads=4, kv_heads=2, **_TINY_FAMILY)
        for family in ("llama", "qwen2", "mistral")
    },
}

# facebook/opt-*: all share vocab_size 50272 and max_position_embeddings 2048 (the OPT paper's
# table 1); OPT-350m has 512-wide embeddings projected in and out, and no final layer norm.
OPT_SHAPES: dict[str, DecoderArch] = {
    "opt-125m": _opt(12, 768, 12),
    "opt-350m": _opt(24, 1024, 16, word_embed_proj_dim=512, final_layer_norm=False),
    "opt-1.3b": _opt(24, 2048, 32),
    "opt-2.7b": _opt(32, 2560, 32),
    "opt-6.7b": _opt(32, 4096, 32),
    "opt-13b": _opt(40, 5120, 40),
    "opt-30b": _opt(48, 7168, 56),
    "opt-66b": _opt(64, 9216, 72),
}

_LLAMA3 = {"vocab": 128256, "max_positions": 131072, "rope_theta": 500000.0}
_LLAMA2 = {"vocab": 32000, "max_positions": 4096}
_QWEN25 = {"vocab": 152064, "max_positions": 131072, "rope_theta": 1000000.0}
_QWEN25_SMALL = {
    "vocab": 151936,
    "max_positions": 32768,
    "rope_theta": 1000000.0,
    "tie_embeddings": True,
}
FAMILY_SHAPES: dict[str, DecoderArch] = {
    "llama-3.1-8b": _llama_like("llama", 32, 4096, 14336, 32, 8, **_LLAMA3),
    "llama-3.1-70b": _llama_like("llama", 80, 8192, 28672, 64, 8, **_LLAMA3),
    "llama-2-7b": _llama_like("llama", 32, 4096, 11008, 32, 32, **_LLAMA2),
    "llama-2-13b": _llama_like("llama", 40, 5120, 13824, 40, 40, **_LLAMA2),
    "llama-2-70b": _llama_like("llama", 80, 8192, 28672, 64, 8, **_LLAMA2),
    "qwen2.5-0.5b": _llama_like("qwen2", 24, 896, 4864, 14, 2, **_QWEN25_SMALL),
    "qwen2.5-7b": _llama_like("qwen2", 28, 3584, 18944, 28, 4, **_QWEN25),
    "qwen2.5-72b": _llama_like("qwen2", 80, 8192, 29568, 64, 8, **_QWEN25),
    "mistral-7b": _llama_like("mistral", 32, 4096, 14336, 32, 8, vocab=32000, max_positions=32768),
}

SHAPES: dict[str, DecoderArch] = {**TINY_SHAPES, **OPT_SHAPES, **FAMILY_SHAPES}

# The hub checkpoint each named shape describes (the planner and preflight accept these ids).
HUB_IDS: dict[str, str] = {
    **{f"facebook/{name}": name for name in OPT_SHAPES},
    "meta-llama/Llama-3.1-8B": "llama-3.1-8b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B": "llama-3.1-70b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-2-7b-hf": "llama-2-7b",
    "meta-llama/Llama-2-13b-hf": "llama-2-13b",
    "meta-llama/Llama-2-70b-hf": "llama-2-70b",
    "Qwen/Qwen2.5-0.5B": "qwen2.5-0.5b",
    "Qwen/Qwen2.5-7B": "qwen2.5-7b",
    "Qwen/Qwen2.5-72B": "qwen2.5-72b",
    "mistralai/Mistral-7B-v0.1": "mistral-7b",
}


def known_shapes() -> str:
    """What a shape argument may be, for error messages."""
    return (
        f"known families: {', '.join(FAMILIES)}; named shapes: {', '.join(SHAPES)}; hub ids: "
        f"{', '.join(HUB_IDS)}; or a local model directory with a config.json"
    )


def resolve_named_shape(name: str) -> tuple[str, DecoderArch] | None:
    """``(name, arch)`` of a named shape or of a hub id that names one; None otherwise."""
    key = HUB_IDS.get(name, name)
    return (key, SHAPES[key]) if key in SHAPES else None


def resolve_shape(name: str) -> tuple[str, DecoderArch]:
    """``(name, arch)`` for a named shape (``llama-3.1-8b``), its hub id
    (``meta-llama/Llama-3.1-8B``) or a local model directory (its config.json is read, no
    weights); a ValueError listing what is known for anything else."""
    named = resolve_named_shape(name)
    if named is not None:
        return named
    directory = Path(name).expanduser()
    if (directory / "config.json").is_file():
        from transformers import AutoConfig

        try:
            return str(directory), arch_from_config(AutoConfig.from_pretrained(directory))
        except ValueError as error:
            raise ValueError(f"{name}: {error}") from None
    if not name.strip():
        raise ValueError(f"the model name is empty; {known_shapes()}")
    if directory.is_file():
        raise ValueError(f"{name!r} is a file; give a local model directory (its config.json)")
    if directory.is_dir():
        raise ValueError(
            f"{name!r} is a directory without a config.json; give a directory saved with "
            "save_pretrained (its config.json is read, no weights)"
        )
    raise ValueError(f"unknown shape {name!r}; {known_shapes()}")


def resolve_dtype(name: str) -> torch.dtype:
    if name not in TORCH_DTYPES:
        raise ValueError(f"unknown dtype {name!r}; known: {', '.join(TORCH_DTYPES)}")
    return TORCH_DTYPES[name]


def weight_bytes(arch: DecoderArch, dtype: str) -> int:
    """Bytes of the weights of ``arch`` in ``dtype``."""
    resolve_dtype(dtype)
    return count_parameters(arch) * DTYPE_BYTES[dtype]


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
    arch: DecoderArch,
    dtype: str = "float32",
    device: str | torch.device = "cpu",
    seed: int = 0,
    **config_extra: Any,
) -> Any:
    """A randomly initialised ``*ForCausalLM`` of ``arch``, built directly in ``dtype`` on
    ``device`` (no fp32 copy first, so a half-precision model needs only its own bytes), frozen
    and in eval mode; seeded without touching the global generator. ``config_extra`` (token
    ids, attention implementation) goes to the config."""
    from transformers import AutoModelForCausalLM

    config = hf_config(arch, **config_extra)
    with torch.random.fork_rng(devices=_cuda_ids(device)), _default_dtype(resolve_dtype(dtype)):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config)
    return model.eval().requires_grad_(False)
