"""A single-process run's progress in its directory: after every window, its steps so far.

At the end of every window (before its metrics are logged) the run writes its trajectory so far,
its privacy state (``privacy.json``: the ledger's budget, accountant settings and steps booked)
and ``resume.json`` (the MLflow run id, the test metrics before training and the metrics not yet
in the tracking store, this window's included), each atomically.
No weights and no secret generator state: replaying the trajectory on the base weights rebuilds
θ, and a resumed run draws fresh noise and batches from OS entropy for the steps it has not
taken. Every row of the trajectory file is a step that ran and was released to disk, so the
resumed run replays exactly those, books them once in the ledger (restored through the
accountant's state, which refuses other settings), and draws no step again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from privzo.algorithms.loop import TrainingLoop, WindowEnd, WindowSaver
from privzo.privacy.plan import privacy_record
from privzo.rundir.files import (
    PRIVACY_FILE,
    TRAJECTORY_FILE,
    read_record,
    write_json_atomically,
)
from privzo.rundir.resume import ResumePoint, write_resume_point
from privzo.rundir.trajectory import read_run_trajectory, write_trajectory
from privzo.section import ConfigError
from privzo.tasks.evaluation import Evaluation
from privzo.tracking import Tracker
from privzo.zo.integrity import check_fingerprint
from privzo.zo.trajectory import TrajectoryRecorder

logger = logging.getLogger(__name__)


def save_trajectory(output_dir: Path, recorder: TrajectoryRecorder) -> None:
    write_trajectory(output_dir, recorder.to_bytes())


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
        table, meta = read_run_trajectory(output_dir / TRAJECTORY_FILE)
        fingerprint = loop.context.base_fingerprint
        if meta.base_fingerprint is not None and fingerprint is not None:
            check_fingerprint(meta.base_fingerprint, fingerprint, str(output_dir))
        privacy = output_dir / PRIVACY_FILE
        saved = read_record(privacy) if privacy.is_file() else {}
        try:
            done = loop.restore(recorder, table, meta, ledger_state=saved.get("ledger"))
        except ValueError as error:
            raise ConfigError(f"cannot resume the run in {str(output_dir)!r}: {error}") from None
        logger.warning("replayed %d steps; training goes on from step %d", done, done)
        return done

    def saver(self, tracker: Tracker, before: Evaluation | None) -> WindowSaver:
        return DirectorySaver(self.output_dir, tracker, before)

    def stopped(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        if loop.records_trajectory:  # a failed run keeps the steps it made
            save_trajectory(self.output_dir, recorder)


class DirectorySaver:
    """Every window's rows, privacy state and resume point, saved before its metrics go out;
    resumable from the first step on. The point lists the metrics the tracker has not stored
    yet and the window's own, so a kill before they are stored loses none. A run without a
    trajectory (the first-order baselines) cannot resume and saves nothing."""

    def __init__(self, output_dir: Path, tracker: Tracker, before: Evaluation | None):
        self.output_dir, self.tracker, self.before = output_dir, tracker, before

    def start(self, loop: TrainingLoop, recorder: TrajectoryRecorder) -> None:
        self.save(loop, recorder, {})

    def window(self, end: WindowEnd) -> None:
        self.save(end.loop, end.recorder, end.metrics, end.steps_done)

    def save(
        self,
        loop: TrainingLoop,
        recorder: TrajectoryRecorder,
        logging: dict[str, float],
        step: int = 0,
    ) -> None:
        """``logging``: the metrics about to be logged at ``step``, not in the tracker yet."""
        if not loop.records_trajectory:
            return
        privacy = privacy_record(loop.context.plan, loop.ledger, final=False)
        point = ResumePoint(
            self.tracker.run_id, self.before, unsent=self.tracker.unsent_with(logging, step)
        )
        save_trajectory(self.output_dir, recorder)
        write_json_atomically(self.output_dir / PRIVACY_FILE, privacy)
        write_resume_point(self.output_dir, point)  # a point never names missing rows
