"""New local MLflow stores copied from a blank one: MLflow builds a sqlite store by running every
schema migration since its first (seconds on a small machine, the same work for every new output
directory), so the migrated, empty database is built once per MLflow version in a directory the
caller names (the model cache's) and copied.

The blank holds MLflow's schema and its bookkeeping rows, but not the default experiment: MLflow
creates that when it opens the copy, with this store's own artifact location and creation time.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
from pathlib import Path

from privzo.dirlock import waited_lock

__all__ = ["BLANK_PREFIX", "keep_blank_stores_in", "seed_new_store"]

BLANK_PREFIX = "mlflow-blank-"  # + MLflow's version + ".db", in the directory a caller names
DEFAULT_EXPERIMENT_ID = 0  # MLflow's "Default", which it creates in a store that lacks it


class _Kept:
    directory: Path | None = None  # named by keep_blank_stores_in; None: MLflow builds stores


_KEPT = _Kept()


def keep_blank_stores_in(directory: Path | None) -> None:
    """Build new local stores of this process from a blank one kept in ``directory`` (None:
    MLflow builds each)."""
    _KEPT.directory = None if directory is None else Path(directory)


def seed_new_store(db: Path) -> None:
    """Copy the blank store to ``db`` when no store is there yet, building the blank first if
    needed; the caller holds the store's lock. Any failure leaves ``db`` to MLflow, as before:
    the blank only saves time."""
    if _KEPT.directory is None or db.exists():
        return
    try:
        blank = _blank_store(_KEPT.directory)
        staged = db.with_name(f"{db.name}.{os.getpid()}.blank")
        shutil.copyfile(blank, staged)
        os.replace(staged, db)  # a whole store or none: never a half-copied file at db
    except (OSError, sqlite3.Error):
        return


def _blank_store(directory: Path) -> Path:
    import mlflow

    blank = directory / f"{BLANK_PREFIX}{mlflow.__version__}.db"
    if blank.is_file():
        return blank
    directory.mkdir(parents=True, exist_ok=True)
    with waited_lock(blank.with_name(blank.name + ".lock")):
        if not blank.is_file():  # another process may have built it while this one waited
            staged = blank.with_name(f"{blank.name}.{os.getpid()}.building")
            staged.unlink(missing_ok=True)
            _migrate(staged)
            os.replace(staged, blank)
    return blank


def _migrate(db: Path) -> None:
    """MLflow's own creation of a store at ``db``, then its default experiment removed."""
    from mlflow.tracking import MlflowClient

    MlflowClient(tracking_uri=f"sqlite:///{db.resolve().as_posix()}").search_experiments()
    with contextlib.closing(sqlite3.connect(db)) as connection, connection:
        connection.execute(
            "DELETE FROM experiment_tags WHERE experiment_id = ?", (DEFAULT_EXPERIMENT_ID,)
        )
        connection.execute(
            "DELETE FROM experiments WHERE experiment_id = ?", (DEFAULT_EXPERIMENT_ID,)
        )
