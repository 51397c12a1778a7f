"""Ctrl+C in ``privzo run``: a real process gets SIGINT mid-training; it prints one line,
exits 130, its MLflow run (real sqlite) ends KILLED and its directory lock is released."""

from __future__ import annotations

import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

from conftest import REPO, ctrl_c_reaches_it
from privzo.dirlock import LOCK_FILE
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


def test_ctrl_c_prints_one_line_exits_130_and_marks_the_run_killed(
    tmp_path, sentiment_files, cache_dir
):
    output = tmp_path / "runs" / "interrupted"
    command = [sys.executable, "-m", "privzo.cli", "run", str(REPO / "configs/runs/tiny-mezo.yaml")]
    command += ["--output-dir", str(output), "--cache-dir", str(cache_dir), "--quiet"]
    command += [f"task.train_path={sentiment_files[0]}", f"task.test_path={sentiment_files[1]}"]
    command += ["optimizer.steps=1000000", "optimizer.batch_size=8", "model.name_or_path=tiny-opt"]
    process = subprocess.Popen(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=ctrl_c_reaches_it,
    )
    try:
        run_id = _running_run_id(tmp_path / "runs" / "mlflow.db", process)
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=120)
    finally:
        process.kill()
        process.wait(timeout=60)
    assert process.returncode == 130, stderr
    assert "Traceback" not in stderr
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("privzo: interrupted; its MLflow run (if started) is marked KILLED")
    assert str(output) in last
    uri = f"sqlite:///{tmp_path / 'runs' / 'mlflow.db'}"
    assert read_run(uri, run_id)["status"] == "KILLED"
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
