"""Task presets: golden prompts and label words, data loading and sampling, and every preset
run end to end on tiny masked and causal LMs (CPU, seconds)."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from transformers import OPTConfig, OPTForCausalLM, RobertaConfig, RobertaForMaskedLM

from privzo.config import ConfigError, TaskConfig, load_config
from privzo.run import run
from privzo.tasks import PRESETS, build_task, load_splits, resolve_task_config
from word_tokenizer import build_word_tokenizer

# One row per preset, in the dataset's own field names.
ROWS = {
    "sst2": {"sentence": "a gentle and moving film", "label": 1},
    "sst5": {"text": "a dull plot", "label": 1},
    "snli": {"premise": "a man plays", "hypothesis": "someone plays", "label": 0},
    "mnli": {"premise": "the cat sleeps", "hypothesis": "an animal rests", "label": 1},
    "rte": {"premise": "rain fell", "hypothesis": "it was dry", "label": 1},
    "trec": {"text": "who wrote it", "coarse_label": 3},
    "boolq": {
        "passage": "water boils at one hundred degrees",
        "question": "does water boil",
        "label": 1,
    },
}
# The prompt each preset builds from its row (mask shown as <mask>), per model kind.
GOLDEN = {
    ("sst2", "masked"): ("a gentle and moving film It was <mask> .", "great"),
    ("sst2", "causal"): ("a gentle and moving film It was", "great"),
    ("sst5", "masked"): ("a dull plot It was <mask> .", "bad"),
    ("snli", "masked"): ("a man plays ? <mask> , someone plays", "Yes"),
    ("mnli", "masked"): ("the cat sleeps ? <mask> , an animal rests", "Maybe"),
    ("rte", "masked"): ("rain fell ? <mask> , it was dry", "No"),
    ("trec", "masked"): ("<mask> : who wrote it", "Human"),
    ("boolq", "causal"): ("water boils at one hundred degrees does water boil?\n", "Yes"),
}


@pytest.mark.parametrize(("task", "kind"), sorted(GOLDEN))
def test_golden_prompt_and_label_word(task, kind):
    config = resolve_task_config(TaskConfig(name=task), kind)
    row = ROWS[task]
    prompt = config.template.format(**row, mask="<mask>")
    expected_prompt, expected_word = GOLDEN[(task, kind)]
    assert prompt == expected_prompt
    assert config.label_words[row[config.label_field]] == expected_word


GENERATION_ROWS = {
    "squad": {
        "title": "Water",
        "context": "water boils at one hundred degrees",
        "question": "when does water boil",
        "answers": {
            "text": ["one hundred degrees", "at one hundred degrees"],
            "answer_start": [16, 13],
        },
    },
    "drop": {
        "passage": "a man plays and a cat sleeps",
        "question": "how many play",
        "answers_spans": {"spans": ["one"], "types": ["number"]},
    },
}
GOLDEN_GENERATION = {
    "squad": "Title: Water\nContext: water boils at one hundred degrees\n"
    "Question: when does water boil\nAnswer:",
    "drop": "Passage: a man plays and a cat sleeps\nQuestion: how many play\nAnswer:",
}


def test_every_preset_has_a_golden_case():
    assert {task for task, _ in GOLDEN} | set(GOLDEN_GENERATION) == set(PRESETS)


@pytest.mark.parametrize("task", sorted(GOLDEN_GENERATION))
def test_generation_presets_prompt_and_hub_answers(tmp_path, task):
    config = resolve_task_config(TaskConfig(name=task), "causal")
    assert config.template.format(**GENERATION_ROWS[task]) == GOLDEN_GENERATION[task]
    _write([GENERATION_ROWS[task]] * 6, tmp_path / "train.jsonl")
    _write([GENERATION_ROWS[task]] * 3, tmp_path / "test.jsonl")
    splits = load_splits(config.model_copy(update={"data_dir": str(tmp_path)}))
    nested = GENERATION_ROWS[task]["answers" if task == "squad" else "answers_spans"]
    expected = nested["text" if task == "squad" else "spans"]
    assert all(row["answers"] == expected for row in splits.train + splits.test)
    with pytest.raises(ConfigError, match="causal LM"):
        resolve_task_config(TaskConfig(name=task), "masked")
    with pytest.raises(ConfigError, match="train_size"):
        resolve_task_config(TaskConfig(name=task, examples_per_class=4), "causal")


@pytest.mark.parametrize("task", sorted(GOLDEN_GENERATION))
def test_generation_presets_run_end_to_end(tmp_path, tiny_models, task):
    data = tmp_path / "data"
    data.mkdir()
    _write([GENERATION_ROWS[task]] * 12, data / "train.jsonl")
    _write([GENERATION_ROWS[task]] * 3, data / "test.jsonl")
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_models['causal']}",
            f"task.name={task}",
            f"task.data_dir={data}",
            "task.max_new_tokens=4",
            "optimizer.steps=3",
            "optimizer.batch_size=4",
            "tracking.backend=none",
        ],
    )
    summary = run(config, tmp_path / "out", cache_dir=tmp_path / "cache", progress=False)
    assert summary.metric == "f1" and summary.test_examples == 3
    scores = summary.scores
    assert 0.0 <= scores["f1_after"] <= 1.0 and 0.0 <= scores["exact_match_after"] <= 1.0
    assert summary.metric_after == scores["f1_after"]


def test_user_settings_win_over_the_preset():
    config = resolve_task_config(
        TaskConfig(name="sst2", template="{sentence} Overall", label_words=["bad", "good"]),
        "causal",
    )
    assert config.template == "{sentence} Overall" and config.label_words == ["bad", "good"]


def test_a_preset_without_a_prompt_for_the_model_kind_is_refused():
    with pytest.raises(ConfigError, match="no causal LM prompt"):
        resolve_task_config(TaskConfig(name="snli"), "causal")
    with pytest.raises(ConfigError, match="allowed"):
        resolve_task_config(TaskConfig(name="sst-2"), "causal")


def _rows(task: str, count: int, num_labels: int) -> list[dict]:
    """Rows shaped like the preset's row, with labels cycling over every class."""
    config = resolve_task_config(TaskConfig(name=task), next(iter(PRESETS[task].templates)))
    rows = []
    for index in range(count):
        row = dict(ROWS[task])
        row[config.label_field] = index % num_labels
        rows.append(row)
    return rows


