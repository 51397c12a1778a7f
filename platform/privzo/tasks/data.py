"""Rows of a task from local JSONL / JSON / Parquet / CSV files or a HF ``datasets`` id."""

from __future__ import annotations

import csv
import hashlib
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from privzo.extras import require_extra
from privzo.section import ConfigError
from privzo.tasks.presets import HubSource

Row = dict[str, Any]
SUFFIXES = (".jsonl", ".json", ".parquet", ".csv")
# A JSONL line that cannot be read becomes a row holding only this key and the reason, so the
# task's row check reports it (file and row) or skips and counts it, like any invalid row.
UNREADABLE = "__privzo_unreadable__"


def read_rows(path: str | Path, field: str = "task.train_path") -> list[Row]:
    """Read a local file into a list of dict rows; errors name the config field and path."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise ConfigError(
            f"{field}={str(path)!r} is a directory; give one data file ({', '.join(SUFFIXES)}), "
            "or task.data_dir for a directory of train / test files"
        )
    if not path.exists():
        raise ConfigError(f"{field}={str(path)!r}: dataset file does not exist")
    if not path.is_file():  # a FIFO or device: reading it could block forever
        raise ConfigError(
            f"{field}={str(path)!r} is not a regular file (a pipe, socket or device); give a "
            "data file"
        )
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise ConfigError(f"{field}={str(path)!r}: unsupported file type; allowed: {SUFFIXES}")
    if suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    if suffix == ".csv":
        return _read_csv_rows(path, field)
    return _read_json_rows(path, field)


def _read_csv_rows(path: Path, field: str) -> list[Row]:
    """The CSV's rows (pyarrow infers the column types), after every record is checked to
    have the header's fields: an unterminated quote otherwise merges the lines after it."""
    import pyarrow as pa
    import pyarrow.csv as pacsv

    _check_csv_records(path, field)
    try:
        # quoted line breaks are text: the check above refused the quotes that run away
        options = pacsv.ParseOptions(newlines_in_values=True)
        return pacsv.read_csv(path, parse_options=options).to_pylist()
    except pa.ArrowInvalid as error:
        raise ConfigError(f"{field}={str(path)!r}: not a readable CSV file ({error})") from None


def _check_csv_records(path: Path, field: str) -> None:
    """Refuse a record with more or fewer fields than the header, or one whose quoted field
    runs over lines that look like whole rows (an unterminated quote), naming its line."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            start = reader.line_num + 1
            for record in reader:
                problem = _csv_record_problem(record, len(header), start, reader.line_num)
                if problem is not None:
                    raise ConfigError(f"{field}={str(path)!r}, line {start}: {problem}")
                start = reader.line_num + 1
    except (UnicodeDecodeError, csv.Error) as error:
        raise ConfigError(f"{field}={str(path)!r}: not a readable CSV file ({error})") from None


def _csv_record_problem(record: list[str], columns: int, start: int, end: int) -> str | None:
    if not record:  # a blank line
        return None
    spans = f"; its quoted field runs to line {end}: an unterminated quote?" if end > start else ""
    if len(record) != columns:
        count = f"{len(record)} field{'' if len(record) == 1 else 's'}"
        return f"{count} where the header has {columns}{spans}"
    inner = [line for value in record for line in value.splitlines()[:-1]]
    if columns > 1 and any(line.count(",") >= columns - 1 for line in inner):
        return (
            f"a quoted field holds whole rows{spans} close the quote, or write a quote inside "
            'a field as ""'
        )
    return None


def _read_json_rows(path: Path, field: str) -> list[Row]:
    if path.suffix.lower() == ".json":
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            message = f"{field}={str(path)!r}: not a valid UTF-8 JSON file ({error})"
            raise ConfigError(message) from None
        if not isinstance(rows, list):
            raise ConfigError(f"{field}={str(path)!r}: a .json dataset must hold a list of rows")
        return rows
    rows = []
    for number, raw in enumerate(path.read_bytes().splitlines(), start=1):
        if raw.strip():
            rows.append(_parse_jsonl_line(raw, number))
    return rows


def _parse_jsonl_line(raw: bytes, number: int) -> Row:
    try:
        row = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        return {UNREADABLE: f"line {number} is not valid UTF-8"}
    except json.JSONDecodeError as error:
        return {UNREADABLE: f"line {number} is not valid JSON ({error.msg})"}
    if not isinstance(row, dict):
        return {UNREADABLE: f"line {number} is not a JSON object"}
    return row


def load_hf_rows(source: HubSource) -> tuple[list[Row], list[Row]]:
    """(train, test) rows of a hub dataset, with the splits its preset names.

    GLUE-style test splits carry no labels, so presets use the labelled validation split there.
    """
    require_extra("datasets", f"loading the hub dataset {source.dataset!r}")
    import datasets

    pinned = {"revision": source.revision} if source.revision is not None else {}
    loaded = datasets.load_dataset(source.dataset, source.subset, **pinned)
    for split in (source.train_split, source.test_split):
        if split not in loaded:
            raise ConfigError(
                f"hub dataset {source.dataset!r} ({source.subset}) has no split {split!r}; "
                f"it has {sorted(loaded)}"
            )
    return list(loaded[source.train_split]), list(loaded[source.test_split])


def record_hash(row: Row, salt: str) -> int:
    """A salted 64-bit hash of one record's content (its fields, in key order).

    Splits and few-shot selections rank records by it, so where a record goes depends on that
    record alone: adding or removing one record moves no other across a threshold, and at most
    one across a fixed-size cut (a seeded permutation of the whole file moved 21 of 220).
    """
    text = json.dumps(row, sort_keys=True, default=str, ensure_ascii=False)
    digest = hashlib.blake2b(text.encode(), digest_size=8, key=salt.encode()[:64]).digest()
    return int.from_bytes(digest, "little")


def hash_order(rows: Sequence[Row], salt: str) -> list[int]:
    """Indices of ``rows`` by salted content hash (equal rows keep their file order)."""
    hashes = [record_hash(row, salt) for row in rows]
    return sorted(range(len(rows)), key=lambda index: (hashes[index], index))
