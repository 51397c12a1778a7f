"""A CLI run stopped by SIGTERM or SIGKILL resumes with the same command: the steps written
before the kill kept as they were, every step once, the same MLflow run finished with ε at every
window end. The SIGTERMed
run trains a tiny Mistral (SentencePiece-style tokenizer with BOS), the SIGKILLed one tiny-opt."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from privzo.tracking import read_run
from tiny_families import save_tiny_family

pytestmark = pytest.mark.integration

STEPS = 60  # the stop lands after step 10: most of the run is left to resume


def _cli(args: list[str], **kwargs) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONUNBUFFERED": "1"}
    command = [sys.executable, "-m", "privzo.cli", *args]
    return subprocess.Popen(command, env=environment, text=True, **kwargs)


@pytest.mark.parametrize(("stop", "family"), [(signal.SIGTERM, "mistral"), (signal.SIGKILL, "opt")])
def test_a_killed_cli_run_resumes_with_the_same_command(
    tmp_path, sentiment_files, cache_dir, stop, family
):
    train, test = sentiment_files
    output = tmp_path / "runs" / "dp"
    model = "tiny-opt" if family == "opt" else save_tiny_family(family, tmp_path / family)
    command = [
        "run",
        "--quiet",
        "--cache-dir",
        str(cache_dir),
        "--output-dir",
        str(output),
        f"model.name_or_path={model}",
        f"task.train_path={train}",
        f"task.test_path={test}",
        f"optimizer.steps={STEPS}",
        "task.max_length=16",  # prompts of at most 6 tokens: batches pad to 16, not 128
        "optimizer.batch_size=8",
        "tracking.log_every=5",
    ]
    config = tmp_path / "run.yaml"
    config.write_text("seed: 0\n")
    process = _cli([command[0], str(config), *command[1:]], stderr=subprocess.PIPE)
    deadline = time.monotonic() + 900  # a margin for a loaded machine, not a timing
    while not (output / "resume.json").exists() or _rows(output) < 10:
        assert process.poll() is None, process.stderr.read()
        assert time.monotonic() < deadline, "no window written"
        time.sleep(0.2)
    process.send_signal(stop)
    _out, err = process.communicate(timeout=600)
    assert process.returncode == (143 if stop == signal.SIGTERM else -signal.SIGKILL), err
    done = _rows(output)
    first = pq.read_table(output / "trajectory.parquet").to_pylist()
    point = json.loads((output / "resume.json").read_text())

    resumed = _cli([command[0], str(config), *command[1:]], stderr=subprocess.PIPE)
    _out, err = resumed.communicate(timeout=1800)
    assert resumed.returncode == 0, err
    rows = pq.read_table(output / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert rows[:done] == first
    summary = json.loads((output / "summary.json").read_text())
    assert summary["tracking_run_id"] == point["tracking_run_id"]
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert record["status"] == "FINISHED"
    # ε at every window end of both attempts and at the step the second went on from, once
    # each, also where the killed attempt's ε thread had not handed its last windows' out
    window_ends = {step for step, _ in record["history"]["learning_rate"]}
    epsilons = [step for step, _ in record["history"]["epsilon_spent"]]
    assert epsilons == sorted(set(epsilons)), epsilons
    assert window_ends | {len(first)} <= set(epsilons), (sorted(window_ends), epsilons)


def _rows(output: Path) -> int:
    try:
        return pq.read_table(output / "trajectory.parquet").num_rows
    except (OSError, ValueError):  # not written yet
        return 0
