"""A word-level tokenizer over a test's own words, for task tests whose golden token counts need
every word to be exactly one token (privzo's own tokenizer is a byte-level BPE)."""

from __future__ import annotations

from collections.abc import Sequence

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import PreTrainedTokenizerFast

from privzo.models.builtin import MAX_POSITIONS, SPECIAL_TOKENS


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
    single = "<s> $A </s>" if append_eos else "<s> $A"
    pair = "<s> $A </s> $B:1 </s>:1" if append_eos else "<s> $A $B:1"
    core.post_processor = processors.TemplateProcessing(
        single=single,
        pair=pair,
        special_tokens=[("<s>", vocab["<s>"]), ("</s>", vocab["</s>"])],
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        mask_token="<mask>",
        model_max_length=MAX_POSITIONS,
    )
