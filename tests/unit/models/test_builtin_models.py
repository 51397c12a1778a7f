"""The offline built-in models and the synthetic demo data they are pretrained on."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoModelForMaskedLM, AutoTokenizer

from conftest import REPO
from privzo import demo_data
from privzo.models import builtin
from privzo.tasks.label_words import label_word_tokens
from privzo.tasks.presets import PRESETS

ARBITRARY_TEXT = (
    "I tried the Hotel in Zürich, room 42 for $129.50 — the staff was lovely 😀! It was",
    "naïve café 東京 ½ \t tabs\nnewlines and CAPITALS 0123456789",
    "we booked the sofa . the price was poor but the seats was superb .",
)


@pytest.mark.parametrize("text", ARBITRARY_TEXT)
def test_any_text_encodes_without_unknown_tokens_and_decodes_back(
    text: str, tmp_path: Path
) -> None:
    builtin.build_tokenizer().save_pretrained(tmp_path)
    tok = AutoTokenizer.from_pretrained(tmp_path)
    ids = tok(text)["input_ids"]
    assert ids[0] == tok.bos_token_id and ids[-1] != tok.eos_token_id
    assert tok.unk_token_id not in ids
    # lowercased as the corpus is; the prefix space makes the first word a word like the others
    assert tok.decode(ids, skip_special_tokens=True) == " " + text.lower()


def test_the_demo_words_and_the_presets_label_words_are_single_tokens() -> None:
    tok = builtin.build_tokenizer()
    for word in builtin.tokenizer_words():
        (word_id,) = tok(f" {word}", add_special_tokens=False)["input_ids"]
        assert tok.convert_ids_to_tokens(word_id) == f"Ġ{word}"
    for name, preset in PRESETS.items():
        for kind, words in preset.label_words.items():
            for word in words:
                tokens = label_word_tokens(tok, word, " ", "a review . It was", single=True)
                assert tok.convert_ids_to_tokens(tokens) == [f"Ġ{word.lower()}"], (name, kind)
    specials = (tok.pad_token, tok.bos_token, tok.eos_token, tok.unk_token, tok.mask_token)
    assert specials == builtin.SPECIAL_TOKENS
    assert tok.convert_tokens_to_ids(list(builtin.SPECIAL_TOKENS)) == [0, 1, 2, 3, 4]
    guide = (REPO / "docs" / "guides" / "models-peft.md").read_text()
    assert f"byte-level BPE ({len(tok)} tokens" in " ".join(guide.split())
    masked = builtin.build_tokenizer(append_eos=True)
    ids = masked("it was <mask> .")["input_ids"]
    assert masked.convert_ids_to_tokens(ids) == ["<s>", "Ġit", "Ġwas", "<mask>", "Ġ.", "</s>"]


def test_demo_prompts_are_one_token_per_word() -> None:
    """The merges cover the demo's words, so its prompts cost what a word-level tokenizer's do."""
    tok = builtin.build_tokenizer()
    train, test = demo_data.private_sentiment_task(200, 200, seed=3)
    texts = demo_data.public_corpus(500, seed=3) + [str(r["sentence"]) for r in train + test]
    for text, ids in zip(texts, tok(texts, add_special_tokens=False)["input_ids"], strict=True):
        assert len(ids) == len(text.split())


def test_a_padded_vocabulary_has_one_token_per_embedding_row() -> None:
    tok = builtin.build_tokenizer(size=8192)
    assert len(tok) == 8192 and tok.decode([8191]) == "<reserved_8191>"
    assert tok("the soup")["input_ids"] == builtin.build_tokenizer()("the soup")["input_ids"]
    with pytest.raises(ValueError, match="smaller than privzo's tokenizer"):
        builtin.build_tokenizer(size=100)


@pytest.mark.parametrize(
    ("name", "auto_cls"),
    [("tiny-opt", AutoModelForCausalLM), ("tiny-roberta", AutoModelForMaskedLM)],
)
def test_tiny_models_build_and_reload(name: str, auto_cls: type, cache_dir: Path) -> None:
    path = builtin.materialize_builtin(name, cache_dir, progress=False)
    assert path.parent == cache_dir and path.name.startswith(f"{name}-")
    model = auto_cls.from_pretrained(path).eval()
    tok = AutoTokenizer.from_pretrained(path)
    template = demo_data.TEMPLATE + (" <mask>" if name == "tiny-roberta" else "")
    prompts = [template.format(sentence=s) for s in ("the room was clean .", "i tried it .")]
    batch = tok(prompts, padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**batch).logits
    assert logits.shape == (*batch["input_ids"].shape, len(tok))
    assert model.get_input_embeddings().num_embeddings == len(tok)
    assert model.config.hidden_size == 32 and model.config.num_hidden_layers == 2


def test_cache_is_reused_without_rebuilding(
    cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = builtin.materialize_builtin("tiny-opt", cache_dir, progress=False)
    stamp = (first / "privzo_builtin.json").stat().st_mtime_ns

    def fail(*args: object, **kwargs: object) -> None:
        raise AssertionError("a cached built-in was rebuilt")

    monkeypatch.setattr(builtin, "_build", fail)
    assert builtin.materialize_builtin("tiny-opt", cache_dir, progress=False) == first
    assert (first / "privzo_builtin.json").stat().st_mtime_ns == stamp
    info = json.loads((first / "privzo_builtin.json").read_text())
    assert info["version"] == builtin.BUILTIN_MODELS["tiny-opt"].version()


def test_builds_are_reproducible(tmp_path: Path) -> None:
    first = builtin.materialize_builtin("tiny-opt", tmp_path / "a", progress=False)
    second = builtin.materialize_builtin("tiny-opt", tmp_path / "b", progress=False)
    a, b = (AutoModelForCausalLM.from_pretrained(p).state_dict() for p in (first, second))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_interrupted_build_leaves_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def crash(name: str, recipe: object, target: Path, progress: bool) -> None:
        (target / "config.json").write_text("{}")
        raise KeyboardInterrupt

    monkeypatch.setattr(builtin, "_build", crash)
    with pytest.raises(KeyboardInterrupt):
        builtin.materialize_builtin("tiny-opt", tmp_path, progress=False)
    # no model and no staging directory: only the (unlocked) build lock's file remains
    assert [path.name for path in tmp_path.iterdir()] == [f".{_final_name('tiny-opt')}.lock"]


def _final_name(name: str) -> str:
    return f"{name}-{builtin.BUILTIN_MODELS[name].version()}"


def test_concurrent_builds_into_one_cache_build_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builders of one model in one cold cache: the second waits for the first's build
    instead of making its own (the first holds its build open until the second has had time
    to start one, so without the lock both would build)."""
    real_build = builtin._build
    builds: list[Path] = []
    second_built = threading.Event()

    def counted(name: str, recipe: object, target: Path, progress: bool) -> None:
        builds.append(target)
        if len(builds) == 1:
            second_built.wait(timeout=2.0)
        else:
            second_built.set()
        real_build(name, recipe, target, progress)

    monkeypatch.setattr(builtin, "_build", counted)
    results: list[Path] = []
    threads = [
        threading.Thread(
            target=lambda: results.append(
                builtin.materialize_builtin("tiny-opt", tmp_path, progress=False)
            )
        )
        for _ in range(2)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=300)
    assert len(builds) == 1 and not second_built.is_set()
    assert results == [tmp_path / _final_name("tiny-opt")] * 2


