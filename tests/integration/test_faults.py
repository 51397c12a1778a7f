"""Fault injection: a single run SIGKILLed at random steps, again and again, then let finish
(issue 14 item 6). Every kill lands wherever the run is (inside a step, while a window's
trajectory and resume point are written, while MLflow is logging); the same command resumes.

Checked at the end: every step in the trajectory exactly once and in order, the rows each killed
attempt had written kept unchanged (nothing lost, nothing redrawn), ε the accountant's value for
T steps (each step booked once), one MLflow run in the experiment, FINISHED, whose ε windows are
each logged at most once.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from privzo.privacy import compute_epsilon
from privzo.tracking import find_runs, read_run

STEPS = 300
KILLS = 3
WAIT_S = 600  # a margin for a loaded machine, not a timing


def _rows(output: Path) -> list[dict]:
    try:
        return pq.read_table(output / "trajectory.parquet").to_pylist()
    except (OSError, ValueError):  # not written yet
        return []


def _start(config: Path, output: Path, cache_dir: Path, train: Path, test: Path):
    command = [
        *(sys.executable, "-m", "privzo.cli", "run", str(config), "--quiet"),
        *("--cache-dir", str(cache_dir), "--output-dir", str(output)),
        "model.name_or_path=tiny-opt",
        f"task.train_path={train}",
        f"task.test_path={test}",
        f"optimizer.steps={STEPS}",
        "optimizer.batch_size=8",
        "tracking.log_every=5",
        "tracking.experiment=faults",
        "privacy.epsilon=3",
    ]
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(command, env=environment, text=True, stderr=subprocess.PIPE)


@pytest.mark.integration
def test_a_run_killed_at_random_steps_loses_nothing_and_books_each_step_once(
    tmp_path, sentiment_files, cache_dir
):
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)  # the kill points; the seed is in every failure message
    config = tmp_path / "run.yaml"
    config.write_text("seed: 0\n")
    output = tmp_path / "runs" / "dp"
    kept: list[list[dict]] = []  # what each killed attempt had written
    low = 1
    for kill in range(KILLS):
        # a step in the kill's quarter of the run, past what the last attempt wrote
        span = STEPS // (KILLS + 1)
        target = max(low, rng.randrange(kill * span + 1, (kill + 1) * span))
        process = _start(config, output, cache_dir, *sentiment_files)
        deadline = time.monotonic() + WAIT_S
        while len(_rows(output)) < target:
            assert process.poll() is None, f"seed {seed}: ended early\n{process.stderr.read()}"
            assert time.monotonic() < deadline, f"seed {seed}: step {target} not reached"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))  # land anywhere: in a step, a write, a log
        process.send_signal(signal.SIGKILL)
        _out, err = process.communicate(timeout=60)
        assert process.returncode == -signal.SIGKILL, f"seed {seed}, kill {kill}: {err}"
        kept.append(_rows(output))
        assert len(kept[-1]) >= target and not (output / "summary.json").exists()
        low = len(kept[-1]) + 1

    process = _start(config, output, cache_dir, *sentiment_files)
    _out, err = process.communicate(timeout=WAIT_S)
    assert process.returncode == 0, f"seed {seed}: {err}"

    rows = _rows(output)
    assert [row["step"] for row in rows] == list(range(STEPS)), f"seed {seed}"
    for kill, before in enumerate(kept):
        assert rows[: len(before)] == before, f"seed {seed}: attempt {kill}'s rows changed"
    summary = json.loads((output / "summary.json").read_text())
    expected = compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=summary["sample_rate"],
        steps=STEPS,
        delta=summary["delta"],
        noise_parameters=summary["mechanism_parameters"],  # the discrete noise's grid
    )
    assert summary["steps"] == STEPS
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9), f"seed {seed}"
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    runs = find_runs(uri, "faults")
    assert [(run.run_id, run.status) for run in runs] == [
        (summary["tracking_run_id"], "FINISHED")
    ], f"seed {seed}"
    history = [
        step for step, _ in read_run(uri, summary["tracking_run_id"])["history"]["epsilon_spent"]
    ]
    assert history == sorted(set(history)) and history[-1] == STEPS, f"seed {seed}: {history}"
    assert not (output / "resume.json").exists()
