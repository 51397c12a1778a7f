"""A real search: local Ray, MLflow on sqlite in a temp dir, interrupted and resumed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pytest
import yaml

from conftest import ctrl_c_reaches_it
from privzo.cli import main
from privzo.config import ConfigError
from privzo.privacy import compute_epsilon
from privzo.search.export import export_best
from privzo.tracking import open_client
from privzo.tracking.clock import PUBLIC_TIME_MS

pytestmark = [pytest.mark.ray, pytest.mark.slow, pytest.mark.integration]


class TuneProcess:
    """``privzo tune`` in a subprocess whose output goes to a file: a pipe nobody reads while
    the search runs would fill and block it. Killed (with its Ray) if the test fails early."""

    def __init__(self, search: Path, output: Path, cache_dir: Path, log: Path) -> None:
        command = [sys.executable, "-m", "privzo.cli", "tune", str(search)]
        command += ["--output-dir", str(output), "--cache-dir", str(cache_dir), "--quiet"]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "RAY_DEDUP_LOGS": "0"}
        self.log = log
        with log.open("wb") as sink:
            self.process = subprocess.Popen(
                command,
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                preexec_fn=ctrl_c_reaches_it,  # the test's Ctrl+C must reach it
            )

    def output(self) -> str:
        return self.log.read_text(errors="replace")

    def wait(self, timeout: float) -> tuple[int, str]:
        return self.process.wait(timeout=timeout), self.output()

    def running(self) -> bool:
        return self.process.poll() is None

    def interrupt(self) -> None:
        self.process.send_signal(signal.SIGINT)

    def kill(self) -> None:
        if self.running():
            self.process.kill()
            self.process.wait(timeout=60)


@pytest.fixture
def tune_processes():
    """Start ``privzo tune`` processes; any still running when the test ends is killed."""
    started: list[TuneProcess] = []

    def start(*args: Path) -> TuneProcess:
        started.append(TuneProcess(*args))
        return started[-1]

    yield start
    for process in started:
        process.kill()


def _finished_trials(output: Path) -> list[Path]:
    return sorted((output / "trials").glob("*/summary.json"))


def test_resources_the_cluster_lacks_fail_before_any_trial(
    tmp_path, make_search, cache_dir, tune_processes
):
    search = make_search(resources={"cpus_per_trial": 64})
    output = tmp_path / "search"
    process = tune_processes(search, output, cache_dir, tmp_path / "tune.log")
    returncode, log = process.wait(timeout=900)
    assert returncode == 2, log[-3000:]
    assert "resources.cpus_per_trial=64: the Ray cluster has" in log
    assert not (output / "trials").exists() and not (output / "search_state.json").exists()


@dataclass(frozen=True)
class QuickDemo:
    """The quick demo's output directory and what its second, completing command printed; and
    of its first command, Ctrl+C'd once the search's first trial had finished: the finished
    trials' summary times and the search summary it wrote."""

    output: Path
    printed: str
    log: str
    done_before: dict[str, int]
    early_summary: dict


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory, cache_dir) -> QuickDemo:
    """The README's first command shortened with --quick (arms, the search, the study): Ctrl+C
    once the search's first trial has finished, then the same command again, which reuses the
    arms, resumes the search and runs the study. Run once for the tests that read what it wrote
    and printed; the session's model cache."""
    root = tmp_path_factory.mktemp("quick-demo")
    output = root / "demo"
    command = [sys.executable, "-m", "privzo.cli", "demo", "--quick"]
    command += ["--output-dir", str(output), "--cache-dir", str(cache_dir)]
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    with (root / "first.log").open("wb") as sink:
        first = subprocess.Popen(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, preexec_fn=ctrl_c_reaches_it
        )
        try:
            _interrupt_after_first_trial(first, output / "search", root / "first.log")
        finally:
            if first.poll() is None:
                first.kill()
    first_log = (root / "first.log").read_text(errors="replace")
    assert first.returncode == 130, first_log[-3000:]
    search = output / "search"
    done_before = {path.parent.name: path.stat().st_mtime_ns for path in _finished_trials(search)}
    early_summary = json.loads((search / "search_summary.json").read_text())
    with pytest.raises(ConfigError, match="was interrupted"):  # its best is not the best of all
        export_best(search, root / "early-export")
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, (result.stdout + result.stderr)[-4000:]
    return QuickDemo(
        output, result.stdout, result.stdout + result.stderr, done_before, early_summary
    )


