"""A stopped single run resumes where it stopped: θ rebuilt by replay, no step drawn twice,
each step accounted once, the same MLflow run finished. A CLI run killed by a signal and resumed
by the same command is tests/integration/test_killed_cli_run.py."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from privzo.cli.run import interrupted_line
from privzo.config import ConfigError
from privzo.privacy import compute_epsilon
from privzo.replay import replay
from privzo.run import RunHooks, TrainingLoop, can_resume, run
from privzo.tracking import TrackingStoreError, read_run
from privzo.tracking.tags import CONTINUES_FROM_STEP, METRIC, MODEL_PARAMETERS, STRATEGY

STEPS = 12


RESUMED_RUN = (f"optimizer.steps={STEPS}", "save_model=true")


def _accountant_epsilon(summary, steps: int) -> float:
    """ε after ``steps`` steps of the summary's run, from the public accountant."""
    return compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=summary["sample_rate"],
        steps=steps,
        delta=summary["delta"] - summary["truncation_delta"],  # the rest is truncation's
        noise_parameters=summary["mechanism_parameters"],  # the discrete noise's grid
    )


def _stop_after(step: int) -> RunHooks:
    def stop(_context, steps_done: int, _metrics) -> None:
        if steps_done == step:
            raise KeyboardInterrupt  # what Ctrl+C raises (and SIGTERM, through the CLI)

    return RunHooks(after_window=stop)


@pytest.mark.parametrize(
    "directions",
    [(), ("optimizer.directions_per_step=2", "privacy.noise_grid=null")],
    ids=["one-direction", "two-directions"],
)
def test_an_interrupted_run_resumes_without_drawing_a_step_again(
    tmp_path, tiny_run_config, cache_dir, directions
):
    config = tiny_run_config(*RESUMED_RUN, *directions)
    output = tmp_path / "runs" / "dp"
    with pytest.raises(KeyboardInterrupt):
        run(config, output, cache_dir=cache_dir, progress=False, hooks=_stop_after(5))
    first = pq.read_table(output / "trajectory.parquet").to_pylist()
    point = json.loads((output / "resume.json").read_text())
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    assert len(first) == 5 and not (output / "summary.json").exists()
    killed = read_run(uri, point["tracking_run_id"])
    assert killed["status"] == "KILLED"
    # the ε curve's thread runs ahead of training: the windows not run logged no ε
    assert [step for step, _ in killed["history"]["epsilon_spent"]] == [5]
    saved = json.loads((output / "privacy.json").read_text())  # the ledger, as the window ended
    assert saved["steps_accounted"] == 5 and saved["ledger"]["accountant"]["steps"] == 5
    assert saved["final"] is False and saved["epsilon_spent"] is None

    summary = run(config, output, cache_dir=cache_dir, progress=False)  # the same command
    rows = pq.read_table(output / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in rows] == list(range(STEPS))
    assert rows[:5] == first  # the released steps were replayed, not drawn again
    count = config.optimizer.directions_per_step
    assert all(len(row["extra_projected_gradients"]) == count - 1 for row in rows)
    assert summary["tracking_run_id"] == point["tracking_run_id"]
    record = read_run(uri, summary["tracking_run_id"])
    assert record["status"] == "FINISHED"
    assert [step for step, _ in record["history"]["epsilon_spent"]] == [5, 10, 12]
    expected = _accountant_epsilon(summary, STEPS)
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)  # 12 steps, booked once
    privacy = json.loads((output / "privacy.json").read_text())
    assert privacy["final"] is True and privacy["steps_accounted"] == STEPS
    assert privacy["epsilon_spent"] == summary["epsilon"]
    assert privacy["noise_multiplier"] == summary["noise_multiplier"]
    assert privacy["sample_rate"] == summary["sample_rate"] and privacy["mechanism"] == "gaussian"
    assert summary["accuracy_before"] == record["metrics"]["test_accuracy"]
    assert not (output / "resume.json").exists()
    # θ of the resumed run is what the whole trajectory rebuilds from the base
    _loaded, model, steps = replay("tiny-opt", output / "trajectory.parquet", cache_dir=cache_dir)
    saved = load_file(output / "model" / "model.safetensors")
    assert steps == STEPS
    assert all(torch.equal(saved[n], p) for n, p in model.named_parameters() if n in saved)


