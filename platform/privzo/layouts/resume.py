"""Resuming a run: its resume point (``resume.json``), and a single-process zeroth-order run's
progress in its directory (``RunDirectoryProgress``). A distributed run's driver writes the
resume point too, naming the Ray Train run whose checkpoints hold its steps
(``privzo.distributed.resume``).

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
import logging
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privzo.algorithms.loop import TrainingLoop
from privzo.config import ConfigError, RunConfig, dump_config, load_config
from privzo.layouts.record import PRIVACY_FILE, TRAJECTORY_FILE
from privzo.privacy.plan import privacy_record
from privzo.tasks.evaluation import Evaluation
from privzo.tracking import Tracker
from privzo.zo.integrity import check_fingerprint
from privzo.zo.trajectory import TrajectoryRecorder, read_trajectory

logger = logging.getLogger(__name__)

RESUME_FILE = "resume.json"


@dataclass(frozen=True)
class ResumePoint:
    """What a resumed run needs besides its steps (the trajectory in the run directory, or a
    distributed run's Ray Train checkpoints)."""

    tracking_run_id: str | None
    before: tuple[dict[str, float], float] | None  # test metrics before training, their time
    # a distributed run's Ray Train run (its name in the checkpoint storage), which every
    # launch of the run continues; None for a single-process run
    ray_run: str | None = None


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
    write_resume_point(output_dir, point)


def write_resume_point(output_dir: Path, point: ResumePoint) -> None:
    """What the same command needs to go on with this run (atomically)."""
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
    return ResumePoint(saved["tracking_run_id"], before, saved.get("ray_run"))


def clear_resume_point(output_dir: Path) -> None:
    (output_dir / RESUME_FILE).unlink(missing_ok=True)


class RunDirectoryProgress:
    """A single-process run's progress store (``privzo.layouts.train.ProgressStore``): after
    every window, the rows so far, the privacy state and the resume point in the run
    directory; ``resume`` (found by the run pipeline) is an earlier attempt to go on with."""

    def __init__(self, output_dir: Path, resume: ResumePoint | None):
        self.output_dir, self.resume = output_dir, resume

    def before(self, measure: Callable[[], Evaluation | None]) -> tuple[Evaluation | None, bool]:
        if self.resume is not None:
            return self.resume.before, False  # measured and logged by the earlier attempt
        return measure(), True

    def restore(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> int:
        """Rebuild an earlier attempt's state from its trajectory (checked: rows and base)
        and its privacy state (checked: the same budget and accountant settings)."""
        if self.resume is None:
            return 0
        output_dir = self.output_dir
        table, meta = read_trajectory(output_dir / TRAJECTORY_FILE)
        fingerprint = loop.context.base_fingerprint
        if meta.base_fingerprint is not None and fingerprint is not None:
            check_fingerprint(meta.base_fingerprint, fingerprint, str(output_dir))
        privacy = output_dir / PRIVACY_FILE
        saved = json.loads(privacy.read_text()) if privacy.is_file() else {}
        try:
            done = loop.restore(recorder, table, meta, ledger_state=saved.get("ledger"))
        except ValueError as error:
            raise ConfigError(f"cannot resume the run in {str(output_dir)!r}: {error}") from None
        logger.warning("replayed %d steps; training goes on from step %d", done, done)
        return done

    def watch(
        self,
        loop: TrainingLoop,
        recorder: TrajectoryRecorder,
        tracker: Tracker,
        before: Evaluation | None,
    ) -> None:
        """Every window's rows and resume point, saved before its metrics (and the loop's own
        ``on_window``); resumable from the first step on. A run without a trajectory (the
        first-order baselines) cannot resume and saves nothing."""
        if not loop.records_trajectory:
            return
        point = ResumePoint(tracker.run_id, before)
        inner = loop.on_window

        def save() -> None:
            privacy = privacy_record(loop.context.plan, loop.ledger, final=False)
            files = (TRAJECTORY_FILE, PRIVACY_FILE)
            save_progress(self.output_dir, recorder, point, files, privacy)

        def on_window(steps_done: int, metrics: dict[str, float]) -> None:
            save()
            if inner is not None:
                inner(steps_done, metrics)

        loop.on_window = on_window
        save()

    def stopped(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        if loop.records_trajectory:  # a failed run keeps the steps it made
            recorder.write(self.output_dir / TRAJECTORY_FILE)
