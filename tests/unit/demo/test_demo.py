"""The demo's arms, on tiny-opt and the tiny sentiment files instead of the built-in demo model
(``run_demo``'s ``config_dir``): an arm stopped by Ctrl+C goes on with the same command."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from privzo.config import ConfigError
from privzo.demo import ARMS, run_demo
from privzo.run import TrainingLoop
from privzo.tracking import open_client, read_run, ui_address

STEPS = 6


def _arm_configs(directory, sentiment_files):
    train, test = sentiment_files
    for arm, name in ARMS.items():
        config = {
            "model": {"name_or_path": "tiny-opt"},
            "task": {"train_path": str(train), "test_path": str(test)},
            "optimizer": {"algorithm": arm, "steps": STEPS, "batch_size": 8},
            "tracking": {"experiment": "privzo-tiny", "log_every": 3},
        }
        if arm == "dpzero":
            config["privacy"] = {"epsilon": 2.0}
        (directory / name).write_text(yaml.safe_dump(config))
    return directory


def test_an_interrupted_arm_resumes_into_its_mlflow_run(
    tmp_path, sentiment_files, cache_dir, monkeypatch, capsys
):
    config_dir = _arm_configs(tmp_path, sentiment_files)
    output = tmp_path / "demo"
    options = {"cache_dir": cache_dir, "arms_only": True, "config_dir": config_dir}
    options["cores"] = torch.get_num_threads()  # this process's pools as they are
    real_step = TrainingLoop.step

    def stop_at_step_4(self, step):
        if step == 4:
            raise KeyboardInterrupt  # what Ctrl+C raises
        return real_step(self, step)

    monkeypatch.setattr(TrainingLoop, "step", stop_at_step_4)
    with pytest.raises(KeyboardInterrupt):
        run_demo(output, **options)  # the first arm, DPZero, stops
    monkeypatch.undo()
    arm = output / "dpzero"
    kept = pq.read_table(arm / "trajectory.parquet").to_pylist()
    killed_run = json.loads((arm / "resume.json").read_text())["tracking_run_id"]
    uri = f"sqlite:///{output / 'mlflow.db'}"
    assert [row["step"] for row in kept] == [0, 1, 2, 3]
    assert read_run(uri, killed_run)["status"] == "KILLED"

    rows = run_demo(output, **options)  # the same command
    trajectory = pq.read_table(arm / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in trajectory] == list(range(STEPS)) and trajectory[:4] == kept
    summary = json.loads((arm / "summary.json").read_text())
    assert summary["tracking_run_id"] == killed_run and summary["steps"] == STEPS
    assert read_run(uri, killed_run)["status"] == "FINISHED"
    client = open_client(uri)
    experiment = client.get_experiment_by_name("privzo-tiny").experiment_id
    runs = client.search_runs([experiment])
    assert sorted(run.info.status for run in runs) == ["FINISHED", "FINISHED"]  # one per arm
    printed = capsys.readouterr().out  # the experiment's runs, in the UI's classic view
    assert f"mlflow ui --backend-store-uri {uri}" in printed
    assert f"  privzo-tiny: {ui_address(experiment_id=experiment)}" in printed
    private = next(row for row in rows if row.method == "DPZero (private)")
    assert private.steps == STEPS and private.epsilon == summary["epsilon"]

    with pytest.raises(ConfigError, match=r"demo arm dpzero: .* holds a run of another config"):
        run_demo(output, **options, quick=True)  # 20 steps: not this arm's config
    assert pq.read_table(arm / "trajectory.parquet").num_rows == STEPS  # kept
