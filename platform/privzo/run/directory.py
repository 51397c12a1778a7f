"""A run's directory: whether it holds a finished run of a config, whether an unfinished one
resumes, and the records a finished run leaves (``privzo.layouts.record`` names the files and
checks, prepares and writes them for every layout).

Searches, studies and the demo ask ``finished_summary`` before they start a run, so "this
directory already holds this config's result" is decided in one place.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from privzo.algorithms.registry import writes_trajectory
from privzo.config import RunConfig, dump_config
from privzo.layouts.record import CONFIG_FILE, PRIVACY_FILE, SUMMARY_FILE, TRAJECTORY_FILE
from privzo.layouts.resume import (
    ResumePoint,
    clear_resume_point,
    find_resume_point,
    write_json_atomically,
)

logger = logging.getLogger(__name__)


def finished_summary(output_dir: Path, config: RunConfig) -> dict[str, Any] | None:
    """The summary of a finished run of exactly ``config`` in ``output_dir``, else None."""
    summary, saved = Path(output_dir) / SUMMARY_FILE, Path(output_dir) / CONFIG_FILE
    if not (summary.is_file() and saved.is_file()):
        return None
    if saved.read_text() != dump_config(config):
        return None
    return json.loads(summary.read_text())


def can_resume(config: RunConfig, output_dir: Path) -> bool:
    """Whether ``run(config, output_dir)`` would go on with an unfinished run there: a
    zeroth-order run (its trajectory rebuilds θ) of exactly this config, on any layout."""
    return find_unfinished(config, Path(output_dir)) is not None


def find_unfinished(config: RunConfig, output_dir: Path) -> ResumePoint | None:
    """The resume point of an unfinished run of ``config`` that can go on, if any: a single
    run's steps are in the directory, a distributed run's in the Ray Train run it names."""
    if not writes_trajectory(config):
        return None
    point = find_resume_point(output_dir, config, CONFIG_FILE, SUMMARY_FILE)
    if point is not None and config.parallel.strategy != "single" and point.ray_run is None:
        return None  # no Ray Train run to go on with: the steps' record is not found
    return point


def unfinished_steps(config: RunConfig, output_dir: Path) -> int:
    """The steps an unfinished run of ``config`` in ``output_dir`` made and released, which a
    resumed run keeps (0 if there is none to resume): a single run's trajectory rows, a
    distributed run's newest committed checkpoint (``privzo.distributed.resume``)."""
    point = find_unfinished(config, Path(output_dir))
    if point is None:
        return 0
    if point.ray_run is not None:
        from privzo.distributed.launch import resumed_steps

        return resumed_steps(config, Path(output_dir), point.ray_run)
    trajectory = Path(output_dir) / TRAJECTORY_FILE
    return pq.read_metadata(trajectory).num_rows if trajectory.is_file() else 0


def resume_point(config: RunConfig, output_dir: Path) -> ResumePoint | None:
    """``find_unfinished``, saying so when a run goes on."""
    point = find_unfinished(config, output_dir)
    if point is not None:
        logger.warning("resuming the unfinished run in %s", output_dir)
    return point


@dataclass(frozen=True)
class RunRecords:
    """What a finished run leaves besides its config: the summary, the privacy state, and the
    trajectory where a Ray Train rank returned it (a single process writes its own as it goes)."""

    summary: dict[str, Any]
    privacy: dict[str, Any]
    trajectory: bytes | None = None


def write_records(output_dir: Path, records: RunRecords) -> None:
    """The finished run's files: the privacy state, then the summary that marks it finished;
    nothing is left to resume."""
    if records.trajectory is not None:
        (output_dir / TRAJECTORY_FILE).write_bytes(records.trajectory)
    write_json_atomically(output_dir / PRIVACY_FILE, records.privacy)
    (output_dir / SUMMARY_FILE).write_text(json.dumps(records.summary, indent=2) + "\n")
    clear_resume_point(output_dir)
