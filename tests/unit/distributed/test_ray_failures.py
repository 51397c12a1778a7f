"""How a distributed run that Ray ends (a worker lost beyond ``parallel.max_failures``) reaches
the user: privzo's one line naming the first failed worker and the way on, not Ray's error."""

from __future__ import annotations

from pathlib import Path

from privzo.cli.entry import refusal_line
from privzo.distributed.cluster import RayFailedError
from privzo.distributed.launch import training_failed

RAY_TRACEBACK = "Traceback (most recent call last):\n  File 'worker.py', line 1\nActorDiedError"


def test_a_lost_worker_ends_in_one_line_naming_it_and_the_way_on():
    from ray.train.v2.api.exceptions import WorkerGroupError

    lost = WorkerGroupError(
        "Training failed due to worker errors",
        {
            1: RuntimeError(f"The actor died unexpectedly.\n{RAY_TRACEBACK}"),
            0: ConnectionError(f"worker 0 exited with SIGKILL\n{RAY_TRACEBACK}"),
        },
    )
    error = training_failed(lost, 0, Path("/runs/replica"))
    assert isinstance(error, RayFailedError)
    line = refusal_line(error)
    assert line is not None and "\n" not in line
    assert line.startswith("privzo: error: the distributed run failed after 0 worker restarts")
    assert "(worker 0: ConnectionError: worker 0 exited with SIGKILL)" in line  # the first rank
    assert "/runs/replica keeps the steps of its newest checkpoint" in line
    assert "the same command resumes" in line and "parallel.max_failures" in line


def test_a_controller_failure_ends_in_one_line_naming_its_cause():
    from ray.train.v2.api.exceptions import ControllerError

    stopped = ControllerError(RuntimeError(f"the controller stopped\n{RAY_TRACEBACK}"))
    line = refusal_line(training_failed(stopped, 2, Path("/runs/replica")))
    assert line is not None and "\n" not in line
    # Ray's own first line ("Training failed due to controller error:") names no cause
    assert "after 2 worker restarts (Ray Train's controller: RuntimeError: the controller " in line
