"""Resuming a single-process zeroth-order run from its directory.

At the end of every window (before its metrics are logged) the run writes its trajectory so far,
its privacy state (``privacy.json``: the ledger's budget, accountant settings and steps booked)
and ``resume.json`` (the MLflow run id and the test metrics before training), each atomically:
write a temporary file, then rename. No weights and no secret generator state: replaying the
trajectory on the base weights rebuilds θ, and a resumed run draws fresh noise and batches from
OS entropy for the steps it has not taken. Every row of the trajectory file is a step that ran
and was released to disk, so the resumed run replays exactly those, books them once in the
ledger (restored through the accountant's state, which refuses other settings), and draws no
step again.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privzo.config import RunConfig, dump_config, load_config
from privzo.zo.trajectory import TrajectoryRecorder

RESUME_FILE = "resume.json"


@dataclass(frozen=True)
class ResumePoint:
    """What a resumed run needs besides the trajectory."""

    tracking_run_id: str | None
    before: tuple[dict[str, float], float] | None  # test metrics before training, their time


def write_atomically(path: Path, data: bytes) -> None:
    """Write then rename: a kill mid-write leaves the previous file whole."""
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_bytes(data)
    os.replace(temporary, path)


def save_progress(
    output_dir: Path,
    recorder: TrajectoryRecorder,
    point: ResumePoint,
    files: tuple[str, str],
    privacy: dict[str, Any],
) -> None:
    """The trajectory so far, the privacy state, then the resume point (a point never names
    missing rows). ``files``: the trajectory's and the privacy state's names."""
    trajectory_file, privacy_file = files
    recorder.write(output_dir / trajectory_file)  # atomic too
    write_json_atomically(output_dir / privacy_file, privacy)
    write_atomically(output_dir / RESUME_FILE, json.dumps(asdict(point)).encode())


def write_json_atomically(path: Path, data: dict[str, Any]) -> None:
    write_atomically(path, (json.dumps(data, indent=2) + "\n").encode())


def find_resume_point(
    output_dir: Path, config: RunConfig, config_file: str, summary_file: str
) -> ResumePoint | None:
    """The resume point of an unfinished run of exactly ``config`` in ``output_dir``, if any."""
    path = output_dir / RESUME_FILE
    if not path.is_file() or (output_dir / summary_file).exists():
        return None
    if not (output_dir / config_file).is_file():
        return None
    if dump_config(load_config(output_dir / config_file)) != dump_config(config):
        return None
    saved = json.loads(path.read_text())
    before = tuple(saved["before"]) if saved["before"] is not None else None
    return ResumePoint(saved["tracking_run_id"], before)


def clear_resume_point(output_dir: Path) -> None:
    (output_dir / RESUME_FILE).unlink(missing_ok=True)
