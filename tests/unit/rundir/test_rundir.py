"""The run directory's records: written whole, and read as finished only when whole."""

from __future__ import annotations

import json
import resource
import signal
import stat

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from privzo.rundir import (
    CONFIG_FILE,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    TRAJECTORY_KEY_FILE,
    RunSummary,
    finished,
    finished_record,
    prepare_output_dir,
    read_run_trajectory,
    write_atomically,
    write_config,
    write_summary,
    write_text_atomically,
    write_trajectory,
)
from privzo.zo.directions import step_seed
from privzo.zo.step import StepRecord
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder, read_trajectory

SUMMARY = {
    "model": "tiny-opt",
    "task": "sentiment",
    "algorithm": "dpzero",
    "metric": "accuracy",
    "metric_before": 0.5,
    "metric_after": 0.75,
    "accuracy_before": 0.5,
    "accuracy_after": 0.75,
    "private": True,
    "epsilon": 1.9,
    "epsilon_target": 2.0,
    "delta": 1e-5,
    "noise_multiplier": 3.2,
    "mechanism": "gaussian",
    "mechanism_parameters": None,
    "accountant": "pld",
    "adjacency": "add-remove",
    "replace_one_epsilon": 3.8,
    "replace_one_delta": 7.7e-5,
    "sample_rate": 0.1,
    "expected_batch_size": 4.0,
    "pad_to": "batch",
    "max_batch_size": None,
    "truncation_delta": None,
    "clip": 1.0,
    "steps": 2,
    "resumed_steps": 0,
    "train_examples": 40,
    "test_examples": 20,
    "skipped_rows": None,
    "trainable_parameters": 100,
    "model_parameters": 200,
    "eval_time_s": None,
    "peak_memory_mb": None,
    "step_peak_memory_mb": None,
    "mean_step_time_s": None,
    "wall_time_s": None,
    "nonfinite_differences": None,
    "empty_batches": None,
    "device": "cpu",
    "dtype": "float32",
    "tracking_run_id": None,
    "validation_accuracy": 0.7,
    "selection_score": 0.6,
}


@pytest.fixture
def run_dir(tmp_path, tiny_run_config):
    config = tiny_run_config()
    write_config(tmp_path, config)
    return tmp_path, config


def test_a_summary_reads_back_as_it_was_written(run_dir):
    directory, config = run_dir
    write_summary(directory / SUMMARY_FILE, RunSummary.from_dict(SUMMARY))
    done = finished(directory, config)
    assert done is not None and done.to_dict() == SUMMARY
    assert done.scores == {"accuracy_before": 0.5, "accuracy_after": 0.75}
    assert done.extra == {"validation_accuracy": 0.7, "selection_score": 0.6}


@pytest.mark.parametrize("text", ["", "{", "{}", "[1]", json.dumps({"model": "tiny-opt"})])
def test_a_summary_not_written_whole_is_no_finished_run(run_dir, text):
    directory, config = run_dir
    (directory / SUMMARY_FILE).write_text(text)
    assert finished(directory, config) is None


def test_a_summary_of_another_config_is_no_finished_run(run_dir, tiny_run_config):
    directory, _config = run_dir
    write_summary(directory / SUMMARY_FILE, RunSummary.from_dict(SUMMARY))
    assert finished(directory, tiny_run_config("seed=7")) is None
    (directory / CONFIG_FILE).unlink()
    assert finished(directory, tiny_run_config()) is None


def test_a_record_is_finished_only_with_every_config_text(tmp_path):
    write_text_atomically(tmp_path / "a.yaml", "a: 1\n")
    write_text_atomically(tmp_path / "result.json", '{"done": true}')
    assert finished_record(tmp_path, "result.json", {"a.yaml": "a: 1\n"}) == {"done": True}
    assert finished_record(tmp_path, "result.json", {"a.yaml": "a: 2\n"}) is None
    assert finished_record(tmp_path, "result.json", {"a.yaml": "a: 1\n", "b.yaml": ""}) is None
    write_text_atomically(tmp_path / "result.json", "")
    assert finished_record(tmp_path, "result.json", {"a.yaml": "a: 1\n"}) is None


def test_an_atomic_write_leaves_no_temporary_file(tmp_path):
    write_text_atomically(tmp_path / "x.json", "first")
    write_text_atomically(tmp_path / "x.json", "second")
    assert [path.name for path in tmp_path.iterdir()] == ["x.json"]
    assert (tmp_path / "x.json").read_text() == "second"


