"""Tracking against a real MLflow sqlite store, one per module (creating the schema is slow)."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from urllib.parse import urlparse

import matplotlib
import pandas as pd
import pytest

from privzo.tracking import (
    TRACKERS,
    MetricPoint,
    MlflowTracker,
    NoopTracker,
    TrackingStoreError,
    default_artifact_location,
    default_tracking_uri,
    end_runs,
    get_or_create_experiment,
    join_split_params,
    make_tracker,
    open_client,
    read_run,
    read_table,
    split_param,
)
from privzo.tracking.clock import PUBLIC_TIME_MS

EXPERIMENT = "privzo-tests"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Output root holding the shared sqlite store, with the test experiment already created."""
    out = tmp_path_factory.mktemp("tracking")
    client = open_client(default_tracking_uri(out))
    get_or_create_experiment(client, EXPERIMENT, default_artifact_location(out))
    return out


def _tracker(root: Path, run_name: str, **kwargs: object) -> MlflowTracker:
    tracker = make_tracker(
        "mlflow", uri=None, experiment=EXPERIMENT, output_root=root, run_name=run_name, **kwargs
    )
    assert isinstance(tracker, MlflowTracker)
    return tracker


CONFIG = {
    "model": {"name": "opt-125m", "layers": 12},
    "optim": {"lr": 1e-3, "betas": [0.9, 0.99], "schedule": {"kind": "cosine"}},
    "dp": {"epsilon": 2.0, "delta": 1e-5},
    "empty": {},
    "long": "abcdefghij" * 1500,  # 15000 chars: over MLflow's 6000-char param limit
}

EXPECTED_PARAMS = {
    "model.name": "opt-125m",
    "model.layers": "12",
    "optim.lr": "0.001",
    "optim.betas": "[0.9, 0.99]",
    "optim.schedule.kind": "cosine",
    "dp.epsilon": "2.0",
    "dp.delta": "1e-05",
    "empty": "{}",
    "long": "abcdefghij" * 1500,
}


def _metrics(step: int) -> dict[str, float]:
    return {"loss": 1.0 / (step + 1), "acc": step / 64, "eps_spent": 0.25 * step}


def test_full_run_round_trip(root: Path, tmp_path: Path) -> None:
    tracker = _tracker(root, "round-trip", tags={"suite": "tracking"})
    tracker.start()
    run_id = tracker.run_id
    assert run_id is not None
    tracker.log_params(CONFIG)

    steps = range(60)  # 3 metrics x 60 steps = 180 points; batch size 100
    for step in steps:
        tracker.log_metrics(_metrics(step), step=step)
        if step == 33:  # the 102nd point triggered a batch send
            assert tracker.buffered == 0
    assert tracker.buffered == 180 - 102

    mid = read_run(tracker.uri, run_id)
    assert mid["status"] == "RUNNING"
    assert [s for s, _ in mid["history"]["loss"]] == list(range(34))

    (tmp_path / "config.yaml").write_text("lr: 0.001\n")
    evals = tmp_path / "evals"
    evals.mkdir()
    (evals / "a.json").write_text("{}")
    (evals / "b.json").write_text("[]")
    tracker.log_artifact(tmp_path / "config.yaml")
    tracker.log_artifact(evals)
    tracker.set_tags({"phase": "done"})
    tracker.finish()
    assert tracker.buffered == 0
    assert not tracker.active

    record = read_run(tracker.uri, run_id)
    assert record["status"] == "FINISHED"
    assert record["end_time"] is not None
    assert record["run_name"] == "round-trip"
    assert record["params"] == EXPECTED_PARAMS
    for key in ("loss", "acc", "eps_spent"):
        assert record["history"][key] == [(s, _metrics(s)[key]) for s in steps]
    assert record["metrics"] == _metrics(59)
    assert record["tags"]["suite"] == "tracking"
    assert record["tags"]["phase"] == "done"
    assert record["tags"]["mlflow.runName"] == "round-trip"
    assert record["artifacts"] == ["config.yaml", "evals/a.json", "evals/b.json"]
    artifact_dir = Path(urlparse(record["artifact_uri"]).path)
    assert (artifact_dir / "config.yaml").read_text() == "lr: 0.001\n"


def test_long_param_is_stored_in_parts(root: Path) -> None:
    with _tracker(root, "long-param") as tracker:
        tracker.log_params({"long": CONFIG["long"]})
    raw = open_client(tracker.uri).get_run(tracker.run_id).data.params
    assert sorted(raw) == ["long", "long/part2", "long/part3"]
    assert [len(raw[k]) for k in ("long", "long/part2", "long/part3")] == [6000, 6000, 3000]