def test_registry_and_versions() -> None:
    assert set(builtin.BUILTIN_MODELS) == {
        "tiny-opt", "tiny-roberta", "demo-opt-s", "demo-opt-m", "demo-opt-l"
    }  # fmt: skip
    assert builtin.is_builtin("demo-opt-s") and not builtin.is_builtin("facebook/opt-125m")
    versions = {recipe.version() for recipe in builtin.BUILTIN_MODELS.values()}
    assert len(versions) == len(builtin.BUILTIN_MODELS)
    with pytest.raises(KeyError, match="unknown built-in"):
        builtin.materialize_builtin("opt-huge", Path("/nonexistent"), progress=False)


def test_demo_data_is_deterministic_by_seed() -> None:
    assert demo_data.public_corpus(300, seed=1) == demo_data.public_corpus(300, seed=1)
    assert demo_data.public_corpus(300, seed=1) != demo_data.public_corpus(300, seed=2)
    task = demo_data.private_sentiment_task
    assert task(50, 20, seed=1) == task(50, 20, seed=1)
    assert task(50, 20, seed=1) != task(50, 20, seed=2)


def test_private_task_is_balanced_and_disjoint_from_public_corpus() -> None:
    corpus = demo_data.public_corpus(20_000, seed=0)
    train, test = demo_data.private_sentiment_task(1000, 501, seed=0)
    assert len(train) == 1000 and len(test) == 501
    assert sum(r["label"] for r in train) == 500
    assert sum(r["label"] for r in test) in (250, 251)
    public = set(corpus)
    assert not any(r["sentence"] in public for r in train + test)
    # No corpus sentence even contains a review as a substring.
    joined = "\n".join(corpus)
    assert not any(str(r["sentence"]) in joined for r in train[:100] + test[:100])


def test_label_is_not_one_shared_token_away() -> None:
    """Train and test use disjoint adjectives, and reviews never contain the label words."""
    train, test = demo_data.private_sentiment_task(1000, 500, seed=0)

    def words(rows: list[dict[str, object]]) -> set[str]:
        return {w for r in rows for w in str(r["sentence"]).split()}

    adjectives = set(demo_data.POSITIVE_ADJECTIVES) | set(demo_data.NEGATIVE_ADJECTIVES)
    assert not (words(train) & words(test) & adjectives)
    assert not (words(train) | words(test)) & set(demo_data.LABEL_WORDS)


def test_write_jsonl_round_trip(tmp_path: Path) -> None:
    rows, _ = demo_data.private_sentiment_task(6, 2, seed=0)
    path = demo_data.write_jsonl(rows, tmp_path / "sub" / "train.jsonl")
    assert [json.loads(line) for line in path.read_text().splitlines()] == rows


@pytest.mark.slow
def test_demo_model_pretraining_lowers_the_loss(cache_dir) -> None:
    """Read from the build record of the session's demo-opt-s, so the suite pretrains it once."""
    recipe = builtin.BUILTIN_MODELS["demo-opt-s"]
    assert recipe.pretrain is not None
    directory = builtin.materialize_builtin("demo-opt-s", cache_dir, progress=False)
    losses = json.loads((directory / "privzo_builtin.json").read_text())["pretrain_losses"]
    assert len(losses) == recipe.pretrain.steps
    assert sum(losses[-20:]) / 20 < 0.5 * losses[0]
