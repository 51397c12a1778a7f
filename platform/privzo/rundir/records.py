"""A run's directory from start to finish: the config written first, the records that mark it
finished written last, and the one question every caller asks before it starts a run, searches,
studies, audits and the demo alike: does this directory already hold this config's result?
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from privzo.algorithms.registry import writes_trajectory
from privzo.config.loading import dump_config
from privzo.config.run import RunConfig
from privzo.rundir.files import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    RAY_STATE_DIR,
    RESUME_FILE,
    RUN_FILES,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    read_json_object,
    write_json_atomically,
    write_text_atomically,
)
from privzo.rundir.resume import (
    ResumePoint,
    clear_resume_point,
    goes_on_from,
    unfinished_point,
    write_resume_point,
)
from privzo.rundir.summary import RunRecords, RunSummary, read_summary, write_summary
from privzo.rundir.trajectory import write_trajectory
from privzo.section import ConfigError


def write_config(output_dir: Path, config: RunConfig) -> None:
    """The resolved config, first of a new run's files: what ``finished`` and a resume compare."""
    write_text_atomically(output_dir / CONFIG_FILE, dump_config(config))


def write_records(output_dir: Path, records: RunRecords) -> None:
    """The finished run's files: the privacy state, then the summary that marks it finished.

    The resume point stays (one naming the tracking run is written where the run kept none)
    until ``mark_tracked``: a run killed after its summary but before its tracking run is final
    is found by ``untracked`` and completed by the same command, not trained again."""
    if records.trajectory is not None:
        write_trajectory(output_dir, records.trajectory)
    write_json_atomically(output_dir / PRIVACY_FILE, records.privacy)
    if not (output_dir / RESUME_FILE).is_file():
        write_resume_point(output_dir, ResumePoint(records.summary.tracking_run_id, None))
    write_summary(output_dir / SUMMARY_FILE, records.summary)


def record_tracking_run(output_dir: Path, summary: RunSummary, run_id: str | None) -> RunSummary:
    """The finished run's summary, naming the tracking run that now holds its records (one
    that stands in for a run the store lost), written over the earlier summary."""
    summary = replace(summary, tracking_run_id=run_id)
    write_summary(Path(output_dir) / SUMMARY_FILE, summary)
    return summary


def mark_tracked(output_dir: Path) -> None:
    """The finished run's tracking run is final (its artifacts logged, FINISHED): nothing is
    left to complete."""
    clear_resume_point(output_dir)


def untracked(output_dir: Path, config: RunConfig) -> RunSummary | None:
    """The summary of a finished run of exactly ``config`` in ``output_dir`` whose tracking run
    (the summary's ``tracking_run_id``) was not ended: a kill after its summary; else None."""
    if not (Path(output_dir) / RESUME_FILE).is_file():  # the common case reads nothing
        return None
    return finished(output_dir, config)


def finished(output_dir: Path, config: RunConfig) -> RunSummary | None:
    """The summary of a finished run of exactly ``config`` in ``output_dir``, else None."""
    if not holds_configs(Path(output_dir), {CONFIG_FILE: dump_config(config)}):
        return None
    return read_summary(Path(output_dir) / SUMMARY_FILE)


def holds_run(output_dir: Path) -> bool:
    """Whether ``output_dir`` holds a run's records, finished or not."""
    return any((Path(output_dir) / name).exists() for name in RUN_FILES)


def holds_other_run(output_dir: Path, config: RunConfig) -> bool:
    """Whether ``output_dir`` holds a run's records, finished or not, of a config other than
    ``config``: released steps that a caller naming the directory itself (a study's cell, a
    demo arm) refuses to write over."""
    directory = Path(output_dir)
    if not holds_run(directory):
        return False
    return not holds_configs(directory, {CONFIG_FILE: dump_config(config)})


def refuse_other_run(directory: Path, config: RunConfig, named: str, advice: str) -> None:
    """Refuse ``directory`` where it holds another config's run (``holds_other_run``), before
    anything trains. ``named`` prefixes the message with what the directory is to the caller;
    ``advice`` says why the config may differ and how to go on."""
    if holds_other_run(directory, config):
        raise ConfigError(f"{named}{directory} holds a run of another config {advice}")


def released_nothing(output_dir: Path, config: RunConfig) -> bool:
    """Whether ``output_dir`` holds an attempt at exactly ``config`` that stopped before it kept
    any step: while loading, before its first step (its trajectory, if written, has no row), or
    a run that keeps no trajectory (a first-order baseline) before its end, whose noised steps
    never left the process. Starting it again draws no kept step twice."""
    directory = Path(output_dir)
    if any((directory / name).exists() for name in (SUMMARY_FILE, RESUME_FILE, MODEL_DIR)):
        return False
    if (directory / RAY_STATE_DIR).exists() or _kept_rows(directory / TRAJECTORY_FILE) != 0:
        return False
    return holds_configs(directory, {CONFIG_FILE: dump_config(config)})


def _kept_rows(trajectory: Path) -> int | None:
    """The rows of a trajectory file (0: none there); None where it cannot be read."""
    if not trajectory.exists():
        return 0
    try:
        return pq.read_metadata(trajectory).num_rows
    except (OSError, pa.ArrowException):
        return None


def starts_over(config: RunConfig, output_dir: Path) -> bool:
    """``run``'s ``overwrite`` for a caller that names the run's directory itself (a search's
    trial, a study's cell, a demo arm), once it found no finished run there: an unfinished run
    of ``config`` resumes from its own trajectory into its MLflow run (False) unless it cannot
    (True: a first-order run keeps no trajectory to go on from); another config's run is never
    written over (False: ``run`` refuses it). The directory's config is read once."""
    directory = Path(output_dir)
    if not holds_run(directory):
        return True  # nothing there to keep
    if not holds_configs(directory, {CONFIG_FILE: dump_config(config)}):
        return False  # another config's run
    if not writes_trajectory(config):
        return True
    point = unfinished_point(directory)  # of exactly ``config``: its file was just compared
    return point is None or not goes_on_from(config, point)


def finished_record(
    directory: Path, result_file: str, configs: Mapping[str, str]
) -> dict[str, Any] | None:
    """The JSON result of finished work other than a run (an audit, the synthetic study) whose
    config files (name → text) hold exactly ``configs``; None if it is not there whole."""
    if not holds_configs(Path(directory), configs):
        return None
    return read_json_object(Path(directory) / result_file)


def holds_configs(directory: Path, configs: Mapping[str, str]) -> bool:
    """Whether every config file named in ``configs`` is in ``directory`` with exactly its text."""
    for name, text in configs.items():
        path = directory / name
        if not path.is_file() or path.read_text() != text:
            return False
    return True