def test_split_and_join_params() -> None:
    parts = split_param("k", "abcdefghij", limit=4)
    assert parts == [("k", "abcd"), ("k/part2", "efgh"), ("k/part3", "ij")]
    assert join_split_params(dict(parts)) == {"k": "abcdefghij"}
    assert split_param("k", "") == [("k", "")]
    # A "/partN" key without its base key is an ordinary param, left alone.
    assert join_split_params({"x/part2": "v"}) == {"x/part2": "v"}
    many = dict(split_param("k", "".join(str(i % 10) for i in range(12)), limit=1))
    assert join_split_params(many)["k"] == "012345678901"  # part10 after part9


@pytest.mark.parametrize(
    ("error", "status"),
    [(None, "FINISHED"), (RuntimeError, "FAILED"), (KeyboardInterrupt, "KILLED")],
)
def test_context_manager_status_keeps_buffered_metrics(
    root: Path, error: type[BaseException] | None, status: str
) -> None:
    tracker = _tracker(root, f"ctx-{status}")
    with pytest.raises(error) if error else contextlib.nullcontext(), tracker:
        for step in range(5):
            tracker.log_metrics({"loss": float(step)}, step=step)
        assert tracker.buffered == 5  # nothing sent yet: exit must flush
        if error:
            raise error("boom")
    record = read_run(tracker.uri, tracker.run_id)
    assert record["status"] == status
    assert record["history"]["loss"] == [(s, float(s)) for s in range(5)]