def _write(rows: list[dict], path: Path) -> Path:
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_data_dir_sampling_per_class_is_deterministic(tmp_path, suffix):
    _write(_rows("snli", 60, 3), tmp_path / f"train{suffix}")
    _write(_rows("snli", 30, 3), tmp_path / f"test{suffix}")
    config = resolve_task_config(
        TaskConfig(name="snli", data_dir=str(tmp_path), examples_per_class=4, test_size=10),
        "masked",
    )
    splits = load_splits(config)
    assert Counter(row["label"] for row in splits.train) == {0: 4, 1: 4, 2: 4}
    assert len(splits.test) == 10
    again = load_splits(config)
    assert again.train == splits.train and again.test == splits.test
    other = load_splits(config.model_copy(update={"data_seed": 1}))
    assert other.train != splits.train or other.test != splits.test


def test_train_size_samples_that_many(tmp_path):
    _write(_rows("boolq", 50, 2), tmp_path / "train.jsonl")
    _write(_rows("boolq", 20, 2), tmp_path / "test.jsonl")
    config = resolve_task_config(
        TaskConfig(name="boolq", data_dir=str(tmp_path), train_size=7, test_size=5), "causal"
    )
    splits = load_splits(config)
    assert len(splits.train) == 7 and len(splits.test) == 5


def test_invalid_rows_fail_with_file_and_row_or_are_skipped_and_counted(tmp_path):
    rows = _rows("snli", 12, 3)
    rows[5]["label"] = -1  # SNLI marks examples without a gold label with -1
    rows[7]["hypothesis"] = ""
    _write(rows, tmp_path / "train.jsonl")
    _write(_rows("snli", 6, 3), tmp_path / "test.jsonl")
    config = resolve_task_config(TaskConfig(name="snli", data_dir=str(tmp_path)), "masked")
    with pytest.raises(ConfigError, match=r"train split\) row 5: label=-1"):
        load_splits(config)
    skipping = config.model_copy(update={"skip_invalid_rows": True})
    splits = load_splits(skipping)
    assert splits.skipped_rows == 2 and len(splits.train) == 10


def test_missing_data_dir_files_are_named(tmp_path):
    config = resolve_task_config(TaskConfig(name="rte", data_dir=str(tmp_path)), "masked")
    with pytest.raises(ConfigError, match="has no train file"):
        load_splits(config)


# --- end to end on tiny models whose vocabulary covers the fixtures and every label word ---


