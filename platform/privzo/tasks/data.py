"""Rows of a task from local JSONL / JSON / Parquet / CSV files or a HF ``datasets`` id."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from privzo.config import ConfigError

Row = dict[str, Any]
SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")


def read_rows(path: str | Path, field: str = "task.train_path") -> list[Row]:
    """Read a local file into a list of dict rows; errors name the config field and path."""
    path = Path(path).expanduser()
    if not path.is_file():
        raise ConfigError(f"{field}={str(path)!r}: dataset file does not exist")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{field}={str(path)!r}: unsupported file type; allowed: {SUFFIXES}")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".csv":
        import pyarrow.csv as pacsv

        return pacsv.read_csv(path).to_pylist()
    return _read_json_rows(path, field)


def _read_json_rows(path: Path, field: str) -> list[Row]:
    text = path.read_text(encoding="utf-8")
    if path.suffix.lower() == ".json":
        rows = json.loads(text)
        if not isinstance(rows, list):
            raise ConfigError(f"{field}={str(path)!r}: a .json dataset must hold a list of rows")
        return rows
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as error:
            raise ConfigError(
                f"{str(path)!r} line {number}: not valid JSON ({error.msg})"
            ) from None
    return rows


def load_hf_rows(dataset_id: str, subset: str | None) -> tuple[list[Row], list[Row]]:
    """(train, test) rows of a hub dataset such as ('glue', 'sst2'); test = validation split.

    GLUE-style test splits carry no labels, so the labelled validation split is the held-out set.
    """
    try:
        import datasets
    except ImportError:
        raise ConfigError(
            f"task.hf_dataset={dataset_id!r} needs the 'datasets' package: pip install "
            "'privzo[hub]', or export the data to local files and set task.train_path"
        ) from None
    loaded = datasets.load_dataset(dataset_id, subset)
    test_split = "validation" if "validation" in loaded else "test"
    return list(loaded["train"]), list(loaded[test_split])
