"""Decoder architectures described by their sizes: what the planner, the named shapes and
``privzo models init`` share, for every decoder family privzo knows.

A :class:`DecoderArch` holds what determines a decoder's parameter count and activation memory:
the sizes (layers, hidden, feed-forward, query and key/value heads, head width, vocabulary),
whether the LM head is tied to the token embeddings, and the family's layer layout (OPT: learned
positions, biases everywhere, LayerNorm, a two-matrix ReLU MLP; the Llama family: rotary
positions, RMSNorm, a gated three-matrix MLP, grouped key/value heads, and per family the biases
or query/key norms its attention has). It is read from a ``transformers`` config
(:func:`arch_from_config`) and turned back into one (:func:`hf_config`), so a shape is all a
benchmark needs: no checkpoint is read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Family:
    """What a decoder family's layers hold beyond the sizes (the same for all its checkpoints)."""

    model_type: str  # transformers' ``config.model_type``
    learned_positions: bool  # a learned position table (OPT) instead of rotary positions
    layer_norm: bool  # LayerNorm (weight and bias) instead of RMSNorm (weight only)
    gated_mlp: bool  # gate/up/down projections (SwiGLU) instead of fc1/fc2
    qkv_bias: bool  # biases on the query, key and value projections
    out_bias: bool  # biases on the attention output and the MLP projections
    qk_norm: bool  # an RMSNorm over each head's queries and keys (Qwen3)
    config_class: str  # the transformers config class that builds this family


FAMILIES: dict[str, Family] = {
    "opt": Family("opt", True, True, False, True, True, False, "OPTConfig"),
    "llama": Family("llama", False, False, True, False, False, False, "LlamaConfig"),
    "mistral": Family("mistral", False, False, True, False, False, False, "MistralConfig"),
    "qwen2": Family("qwen2", False, False, True, True, False, False, "Qwen2Config"),
    "qwen3": Family("qwen3", False, False, True, False, False, True, "Qwen3Config"),
}


@dataclass(frozen=True)
class DecoderArch:
    """The sizes of a decoder that determine its parameter count and activation memory.

    ``kv_heads`` and ``head_dim`` default to ``heads`` and ``hidden // heads`` (no grouped
    key/value heads, the usual head width). ``word_embed_proj_dim`` and ``final_layer_norm``
    are OPT's: OPT-350m has narrower token embeddings projected in and out, and no final norm.
    """

    layers: int
    hidden: int
    ffn: int
    heads: int
    vocab: int = 50272
    max_positions: int = 2048
    family: str = "opt"
    kv_heads: int | None = None
    head_dim: int | None = None
    tie_embeddings: bool = True
    word_embed_proj_dim: int | None = None
    final_layer_norm: bool = True
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"unknown family {self.family!r}; known: {', '.join(FAMILIES)}")
        if self.heads % self.key_value_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}")

    @property
    def traits(self) -> Family:
        return FAMILIES[self.family]

    @property
    def embed_dim(self) -> int:
        return self.hidden if self.word_embed_proj_dim is None else self.word_embed_proj_dim

    @property
    def key_value_heads(self) -> int:
        return self.heads if self.kv_heads is None else self.kv_heads

    @property
    def head_width(self) -> int:
        return self.hidden // self.heads if self.head_dim is None else self.head_dim

    @property
    def query_width(self) -> int:
        """Width of all query heads together (``hidden`` unless the head width is set apart)."""
        return self.heads * self.head_width

    @property
    def key_value_width(self) -> int:
        return self.key_value_heads * self.head_width


def _norm_parameters(arch: DecoderArch, width: int) -> int:
    return 2 * width if arch.traits.layer_norm else width


def _attention_parameters(arch: DecoderArch) -> int:
    traits, h = arch.traits, arch.hidden
    q, kv = arch.query_width, arch.key_value_width
    total = h * q + 2 * h * kv + q * h
    if traits.qkv_bias:
        total += q + 2 * kv
    if traits.out_bias:
        total += h
    if traits.qk_norm:
        total += 2 * arch.head_width
    return total


def _mlp_parameters(arch: DecoderArch) -> int:
    h, f = arch.hidden, arch.ffn
    if arch.traits.gated_mlp:
        return 3 * h * f + (2 * f + h if arch.traits.out_bias else 0)
    return 2 * h * f + (f + h if arch.traits.out_bias else 0)