def _interrupt_after_first_trial(process: subprocess.Popen, search: Path, log: Path) -> None:
    deadline = time.monotonic() + 1800  # a margin for a loaded 2-core machine, not a timing
    while not _finished_trials(search) and time.monotonic() < deadline:
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        time.sleep(1)
    assert _finished_trials(search), "no trial finished within 30 minutes"
    process.send_signal(signal.SIGINT)
    process.wait(timeout=900)


def test_demo_quick_runs_all_arms(quick_demo):
    """Builds demo-opt-s and runs both shipped configs, pointing at the MLflow records."""
    output, printed = quick_demo.output, quick_demo.printed
    for label in ("zero-shot", "DPZero (private)", "MeZO (non-private)", "mlflow ui"):
        assert label in printed
    summary = json.loads((output / "dpzero" / "summary.json").read_text())
    assert summary["steps"] == 20 and summary["epsilon"] <= 2.0 * (1 + 1e-6)


def test_main_job_quick_prints_arms_search_and_scaling_report(quick_demo):
    """The search and the scaling study after the arms."""
    output, printed = quick_demo.output, quick_demo.printed
    for text in ("DPZero (private)", "MeZO (non-private)", "privacy: composition of 3 trials"):
        assert text in printed
    header = "| task | model | parameters | zero-shot | dpzero ε=2 | mezo (non-private) |"
    assert header in re.sub(r"\| +", "| ", re.sub(r" +\|", " |", printed))  # padding aside
    scaling = pd.read_parquet(output / "scaling" / "report" / "scaling.parquet")
    assert set(scaling["model"]) == {"demo-opt-s", "demo-opt-m"}  # --quick's two sizes
    assert scaling["model_parameters"].nunique() == 2
    trials = pd.read_parquet(output / "search" / "trials.parquet")
    assert len(trials) == 3 and set(trials["status"]) == {"finished"}


def test_the_demos_private_trials_leave_no_timing_fields_in_tunes_records(quick_demo):
    """The quick demo's private search directory holds no name or content that reads as the
    wall clock: Tune's experiment, whose state files are named after each session's start, is
    kept beside it. There, Tune's result.json, progress.csv and experiment states (one per Tune
    session: the interrupted one and its resume; three trials) hold no time_this_iter_s,
    time_total_s, time_since_restore, timestamp or date, its trials' starts and last reports
    are at the public time and their folders' names carry no date."""
    from privzo.search.tuner import tune_dir as tune_dir_of
    from privzo.search.withhold import TIMING_FIELDS

    output = quick_demo.output
    search = output / "search"
    released = list(search.rglob("*"))
    assert {"trials", "trials.parquet", "search_summary.json"} <= {p.name for p in released}
    assert not (search / "tune").exists()
    assert not [path for path in released if re.search(r"\d{4}-\d\d-\d\d", path.name)]
    for path in released:
        if path.is_file():
            assert _clock_text(path) == [], path
    tune_dir = tune_dir_of(search, private=True)
    assert tune_dir.parent == search.parent
    results = [*tune_dir.rglob("result.json"), *tune_dir.rglob("progress.csv")]
    states = list(tune_dir.rglob("experiment_state-*.json"))  # trials' last results, metrics
    assert len(results) == 2 * 3 and len(states) == 2, list(tune_dir.rglob("*"))
    reported = "\n".join(path.read_text() for path in results)
    assert "selection_score" in reported and "training_iteration" in reported
    for path in [*results, *states]:
        text = path.read_text(errors="replace")
        for field in TIMING_FIELDS:
            assert not re.search(rf"(?<!\w){field}(?!\w)", text), (path, field)
    # nor when each trial started and last reported, nor its folder's creation date
    for state in states:
        for _, metadata in json.loads(state.read_text())["trial_data"]:
            times = json.loads(metadata)
            # None: a trial the interrupted session had not started yet
            assert times["start_time"] in (PUBLIC_TIME_MS / 1000, None)
            # Tune's -inf: a trial the interrupted session had not heard from yet
            assert times["last_result_time"] in (PUBLIC_TIME_MS / 1000, float("-inf"))
    folders = [path.name for path in states[0].parent.iterdir() if path.is_dir()]
    assert folders and not any(re.search(r"\d{4}-\d\d-\d\d", name) for name in folders)
    # each released score is an exact discrete Gaussian on the grid: score × m × size is an
    # integer (m = selection.score_grid = 1024, the validation examples of the trial's config)
    summaries = list((output / "search" / "trials").glob("*/summary.json"))
    assert len(summaries) == 3
    for summary in summaries:
        config = yaml.safe_load((summary.parent / "config.yaml").read_text())
        size = config["task"]["validation_size"]
        units = json.loads(summary.read_text())["selection_score"] * 1024 * size
        assert units == pytest.approx(round(units), abs=1e-6)


