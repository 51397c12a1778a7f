"""model.tokenizer_use_fast: the slow tokenizer when one exists, else a refusal before compute."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import transformers

from privzo.config import ConfigError, ModelConfig, load_config
from privzo.models.loading import load_model, load_tokenizer
from privzo.search.config import load_search_config
from privzo.search.plan import plan_search

SLOW_TOKENIZERS = int(transformers.__version__.split(".")[0]) < 5


@pytest.fixture
def gpt2_style_tokenizer(tmp_path: Path) -> Path:
    """A byte-level BPE tokenizer as OPT ships it: vocab.json + merges.txt, the files the slow
    GPT2Tokenizer reads (transformers 4 builds either class from them)."""
    directory = tmp_path / "gpt2-style"
    directory.mkdir()
    vocab = {"<|endoftext|>": 0, "a": 1, "b": 2, "ab": 3, "Ġ": 4, "Ġab": 5}
    (directory / "vocab.json").write_text(json.dumps(vocab))
    (directory / "merges.txt").write_text("#version: 0.2\na b\nĠ ab\n")
    special = {name: "<|endoftext|>" for name in ("bos_token", "eos_token", "unk_token")}
    config = {"tokenizer_class": "GPT2Tokenizer", **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


def test_the_default_loads_the_fast_tokenizer(gpt2_style_tokenizer: Path) -> None:
    config = ModelConfig(name_or_path=str(gpt2_style_tokenizer))
    tokenizer = load_tokenizer(config, str(gpt2_style_tokenizer))
    assert tokenizer.is_fast
    assert tokenizer("ab ab")["input_ids"] == [3, 5]


def test_use_fast_false_gives_the_slow_tokenizer_or_a_refusal(gpt2_style_tokenizer: Path) -> None:
    config = load_config(
        None,
        [f"model.name_or_path={gpt2_style_tokenizer}", "model.tokenizer_use_fast=false"],
    ).model
    if SLOW_TOKENIZERS:  # transformers 4: the Python GPT2Tokenizer, same ids as the fast one
        tokenizer = load_tokenizer(config, str(gpt2_style_tokenizer))
        assert not tokenizer.is_fast and type(tokenizer).__name__ == "GPT2Tokenizer"
        assert tokenizer("ab ab")["input_ids"] == [3, 5]
        return
    # transformers 5 ignores use_fast: the fast tokenizer would be used silently, so refuse
    with pytest.raises(ConfigError) as error:
        load_tokenizer(config, str(gpt2_style_tokenizer))
    message = str(error.value)
    assert "model.tokenizer_use_fast=false" in message
    assert f"transformers {transformers.__version__} loaded GPT2Tokenizer" in message
    assert "allowed: model.tokenizer_use_fast=true" in message


@pytest.mark.skipif(SLOW_TOKENIZERS, reason="transformers 4 may have a slow tokenizer for it")
def test_runs_and_searches_refuse_a_slow_tokenizer_they_cannot_have(
    cache_dir: Path, make_search
) -> None:
    """The built-in models ship a fast tokenizer only: a run refuses before loading weights,
    and a search before its first trial."""
    config = load_config(None, ["model.name_or_path=tiny-opt", "model.tokenizer_use_fast=false"])
    with pytest.raises(ConfigError, match=r"model\.tokenizer_use_fast=false: 'tiny-opt'"):
        load_model(config.model, cache_dir, progress=False)
    search = load_search_config(make_search(overrides={"model.tokenizer_use_fast": False}))
    with pytest.raises(ConfigError, match=r"model\.tokenizer_use_fast=false: 'tiny-opt'"):
        plan_search(search, cache_dir)