def layer_parameters(arch: DecoderArch) -> int:
    """One decoder layer: attention, MLP and its two norms (the unit ZeRO-3 gathers)."""
    return (
        _attention_parameters(arch)
        + _mlp_parameters(arch)
        + 2 * _norm_parameters(arch, arch.hidden)
    )


def count_parameters(arch: DecoderArch) -> int:
    """Exact parameter count of the ``*ForCausalLM`` of ``arch``.

    Counted once: token embeddings, the LM head only when it is not tied to them, OPT's learned
    positions (offset by 2, so the table has ``max_positions + 2`` rows) and its bias-free
    project_in/out where the embeddings are narrower, the layers, and the final norm where the
    architecture has one. Rotary positions have no parameters.
    """
    h, e = arch.hidden, arch.embed_dim
    total = arch.vocab * e + arch.layers * layer_parameters(arch)
    if not arch.tie_embeddings:
        total += arch.vocab * e
    if arch.traits.learned_positions:
        total += (arch.max_positions + 2) * h
    if arch.final_layer_norm:
        total += _norm_parameters(arch, h)
    if e != h:
        total += 2 * e * h
    return total


def arch_from_config(config: Any) -> DecoderArch:
    """The :class:`DecoderArch` of a ``transformers`` config of a known family; a ValueError
    naming the known families for any other."""
    model_type = getattr(config, "model_type", None)
    if model_type not in FAMILIES:
        raise ValueError(
            f"model_type {model_type!r} is not a decoder family privzo models; known families: "
            f"{', '.join(FAMILIES)}"
        )
    if model_type == "opt":
        return _opt_arch(config)
    if model_type == "llama" and (config.attention_bias or config.mlp_bias):
        raise ValueError("a Llama config with attention_bias or mlp_bias is not modelled")
    return DecoderArch(
        family=model_type,
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        ffn=config.intermediate_size,
        heads=config.num_attention_heads,
        kv_heads=config.num_key_value_heads,
        head_dim=getattr(config, "head_dim", None),
        vocab=config.vocab_size,
        max_positions=config.max_position_embeddings,
        tie_embeddings=bool(config.tie_word_embeddings),
        rope_theta=float(_rope_parameters(config).get("rope_theta", 10000.0)),
    )


def _rope_parameters(config: Any) -> dict[str, Any]:
    parameters = getattr(config, "rope_parameters", None)
    return parameters if isinstance(parameters, dict) else {}


def _opt_arch(config: Any) -> DecoderArch:
    return DecoderArch(
        layers=config.num_hidden_layers,
        hidden=config.hidden_size,
        ffn=config.ffn_dim,
        heads=config.num_attention_heads,
        vocab=config.vocab_size,
        max_positions=config.max_position_embeddings,
        tie_embeddings=bool(getattr(config, "tie_word_embeddings", True)),
        word_embed_proj_dim=config.word_embed_proj_dim,
        final_layer_norm=config.do_layer_norm_before and not config._remove_final_layer_norm,
    )


def hf_config(arch: DecoderArch, **extra: Any) -> Any:
    """The ``transformers`` config of ``arch``; dropout off, as privzo scores and trains
    without it. ``extra`` (token ids, attention implementation) is passed through."""
    import transformers

    config_class = getattr(transformers, arch.traits.config_class)
    if arch.family == "opt":
        return config_class(**_opt_values(arch), **extra)
    values: dict[str, Any] = {
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        "intermediate_size": arch.ffn,
        "num_hidden_layers": arch.layers,
        "num_attention_heads": arch.heads,
        "num_key_value_heads": arch.key_value_heads,
        "head_dim": arch.head_width,
        "max_position_embeddings": arch.max_positions,
        "tie_word_embeddings": arch.tie_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": arch.rope_theta},
        "attention_dropout": 0.0,
    }
    return config_class(**values, **extra)


def _opt_values(arch: DecoderArch) -> dict[str, Any]:
    """OPT-350m is the one post-norm size (``do_layer_norm_before=False``), which is also what
    drops its final layer norm in ``transformers``."""
    return {
        "vocab_size": arch.vocab,
        "hidden_size": arch.hidden,
        "num_hidden_layers": arch.layers,
        "ffn_dim": arch.ffn,
        "num_attention_heads": arch.heads,
        "max_position_embeddings": arch.max_positions,
        "word_embed_proj_dim": arch.embed_dim,
        "do_layer_norm_before": arch.final_layer_norm,
        "tie_word_embeddings": arch.tie_embeddings,
        "dropout": 0.0,
        "attention_dropout": 0.0,
    }