def test_another_config_is_refused_and_overwrite_starts_over(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(*RESUMED_RUN, "tracking.backend=none")
    output = tmp_path / "dp"
    with pytest.raises(KeyboardInterrupt):
        run(config, output, cache_dir=cache_dir, progress=False, hooks=_stop_after(5))
    other = tiny_run_config(*RESUMED_RUN, "tracking.backend=none", "optimizer.learning_rate=2e-3")
    assert can_resume(config, output) and not can_resume(other, output)  # what a trial asks
    with pytest.raises(ConfigError, match="holds an unfinished run of another config"):
        run(other, output, cache_dir=cache_dir, progress=False)
    summary = run(other, output, cache_dir=cache_dir, progress=False, overwrite=True)
    assert summary["steps"] == STEPS and not can_resume(other, output)  # finished
    assert pq.read_table(output / "trajectory.parquet").num_rows == STEPS


def test_a_resume_under_another_privacy_state_is_refused(tmp_path, tiny_run_config, cache_dir):
    """The saved ledger is restored through the accountant's state API: a budget or σ that is
    not this run's is refused before any step, and the files are left as they were."""
    config = tiny_run_config(*RESUMED_RUN, "tracking.backend=none")
    output = tmp_path / "dp"
    with pytest.raises(KeyboardInterrupt):
        run(config, output, cache_dir=cache_dir, progress=False, hooks=_stop_after(5))
    path = output / "privacy.json"
    for section, key, value in (
        ("ledger", "epsilon_budget", 4.0),
        ("accountant", "noise_multiplier", 9.0),
    ):
        saved = json.loads(path.read_text())
        edited = json.loads(path.read_text())
        target = edited["ledger"] if section == "ledger" else edited["ledger"]["accountant"]
        target[key] = value
        path.write_text(json.dumps(edited))
        with pytest.raises(ConfigError, match=f"cannot resume.*{key}"):
            run(config, output, cache_dir=cache_dir, progress=False)
        assert pq.read_table(output / "trajectory.parquet").num_rows == 5
        path.write_text(json.dumps(saved))
    assert run(config, output, cache_dir=cache_dir, progress=False)["steps"] == STEPS


def test_a_run_stopped_inside_its_first_window_resumes(
    tmp_path, tiny_run_config, cache_dir, monkeypatch
):
    """Stopped at step 2, before any window ended: the two steps it made (written when it
    stopped) are kept and the run goes on from there."""
    real_step = TrainingLoop.step

    def stop_at_step_2(self, step):
        if step == 2:
            raise KeyboardInterrupt
        return real_step(self, step)

    config = tiny_run_config(*RESUMED_RUN, "tracking.backend=none")
    output = tmp_path / "dp"
    monkeypatch.setattr(TrainingLoop, "step", stop_at_step_2)
    with pytest.raises(KeyboardInterrupt):
        run(config, output, cache_dir=cache_dir, progress=False)
    monkeypatch.undo()
    first = pq.read_table(output / "trajectory.parquet").to_pylist()
    assert len(first) == 2 and can_resume(config, output)
    said = interrupted_line(config, output)  # what the CLI's Ctrl+C line promises
    assert "keeps its 2 released steps: the same command resumes from there" in said, said
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    rows = pq.read_table(output / "trajectory.parquet").to_pylist()
    assert summary["steps"] == STEPS and rows[:2] == first and len(rows) == STEPS
    # saved before step 0 (nothing booked); the 2 steps run since are booked on resume, once
    assert json.loads((output / "privacy.json").read_text())["steps_accounted"] == STEPS


@pytest.mark.parametrize(
    "algorithm", ["dpzero", "dpsgd"], ids=["before-its-first-step", "first-order"]
)
def test_a_run_that_kept_no_step_starts_again_under_the_same_command(
    tmp_path, tiny_run_config, cache_dir, monkeypatch, caplog, algorithm
):
    """DPZero stopped before its first step, DP-SGD after a window (it keeps no trajectory and
    released no noised value): the same command starts the run again and finishes it."""

    def stop_before_the_loop(_self, *_args, **_kwargs):
        raise KeyboardInterrupt  # as Ctrl+C while the model loads or evaluates

    config = tiny_run_config(*RESUMED_RUN, f"optimizer.algorithm={algorithm}")
    output = tmp_path / "dp"
    if algorithm == "dpzero":
        monkeypatch.setattr(TrainingLoop, "run", stop_before_the_loop)
    hooks = _stop_after(5) if algorithm == "dpsgd" else None
    with pytest.raises(KeyboardInterrupt):
        run(config, output, cache_dir=cache_dir, progress=False, hooks=hooks)
    monkeypatch.undo()
    assert not can_resume(config, output)
    said = interrupted_line(config, output)  # the Ctrl+C line promises what the rerun does
    assert "kept no step yet" in said and "starts the run again from step 0" in said, said
    assert "resume" not in said
    with caplog.at_level("WARNING", logger="privzo.run.pipeline"):
        summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert "stopped before it kept any step" in caplog.text
    assert summary["steps"] == STEPS and summary["resumed_steps"] == 0
    record = read_run(f"sqlite:///{tmp_path / 'mlflow.db'}", summary.tracking_run_id)
    assert record["status"] == "FINISHED"


def test_a_run_killed_after_its_summary_has_its_tracking_run_ended(
    tmp_path, tiny_run_config, cache_dir
):
    """A kill after summary.json, before the MLflow run is final, leaves the summary, the
    resume point and a RUNNING run without artifacts: the same command (or a search, study or
    demo asking ``finished_run``) logs the records and model and ends it FINISHED, training
    nothing."""
    import shutil
    from urllib.parse import urlparse

    from privzo.run import finished_run
    from privzo.rundir import ResumePoint, untracked, write_resume_point
    from privzo.tracking import open_client

    config = tiny_run_config("optimizer.steps=2")
    output = tmp_path / "runs" / "dp"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert not (output / "resume.json").exists() and untracked(output, config) is None
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    done = read_run(uri, summary["tracking_run_id"])
    assert {"summary.json", "trajectory.parquet", "model/MLmodel"} <= set(done["artifacts"])
    trajectory = (output / "trajectory.parquet").read_bytes()

    # what write_records leaves for the moment after the summary: the resume point kept
    write_resume_point(output, ResumePoint(summary["tracking_run_id"], None))
    open_client(uri).update_run(summary["tracking_run_id"], status="RUNNING")
    shutil.rmtree(urlparse(done["artifact_uri"]).path)
    stopped = untracked(output, config)
    assert stopped is not None and stopped.to_dict() == summary.to_dict()
    said = interrupted_line(config, output)  # a Ctrl+C while the records are logged
    assert "holds the finished run: the same command ends its MLflow run" in said, said

    again = finished_run(config, output, cache_dir=cache_dir)
    assert again is not None and again.to_dict() == summary.to_dict()
    ended = read_run(uri, summary["tracking_run_id"])
    assert ended["status"] == "FINISHED" and set(ended["artifacts"]) == set(done["artifacts"])
    assert ended["history"] == done["history"]  # no metric logged twice, no step drawn again
    assert (output / "trajectory.parquet").read_bytes() == trajectory
    assert not (output / "resume.json").exists()
    last = finished_run(config, output, cache_dir=cache_dir)  # now simply finished
    assert last is not None and last.to_dict() == summary.to_dict()


def test_a_finished_run_whose_store_lost_its_tracking_run_ends_in_a_new_one(
    tmp_path, tiny_run_config, cache_dir
):
    """A kill after summary.json, then the store gone: the same command (its store elsewhere)
    records the finished run into a new FINISHED tracking run that says it continues from the
    last step, with the final metrics and files, names it in summary.json, and trains nothing."""
    from privzo.rundir import ResumePoint, write_resume_point

    config = tiny_run_config("optimizer.steps=2")
    output = tmp_path / "runs" / "dp"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    trajectory = (output / "trajectory.parquet").read_bytes()
    write_resume_point(output, ResumePoint(summary["tracking_run_id"], None))

    uri = f"sqlite:///{(tmp_path / 'elsewhere.db').resolve()}"
    caller = {"privzo.study": "lost-store"}  # a caller's tags (a study's) go on the new run
    again = run(config, output, cache_dir=cache_dir, progress=False, tracking_uri=uri, tags=caller)
    assert again["tracking_run_id"] not in (None, summary["tracking_run_id"])
    record = read_run(uri, again["tracking_run_id"])
    assert record["status"] == "FINISHED" and record["tags"][CONTINUES_FROM_STEP] == "2"
    # what the analysis reads: the run's sizes and metric, as the lost run had them
    assert record["tags"][MODEL_PARAMETERS] == str(summary["model_parameters"])
    assert record["tags"][METRIC] == summary["metric"]
    assert record["tags"]["privzo.study"] == "lost-store" and STRATEGY not in record["tags"]
    assert record["metrics"]["final_epsilon"] == summary["epsilon"]
    assert record["params"]["optimizer.steps"] == "2"
    assert {"summary.json", "trajectory.parquet", "model/MLmodel"} <= set(record["artifacts"])
    written = json.loads((output / "summary.json").read_text())
    assert written["tracking_run_id"] == again["tracking_run_id"]
    assert {k: v for k, v in written.items() if k != "tracking_run_id"} == {
        k: v for k, v in summary.to_dict().items() if k != "tracking_run_id"
    }
    assert (output / "trajectory.parquet").read_bytes() == trajectory  # nothing trained
    assert not (output / "resume.json").exists()


def _empty_store_after(step: int, store, sent: dict[str, float]) -> RunHooks:
    """Empties ``store`` after window ``step``, keeping in ``sent`` what that window stored."""

    def empty(_context, steps_done: int, metrics) -> None:
        if steps_done == step:
            sent.update(metrics)
            store.write_bytes(b"")  # the store replaced under the run by an empty one

    return RunHooks(after_window=empty)


def test_a_store_lost_mid_run_stops_it_and_the_same_command_goes_on_in_a_new_run(
    tmp_path, tiny_run_config, cache_dir
):
    config = tiny_run_config(*RESUMED_RUN)
    output = tmp_path / "runs" / "dp"
    store = tmp_path / "runs" / "mlflow.db"
    sent: dict[str, float] = {}
    hooks = _empty_store_after(5, store, sent)
    with pytest.raises(TrackingStoreError) as stopped:
        run(config, output, cache_dir=cache_dir, progress=False, hooks=hooks)
    message = str(stopped.value)
    assert "\n" not in message and str(store) in message and "no such table" in message
    assert f"The run in {output} keeps its steps" in message
    assert len(pq.read_table(output / "trajectory.parquet")) == 10  # the window that failed too
    point = json.loads((output / "resume.json").read_text())
    unsent = {(p["key"], p["step"]) for p in point["unsent"]}
    # window 5's ε went out with it, or, computed too late for it (a cold ε cache), is logged
    # at its own step once computed: with the failed window (unsent like it) or after it
    late = set() if "epsilon_spent" in sent else {("epsilon_spent", 5)}
    assert ("learning_rate", 10) in unsent and {step for _, step in unsent - late} == {10}

    # the same command, its store elsewhere now (MLflow keeps the emptied one's engine open
    # in this process; a new process reopens the emptied file, as the CLI check does)
    uri = f"sqlite:///{(tmp_path / 'elsewhere.db').resolve()}"
    summary = run(config, output, cache_dir=cache_dir, progress=False, tracking_uri=uri)
    assert summary["tracking_run_id"] != point["tracking_run_id"]
    record = read_run(uri, summary["tracking_run_id"])
    assert record["status"] == "FINISHED" and record["tags"][CONTINUES_FROM_STEP] == "10"
    for key, step in unsent:  # the window the lost store never took, stored in the new run
        assert step in [step for step, _ in record["history"][key]]
    assert [step for step, _ in record["history"]["learning_rate"]] == [10, 12]
    # ε at every window end, the lost run's and its own, the accountant's value at each: the
    # lost run's ε for window 5 or 10 may never have reached any store (computed too late)
    epsilons = record["history"]["epsilon_spent"]
    assert [steps for steps, _ in epsilons] == [5, 10, STEPS]
    for steps, epsilon in epsilons:
        assert epsilon == pytest.approx(_accountant_epsilon(summary, steps), rel=1e-9), steps
    assert [row["step"] for row in pq.read_table(output / "trajectory.parquet").to_pylist()] == (
        list(range(STEPS))
    )
