"""Preparing a preset's data for offline clusters, from a local mirror (the Hub is not needed).

The mirror is a directory of SST-2-shaped JSONL files that ``datasets`` splits by file name,
exactly as it would split a downloaded copy; the prepared directory is then read back through
``task.data_dir`` as a run would read it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from conftest import REPO
from privzo.config import TaskConfig, load_config
from privzo.tasks import load_splits, resolve_task_config
from privzo.tasks.prepare import prepare_task_data, resolve_source
from privzo.tasks.presets import HubSource

datasets = pytest.importorskip("datasets")
pq = pytest.importorskip("pyarrow.parquet")

TASK_CONFIGS = REPO / "configs" / "tasks"


def sst2_rows(count: int, prefix: str) -> list[dict]:
    """Rows in GLUE SST-2's fields, with non-ASCII text and both labels."""
    return [
        {
            "sentence": f"{prefix} review {index}: {'très bien' if index % 2 else 'awful'}",
            "label": index % 2,
        }
        for index in range(count)
    ]


TRAIN = sst2_rows(40, "train")
VALIDATION = sst2_rows(12, "validation")


@pytest.fixture(autouse=True)
def datasets_cache(tmp_path, monkeypatch):
    """Keep the ``datasets`` cache of each test in its own temporary directory."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")


@pytest.fixture
def mirror(tmp_path) -> Path:
    """A local stand-in for glue/sst2: train.jsonl and validation.jsonl."""
    directory = tmp_path / "sst2-mirror"
    directory.mkdir()
    for name, rows in (("train", TRAIN), ("validation", VALIDATION)):
        lines = (json.dumps(row, ensure_ascii=False) for row in rows)
        (directory / f"{name}.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return directory


@pytest.fixture
def prepared(tmp_path, mirror) -> tuple[Path, dict]:
    output = tmp_path / "prepared" / "sst2"
    return output, prepare_task_data("sst2", output, hf_dataset=str(mirror), progress=False)


def test_writes_each_split_row_for_row(prepared):
    output, _ = prepared
    assert pq.read_table(output / "train.parquet").to_pylist() == TRAIN
    assert pq.read_table(output / "test.parquet").to_pylist() == VALIDATION


def test_task_json_records_source_splits_and_shapes(prepared, mirror):
    output, record = prepared
    assert json.loads((output / "task.json").read_text()) == record
    assert record["task"] == "sst2"
    assert record["source"] == {"dataset": str(mirror.resolve()), "subset": None}
    train, test = record["splits"]["train"], record["splits"]["test"]
    assert (train["source_split"], train["rows"], train["file"]) == ("train", 40, "train.parquet")
    assert (test["source_split"], test["rows"], test["file"]) == ("validation", 12, "test.parquet")
    assert train["columns"] == test["columns"] == ["sentence", "label"]


def test_refuses_to_overwrite_prepared_data(prepared, mirror):
    output, _ = prepared
    before = {path.name: path.read_bytes() for path in output.iterdir()}
    with pytest.raises(ValueError, match=re.escape(str(output / "train.parquet"))):
        prepare_task_data("sst2", output, hf_dataset=str(mirror), progress=False)
    assert {path.name: path.read_bytes() for path in output.iterdir()} == before


def test_refuses_a_directory_holding_any_of_its_files(tmp_path, mirror):
    output = tmp_path / "partial"
    output.mkdir()
    (output / "task.json").write_text("{}")
    with pytest.raises(ValueError, match=re.escape(str(output / "task.json"))):
        prepare_task_data("sst2", output, hf_dataset=str(mirror), progress=False)
    assert sorted(path.name for path in output.iterdir()) == ["task.json"]


def test_unknown_task_names_the_presets(tmp_path):
    with pytest.raises(ValueError, match=r"'imdb'.*allowed: \[.*'boolq'.*'sst2'.*'trec'"):
        prepare_task_data("imdb", tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_overrides_keep_the_preset_split_names(mirror):
    assert resolve_source("mnli", None, None) == HubSource(
        "glue", "mnli", "train", "validation_matched"
    )
    assert resolve_source("sst2", None, "sst2-copy") == HubSource("glue", "sst2-copy")
    assert resolve_source("sst2", "someone/sst2", None) == HubSource("someone/sst2", None)
    assert resolve_source("trec", str(mirror), None).dataset == str(mirror.resolve())


def test_progress_setting_is_restored(tmp_path, mirror):
    was_disabled = datasets.are_progress_bars_disabled()
    prepare_task_data("sst2", tmp_path / "quiet", hf_dataset=str(mirror), progress=False)
    assert datasets.are_progress_bars_disabled() == was_disabled


def test_run_config_reads_the_prepared_directory(prepared):
    output, _ = prepared
    config = TaskConfig(name="sst2", data_dir=str(output))
    splits = load_splits(resolve_task_config(config, "causal"))
    assert (len(splits.train), len(splits.test), splits.skipped_rows) == (40, 12, 0)
    assert splits.test == VALIDATION
    assert sorted(splits.train, key=lambda row: row["sentence"]) == sorted(
        TRAIN, key=lambda row: row["sentence"]
    )


@pytest.mark.parametrize(
    ("config_file", "kind", "overrides", "train_rows"),
    [
        # train_size 1000 > the 30 rows left after a 10-row validation split: every row
        ("sst2-opt.yaml", "causal", ["task.validation_size=10"], 30),
        ("sst2-roberta.yaml", "masked", ["task.examples_per_class=4"], 8),
    ],
)
def test_shipped_task_configs_read_prepared_data(
    prepared, config_file, kind, overrides, train_rows
):
    output, _ = prepared
    config = load_config(TASK_CONFIGS / config_file, [f"task.data_dir={output}", *overrides])
    splits = load_splits(resolve_task_config(config.task, kind))
    assert (len(splits.train), len(splits.test)) == (train_rows, 12)


def test_cli_data_prepare(tmp_path, mirror, capsys):
    from privzo.cli import main

    output = tmp_path / "cli-out"
    assert (
        main(["data", "prepare", "sst2", "--output-dir", str(output), "--hf-dataset", str(mirror)])
        == 0
    )
    printed = capsys.readouterr().out
    assert "train: 40 rows" in printed and "test: 12 rows" in printed
    assert pq.read_table(output / "train.parquet").num_rows == 40
    assert (
        main(["data", "prepare", "sst2", "--output-dir", str(output), "--hf-dataset", str(mirror)])
        == 2
    )  # refuses to overwrite
    error = capsys.readouterr().err
    assert "privzo: error" in error and str(output) in error
