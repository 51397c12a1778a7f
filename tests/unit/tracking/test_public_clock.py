"""Two private runs of different lengths release the same times: the public clock's.

A private run's duration follows its sampled batches, so every time it puts into MLflow (the
run's start and end, metric stamps, ``MLmodel`` creation times, artifact files' modification
times) must come from ``privzo.tracking.clock``, never from the wall clock.
"""

from __future__ import annotations

import re
import sqlite3
import time
from datetime import datetime, timezone
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

from conftest import REPO
from privzo.config import load_config
from privzo.run import run
from privzo.tracking import read_run
from privzo.tracking.clock import PUBLIC_TIME_MS, PUBLIC_UTC_TIME_CREATED
from tiny_families import save_tiny_family

TINY_DPZERO = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
# tiny-dpzero.yaml shrunk to seconds (tiny-opt, 64 examples), with a LoRA view so that both the
# replayable model and the adapter are logged as MLflow models
SMALL = [
    "model.name_or_path=tiny-opt",
    "task.examples_per_class=32",
    "task.test_size=16",
    "optimizer.batch_size=8",
    "tracking.log_every=2",
    "model.trainable=lora",
    "model.peft.lora_rank=2",
]
MARGIN_S = 3600.0  # a value within an hour of the test is read as the wall clock


def _on_the_clock(value: float, started: float, ended: float) -> bool:
    """Whether ``value`` reads as a time of the test, in seconds or milliseconds."""
    low, high = started - MARGIN_S, ended + MARGIN_S
    return low <= value <= high or low * 1000 <= value <= high * 1000


def _clock_values_in_store(db: Path, started: float, ended: float) -> list[tuple[str, str]]:
    """(table, column) of every number in the sqlite store that reads as the wall clock, but the
    experiments' creation and update times: experiments are shared by every run and made when
    first used, not records of a run."""
    found = []
    with sqlite3.connect(db) as connection:
        tables = [
            row[0]
            for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        ]
        for table in tables:
            if table == "experiments" or table.startswith("sqlite_"):
                continue
            columns = [row[1] for row in connection.execute(f"PRAGMA table_info('{table}')")]
            for row in connection.execute(f"SELECT * FROM '{table}'"):
                for column, value in zip(columns, row, strict=True):
                    text = str(value)
                    if re.fullmatch(r"\d+(\.\d+)?", text) and _on_the_clock(
                        float(text), started, ended
                    ):
                        found.append((table, column))
    return found


def _clock_text(path: Path, started: float, ended: float) -> list[str]:
    """Dates of the test (``YYYY-MM-DD``) and 10- or 13-digit numbers reading as its clock in a
    file's bytes."""
    text = path.read_bytes().decode("latin-1")
    days = {
        datetime.fromtimestamp(moment, tz=timezone.utc).strftime("%Y-%m-%d")
        for moment in (started, ended)
    }
    found = [day for day in days if day in text]
    numbers = re.findall(r"(?<!\d)(\d{10}|\d{13})(?!\d)", text)
    return found + [n for n in numbers if _on_the_clock(float(n), started, ended)]


@pytest.mark.slow
def test_private_runs_of_different_lengths_release_the_same_times(tmp_path, cache_dir):
    """The 2-step run trains tiny-opt, the 6-step one a tiny Llama: the logged adapter, its
    tokenizer and its base's reference are the family's own."""
    started = time.time()
    llama = save_tiny_family("llama", tmp_path / "llama")
    bases = {2: "tiny-opt", 6: str(llama)}
    runs = {}
    for steps in (2, 6):
        overrides = [f"optimizer.steps={steps}", f"model.name_or_path={bases[steps]}"]
        config = load_config(TINY_DPZERO, [*SMALL, *overrides])
        output = tmp_path / "runs" / f"steps-{steps}"
        summary = run(config, output, cache_dir=cache_dir, progress=False)
        assert summary["steps"] == steps and summary["private"] is True
        runs[steps] = (output, summary)
    ended = time.time()

    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert _clock_values_in_store(tmp_path / "runs" / "mlflow.db", started, ended) == []
    released = {}
    for steps, (output, summary) in runs.items():
        record = read_run(uri, summary["tracking_run_id"])
        assert record["start_time"] == record["end_time"] == PUBLIC_TIME_MS
        assert record["history"]["epsilon_spent"][-1][0] == steps
        artifacts = Path(urlparse(record["artifact_uri"]).path)
        models = sorted(artifacts.rglob("MLmodel"))
        assert [path.parent.name for path in models] == ["adapter", "model"]
        for path in models:
            assert yaml.safe_load(path.read_text())["utc_time_created"] == PUBLIC_UTC_TIME_CREATED
        entries = [artifacts, artifacts.parent, *artifacts.rglob("*")]
        released[steps] = {
            "times": (record["start_time"], record["end_time"]),
            "created": {yaml.safe_load(path.read_text())["utc_time_created"] for path in models},
            "mtimes": {entry.stat().st_mtime for entry in entries},
        }
        for path in artifacts.rglob("*"):
            if path.is_file():
                assert _clock_text(path, started, ended) == [], path
        # the run directory's files hold no clock either, keep the file system's own times,
        # and nothing logged carries those
        local = [path for path in output.rglob("*") if path.is_file()]
        for path in local:
            assert _clock_text(path, started, ended) == [], path
        assert {"config.yaml", "trajectory.parquet"} <= {path.name for path in local}
        assert all(path.stat().st_mtime >= started - 1 for path in local)
        assert not {path.stat().st_mtime for path in local} & released[steps]["mtimes"]
    assert released[2] == released[6]
    assert released[2]["mtimes"] == {PUBLIC_TIME_MS / 1000}