def _clock_text(path: Path) -> list[str]:
    """Today's and yesterday's dates (``YYYY-MM-DD``, the test's clock's) and 10- or 13-digit
    numbers within a day of now (seconds or milliseconds) in a file's bytes."""
    now = time.time()
    text = path.read_bytes().decode("latin-1")
    days = {
        time.strftime("%Y-%m-%d", clock(moment))
        for moment in (now - 86400, now)
        for clock in (time.gmtime, time.localtime)
    }
    numbers = re.findall(r"(?<!\d)(\d{10}|\d{13})(?!\d)", text)
    near = [n for n in numbers if now - 86400 <= float(n) / (1000 if len(n) == 13 else 1) <= now]
    return [day for day in days if day in text] + near


def test_the_demos_interrupted_search_resumes_and_records_every_trial_once(quick_demo, capsys):
    """Ctrl+C in the demo's search, then the same command: the finished trials are not run
    again, the interrupted one is, and the records (trials table, summary, MLflow, the exported
    best trial) count every trial once, each at the same (ε, δ)."""
    output = quick_demo.output / "search"
    done_before, early = quick_demo.done_before, quick_demo.early_summary
    assert 1 <= len(done_before) < 3
    # what the interrupted search stated covers every trial that had started (released anything)
    assert early["interrupted"] is True and early["trials_run"] >= len(done_before)
    assert early["end_to_end_epsilon"] >= early["per_trial_epsilon"] == 2.0
    assert "resuming the search" in quick_demo.printed
    # the libraries' known noise stays off the console
    for noise in ("TensorboardX", "Token authentication is enabled", "Loading weights"):
        assert noise not in quick_demo.log, noise
    for trial_id, mtime in done_before.items():
        assert (output / "trials" / trial_id / "summary.json").stat().st_mtime_ns == mtime

    summary = json.loads((output / "search_summary.json").read_text())
    trials = pd.read_parquet(output / "trials.parquet")
    assert len(trials) == 3 and set(trials["status"]) == {"finished"}
    assert set(trials["strategy"]) == {"single"} and set(trials["workers"]) == {1}
    assert summary["interrupted"] is False and summary["trials_finished"] == 3
    # the interrupted DPZero trial went on from its trajectory: no attempt started over
    assert summary["restarts"] == 0 and set(trials["restarts"]) == {0}

    # every trial spends the same ε although steps differ; σ differs where steps differ
    for row in trials.itertuples():
        # on the grid Δ = ⌈K/σ⌉ moves in steps of ~σ/K, so ε lands up to ~1.5σ/K below target
        assert 2.0 * (1 - 5e-3) <= row.epsilon <= 2.0
        trial = json.loads((output / "trials" / row.trial_id / "summary.json").read_text())
        expected = compute_epsilon(
            noise_multiplier=row.noise_multiplier,
            sample_rate=row.sample_rate,
            steps=int(row.steps),
            delta=1e-5 - trial["truncation_delta"],  # what the accountant evaluates ε at
            noise_parameters={"grid": 1024},  # the default discrete noise
        )
        assert row.epsilon == pytest.approx(expected, rel=1e-6)
    sigma_by_steps = trials.groupby("steps")["noise_multiplier"].agg(["min", "max"])
    assert list(sigma_by_steps.index) == [20, 40], "the demo's seeded search draws both"
    assert (sigma_by_steps["max"] - sigma_by_steps["min"] < 1e-9).all()
    assert sigma_by_steps.loc[40, "min"] > sigma_by_steps.loc[20, "max"]
    assert summary["end_to_end_epsilon"] >= summary["per_trial_epsilon"] == 2.0

    # the best trial is chosen on the selection score, never the test metric
    best = trials.loc[trials["selection_score"].idxmax()]
    assert summary["best_trial"] == best["trial_id"]
    _check_search_in_mlflow(quick_demo.output / "mlflow.db", output, summary, trials, done_before)
    _check_export_best(output, quick_demo.output.parent / "export", summary, capsys)