def _vocabulary() -> list[str]:
    words = {
        word for preset in PRESETS.values() for kind in preset.label_words.values() for word in kind
    }
    for row in ROWS.values():
        for value in row.values():
            if isinstance(value, str):
                words.update(value.replace("?", " ").split())
    return sorted(words | {"it", "was", "?", ",", ":", "."})


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> dict[str, Path]:
    """A tiny OPT and a tiny RoBERTa with a word-level tokenizer over the fixtures' words."""
    root = tmp_path_factory.mktemp("task-models")
    paths = {}
    tokenizer = build_word_tokenizer(_vocabulary())
    size = dict(hidden_size=32, num_attention_heads=4, max_position_embeddings=64)
    models = {
        "causal": OPTForCausalLM(
            OPTConfig(
                vocab_size=len(tokenizer),
                ffn_dim=64,
                num_hidden_layers=2,
                word_embed_proj_dim=32,
                pad_token_id=tokenizer.pad_token_id,
                **size,
            )
        ),
        "masked": RobertaForMaskedLM(
            RobertaConfig(
                vocab_size=len(tokenizer),
                intermediate_size=64,
                num_hidden_layers=2,
                pad_token_id=tokenizer.pad_token_id,
                **size,
            )
        ),
    }
    for kind, model in models.items():
        model.save_pretrained(root / kind)
        tokenizer.save_pretrained(root / kind)
        paths[kind] = root / kind
    return paths


@pytest.mark.parametrize(("task", "kind"), sorted(GOLDEN))
def test_every_preset_runs_end_to_end(tmp_path, tiny_models, task, kind):
    num_labels = len(PRESETS[task].label_words[kind])
    data = tmp_path / "data"
    data.mkdir()
    _write(_rows(task, 8 * num_labels, num_labels), data / "train.jsonl")
    _write(_rows(task, 2 * num_labels, num_labels), data / "test.jsonl")
    config = load_config(
        None,
        [
            f"model.name_or_path={tiny_models[kind]}",
            f"task.name={task}",
            f"task.data_dir={data}",
            "task.examples_per_class=4",
            "optimizer.steps=3",
            "optimizer.batch_size=4",
            "tracking.backend=none",
        ],
    )
    summary = run(config, tmp_path / "out", cache_dir=tmp_path / "cache", progress=False)
    assert summary.task == task and summary.metric == "accuracy"
    assert summary.train_examples == 4 * num_labels
    assert summary.test_examples == 2 * num_labels
    assert 0.0 <= summary.metric_after <= 1.0
    assert summary.eval_time_s is None  # a private run's times are withheld


def test_masked_prompt_scores_the_mask_position(tiny_models):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["masked"])
    config = resolve_task_config(TaskConfig(name="trec"), "masked")
    task = build_task(config, tokenizer, "masked")
    examples = task.encode([ROWS["trec"]])
    ids = examples.input_ids[0]
    assert ids[examples.positions[0]] == tokenizer.mask_token_id
    assert examples.positions[0] == 1  # "<s> <mask> : who wrote it </s>"


@pytest.mark.parametrize("kind", ["masked", "causal"])
def test_a_max_length_the_template_fills_is_refused(tiny_models, kind):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models[kind])
    template = "Review: {sentence} All in all the film was"  # more than 4 tokens alone
    config = resolve_task_config(TaskConfig(name="sst2", template=template, max_length=4), kind)
    with pytest.raises(ConfigError, match=r"task\.max_length=4 leaves no room.*max_length ≥"):
        build_task(config, tokenizer, kind)
    roomy = resolve_task_config(TaskConfig(name="sst2", max_length=32), kind)
    examples = build_task(roomy, tokenizer, kind).encode([ROWS["sst2"]])
    assert len(examples.input_ids[0]) <= 32


@pytest.mark.parametrize("kind", ["masked", "causal"])
def test_a_max_length_that_cuts_most_prompts_is_said(tiny_models, kind, caplog):
    """Room for one word of text: every prompt loses its start, and the run says how much."""
    from transformers import AutoTokenizer

    from privzo.tasks import warn_cut_prompts
    from privzo.tasks.classification import EncodedExamples

    tokenizer = AutoTokenizer.from_pretrained(tiny_models[kind])
    rows = [ROWS["sst2"], {"sentence": "a dull plot", "label": 0}]
    roomy = build_task(resolve_task_config(TaskConfig(name="sst2"), kind), tokenizer, kind)
    blank = roomy.encode([{"sentence": "", "label": 0}])
    assert isinstance(blank, EncodedExamples)
    fixed = len(blank.input_ids[0])  # the template's own tokens
    tight = resolve_task_config(TaskConfig(name="sst2", max_length=fixed + 1), kind)
    examples = build_task(tight, tokenizer, kind).encode(rows)
    assert examples.cut_tokens == [4, 2]  # five and three words, one kept
    with caplog.at_level("WARNING", logger="privzo.tasks.describe"):
        warn_cut_prompts(roomy.encode(rows), roomy.max_length)
        assert not caplog.records
        warn_cut_prompts(examples, fixed + 1)
    assert (
        f"100 % of the training prompts do not fit max_length={fixed + 1} tokens and lose their "
        f"start, 3 tokens each on average (the longest prompt has {fixed + 5})"
    ) in caplog.text


