"""Searches whose trials are distributed runs (Ray Train workers inside each Tune trial).

Their refusals and resume rules, which need no Ray: tests/unit/search/test_distributed_trials.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import RAY_TEST_ENV
from privzo.privacy import compute_epsilon
from privzo.search import load_search_config, plan_search
from privzo.search.tuner import tune_dir
from privzo.tracking import open_client
from tiny_families import save_tiny_family

# Margins for a loaded machine (2 cores shared by several jobs), not timings: Ray Train's worker
# groups start slowly under load, and a hang still ends.
SEARCH_LIMIT_S = 2400


pytestmark = pytest.mark.integration


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["zero3"])
def test_search_over_distributed_trials_of_two_workers(tmp_path, make_search, cache_dir, strategy):
    """Two private trials, each a distributed run of 2 Ray Train workers, one at a time on 2
    CPUs; ASHA scores every 5 steps, so a window's score reaches Tune from rank 0 (under zero3
    every rank scores: its forwards are collective) and the final one from the trial's driver.
    The search's ε is the one a search of single trials has. (A search of replica trials runs,
    is killed and resumes in tests/integration/test_faults.py.) The trials train a tiny Llama,
    so a search's distributed trials run on a family beside OPT."""
    scheduler = {"type": "asha", "evaluate_every": 5, "grace_period": 2}
    llama = save_tiny_family("llama", tmp_path / "llama")
    layout = {
        "parallel.strategy": strategy,
        "parallel.workers": 2,
        "model.name_or_path": str(llama),
    }
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
            delta=1e-5 - run_summary["truncation_delta"],  # what the accountant evaluates ε at
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
        path
        for path in tune_dir(output, private=True).rglob("result.json")
        if trial_id in path.parent.name
    ]
    assert len(results) == 1, results
    lines = [json.loads(line) for line in results[0].read_text().splitlines() if line.strip()]
    assert [line["step"] for line in lines] == [5, 10]
    assert all(isinstance(line["selection_score"], float) for line in lines)
    assert lines[-1]["selection_score"] == final_score