def _check_search_in_mlflow(store: Path, output: Path, summary, trials, done_before) -> None:
    """One parent, one finished child per trial (plus the interrupted attempt, KILLED)."""
    client = open_client(f"sqlite:///{store}")
    state = json.loads((output / "search_state.json").read_text())
    parent = client.get_run(state["parent_run_id"])
    assert parent.info.status == "FINISHED"
    assert parent.data.metrics["end_to_end_epsilon"] == pytest.approx(summary["end_to_end_epsilon"])
    assert parent.data.tags["privzo.best_trial"] == summary["best_trial"]
    experiment = parent.info.experiment_id
    children = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'"
    )
    finished = {c.data.tags["privzo.trial"]: c for c in children if c.info.status == "FINISHED"}
    assert set(finished) == set(trials["trial_id"])
    best_run = finished[summary["best_trial"]]  # its model: the trajectory, replayed on load
    best_model = f"runs:/{best_run.info.run_id}/model"
    assert parent.data.tags["privzo.best_model_uri"] == best_model
    assert best_run.data.tags["privzo.model_uri"] == best_model
    assert all(c.info.status in ("FINISHED", "KILLED") for c in children)
    for trial_id in done_before:  # a trial finished before the interruption ran once
        assert sum(c.data.tags["privzo.trial"] == trial_id for c in children) == 1
    for row in trials.itertuples():  # trials.parquet matches MLflow
        child = finished[row.trial_id]
        assert child.info.run_id == row.tracking_run_id
        assert child.data.metrics["final_epsilon"] == pytest.approx(row.epsilon)
        assert child.data.metrics["final_selection_score"] == pytest.approx(row.selection_score)
        assert child.data.metrics["final_accuracy_after"] == pytest.approx(row.metric_after)
        assert child.data.tags["privzo.epsilon"] == "2"
        assert int(child.data.tags["privzo.model_parameters"]) > 0
        assert child.data.params["optimizer.steps"] == str(int(row.steps))


def _check_export_best(output: Path, export: Path, summary, capsys) -> None:
    """The best trial alone, without what points back into the search: ``privzo export-best``
    called in this process (the command tour runs it in a process of its own)."""
    command = ["export-best", str(output), "--output-dir", str(export)]
    capsys.readouterr()
    assert main(command) == 0, capsys.readouterr().err[-3000:]
    assert {path.name for path in export.iterdir()} == {
        "config.yaml",
        "summary.json",
        "trajectory.parquet",
    }
    best_dir = output / "trials" / summary["best_trial"]
    assert (export / "trajectory.parquet").read_bytes() == (
        best_dir / "trajectory.parquet"
    ).read_bytes()
    exported_summary = json.loads((export / "summary.json").read_text())
    assert "tracking_run_id" not in exported_summary
    assert summary["best_trial"] not in (export / "summary.json").read_text()
    # a fixed trial count: the export is covered by the search's composition bound
    assert exported_summary["epsilon"] == summary["end_to_end_epsilon"]
    assert exported_summary["epsilon_per_trial"] == pytest.approx(2.0, rel=5e-3)
    assert main(command) == 2 and "is not empty" in capsys.readouterr().err