def test_a_class_smaller_than_k_contributes_all_its_rows(tmp_path):
    rows = _rows("trec", 60, 6)  # 10 rows per class
    rows = [row for row in rows if row["coarse_label"] != 0] + rows[:1]  # class 0: one row
    _write(rows, tmp_path / "train.jsonl")
    _write(_rows("trec", 12, 6), tmp_path / "test.jsonl")
    config = resolve_task_config(
        TaskConfig(name="trec", data_dir=str(tmp_path), examples_per_class=5), "masked"
    )
    counts = Counter(row["coarse_label"] for row in load_splits(config).train)
    assert counts == {0: 1, 1: 5, 2: 5, 3: 5, 4: 5, 5: 5}


def test_multi_token_candidates_score_by_mean_log_probability(tiny_models):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["causal"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["causal"]).eval()
    config = resolve_task_config(
        TaskConfig(name="sst2", label_words=["a dull plot", "great"]), "causal"
    )
    task = build_task(config, tokenizer, "causal")
    assert not task.single_token and [len(c) for c in task.candidates] == [3, 1]
    rows = [ROWS["sst2"], {"sentence": "a dull plot", "label": 0}]
    examples = task.encode(rows)
    scores = task.label_logits(model, task.collate(examples, [0, 1]))
    assert scores.shape == (2, 2)
    for row, prompt in enumerate(examples.input_ids):  # unbatched, by hand
        for column, candidate in enumerate(task.candidates):
            sequence = torch.tensor([prompt + candidate])
            with torch.no_grad():
                log_probs = torch.log_softmax(model(input_ids=sequence).logits[0].float(), -1)
            expected = torch.stack(
                [log_probs[len(prompt) - 1 + j, token] for j, token in enumerate(candidate)]
            ).mean()
            assert float(scores[row, column]) == pytest.approx(float(expected), abs=1e-5)
    losses = task.per_example_loss(model, task.collate(examples, [0, 1]))
    assert losses.shape == (2,) and bool(torch.isfinite(losses).all())


def test_masked_lm_label_words_must_be_single_tokens(tiny_models):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_models["masked"])
    config = resolve_task_config(
        TaskConfig(name="sst2", label_words=["a dull plot", "great"]), "masked"
    )
    with pytest.raises(ConfigError, match="single tokens"):
        build_task(config, tokenizer, "masked")


