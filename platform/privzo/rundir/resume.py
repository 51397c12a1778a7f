"""Whether an unfinished run goes on: its resume point (``resume.json``) and the steps it kept.

A single-process run's steps are in its directory (``privzo.rundir.progress`` saves them after
every window); a distributed run's driver writes the resume point too, naming the Ray Train run
whose checkpoints hold its steps (``privzo.distributed.resume``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path

import pyarrow.parquet as pq

from privzo.algorithms.registry import writes_trajectory
from privzo.config.loading import dump_config, load_config
from privzo.config.run import RunConfig
from privzo.rundir.files import (
    CONFIG_FILE,
    RESUME_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    malformed_record,
    read_record,
    write_text_atomically,
)
from privzo.tracking import MetricPoint, is_metric_point

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """What a resumed run needs besides its steps (the trajectory in the run directory, or a
    distributed run's Ray Train checkpoints)."""

    tracking_run_id: str | None
    before: tuple[dict[str, float], float] | None  # test metrics before training, their time
    # a distributed run's Ray Train run (its name in the checkpoint storage), which every
    # launch of the run continues; None for a single-process run
    ray_run: str | None = None
    # the metrics logged but not yet in the tracking store when the point was saved, which a
    # resumed run stores where the store lacks them (a kill drops the tracker's buffer)
    unsent: tuple[MetricPoint, ...] = ()


def write_resume_point(output_dir: Path, point: ResumePoint) -> None:
    """What the same command needs to go on with this run (atomically)."""
    write_text_atomically(output_dir / RESUME_FILE, json.dumps(asdict(point)))


def find_resume_point(output_dir: Path, config: RunConfig) -> ResumePoint | None:
    """The resume point of an unfinished run of exactly ``config`` in ``output_dir``, if any."""
    if not _unfinished(output_dir) or not (output_dir / CONFIG_FILE).is_file():
        return None
    if dump_config(load_config(output_dir / CONFIG_FILE)) != dump_config(config):
        return None
    return read_resume_point(output_dir / RESUME_FILE)


def unfinished_point(output_dir: Path) -> ResumePoint | None:
    """The resume point of the unfinished run in ``output_dir``, whatever its config: for a
    caller that has just compared the directory's config itself and reads it no more."""
    return read_resume_point(output_dir / RESUME_FILE) if _unfinished(output_dir) else None


def _unfinished(output_dir: Path) -> bool:
    """A resume point without the summary that marks the run finished."""
    return (output_dir / RESUME_FILE).is_file() and not (output_dir / SUMMARY_FILE).exists()


def read_resume_point(path: Path) -> ResumePoint:
    """The resume point in ``path``, each field checked: a malformed one is refused naming the
    file and the field, before the run goes on with it."""
    saved = read_record(path)
    for key in ("tracking_run_id", "ray_run"):
        if not isinstance(saved.get(key), str | None):
            raise malformed_record(path, f"{key} must be text or null, got {saved[key]!r}")
    before = saved.get("before")
    if before is not None and not _is_before(before):
        raise malformed_record(path, f"before must be [metrics, seconds] or null, got {before!r}")
    unsent = saved.get("unsent", [])
    if not isinstance(unsent, list) or not all(is_metric_point(point) for point in unsent):
        raise malformed_record(
            path, f"unsent must be a list of {{key, value, step}} metrics, got {unsent!r}"
        )
    return ResumePoint(
        saved.get("tracking_run_id"),
        None if before is None else (before[0], before[1]),
        saved.get("ray_run"),
        tuple(MetricPoint(p["key"], float(p["value"]), p["step"]) for p in unsent),
    )


def _is_before(value: object) -> bool:
    """Whether ``value`` is ``[{name: number}, seconds]``, as ``write_resume_point`` writes it."""
    if not isinstance(value, list) or len(value) != 2:
        return False
    metrics, seconds = value
    numbers = (int, float)
    return (
        isinstance(metrics, dict)
        and all(isinstance(v, numbers) and not isinstance(v, bool) for v in metrics.values())
        and isinstance(seconds, numbers)
        and not isinstance(seconds, bool)
    )


def clear_resume_point(output_dir: Path) -> None:
    (output_dir / RESUME_FILE).unlink(missing_ok=True)


def can_resume(config: RunConfig, output_dir: Path) -> bool:
    """Whether ``run(config, output_dir)`` would go on with an unfinished run there: a
    zeroth-order run (its trajectory rebuilds θ) of exactly this config, on any layout."""
    return find_unfinished(config, Path(output_dir)) is not None


def find_unfinished(config: RunConfig, output_dir: Path) -> ResumePoint | None:
    """The resume point of an unfinished run of ``config`` that can go on, if any: a single
    run's steps are in the directory, a distributed run's in the Ray Train run it names."""
    if not writes_trajectory(config):
        return None
    point = find_resume_point(output_dir, config)
    return point if point is not None and goes_on_from(config, point) else None


def goes_on_from(config: RunConfig, point: ResumePoint) -> bool:
    """Whether a zeroth-order run of ``config`` goes on from ``point``: a distributed one only
    where the point names the Ray Train run whose checkpoints hold its steps."""
    return config.parallel.strategy == "single" or point.ray_run is not None


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
