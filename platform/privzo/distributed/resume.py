"""Where a distributed run stands between launches: its Ray Train run's committed checkpoints.

Every launch of a distributed run continues one Ray Train run, whose name the run directory's
resume point keeps (``privzo.rundir.resume.ResumePoint.ray_run``). Launched again under the
same name and storage, Ray Train restores its checkpoint manager from storage, hands the workers
the newest checkpoint any launch committed (``ray.train.get_checkpoint``: the same path as a
restart within one launch) and deletes superseded ones as the resumed run commits newer ones
(``CheckpointConfig(num_to_keep)``). This module reads that record from the driver (through
``ray.train.Result.from_path``, so checkpoints in cloud storage are read too) and removes what Ray
does not know of: checkpoints a killed launch uploaded that Ray never committed. Rank 0 logs,
reports and scores a window only after its checkpoint is committed, so nothing of such a
checkpoint's steps went out but the file itself, which is deleted before those steps are drawn
again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from privzo.distributed.checkpoint import read_checkpoint
from privzo.section import ConfigError

CHECKPOINT_PREFIX = "checkpoint_"
# Ray Train's checkpoint manager, whose snapshot reader logs SNAPSHOT_NOTICE at INFO
SNAPSHOT_LOGGER = "ray.train.v2._internal.execution.checkpoint.checkpoint_manager"
SNAPSHOT_NOTICE = "A run snapshot was found"


def ray_run_path(storage: str, ray_run: str) -> str:
    return f"{storage.rstrip('/')}/{ray_run}"


@dataclass(frozen=True)
class Committed:
    """The newest checkpoint a launch of the Ray Train run committed (None: none yet)."""

    checkpoint: Any  # ray.train.Checkpoint | None
    steps: int
    registered: frozenset[str]  # the paths of every checkpoint Ray keeps for the run


def committed(run_path: str) -> Committed:
    """Ray Train's record of the run's checkpoints, its newest one read and checked; a record
    or checkpoint that cannot be read is a ``ConfigError`` (the run cannot resume)."""
    from ray.train.v2.api.result import Result  # see fit() in launch.py for the module

    try:
        with snapshot_notice_dropped():
            result = Result.from_path(run_path)
    except RuntimeError:  # no run folder or no snapshot: no launch committed a checkpoint
        return Committed(None, 0, frozenset())
    except Exception as error:  # a snapshot naming checkpoints that are gone, or unreadable
        raise _unresumable(run_path, error) from None
    if result.checkpoint is None:
        return Committed(None, 0, frozenset())
    try:
        with result.checkpoint.as_directory() as directory:
            _table, _meta, state = read_checkpoint(Path(directory))
    except (OSError, ValueError, KeyError) as error:
        raise _unresumable(run_path, error) from None
    kept = {checkpoint.path for checkpoint, _metrics in result.best_checkpoints or []}
    kept.add(result.checkpoint.path)
    return Committed(result.checkpoint, state.steps_done, frozenset(kept))


@contextlib.contextmanager
def snapshot_notice_dropped() -> Iterator[None]:
    """Without Ray Train's notice that a run snapshot was found, which tells the user to delete
    the run's folder to start anew: privzo reads the snapshot to go on, and says so itself."""

    def keep(record: logging.LogRecord) -> bool:
        return SNAPSHOT_NOTICE not in record.getMessage()

    logger = logging.getLogger(SNAPSHOT_LOGGER)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


def _unresumable(run_path: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"cannot resume the distributed run: its Ray Train checkpoints in {run_path!r} cannot "
        f"be read ({error}); pass --overwrite to start over (a new run, with its own budget)"
    )


def remove_uncommitted(run_path: str, registered: frozenset[str]) -> None:
    """Delete the run's checkpoint folders Ray Train does not keep: a killed launch's upload it
    never committed (its steps are drawn again), or one it superseded but had not deleted."""
    filesystem, root = _filesystem(run_path)
    from pyarrow.fs import FileSelector, FileType

    try:
        found = filesystem.get_file_info(FileSelector(root, allow_not_found=True))
    except OSError:
        return
    kept = {path.rstrip("/") for path in registered}
    for info in found:
        path = info.path.rstrip("/")
        is_checkpoint = path.rsplit("/", 1)[-1].startswith(CHECKPOINT_PREFIX)
        if info.type == FileType.Directory and is_checkpoint and path not in kept:
            filesystem.delete_dir(info.path)


def _filesystem(path: str) -> tuple[Any, str]:
    from pyarrow.fs import FileSystem, LocalFileSystem

    if "://" in path:
        return FileSystem.from_uri(path)
    return LocalFileSystem(), str(Path(path).resolve())


def salvaged_rows(trajectory: Path) -> int:
    """Rows of the trajectory a failed launch kept in the run directory (0 if none)."""
    try:
        return pq.read_metadata(trajectory).num_rows
    except (OSError, ValueError):
        return 0
