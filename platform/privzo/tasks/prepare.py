"""Prepare a preset task's data once, where the Hub is reachable, for clusters without internet.

``prepare_task_data`` fetches the preset's hub dataset (or a mirror of it: another hub id or a
local directory of data files) and writes ``train.parquet`` and ``test.parquet`` plus a
``task.json`` record into one directory. Copy that directory to the cluster and set
``task.data_dir`` to it: runs then read the same rows with no network and no ``datasets``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privzo.results import RecordKeys
from privzo.section import ConfigError
from privzo.tasks.data import Row, load_hf_rows
from privzo.tasks.presets import PRESETS, HubSource

SPLIT_FILES = {"train": "train.parquet", "test": "test.parquet"}
RECORD_FILE = "task.json"


def prepare_task_data(
    task: str,
    output_dir: Path,
    *,
    hf_dataset: str | None = None,
    hf_subset: str | None = None,
    progress: bool = True,
) -> PreparedTask:
    """Write the preset ``task``'s train / test rows to ``output_dir`` and return the record.

    ``hf_dataset`` replaces the preset's hub id: another hub id, or a local directory whose
    files ``datasets`` splits by name (train.jsonl, validation.jsonl, test.jsonl, ...). The
    preset's split names still pick the train and test splits, so a mirror must keep them.
    Existing files are never overwritten: a prepared directory is evidence of what a run used.
    """
    source = resolve_source(task, hf_dataset, hf_subset)
    output_dir = Path(output_dir).expanduser()
    _refuse_existing(output_dir)
    with _progress_bars(progress):
        train, test = load_hf_rows(source)
    output_dir.mkdir(parents=True, exist_ok=True)
    record = _record(task, source, {"train": train, "test": test})
    for split, rows in (("train", train), ("test", test)):
        _write_parquet(rows, output_dir / SPLIT_FILES[split])
    # written last, so a directory with a task.json holds a complete preparation
    _write_atomically(output_dir / RECORD_FILE, json.dumps(record.to_dict(), indent=2) + "\n")
    return record


def resolve_source(task: str, hf_dataset: str | None, hf_subset: str | None) -> HubSource:
    """The preset's hub source with the overrides applied; an unknown task names the presets.

    A replaced dataset does not inherit the preset's subset (a local mirror has none); a local
    directory is recorded by its absolute path, so task.json says which copy was read.
    """
    preset = PRESETS.get(task)
    if preset is None or preset.source is None:
        raise ConfigError(f"task {task!r} has no hub data to prepare; allowed: {sorted(PRESETS)}")
    base = preset.source
    if hf_dataset is None:
        return HubSource(base.dataset, hf_subset or base.subset, base.train_split, base.test_split)
    local = Path(hf_dataset).expanduser()
    dataset = str(local.resolve()) if local.is_dir() else hf_dataset
    return HubSource(dataset, hf_subset, base.train_split, base.test_split)


def _refuse_existing(output_dir: Path) -> None:
    """Fail before any download when a file this would write already exists."""
    if output_dir.exists() and not output_dir.is_dir():
        raise ConfigError(f"output {str(output_dir)!r} exists and is not a directory")
    for name in (*SPLIT_FILES.values(), RECORD_FILE):
        path = output_dir / name
        if path.exists():
            raise ConfigError(
                f"{str(path)!r} already exists; refusing to overwrite prepared data (remove it "
                "or choose another output directory)"
            )


@dataclass(frozen=True)
class PreparedSplit:
    """One written split: its file, the hub split it came from, and its rows' shape."""

    file: str
    source_split: str
    rows: int
    columns: list[str]


@dataclass(frozen=True, eq=False)
class PreparedTask(RecordKeys):
    """What task.json says: where the rows came from and what each written split holds."""

    task: str
    dataset: str
    subset: str | None
    splits: dict[str, PreparedSplit]  # "train" and "test"

    def to_dict(self) -> dict[str, Any]:
        return {
            "task": self.task,
            "source": {"dataset": self.dataset, "subset": self.subset},
            "splits": {name: asdict(split) for name, split in self.splits.items()},
        }

    def __eq__(self, other: object) -> bool:
        """Equal to a record of the same content, or to its JSON form (task.json read back)."""
        if isinstance(other, PreparedTask):
            other = other.to_dict()
        return self.to_dict() == other if isinstance(other, dict) else NotImplemented


def _record(task: str, source: HubSource, splits: dict[str, list[Row]]) -> PreparedTask:
    split_names = {"train": source.train_split, "test": source.test_split}
    written = {
        split: PreparedSplit(SPLIT_FILES[split], split_names[split], len(rows), _columns(rows))
        for split, rows in splits.items()
    }
    return PreparedTask(task, source.dataset, source.subset, written)


def _columns(rows: list[Row]) -> list[str]:
    """Every field any row has, in first-seen order (rows need not all share one schema)."""
    return list(dict.fromkeys(name for row in rows for name in row))


def _write_parquet(rows: list[Row], path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({name: [row.get(name) for row in rows] for name in _columns(rows)})
    temporary = path.with_name(path.name + ".partial")
    pq.write_table(table, temporary)
    os.replace(temporary, path)


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(path.name + ".partial")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


@contextmanager
def _progress_bars(enabled: bool) -> Iterator[None]:
    """Hide the download / conversion bars of ``datasets`` and the Hub client for one load when
    not ``enabled``, then restore each library's setting (other callers may rely on it).

    Enabled leaves the settings alone, so an environment that turned the bars off keeps them off.
    """
    if enabled:
        yield
        return
    toggles = [toggle for toggle in _progress_toggles() if not toggle[0]()]
    for _, _, disable in toggles:
        disable()
    try:
        yield
    finally:
        for _, enable, _ in toggles:
            enable()


def _progress_toggles() -> list[tuple[Any, Any, Any]]:
    """(are_disabled, enable, disable) of each installed library; none without ``datasets``
    (``load_hf_rows`` then explains how to install it)."""
    toggles = []
    try:
        import datasets

        toggles.append(
            (
                datasets.are_progress_bars_disabled,
                datasets.enable_progress_bars,
                datasets.disable_progress_bars,
            )
        )
        from huggingface_hub import utils as hub_utils

        toggles.append(
            (
                hub_utils.are_progress_bars_disabled,
                hub_utils.enable_progress_bars,
                hub_utils.disable_progress_bars,
            )
        )
    except ImportError:
        pass
    return toggles
