"""A word-level tokenizer over a test's own words, for task tests whose golden token counts need
every word to be exactly one token (privzo's own tokenizer is a byte-level BPE)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
from transformers import PreTrainedTokenizerFast

from privzo.models.builtin import SPECIAL_TOKENS, wrap_tokenizer


def build_word_tokenizer(
    words: Sequence[str], *, append_eos: bool = False
) -> PreTrainedTokenizerFast:
    """Every word one token, lowercased; causal models get ``<s> text``, masked ones
    ``<s> text </s>``."""
    vocab = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for word in words:
        vocab.setdefault(word.lower(), len(vocab))
    core = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    core.normalizer = normalizers.Lowercase()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Punctuation()]
    )
    core.add_special_tokens(list(SPECIAL_TOKENS))
    return wrap_tokenizer(core, append_eos=append_eos)
