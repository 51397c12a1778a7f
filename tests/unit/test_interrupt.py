"""Ctrl+C in ``privzo run``: a real process gets SIGINT mid-training; it prints one line,
exits 130, its MLflow run (real sqlite) ends KILLED and its directory lock is released. While
it trains, its lock refuses a second run into its directory."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO, ctrl_c_reaches_it, write_sentiment_jsonl
from privzo.dirlock import LOCK_FILE, DirectoryLockedError
from privzo.run import run
from privzo.tracking import read_run


def _running_run_id(database: Path, process: subprocess.Popen, timeout: float = 180.0) -> str:
    """The id of the run's MLflow record once it is RUNNING (training has started)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.poll() is None:
        try:
            with sqlite3.connect(f"file:{database}?mode=ro", uri=True, timeout=1) as connection:
                rows = connection.execute("select run_uuid, status from runs").fetchall()
        except sqlite3.Error:  # not created (or being migrated) yet
            rows = []
        if rows and rows[0][1] == "RUNNING":
            return rows[0][0]
        time.sleep(0.1)
    raise AssertionError(f"no RUNNING MLflow run in {database} (exit {process.poll()})")


@dataclass(frozen=True)
class Training:
    """A ``privzo run`` process that trains until it is stopped, and where it records."""

    process: subprocess.Popen
    output: Path
    tracking_uri: str
    run_id: str


@pytest.fixture(scope="module")
def training(tmp_path_factory, cache_dir) -> Iterator[Training]:
    """One real command (a million MeZO steps of tiny-opt), RUNNING in MLflow: the refusal test
    reads it as it trains, the Ctrl+C test stops it (one process start and import, not two)."""
    root = tmp_path_factory.mktemp("interrupt")
    train = write_sentiment_jsonl(root / "train.jsonl", 64, seed=1)
    test = write_sentiment_jsonl(root / "test.jsonl", 20, seed=2)
    output = root / "runs" / "interrupted"
    command = [sys.executable, "-m", "privzo.cli", "run", str(REPO / "configs/runs/tiny-mezo.yaml")]
    command += ["--output-dir", str(output), "--cache-dir", str(cache_dir), "--quiet"]
    command += [f"task.train_path={train}", f"task.test_path={test}"]
    command += ["optimizer.steps=1000000", "optimizer.batch_size=8", "model.name_or_path=tiny-opt"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    try:
        run_id = _running_run_id(root / "runs" / "mlflow.db", process)
        yield Training(process, output, f"sqlite:///{root / 'runs' / 'mlflow.db'}", run_id)
    finally:
        process.kill()
        process.wait(timeout=60)


# a short non-private run: refused at its directory's lock, before anything loads
SECOND_RUN = ("optimizer.steps=6", "optimizer.algorithm=mezo", "privacy.sampler=shuffle")


def test_a_second_run_is_refused_while_the_first_runs(training, tiny_run_config, cache_dir):
    """A second run into the directory of a training command is refused, naming its PID."""
    assert json.loads((training.output / LOCK_FILE).read_text())["pid"] == training.process.pid
    pid = training.process.pid
    with pytest.raises(DirectoryLockedError, match=rf"in use by another run \(PID {pid}"):
        run(tiny_run_config(*SECOND_RUN), training.output, cache_dir=cache_dir, progress=False)
    assert training.process.poll() is None  # the first one trains on


def test_ctrl_c_prints_one_line_exits_130_and_marks_the_run_killed(training):
    process, output = training.process, training.output
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("privzo: interrupted; its MLflow run (if started) is marked KILLED")
    assert str(output) in last
    assert read_run(training.tracking_uri, training.run_id)["status"] == "KILLED"
    assert not (output / LOCK_FILE).exists()


LOST_IN_A_FINALIZER = """
import gc, signal, sys, time
from privzo.cli.process import redeliver_lost_interrupts

redeliver_lost_interrupts()


class Collected:
    def __del__(self):  # Ctrl+C arriving while a finalizer runs: Python ignores what it raises
        signal.raise_signal(signal.SIGINT)


try:
    Collected()
    gc.collect()
    deadline = time.monotonic() + 30  # the command's own work, where the interrupt must land
    while time.monotonic() < deadline:
        time.sleep(0.01)
except KeyboardInterrupt:
    print("interrupted in the command's code")
    sys.exit(130)
print("the interrupt was lost")
"""


def test_a_ctrl_c_that_lands_in_a_finalizer_still_stops_the_command():
    """A Ctrl+C raised inside a garbage-collector callback or ``__del__`` (SQLAlchemy's, in a
    study) is only printed by Python; privzo's commands deliver it again to their own code."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", LOST_IN_A_FINALIZER],
        capture_output=True,
        text=True,
        timeout=120,
        preexec_fn=ctrl_c_reaches_it,  # pytest-xdist's workers ignore SIGINT, and children inherit
    )
    assert done.returncode == 130, done.stdout + done.stderr
    assert done.stdout.strip() == "interrupted in the command's code"
    assert "Exception ignored" not in done.stderr