def test_artifact_location_is_absolute_under_output_root(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(root.parent)  # relative output_root, as a Ray job's working dir might give
    with _tracker(Path(root.name), "location") as tracker:
        pass
    assert tracker.uri == f"sqlite:///{root.resolve()}/mlflow.db"
    experiment = open_client(tracker.uri).get_experiment(tracker.experiment_id)
    assert experiment.artifact_location == (root.resolve() / "mlartifacts").as_uri()
    artifact_uri = read_run(tracker.uri, tracker.run_id)["artifact_uri"]
    artifact_path = Path(urlparse(artifact_uri).path)
    assert artifact_path.is_absolute()
    assert artifact_path.is_relative_to(root.resolve() / "mlartifacts")


def test_experiment_creation_race_uses_existing(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    client = open_client(default_tracking_uri(root))
    existing = client.get_experiment_by_name(EXPERIMENT).experiment_id
    real_lookup = client.get_experiment_by_name
    lookups: list[str] = []

    def lookup_missing_first(name: str):  # another process creates it right after our lookup
        lookups.append(name)
        return None if len(lookups) == 1 else real_lookup(name)

    monkeypatch.setattr(client, "get_experiment_by_name", lookup_missing_first)
    assert get_or_create_experiment(client, EXPERIMENT, None) == existing
    assert lookups == [EXPERIMENT, EXPERIMENT]


def test_a_new_experiment_opens_in_mlflows_classic_view_and_a_chosen_view_stays(
    root: Path,
) -> None:
    """MLflow 3's UI reads ``mlflow.experimentKind``: privzo's experiments are runs compared by
    metrics and tags (the classic view), not GenAI traces; a kind set on an existing
    experiment (by its owner, in the UI) is left alone."""
    client = open_client(default_tracking_uri(root))
    created = get_or_create_experiment(client, "classic-view", None)
    tags = client.get_experiment(created).tags
    assert tags["mlflow.experimentKind"] == "custom_model_development"
    chosen = client.create_experiment(
        "chosen-view", tags={"mlflow.experimentKind": "genai_development"}
    )
    assert get_or_create_experiment(client, "chosen-view", None) == chosen
    assert client.get_experiment(chosen).tags["mlflow.experimentKind"] == "genai_development"


def test_misuse_is_reported(root: Path) -> None:
    tracker = _tracker(root, "misuse")
    with pytest.raises(RuntimeError, match="start"):
        tracker.log_metrics({"loss": 1.0}, step=0)
    tracker.start()
    with pytest.raises(RuntimeError, match="already started"):
        tracker.start()
    with pytest.raises(ValueError, match="metric key"):
        tracker.log_metrics({"": 1.0}, step=0)
    with pytest.raises(ValueError, match="status"):
        tracker.finish("DONE")  # type: ignore[arg-type]
    tracker.finish("KILLED")
    tracker.finish()  # second finish is a no-op, status stays
    assert read_run(tracker.uri, tracker.run_id)["status"] == "KILLED"


def test_unknown_backend_names_allowed_ones(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown tracking backend 'wandb'") as info:
        make_tracker("wandb", uri=None, experiment="e", output_root=tmp_path, run_name=None)
    assert "mlflow" in str(info.value)
    assert "none" in str(info.value)
    assert set(TRACKERS) == {"mlflow", "none"}


def test_noop_tracker_keeps_interface_and_writes_nothing(tmp_path: Path) -> None:
    tracker = make_tracker("none", uri=None, experiment="e", output_root=tmp_path, run_name="r")
    assert isinstance(tracker, NoopTracker)
    with tracker as active:
        assert active is tracker
        assert tracker.active
        tracker.log_params(CONFIG)
        tracker.log_metrics({"loss": 1.0}, step=0)
        tracker.set_tags({"a": "b"})
        tracker.log_artifact(tmp_path / "missing.txt")
        tracker.log_table(pd.DataFrame({"a": [1]}), "t.json")
        tracker.log_figure(None, "f.png")
        tracker.flush()
        assert tracker.metric_steps("loss") == frozenset()  # a resumed run finds nothing to fill
        with pytest.raises(ValueError, match=r"relative path ending in \.json"):
            tracker.log_table(pd.DataFrame(), "t.csv")
        with pytest.raises(ValueError, match=r"relative path ending in \.png"):
            tracker.log_figure(None, "../f.png")
    assert tracker.run_id is None
    assert not tracker.active
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_concurrent_start_on_fresh_store(tmp_path: Path) -> None:
    """Several processes starting runs on a brand-new sqlite store (unlocked, MLflow's schema
    migrations collide and corrupt the database)."""
    script = textwrap.dedent(
        f"""
        from pathlib import Path
        from privzo.tracking import make_tracker
        root = Path({str(tmp_path)!r})
        with make_tracker("mlflow", uri=None, experiment="x", output_root=root, run_name=None) as t:
            t.log_metrics({{"x": 1.0}}, step=0)
        print(t.experiment_id)
        """
    )
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outputs = [p.communicate(timeout=120)[0].strip() for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0]
    assert len(set(outputs)) == 1
    runs = open_client(default_tracking_uri(tmp_path)).search_runs([outputs[0]])
    assert sorted(r.info.status for r in runs) == ["FINISHED"] * 3


def test_timing_free_tracker_stamps_metrics_with_start_plus_step(root: Path) -> None:
    """A private run's record must not time its windows: it starts and ends at the public
    time, and stamps are that time + step, however long the steps took."""
    import time

    tracker = _tracker(root, "timing-free", release_timing=False)
    with tracker:
        for step in (5, 10, 12):
            time.sleep(0.05)  # real time passes between windows
            tracker.log_metrics({"epsilon_spent": step / 10}, step=step)
    client = open_client(tracker.uri)
    run = client.get_run(tracker.run_id)
    stamps = [
        (m.step, m.timestamp) for m in client.get_metric_history(run.info.run_id, "epsilon_spent")
    ]
    start = PUBLIC_TIME_MS
    assert sorted(stamps) == [(5, start + 5), (10, start + 10), (12, start + 12)]
    assert run.info.start_time == run.info.end_time == start


def test_timing_free_tracker_logs_artifacts_at_the_public_time(root: Path, tmp_path: Path) -> None:
    """MLflow's local store keeps a logged file's modification time and makes folders on the
    clock: without released timing every file and folder of the run reads the public time,
    whatever the logged file's own time; a run that releases timing keeps the real times."""
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    started = time.time()
    written = tmp_path / "written"
    (written / "nested").mkdir(parents=True)
    for name in ("config.yaml", "nested/trajectory.parquet"):
        (written / name).write_text(name)
        os.utime(written / name, (started - 3600, started - 3600))  # an hour before the end
    figure, axis = plt.subplots()
    axis.plot([1, 2], [2, 1])
    folders = {}
    for release_timing in (False, True):
        with _tracker(root, f"artifacts-{release_timing}", release_timing=release_timing) as run:
            run.log_artifact(written / "config.yaml")
            run.log_artifact(written, "folder")
            run.log_table(pd.DataFrame({"a": [1]}), "report/table.json")
            run.log_figure(figure, "report/curve.png")
        folders[release_timing] = Path(urlparse(read_run(run.uri, run.run_id)["artifact_uri"]).path)
    plt.close(figure)

    private = folders[False]
    entries = [private, private.parent, *private.rglob("*")]
    assert len(entries) == 2 + 8  # 5 files, 3 folders under the root
    assert {entry.stat().st_mtime for entry in entries} == {PUBLIC_TIME_MS / 1000}
    public = folders[True]
    assert (public / "config.yaml").stat().st_mtime == started - 3600  # copystat: the source's
    assert (public / "report" / "table.json").stat().st_mtime >= started


def test_ending_timing_free_runs_keeps_their_public_end(root: Path) -> None:
    """A search ends its stopped private trials itself; their end stays at their public start
    rather than the time the search closed them."""
    ended = {}
    for release_timing in (False, True):
        tracker = _tracker(root, f"ended-{release_timing}", release_timing=release_timing)
        tracker.start()
        end_runs(tracker.uri, [str(tracker.run_id)], "KILLED", release_timing=release_timing)
        ended[release_timing] = read_run(tracker.uri, str(tracker.run_id))
    assert ended[False]["status"] == "KILLED"
    assert ended[False]["start_time"] == ended[False]["end_time"] == PUBLIC_TIME_MS
    assert ended[True]["end_time"] >= ended[True]["start_time"] > PUBLIC_TIME_MS


def test_an_unreachable_tracking_server_is_refused_before_the_model_loads(
    tmp_path, sentiment_files
):
    """A closed port answers at once; MLflow's own client would retry it for about four
    minutes. The model named does not exist: the probe comes before anything reads it."""
    import socket

    from privzo.config import ConfigError, load_config
    from privzo.run import run

    with socket.socket() as listener:  # a port nobody listens on once this closes
        listener.bind(("127.0.0.1", 0))
        port = listener.getsockname()[1]
    config = load_config(
        None,
        [
            f"model.name_or_path={tmp_path / 'no-such-model'}",
            f"task.train_path={sentiment_files[0]}",
            f"task.test_path={sentiment_files[1]}",
            f"tracking.uri=http://127.0.0.1:{port}",
        ],
    )
    with pytest.raises(ConfigError, match=f"127.0.0.1:{port} is not reachable within 10 s"):
        run(config, tmp_path / "out", cache_dir=tmp_path / "cache", progress=False)
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def _without_root_override() -> None:
    """In the child, before exec: root gives up overriding file permissions (the capability
    bounding set loses CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so chmod a-w binds it too."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        if libc.prctl(24, capability, 0, 0, 0) != 0:  # PR_CAPBSET_DROP
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


def test_a_read_only_tracking_store_is_refused_before_the_model_loads(tmp_path, sentiment_files):
    """chmod a-w on the sqlite file and its directory: MLflow reads the store and its experiment
    without complaint and failed only when it created the run, after the model and data had
    loaded. The model named does not exist: the store's check comes before anything reads it."""
    import os

    store = tmp_path / "store"
    uri = default_tracking_uri(store)
    get_or_create_experiment(open_client(uri), "default", default_artifact_location(store))
    for path in (store / "mlflow.db", store / "mlflow.db.lock", store):
        path.chmod(0o555 if path.is_dir() else 0o444)
    config = tmp_path / "run.yaml"
    train, test = sentiment_files
    config.write_text(f"task: {{train_path: {train}, test_path: {test}}}\n")
    command = [
        *(sys.executable, "-m", "privzo.cli", "run", str(config)),
        *("--output-dir", str(tmp_path / "out"), "--cache-dir", str(tmp_path / "cache")),
        f"model.name_or_path={tmp_path / 'no-such-model'}",
        f"tracking.uri={uri}",
    ]
    try:
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=120,
            preexec_fn=_without_root_override if os.geteuid() == 0 else None,
        )
    finally:
        store.chmod(0o755)
    assert result.returncode == 2, result.stderr[-2000:]
    assert f"the sqlite store {store / 'mlflow.db'} cannot be written" in result.stderr
    assert "Traceback" not in result.stderr and "no-such-model" not in result.stderr
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()


def test_tables_and_figures_are_logged_for_the_ui_and_read_back(root: Path) -> None:
    """log_table writes MLflow's table artifact (listed in ``mlflow.loggedArtifacts``, which the
    UI reads); logging it again replaces the rows instead of appending them; log_figure's PNG."""
    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    first = pd.DataFrame({"trial": ["t0", "t1"], "score": [0.5, float("nan")], "steps": [4, 8]})
    second = pd.DataFrame(
        {"trial": ["t0", "t1", "t2"], "score": [0.5, 0.6, 0.7], "steps": [4, 8, 8]}
    )
    figure, axis = plt.subplots()
    axis.plot([1, 2, 3], [3, 1, 2])
    with _tracker(root, "tables") as tracker:
        tracker.log_table(first, "report/trials.json")
        logged_once = read_table(tracker.uri, tracker.run_id, "report/trials.json")
        tracker.log_table(second, "report/trials.json")
        tracker.log_figure(figure, "report/curve.png")
    plt.close(figure)
    assert logged_once["trial"].tolist() == ["t0", "t1"] and logged_once["steps"].tolist() == [4, 8]
    assert logged_once["score"].iloc[0] == 0.5 and pd.isna(logged_once["score"].iloc[1])
    pd.testing.assert_frame_equal(
        read_table(tracker.uri, tracker.run_id, "report/trials.json"), second
    )
    record = read_run(tracker.uri, tracker.run_id)
    assert json.loads(record["tags"]["mlflow.loggedArtifacts"]) == [
        {"path": "report/trials.json", "type": "table"}
    ]
    assert "report/curve.png" in record["artifacts"]
    image = Path(urlparse(record["artifact_uri"]).path) / "report" / "curve.png"
    assert image.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_earlier_attempts_unsent_metrics_are_stored_once(root: Path) -> None:
    tracker = _tracker(root, "unsent", release_timing=False)
    with tracker:
        tracker.log_metrics({"loss": 1.0}, step=5)
        tracker.flush()  # stored before the kill; the resume point still lists it
        unsent = (MetricPoint("loss", 1.0, 5), MetricPoint("loss", 0.5, 10))
        assert tracker.log_missing((*unsent, MetricPoint("lr", 0.1, 10))) == 2
        assert tracker.unsent() == ()
        tracker.log_metrics({"loss": 0.25}, step=15)  # buffered: held, though not stored yet
        assert tracker.metric_steps("loss") == {5, 10, 15} and tracker.unsent() != ()
        assert tracker.metric_steps("lr") == {10} and tracker.metric_steps("other") == set()
    record = read_run(tracker.uri, tracker.run_id)
    assert record["history"] == {"loss": [(5, 1.0), (10, 0.5), (15, 0.25)], "lr": [(10, 0.1)]}


def test_a_store_emptied_mid_run_fails_in_one_line_keeping_the_metrics(tmp_path: Path) -> None:
    tracker = make_tracker(
        "mlflow", uri=None, experiment=EXPERIMENT, output_root=tmp_path, run_name="lost"
    )
    tracker.start()
    tracker.log_metrics({"loss": 1.0}, step=5)
    tracker.flush()
    (tmp_path / "mlflow.db").write_bytes(b"")  # the store replaced by an empty file
    tracker.log_metrics({"loss": 0.5}, step=10)
    with pytest.raises(TrackingStoreError) as failed:
        tracker.flush()
    assert str(failed.value) == (
        f"the MLflow store {tmp_path / 'mlflow.db'} failed: no such table: runs"
    )
    assert tracker.unsent() == (MetricPoint("loss", 0.5, 10),)  # kept for the resume point
    with pytest.raises(TrackingStoreError, match="no such table"):  # the same, not MLflow's
        tracker.finish()
    assert not tracker.active


def test_an_artifact_the_store_cannot_take_fails_in_one_line(root: Path, tmp_path: Path) -> None:
    """A file size limit fails the copy into the artifact store as a full disk does (an
    OSError from shutil): the store's one line names the reason and where it was writing, not
    the source, and the run stays open for the caller to end."""
    tracker = _tracker(root, "full")
    record = tmp_path / "trajectory.parquet"
    record.write_bytes(b"x" * 1_000_000)
    tracker.start()
    limits = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # EFBIG instead of a kill
    try:
        resource.setrlimit(resource.RLIMIT_FSIZE, (1024, limits[1]))
        with pytest.raises(TrackingStoreError) as failed:
            tracker.log_artifact(record)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, limits)
        signal.signal(signal.SIGXFSZ, previous)
    message = str(failed.value)
    assert message.startswith("the MLflow artifact store failed: File too large"), message
    assert str(root / "mlartifacts" / tracker.run_id) in message  # where, not the source
    assert "\n" not in message
    assert tracker.active
    tracker.finish("FAILED")
    assert read_run(tracker.uri, tracker.run_id)["status"] == "FAILED"
