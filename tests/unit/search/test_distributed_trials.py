"""Distributed search trials before Ray starts: resources a cluster cannot hold are refused, a
trial's driver holds no CPU, and an interrupted trial resumes only from readable checkpoints."""

from __future__ import annotations

import pytest

from privzo.config import ConfigError, ParallelConfig, dump_config
from privzo.run import CONFIG_FILE, can_resume, unfinished_steps
from privzo.rundir import RAY_STATE_DIR, ResumePoint, write_resume_point
from privzo.search import load_search_config, plan_search, run_search
from privzo.search.resources import DRIVER_MEMORY_BYTES, check_trial_resources

REPLICA_2 = {"parallel.strategy": "replica", "parallel.workers": 2}


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
