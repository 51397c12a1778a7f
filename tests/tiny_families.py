"""Tiny Llama-family models and the two tokenizer styles they ship with, built in memory.

The tokenizers are trained on a few public sentences with the ``tokenizers`` library: a
SentencePiece-style BPE (a ``▁`` word marker added before every word, a BOS token, as Llama
and Mistral have) and a byte-level BPE (the space folded into the next word as ``Ġ``, no BOS,
as Qwen2 has). The models are 2-layer configs with grouped key/value heads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

CORPUS = [
    "a fine film . It was great",
    "a dull plot . It was terrible",
    "the acting was great and the story was good",
    "it was a terrible , bad and dull movie",
] * 20


def sentencepiece_tokenizer() -> PreTrainedTokenizerFast:
    """A Llama-2-style tokenizer: the text's spaces become ``▁`` and one more ``▁`` is prepended
    (its ``tokenizer.json`` normalizer), so a text that starts with a space starts with a bare
    ``▁`` token. The merges are learned word by word, as SentencePiece learns them."""
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    special = ["<unk>", "<s>", "</s>"]
    tokenizer.train_from_iterator(
        CORPUS, trainers.BpeTrainer(vocab_size=200, special_tokens=special)
    )
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split("▁", behavior="merged_with_next")
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
        pad_token="</s>",  # Llama checkpoints have no pad token; runs pad with EOS
    )


def byte_level_tokenizer() -> PreTrainedTokenizerFast:
    """A Qwen2-style tokenizer: byte-level BPE, one end-of-text token, no BOS."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tokenizer.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>"
    )


FAMILY_CONFIGS = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}


def tiny_family_model(family: str, vocab: int, dtype: torch.dtype = torch.float32, **extra: Any):
    """A seeded random 2-layer model of ``family`` (hidden 32, 4 query and 2 key/value heads)."""
    config = FAMILY_CONFIGS[family](
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=family == "qwen2",
        **extra,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    return model.eval()


def save_tiny_family(family: str, directory: Path) -> Path:
    """A tiny ``family`` model and its tokenizer saved to ``directory``, as its checkpoints ship:
    Qwen2 with a byte-level BPE, Llama and Mistral with a SentencePiece-style one."""
    tokenizer = byte_level_tokenizer() if family == "qwen2" else sentencepiece_tokenizer()
    ids = {"pad_token_id": tokenizer.pad_token_id, "eos_token_id": tokenizer.eos_token_id}
    model = tiny_family_model(family, len(tokenizer), bos_token_id=tokenizer.bos_token_id, **ids)
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory
