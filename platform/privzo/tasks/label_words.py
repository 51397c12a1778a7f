"""The tokens a label word is scored as: those it has after the prompt, checked before compute.

SentencePiece-style tokenizers (Llama-2, Mistral) mark a word's leading space themselves: on its
own, ``" great"`` encodes as a bare space marker and ``"▁great"``, while after a prompt it is
the one token ``"▁great"``. Byte-level BPE tokenizers (OPT, GPT-2, Qwen2) fold the space into
the word (``"Ġgreat"``) either way. So a label word's tokens are read off the prompt's end
followed by the word, never off the word alone; a word that runs into the prompt's last token,
or that a masked LM's one slot cannot hold, is refused naming its tokens and what to write
instead.
"""

from __future__ import annotations

from typing import Any

from privzo.section import ConfigError


def label_word_tokens(
    tokenizer: Any, word: str, prefix: str, context: str, single: bool
) -> list[int]:
    """The tokens ``prefix + word`` adds after ``context`` (the prompt's text before the label
    word); a ConfigError where it runs into the prompt, maps to the unknown token, or, with
    ``single`` (a masked LM's one slot), is more than one token."""
    tokens = _tokens_after(tokenizer, context, prefix + word)
    if tokens is None:
        merged = tokenizer.encode(context + prefix + word, add_special_tokens=False)[-3:]
        raise ConfigError(
            f"task.label_words: {word!r} with task.label_word_prefix={prefix!r} runs into the "
            f"prompt's last token (the prompt ends {_pieces(tokenizer, merged)}); "
            f"{_advice(tokenizer, word, context)}"
        )
    if tokenizer.unk_token_id in tokens or not tokens:
        raise ConfigError(
            f"task.label_words: {word!r} is not in the tokenizer's vocabulary (it maps to the "
            "unknown token)"
        )
    if single and len(tokens) > 1:
        raise ConfigError(
            f"task.label_words: {word!r} is {len(tokens)} tokens for this tokenizer "
            f"({_pieces(tokenizer, tokens)}); a masked LM scores one mask slot, so its label "
            f"words must be single tokens; {_advice(tokenizer, word, context)}"
        )
    return tokens


def _tokens_after(tokenizer: Any, context: str, text: str) -> list[int] | None:
    """The tokens ``text`` adds after ``context``; None where the two merge across the
    boundary (the prompt's own tokens change)."""
    before = tokenizer.encode(context, add_special_tokens=False)
    after = tokenizer.encode(context + text, add_special_tokens=False)
    if after[: len(before)] != before:
        return None
    return list(after[len(before) :])


def _pieces(tokenizer: Any, tokens: list[int]) -> str:
    return str(tokenizer.convert_ids_to_tokens(tokens))


def _advice(tokenizer: Any, word: str, context: str) -> str:
    """The prefixes and spellings under which ``word`` is one token after the prompt."""
    fits = []
    for prefix in (" ", ""):
        for spelling in dict.fromkeys((word.strip(), word.lower(), word.capitalize())):
            tokens = _tokens_after(tokenizer, context, prefix + spelling)
            if tokens is not None and len(tokens) == 1 and tokens[0] != tokenizer.unk_token_id:
                fits.append(f"{spelling!r} with task.label_word_prefix={prefix!r}")
    advice = "one token: " + ", or ".join(fits) if fits else "choose a single-token word"
    if context != context.rstrip():
        advice += "; or end task.template without its trailing whitespace"
    return advice
