"""A distributed run's checkpoint keeps the metrics rank 0 had not stored yet, so a kill that
drops its tracker's buffer loses none: the attempt that resumes from the checkpoint stores those
its MLflow run lacks, each step once. Real MLflow (sqlite) and real checkpoint files; the Ray
Train round trip around them is tests/integration/test_distributed.py's."""

from __future__ import annotations

import json

import pytest

from privzo.distributed.checkpoint import STATE, RunState, read_checkpoint, write_checkpoint
from privzo.distributed.worker import unsent_at
from privzo.tracking import MetricPoint, keep_blank_stores_in, make_tracker, read_run
from privzo.zo.directions import step_seed
from privzo.zo.step import StepRecord
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder


def _recorder(steps: int) -> TrajectoryRecorder:
    meta = TrajectoryMeta(1e-3, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace")
    recorder = TrajectoryRecorder(meta, release_batch_size=False)
    for step in range(steps):
        recorder.append(StepRecord(step, step_seed(0, step), 0.1, 0.01, 0, 1.0, 0, 0.0))
    return recorder


def _tracker(tmp_path):
    return make_tracker(
        "mlflow", uri=None, experiment="e", output_root=tmp_path, run_name="r", release_timing=False
    )


def test_a_checkpoint_keeps_unsent_metrics_and_a_resume_stores_each_once(tmp_path, cache_dir):
    keep_blank_stores_in(cache_dir)  # the store from a blank copy, as a run makes it
    killed = _tracker(tmp_path)
    killed.start()
    killed.log_metrics({"loss": 0.9}, step=5)
    killed.flush()  # window 1: stored
    killed.log_metrics({"loss": 0.7}, step=10)  # window 2: still in the buffer
    before = ({"accuracy": 0.5}, 1.25)  # logged with the first window its launch reports
    unsent = unsent_at(killed, {"loss": 0.6, "epsilon_spent": 1.5}, 15, before)
    assert unsent == (
        MetricPoint("loss", 0.7, 10),
        MetricPoint("loss", 0.6, 15),
        MetricPoint("epsilon_spent", 1.5, 15),
        MetricPoint("test_accuracy", 0.5, 0),
    )
    state = RunState("tiny-opt", 15, None, unsent)
    write_checkpoint(tmp_path / "checkpoint", _recorder(15), state)
    # SIGKILL: the buffer and the window's own metrics never reach the store
    run_id = killed.run_id
    assert run_id is not None

    _table, _meta, restored = read_checkpoint(tmp_path / "checkpoint")
    assert restored == state
    resumed = _tracker(tmp_path)
    resumed.attach(run_id)
    with resumed:
        assert resumed.log_missing(restored.unsent) == 4
        assert resumed.log_missing(restored.unsent) == 0  # a second restart stores nothing
    history = read_run(f"sqlite:///{tmp_path / 'mlflow.db'}", run_id)["history"]
    assert history["loss"] == [(5, 0.9), (10, 0.7), (15, 0.6)]
    assert history["epsilon_spent"] == [(15, 1.5)] and history["test_accuracy"] == [(0, 0.5)]


def test_a_checkpoint_without_unsent_metrics_reads_and_a_malformed_one_is_refused(tmp_path):
    directory = tmp_path / "checkpoint"
    write_checkpoint(directory, _recorder(2), RunState("tiny-opt", 2, None))
    saved = json.loads((directory / STATE).read_text())
    del saved["unsent"]  # a checkpoint written before unsent metrics were kept
    (directory / STATE).write_text(json.dumps(saved))
    assert read_checkpoint(directory)[2] == RunState("tiny-opt", 2, None, ())
    (directory / STATE).write_text(json.dumps({**saved, "unsent": [["loss", 1.0, 2]]}))
    with pytest.raises(ValueError, match="unsent must be a list of"):
        read_checkpoint(directory)
