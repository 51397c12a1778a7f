"""Searches whose trials are distributed runs (Ray Train workers inside each Tune trial)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import RAY_TEST_ENV
from privzo.config import ConfigError, ParallelConfig, dump_config
from privzo.privacy import compute_epsilon
from privzo.run import CONFIG_FILE, can_resume, unfinished_steps
from privzo.rundir import RAY_STATE_DIR, ResumePoint, write_resume_point
from privzo.tracking import open_client
from privzo.tuning import load_search_config, plan_search, run_search
from privzo.tuning.resources import DRIVER_MEMORY_BYTES, check_trial_resources

REPLICA_2 = {"parallel.strategy": "replica", "parallel.workers": 2}
# Margins for a loaded machine (2 cores shared by several jobs), not timings: Ray Train's worker
# groups start slowly under load, and a hang still ends.
SEARCH_LIMIT_S = 2400


def test_a_search_whose_trials_the_cluster_cannot_hold_is_refused_before_ray_starts(
    tmp_path, make_search, cache_dir
):
    output = tmp_path / "search"
    too_many_workers = make_search(overrides={**REPLICA_2, "parallel.workers": 3})
    with pytest.raises(ConfigError, match=r"parallel.workers=3: each trial runs 3 Ray Train"):
        run_search(load_search_config(too_many_workers), output, cache_dir=cache_dir, num_cpus=2)
    two_at_once = make_search(overrides=REPLICA_2, resources={"concurrency": 2})
    with pytest.raises(ConfigError, match=r"resources.concurrency=2 trials at once.*<= 1"):
        run_search(load_search_config(two_at_once), output, cache_dir=cache_dir, num_cpus=2)
    assert not output.exists()  # nothing written: no search state, no tracking store


def test_distributed_trial_resources_are_its_workers_and_a_driver_holding_no_cpu(
    make_search, cache_dir
):
    search = load_search_config(make_search(overrides=REPLICA_2))
    plan = plan_search(search, cache_dir)
    needed = check_trial_resources(search, plan.base, {"CPU": 2.0, "memory": 4.0 * 2**30})
    assert needed.tune_spec() == {"cpu": 0.0, "gpu": 0.0, "memory": float(DRIVER_MEMORY_BYTES)}
    assert needed.total() == {"CPU": 2.0, "memory": float(DRIVER_MEMORY_BYTES)}
    with pytest.raises(ConfigError, match="reserves 1 GiB of Ray memory"):
        check_trial_resources(search, plan.base, {"CPU": 2.0, "memory": 0.5 * 2**30})
    gpus = load_search_config(make_search(overrides=REPLICA_2, resources={"gpus_per_trial": 1}))
    with pytest.raises(ConfigError, match=r"resources.gpus_per_trial=1 with parallel.strategy="):
        plan_search(gpus, cache_dir)
    small = load_search_config(make_search(overrides={**REPLICA_2, "optimizer.batch_size": 1}))
    with pytest.raises(ConfigError, match=r"smaller than parallel.workers=2"):
        plan_search(small, cache_dir)


def test_an_interrupted_distributed_trial_resumes_unless_its_checkpoints_are_unreadable(
    tmp_path, make_search, cache_dir
):
    """A distributed trial's attempt leaves its resume point (the MLflow run and the Ray Train
    run, written before any step): a new attempt goes on from the newest checkpoint that run
    committed (none here: 0 steps, nothing released yet); where Ray's record of them cannot be
    read, it is refused before anything starts instead of drawing released steps again."""
    search = load_search_config(make_search(overrides=REPLICA_2))
    config = plan_search(search, cache_dir).base
    trial_dir = tmp_path / "trials" / "t0"
    assert not can_resume(config, trial_dir) and unfinished_steps(config, trial_dir) == 0
    trial_dir.mkdir(parents=True)
    (trial_dir / CONFIG_FILE).write_text(dump_config(config))  # what an attempt writes first
    assert not can_resume(config, trial_dir)  # killed before its launch: nothing released
    write_resume_point(trial_dir, ResumePoint("run-id", None, "t0-0123abcd"))
    assert can_resume(config, trial_dir) and unfinished_steps(config, trial_dir) == 0
    ray_run = trial_dir / RAY_STATE_DIR / "t0-0123abcd"
    ray_run.mkdir(parents=True)
    (ray_run / "checkpoint_manager_snapshot.json").write_text("{not json")
    with pytest.raises(ConfigError, match=r"cannot resume the distributed run.*--overwrite"):
        unfinished_steps(config, trial_dir)
    single = config.model_copy(update={"parallel": ParallelConfig()})
    assert can_resume(single, trial_dir) is False  # another config: not this run's to resume


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replica", "zero3"])
def test_search_over_distributed_trials_of_two_workers(tmp_path, make_search, cache_dir, strategy):
    """Two private trials, each a distributed run of 2 Ray Train workers, one at a time on 2
    CPUs; ASHA scores every 5 steps, so a window's score reaches Tune from rank 0 (under zero3
    every rank scores: its forwards are collective) and the final one from the trial's driver.
    The search's ε is the one a search of single trials has."""
    scheduler = {"type": "asha", "evaluate_every": 5, "grace_period": 2}
    layout = {"parallel.strategy": strategy, "parallel.workers": 2}
    search_path = make_search(
        overrides=layout, space={"privacy.clip": [0.5, 1.0]}, scheduler=scheduler
    )
    output = tmp_path / "search"
    command = [sys.executable, "-m", "privzo.cli", "tune", str(search_path), "--quiet"]
    command += ["--output-dir", str(output), "--cache-dir", str(cache_dir)]
    # the local Ray's workers inherit this environment (conftest's Ray settings for tests)
    env = {**os.environ, "OMP_NUM_THREADS": "1", **RAY_TEST_ENV}
    log = tmp_path / "tune.log"
    with log.open("wb") as sink:
        done = subprocess.run(
            command, env=env, stdout=sink, stderr=subprocess.STDOUT, timeout=SEARCH_LIMIT_S
        )
    assert done.returncode == 0, log.read_text(errors="replace")[-4000:]

    summary = json.loads((output / "search_summary.json").read_text())
    trials = pd.read_parquet(output / "trials.parquet")
    assert len(trials) == 2 and set(trials["status"]) == {"finished"}
    assert set(trials["strategy"]) == {strategy} and set(trials["workers"]) == {2}
    for row in trials.itertuples():
        run_summary = json.loads((output / "trials" / row.trial_id / "summary.json").read_text())
        assert run_summary["strategy"] == strategy and run_summary["workers"] == 2
        assert run_summary["selection_score"] == row.selection_score
        assert row.selection_releases == 2  # steps 5 and 10, by the same scorer on rank 0
        expected = compute_epsilon(
            noise_multiplier=row.noise_multiplier,
            sample_rate=row.sample_rate,
            steps=int(row.steps),
            delta=1e-5,
            noise_parameters={"grid": 1024},  # the default discrete noise
        )
        assert row.epsilon == pytest.approx(expected, rel=1e-6)
        assert 2.0 * (1 - 5e-3) <= row.epsilon <= 2.0
        _assert_tune_saw_scores(output, row.trial_id, row.selection_score)

    # the same search over single trials plans the same privacy events and bound
    single = load_search_config(
        make_search(space={"privacy.clip": [0.5, 1.0]}, scheduler=scheduler)
    )
    bounds = plan_search(single, cache_dir).bounds(trials_run=2)
    assert summary["end_to_end_epsilon"] == pytest.approx(bounds["end_to_end_epsilon"])
    assert summary["per_trial_epsilon"] == bounds["per_trial_epsilon"] == 2.0

    best = trials.loc[trials["selection_score"].idxmax()]
    assert summary["best_trial"] == best["trial_id"]
    client = open_client(f"sqlite:///{output / 'mlflow.db'}")
    parent = client.get_run(json.loads((output / "search_state.json").read_text())["parent_run_id"])
    assert parent.data.metrics["best_selection_score"] == pytest.approx(best["selection_score"])
    assert parent.data.tags["privzo.best_trial"] == best["trial_id"]
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.mlflow.parentRunId = '{parent.info.run_id}'",
    )
    by_trial = {child.data.tags["privzo.trial"]: child for child in children}
    assert set(by_trial) == set(trials["trial_id"])
    for row in trials.itertuples():
        child = by_trial[row.trial_id]
        assert child.info.status == "FINISHED"
        assert child.data.tags["privzo.workers"] == "2"
        assert child.data.tags["privzo.strategy"] == strategy
        assert child.data.metrics["final_selection_score"] == pytest.approx(row.selection_score)


def _assert_tune_saw_scores(output: Path, trial_id: str, final_score: float) -> None:
    """Tune's result.json for the trial: the window score at step 5 (sent by rank 0 of the
    Train workers) and the final one at step 10 (sent by the trial's driver)."""
    results = [
        path for path in (output / "tune").rglob("result.json") if trial_id in path.parent.name
    ]
    assert len(results) == 1, results
    lines = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert [line["step"] for line in lines] == [5, 10]
    assert all(isinstance(line["selection_score"], float) for line in lines)
    assert lines[-1]["selection_score"] == final_score
