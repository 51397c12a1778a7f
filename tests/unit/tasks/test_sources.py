"""Where a task's rows come from, as a user sees it: labels given as words or indices, a column
named otherwise reported with the file's own fields, and the lines that say which rows a run
trains on."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from privzo.config import ConfigError, TaskConfig
from privzo.tasks import data_lines, describe_source, load_splits, resolve_task_config

WORDS = ["terrible", "great"]


def _write_csv(path: Path, header: list[str], rows: list[list[object]]) -> str:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(header)
        writer.writerows(rows)
    return str(path)


def _files(tmp_path: Path, labels: list[object], header: list[str] | None = None) -> TaskConfig:
    header = header or ["sentence", "label"]
    rows = [[f"review number {index}", label] for index, label in enumerate(labels)]
    train = _write_csv(tmp_path / "train.csv", header, rows)
    test = _write_csv(tmp_path / "test.csv", header, rows[:4])
    return TaskConfig(train_path=train, test_path=test, label_words=WORDS)


def test_labels_may_be_the_label_words_or_their_indices(tmp_path):
    words = load_splits(resolve_task_config(_files(tmp_path, ["great", "terrible"] * 5), "causal"))
    indices = load_splits(resolve_task_config(_files(tmp_path, [1, 0] * 5), "causal"))
    assert sorted(row["label"] for row in words.train) == [0] * 5 + [1] * 5
    assert words.train == indices.train and words.test == indices.test
    mixed = load_splits(resolve_task_config(_files(tmp_path, ["great", 0] * 5), "causal"))
    assert sorted(row["label"] for row in mixed.train) == [0] * 5 + [1] * 5


def test_a_label_that_is_neither_a_word_nor_an_index_is_named(tmp_path):
    config = resolve_task_config(_files(tmp_path, ["great", "positive"] * 3), "causal")
    with pytest.raises(ConfigError) as refused:
        load_splits(config)
    message = str(refused.value)
    assert "row 1: label='positive'" in message
    assert "a label word of ['terrible', 'great'] or its index in [0, 2)" in message


@pytest.mark.parametrize(
    ("header", "missing", "role"),
    [
        (["review", "label"], "sentence", "read by task.template"),
        (["sentence", "sentiment"], "label", "task.label_field"),
    ],
)
def test_a_field_no_row_has_is_named_with_the_fields_the_file_has(tmp_path, header, missing, role):
    config = resolve_task_config(_files(tmp_path, [0, 1] * 3, header), "causal")
    with pytest.raises(ConfigError) as refused:
        load_splits(config)
    message = str(refused.value)
    assert f"no row has the field {missing!r} ({role}" in message
    assert f"its rows have the fields {sorted(header)}" in message
    assert "row 0" not in message


def test_the_data_lines_name_the_source_the_counts_and_the_label_mapping(tmp_path):
    config = resolve_task_config(_files(tmp_path, ["great"] * 6 + ["terrible"] * 4), "causal")
    lines = data_lines(config, load_splits(config))
    train, test = config.train_path, config.test_path
    assert lines == [
        f"data        task.train_path={train!r} (test rows from task.test_path={test!r})",
        "rows        10 training, 4 test examples (prompt-classification)",
        "labels      field 'label': 0 or 'terrible' (4 training rows), 1 or 'great' "
        "(6 training rows)",
    ]


@pytest.mark.parametrize(
    ("task", "described"),
    [
        (
            TaskConfig(builtin_dataset="demo-sentiment"),
            "task.builtin_dataset='demo-sentiment' (built into privzo; its test rows)",
        ),
        (TaskConfig(data_dir="data/mine"), "task.data_dir='data/mine' (its train and test files)"),
        (TaskConfig(train_path="a.csv"), "task.train_path='a.csv' (test rows held out of it)"),
        (
            TaskConfig(hf_dataset="glue", hf_subset="sst2"),
            "hub dataset 'glue/sst2' from task.hf_dataset (splits 'train' and 'validation')",
        ),
        (
            TaskConfig(name="sst2"),
            "hub dataset 'glue/sst2' from the sst2 preset (splits 'train' and 'validation')",
        ),
    ],
)
def test_each_source_is_described_in_the_configs_terms(task, described):
    assert describe_source(task) == described


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('sentence,label\ngood,1\n"bad,0\nfine,1\ndull,0\n', "line 3: 1 field where the header"),
        ('sentence,label\n"bad,0\nfine",1\nok,0\n', "line 2: a quoted field holds whole rows"),
        ("sentence,label\ngood,1\nbad\n", "line 3: 1 field where the header has 2"),
    ],
)
def test_a_csv_record_that_is_not_one_row_is_refused_naming_the_line(tmp_path, text, message):
    from privzo.tasks.data import read_rows

    path = tmp_path / "train.csv"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"train\.csv', {message}"):
        read_rows(path)


def test_a_data_path_that_is_a_directory_is_named_as_one(tmp_path):
    from privzo.tasks.data import read_rows

    with pytest.raises(ConfigError, match=r"is a directory; give one data file .* task\.data_dir"):
        read_rows(tmp_path)
    with pytest.raises(ConfigError, match="dataset file does not exist"):
        read_rows(tmp_path / "missing.csv")


def test_a_quoted_field_with_a_line_break_in_its_text_is_read(tmp_path):
    from privzo.tasks.data import read_rows

    path = tmp_path / "train.csv"
    path.write_text('sentence,label\n"one line\nand another",1\nshort,0\n')
    assert read_rows(path) == [
        {"sentence": "one line\nand another", "label": 1},
        {"sentence": "short", "label": 0},
    ]