def test_unreadable_jsonl_lines_are_named_or_skipped_and_counted(tmp_path):
    lines = [json.dumps(row).encode() for row in _rows("sst2", 10, 2)]
    lines[3] = b'{"sentence": "caf\xe9 \xff", "label": 1}'  # not UTF-8
    lines[6] = b'{"sentence": "cut off'  # not JSON
    (tmp_path / "train.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _write(_rows("sst2", 4, 2), tmp_path / "test.jsonl")
    config = resolve_task_config(TaskConfig(name="sst2", data_dir=str(tmp_path)), "causal")
    with pytest.raises(ConfigError, match=r"row 3: line 4 is not valid UTF-8"):
        load_splits(config)
    splits = load_splits(config.model_copy(update={"skip_invalid_rows": True}))
    assert splits.skipped_rows == 2 and len(splits.train) == 8


def test_validation_split_is_held_out_of_training_and_reported_when_public(tmp_path, tiny_models):
    data = tmp_path / "data"
    data.mkdir()
    rows = [{"sentence": f"a dull plot {'great ' * i}", "label": i % 2} for i in range(40)]
    _write(rows, data / "train.jsonl")
    _write(_rows("sst2", 6, 2), data / "test.jsonl")
    task = resolve_task_config(
        TaskConfig(name="sst2", data_dir=str(data), train_size=20, validation_size=10), "causal"
    )
    splits = load_splits(task)
    train_text = {row["sentence"] for row in splits.train}
    assert len(splits.validation) == 10 and len(splits.train) == 20
    assert not train_text & {row["sentence"] for row in splits.validation}
    common = [
        f"model.name_or_path={tiny_models['causal']}",
        "task.name=sst2",
        f"task.data_dir={data}",
        "task.train_size=20",
        "task.validation_size=10",
        "optimizer.steps=2",
        "optimizer.batch_size=4",
        "tracking.backend=none",
    ]
    public = load_config(None, [*common, "optimizer.algorithm=mezo", "privacy.sampler=shuffle"])
    summary = run(public, tmp_path / "mezo", cache_dir=tmp_path / "c", progress=False)
    assert 0.0 <= summary.extra["validation_accuracy"] <= 1.0 and summary.train_examples == 20
    private = load_config(None, common)
    summary = run(private, tmp_path / "dp", cache_dir=tmp_path / "c", progress=False)
    assert "validation_accuracy" not in summary.extra  # private data: not released by default


def test_presets_default_to_the_papers_training_set_sizes():
    assert resolve_task_config(TaskConfig(name="snli"), "masked").examples_per_class == 512
    assert resolve_task_config(TaskConfig(name="boolq"), "causal").train_size == 1000
    assert resolve_task_config(TaskConfig(name="squad"), "causal").train_size == 1000
    custom = resolve_task_config(TaskConfig(name="rte", examples_per_class=16), "masked")
    assert custom.examples_per_class == 16 and custom.train_size is None
    assert resolve_task_config(TaskConfig(), "causal").train_size is None  # custom task: all rows


def test_label_words_follow_the_prompt_as_the_papers_write_them():
    """MeZO's BoolQ answer starts a new line; elsewhere the label word follows a space."""
    assert resolve_task_config(TaskConfig(name="boolq"), "causal").label_word_prefix == ""
    assert resolve_task_config(TaskConfig(name="sst2"), "causal").label_word_prefix == " "
    assert resolve_task_config(TaskConfig(), "masked").label_word_prefix == " "
    custom = TaskConfig(name="boolq", label_word_prefix=" ")
    assert resolve_task_config(custom, "causal").label_word_prefix == " "


def _distinct_rows(count: int) -> list[dict]:
    return [{"sentence": f"review {i}: a fine film", "label": i % 2} for i in range(count)]


def _keys(rows: list[dict]) -> set[str]:
    return {json.dumps(row, sort_keys=True) for row in rows}


@pytest.mark.parametrize(
    "settings",
    [
        {"test_size": 30},  # test carved out of the file, the rest trains
        {"test_size": 30, "validation_size": 20},
        {"test_size": 30, "train_size": 100},
        {"test_size": 30, "examples_per_class": 40},
    ],
)
def test_adding_one_record_moves_at_most_the_one_it_displaces(tmp_path, settings):
    """Splits and selections go by each record's salted content hash: with a seeded
    permutation of the file, one added row moved 21 of 220 training rows."""
    rows = _distinct_rows(220)
    splits = []
    for name, pool in (("before", rows), ("after", [*rows, {"sentence": "new", "label": 1}])):
        path = _write(pool, tmp_path / f"{name}.jsonl")
        task = TaskConfig(name="sst2", train_path=str(path), **settings)
        splits.append(load_splits(resolve_task_config(task, "causal")))
    before, after = splits
    for split in ("train", "test", "validation"):
        old, new = _keys(getattr(before, split)), _keys(getattr(after, split))
        # at most the new row in, and at most one row out (the one it displaced)
        assert len(new - old) <= 1 and len(old - new) <= 1, split
        assert len(new - old) + len(old - new) <= 2, split
    if "train_size" not in settings and "examples_per_class" not in settings:
        # no fixed-size selection of the training rows: they only ever gain one row
        assert _keys(before.train) <= _keys(after.train)
        assert len(after.train) == len(before.train) + 1


def test_a_private_run_refuses_a_test_split_carved_from_its_training_file(tmp_path):
    path = _write(_distinct_rows(50), tmp_path / "train.jsonl")
    carved = [f"task.train_path={path}", "task.test_size=10"]
    with pytest.raises(ConfigError, match="carved out of the private training file"):
        load_config(None, carved)  # dpzero, the default
    assert load_config(None, [*carved, "tracking.log_private_diagnostics=true"])
    assert load_config(None, [*carved, "optimizer.algorithm=mezo", "privacy.sampler=shuffle"])
    separate = _write(_distinct_rows(10), tmp_path / "test.jsonl")
    assert load_config(None, [f"task.train_path={path}", f"task.test_path={separate}"])


def test_a_row_without_its_label_field_is_refused_naming_the_fields_it_has(tmp_path):
    rows = _rows("snli", 12, 3)
    del rows[4]["label"]
    _write(rows, tmp_path / "train.jsonl")
    _write(_rows("snli", 6, 3), tmp_path / "test.jsonl")
    config = resolve_task_config(TaskConfig(name="snli", data_dir=str(tmp_path)), "masked")
    fields = sorted(rows[4])
    with pytest.raises(ConfigError, match=r"row 4: no field 'label' \(task.label_field\)") as error:
        load_splits(config)
    assert f"the row has {fields}" in str(error.value)
