"""New local MLflow stores copied from the cache's blank one, against a store MLflow built."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import mlflow
import pytest

from privzo.tracking import get_or_create_experiment, keep_blank_stores_in, open_client
from privzo.tracking.blank_store import BLANK_PREFIX


def _uri(db: Path) -> str:
    return f"sqlite:///{db.resolve().as_posix()}"


def _schema(db: Path) -> list[tuple[str, list[str]]]:
    """Each table's and index's definition, its clauses sorted (MLflow's migrations write a
    table's constraints in an order that differs from one build to the next), and the schema
    version."""
    with contextlib.closing(sqlite3.connect(db)) as connection:
        rows = connection.execute("SELECT name, sql FROM sqlite_master ORDER BY name").fetchall()
        version = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    clauses = [
        (name, sorted(part.strip() for part in (sql or "").split(","))) for name, sql in rows
    ]
    return [*clauses, ("alembic_version", [str(version)])]


def _experiments(client) -> list[tuple[str, str, str, str]]:
    found = client.search_experiments()
    return sorted((e.experiment_id, e.name, e.artifact_location, e.lifecycle_stage) for e in found)


@pytest.fixture
def blank_in(cache_dir) -> Iterator[None]:
    """The test names its own blank directory; the session's is attached again afterwards."""
    try:
        yield
    finally:
        keep_blank_stores_in(cache_dir)


def test_a_new_store_is_the_blank_with_mlflows_own_default_experiment(
    tmp_path, monkeypatch, blank_in
):
    """The blank is built in one working directory and copied in another: MLflow gives the
    default experiment a location under the working directory, so a blank that kept its own
    would show the first directory."""
    for folder in ("first", "second"):
        (tmp_path / folder).mkdir()
    monkeypatch.chdir(tmp_path / "first")
    keep_blank_stores_in(tmp_path / "cache")
    open_client(_uri(tmp_path / "warm" / "mlflow.db"))  # builds the blank
    blank = tmp_path / "cache" / f"{BLANK_PREFIX}{mlflow.__version__}.db"
    assert blank.is_file()
    built = blank.stat().st_mtime_ns
    monkeypatch.chdir(tmp_path / "second")
    keep_blank_stores_in(None)
    own = open_client(_uri(tmp_path / "own" / "mlflow.db"))  # MLflow's migrations
    keep_blank_stores_in(tmp_path / "cache")
    copied = open_client(_uri(tmp_path / "copied" / "mlflow.db"))
    assert _schema(tmp_path / "copied" / "mlflow.db") == _schema(tmp_path / "own" / "mlflow.db")
    # MLflow created the default experiment when it opened the copy: this store's location
    assert _experiments(copied) == _experiments(own)
    assert [e.name for e in copied.search_experiments()] == ["Default"]
    assert blank.stat().st_mtime_ns == built  # copied, not built again
    # the copy records like any store
    experiment = get_or_create_experiment(copied, "blank", None)
    run = copied.create_run(experiment)
    copied.log_metric(run.info.run_id, "loss", 0.5, step=3)
    reopened = open_client(_uri(tmp_path / "copied" / "mlflow.db"))
    assert [m.value for m in reopened.get_metric_history(run.info.run_id, "loss")] == [0.5]


def test_a_blank_directory_that_cannot_be_made_leaves_the_store_to_mlflow(tmp_path, blank_in):
    occupied = tmp_path / "a-file"
    occupied.write_text("not a directory")
    keep_blank_stores_in(occupied)
    client = open_client(_uri(tmp_path / "store" / "mlflow.db"))
    assert [e.name for e in client.search_experiments()] == ["Default"]
    assert occupied.read_text() == "not a directory"
