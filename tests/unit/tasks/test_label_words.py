"""Label words and prompts under the two tokenizer styles of the Llama family: SentencePiece-style
(a ``▁`` word marker, BOS) and byte-level BPE (``Ġ``, no BOS)."""

from __future__ import annotations

import pytest
import torch

from privzo.config import ConfigError, TaskConfig
from privzo.tasks import build_task, resolve_task_config
from tiny_families import byte_level_tokenizer, sentencepiece_tokenizer, tiny_family_model

ROWS = [{"sentence": "a fine film .", "label": 1}, {"sentence": "a dull plot .", "label": 0}]


def _task(tokenizer, template="{sentence} It was", **task):
    config = TaskConfig(name="sst2", template=template, label_words=["terrible", "great"], **task)
    return build_task(resolve_task_config(config, "causal"), tokenizer, "causal")


def test_label_words_take_the_tokens_they_have_after_the_prompt():
    """Llama-2's tokenizer encodes " great" alone as a bare space marker and "▁great", but
    after the prompt as "▁great", the one token the model would predict there."""
    tokenizer = sentencepiece_tokenizer()
    alone = tokenizer.encode(" great", add_special_tokens=False)
    assert tokenizer.convert_ids_to_tokens(alone) == ["▁", "▁great"]
    task = _task(tokenizer)
    assert task.single_token
    assert [tokenizer.convert_ids_to_tokens(c) for c in task.candidates] == [
        ["▁terrible"],
        ["▁great"],
    ]


def test_sentencepiece_prompts_start_with_bos_and_end_before_the_label_word():
    tokenizer = sentencepiece_tokenizer()
    task = _task(tokenizer)
    examples = task.encode(ROWS)
    ids = examples.input_ids[0]
    assert ids[0] == tokenizer.bos_token_id and tokenizer.eos_token_id not in ids
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == ["▁a", "▁fine", "▁film", "▁.", "▁It", "▁was"]
    assert examples.positions[0] == len(ids) - 1  # the next token is scored
    model = tiny_family_model("llama", len(tokenizer))
    logits = task.label_logits(model, task.collate(examples, [0, 1]))
    assert logits.shape == (2, 2) and logits.dtype == torch.float32


def test_byte_level_prompts_have_no_bos_and_take_the_space_with_the_word():
    tokenizer = byte_level_tokenizer()
    task = _task(tokenizer)  # the default prefix " ": "Ġgreat", one token either way
    assert [tokenizer.convert_ids_to_tokens(c) for c in task.candidates] == [
        ["Ġterrible"],
        ["Ġgreat"],
    ]
    ids = task.encode(ROWS).input_ids[0]
    assert tokenizer.convert_ids_to_tokens(ids) == ["a", "Ġfine", "Ġfilm", "Ġ.", "ĠIt", "Ġwas"]
    model = tiny_family_model("qwen2", len(tokenizer))
    examples = task.encode(ROWS)
    losses = task.per_example_loss(model, task.collate(examples, [0, 1]))
    assert losses.shape == (2,) and bool(torch.isfinite(losses).all())


def test_a_word_that_runs_into_the_prompt_is_refused_naming_tokens_and_the_fix():
    """A template that ends in a space, with no prefix: under byte-level BPE the space joins
    the word ("Ġterrible"), so the prompt's own last token (a bare "Ġ") is not followed by
    the word's tokens but replaced."""
    with pytest.raises(ConfigError) as error:
        _task(byte_level_tokenizer(), template="{sentence} It was ", label_word_prefix="")
    message = str(error.value)
    assert "'terrible' with task.label_word_prefix='' runs into the prompt's last token" in message
    assert "the prompt ends ['ĠIt', 'Ġwas', 'Ġterrible']" in message
    assert "end task.template without its trailing whitespace" in message


def test_a_masked_lm_label_word_of_several_tokens_is_refused_naming_them_and_a_fix():
    tokenizer = sentencepiece_tokenizer()
    tokenizer.add_special_tokens({"mask_token": "<mask>"})
    config = TaskConfig(
        name="sst2", template="{sentence} It was {mask} .", label_words=[" terrible", "great"]
    )
    with pytest.raises(ConfigError) as error:
        build_task(resolve_task_config(config, "masked"), tokenizer, "masked")
    message = str(error.value)
    assert "' terrible' is 2 tokens for this tokenizer (['▁', '▁terrible'])" in message
    assert "one token: 'terrible' with task.label_word_prefix=' '" in message


def test_a_run_warns_when_the_tokenizer_does_not_know_the_data(caplog):
    """Words the vocabulary lacks become <unk>; above 2 % of the tokens the run says so (a
    byte-level tokenizer has no unknown token and never warns)."""
    from privzo.tasks import warn_unknown_tokens
    from privzo.tasks.describe import unknown_token_share

    tokenizer = sentencepiece_tokenizer()
    task = _task(tokenizer)
    known = task.encode(ROWS)
    assert unknown_token_share(known, tokenizer.unk_token_id) == 0.0
    strange = task.encode([{"sentence": "zyzzyva quixotic .", "label": 1}, *ROWS])
    share = unknown_token_share(strange, tokenizer.unk_token_id)
    ids = [token for row in strange.input_ids for token in row]
    assert share == ids.count(tokenizer.unk_token_id) / len(ids) > 0.02
    with caplog.at_level("WARNING", logger="privzo.tasks.describe"):
        warn_unknown_tokens(known, tokenizer.unk_token_id, "m")
        assert not caplog.records
        warn_unknown_tokens(strange, tokenizer.unk_token_id, "m")
    assert f"{100 * share:.0f} % of the training prompts' tokens are unknown to m" in caplog.text
    byte_level = _task(byte_level_tokenizer()).encode(ROWS)
    assert unknown_token_share(byte_level, byte_level_tokenizer().unk_token_id) == 0.0