def test_a_write_the_file_system_refuses_names_the_file_and_keeps_the_old_one(tmp_path):
    """A file size limit fails the write as a full disk does (an OSError from write); the
    error names the record, the previous version stays whole and no temporary is left."""
    path = tmp_path / "trajectory.parquet"
    write_atomically(path, b"kept")
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limits[1]))
        with pytest.raises(OSError, match=r"cannot write '.*trajectory\.parquet' \(File too"):
            write_atomically(path, b"x" * 1_000_000)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    assert path.read_bytes() == b"kept"
    assert [entry.name for entry in tmp_path.iterdir()] == ["trajectory.parquet"]


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ('{"tracking_run_id": 5, "before": null}', "tracking_run_id must be text or null"),
        ('{"tracking_run_id": null, "before": [1, 2, 3]}', "before must be"),
        ('{"tracking_run_id": null, "before": [{"accuracy": "high"}, 1.0]}', "before must be"),
        ('{"tracking_run_id": null, "unsent": [{"key": "loss", "value": 1}]}', "unsent must be"),
        ('{"tracking_run_id": null, "unsent": [["loss", 1.0, 5]]}', "unsent must be"),
        ("[1, 2]", "a JSON list, not an object"),
        ('{"tracking_run_id": ', "not readable JSON"),
    ],
)
def test_a_malformed_resume_record_is_refused_naming_the_file(run_dir, text, problem):
    from privzo.config import ConfigError
    from privzo.rundir.resume import RESUME_FILE, find_resume_point

    directory, config = run_dir
    (directory / RESUME_FILE).write_text(text)
    with pytest.raises(ConfigError, match=r"resume\.json' is malformed") as error:
        find_resume_point(directory, config)
    assert problem in str(error.value)


def test_a_resume_record_reads_back_as_it_was_written(run_dir):
    from privzo.rundir.resume import ResumePoint, find_resume_point, write_resume_point
    from privzo.tracking import MetricPoint

    directory, config = run_dir
    unsent = (MetricPoint("test_accuracy", 0.5, 0), MetricPoint("epsilon_spent", 1.5, 10))
    point = ResumePoint("abc123", ({"accuracy": 0.5}, 1.25), None, unsent)
    write_resume_point(directory, point)
    assert find_resume_point(directory, config) == point


def test_a_summary_written_before_its_tracking_run_ends_is_untracked(run_dir):
    """The records mark the run finished; the resume point stays until the tracking run is
    final, so a kill in between is found (and not trained again: no resume point to train)."""
    from privzo.rundir import RunRecords, mark_tracked, untracked, write_records
    from privzo.rundir.resume import RESUME_FILE, find_resume_point

    directory, config = run_dir
    summary = RunSummary.from_dict({**SUMMARY, "tracking_run_id": "abc123"})
    write_records(directory, RunRecords(summary, {"final": True}))
    assert finished(directory, config) is not None
    assert find_resume_point(directory, config) is None
    stopped = untracked(directory, config)
    assert stopped is not None and stopped.tracking_run_id == "abc123"
    mark_tracked(directory)
    assert untracked(directory, config) is None and not (directory / RESUME_FILE).exists()
    assert finished(directory, config) is not None


def test_a_caller_naming_the_directory_resumes_starts_over_or_keeps_another_run(
    run_dir, tiny_run_config
):
    """What a study's cell or a demo arm passes as ``overwrite``: an unfinished run of its config
    resumes (when it keeps a trajectory) or starts over (when it cannot); another config's run
    is never written over."""
    from privzo.rundir import ResumePoint, holds_other_run, starts_over, write_resume_point

    directory, config = run_dir
    other = tiny_run_config("seed=7")
    assert not holds_other_run(directory / "empty", config)
    assert starts_over(config, directory / "empty")  # nothing there to keep
    assert not holds_other_run(directory, config) and holds_other_run(directory, other)
    assert starts_over(config, directory)  # no resume point: nothing to go on from
    assert not starts_over(other, directory)  # ``run`` refuses it instead
    write_resume_point(directory, ResumePoint("abc123", None))
    assert not starts_over(config, directory)  # goes on from its trajectory
    first_order = tiny_run_config("optimizer.algorithm=dpsgd")
    write_config(directory, first_order)
    assert starts_over(first_order, directory)  # keeps no trajectory: starts over
    (directory / CONFIG_FILE).unlink()
    write_summary(directory / SUMMARY_FILE, RunSummary.from_dict(SUMMARY))
    assert holds_other_run(directory, config)  # records without their config are no one's


def _trajectory(gradients: list[float], perturbation_scale: float = 1e-3) -> bytes:
    """A trajectory file's bytes, its plain checksums made by the recorder (as an editor who
    recomputes them would make them)."""
    meta = TrajectoryMeta(
        perturbation_scale, "gaussian", "cpu", "full", {}, 0, "q", "float32", "inplace"
    )
    recorder = TrajectoryRecorder(meta, release_batch_size=True)
    for step, gradient in enumerate(gradients):
        recorder.append(StepRecord(step, step_seed(0, step), gradient, 0.01, 1, 1.0, 0, 0.0))
    return recorder.to_bytes()


def test_a_run_directory_keeps_its_trajectory_key_to_itself(tmp_path):
    write_trajectory(tmp_path, _trajectory([0.1, 0.2]))
    key = tmp_path / TRAJECTORY_KEY_FILE
    assert stat.S_IMODE(key.stat().st_mode) & 0o077 == 0  # the owner's alone
    first = key.read_bytes()
    write_trajectory(tmp_path, _trajectory([0.1, 0.2, 0.3]))  # the next window: the same key
    assert key.read_bytes() == first and len(first) == 32
    table, _meta = read_run_trajectory(tmp_path / TRAJECTORY_FILE)
    assert table.column("projected_gradient").to_pylist() == [0.1, 0.2, 0.3]
    prepare_output_dir(tmp_path)  # a run started over draws a key of its own
    assert not key.exists()


@pytest.mark.parametrize(
    "edited",
    [
        _trajectory([0.1, 0.25]),  # a row changed
        _trajectory([0.1, 0.2], perturbation_scale=1.001e-3),  # the metadata changed
    ],
    ids=["row", "metadata"],
)
def test_an_edit_with_its_checksums_recomputed_fails_the_run_key(tmp_path, edited):
    """Whoever edits a released copy can recompute the plain checksums, and can copy the keyed
    one over, but cannot make the keyed one without the run directory's key."""
    write_trajectory(tmp_path, _trajectory([0.1, 0.2]))
    path = tmp_path / TRAJECTORY_FILE
    written = pq.read_table(path).schema.metadata
    table = pq.read_table(pa.BufferReader(edited))
    keyed = {k: v for k, v in written.items() if k == b"privzo.checksum.keyed"}
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, **keyed}), path)
    read_trajectory(path)  # the plain checksums pass: they were recomputed
    with pytest.raises(ValueError, match="fails the keyed checksum of its run directory's key"):
        read_run_trajectory(path)
    path.write_bytes(edited)  # the keyed checksum dropped
    with pytest.raises(ValueError, match="has no keyed checksum"):
        read_run_trajectory(path)


def test_a_trajectory_without_a_key_beside_it_reads_with_the_plain_checks(tmp_path):
    """A released copy, or a run directory from before keyed checksums, replays as before."""
    (tmp_path / TRAJECTORY_FILE).write_bytes(_trajectory([0.1, 0.2]))
    table, _meta = read_run_trajectory(tmp_path / TRAJECTORY_FILE)
    assert table.num_rows == 2


def test_an_attempt_that_kept_no_step_is_started_again(run_dir, tiny_run_config):
    """Its config alone, or a trajectory with no row: nothing to draw twice. A kept row, a
    resume point, weights or another config's file keep the directory as it is."""
    from privzo.rundir import ResumePoint, released_nothing, write_resume_point

    directory, config = run_dir
    assert released_nothing(directory, config)
    assert not released_nothing(directory, tiny_run_config("seed=7"))
    write_trajectory(directory, _trajectory([]))  # written as it stopped before step 0
    assert released_nothing(directory, config)
    write_trajectory(directory, _trajectory([0.1]))
    assert not released_nothing(directory, config)
    write_trajectory(directory, _trajectory([]))
    (directory / "model").mkdir()  # a first-order run's weights, saved before its summary
    assert not released_nothing(directory, config)
    (directory / "model").rmdir()
    write_resume_point(directory, ResumePoint("abc123", None))
    assert not released_nothing(directory, config)
