"""MLflow backend for :class:`~privzo.tracking.base.Tracker`, built on ``MlflowClient``.

Why the client API and not ``mlflow.start_run`` / ``mlflow.log_metric``: the fluent API keeps the
active run and tracking URI in process-global state (and reads ``MLFLOW_*`` environment
variables), which breaks as soon as two runs share a process (Tune trials, tests). Here every
run owns its client and URI explicitly.

``import mlflow`` costs about 2 s, so it is deferred until a tracker actually starts.
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import logging
import os
import posixpath
import socket
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, TypeVar
from urllib.parse import unquote, urlsplit

from privzo.tracking.base import (
    DatasetLineage,
    RunStatus,
    Tracker,
    check_artifact_file,
    flatten_params,
)
from privzo.tracking.clock import PUBLIC_TIME_MS, PUBLIC_UTC_TIME_CREATED, stamp_public_time

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

PARAM_VALUE_LIMIT = 6000
"""MLflow's maximum param value length (``MAX_PARAM_VAL_LENGTH``). Longer values are split."""
PARAM_KEY_LIMIT = 250
"""MLflow's maximum param/metric/tag key length."""
PART_MARKER = "/part"
"""Suffix of continuation keys for split params: ``key``, ``key/part2``, ``key/part3``, ..."""

DATASET_CONTEXT_TAG = "mlflow.data.context"  # MLflow's tag for a dataset's role in a run
FIGURE_DPI = 120
"""Resolution of logged figures (the report's PNGs use the same)."""
_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
_METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_STATUSES: tuple[RunStatus, ...] = ("FINISHED", "FAILED", "KILLED")
_REMOTE_SCHEMES = ("http://", "https://", "databricks")

_T = TypeVar("_T")

logger = logging.getLogger(__name__)


def _installed(*packages: str) -> list[str]:
    """Pins of the installed ``packages`` (a model's requirements, stated, not inferred)."""
    return [f"{name}=={importlib.metadata.version(name)}" for name in packages]


def default_tracking_uri(output_root: Path) -> str:
    """Local sqlite store ``<output_root>/mlflow.db`` with an absolute path.

    Absolute because Ray jobs and Tune trials change the working directory; sqlite is MLflow 3's
    default store (the file store is legacy).
    """
    return f"sqlite:///{(Path(output_root).resolve() / 'mlflow.db').as_posix()}"


def default_artifact_location(output_root: Path) -> str:
    """Absolute ``file://`` URI of ``<output_root>/mlartifacts``.

    MLflow's own default artifact root is relative to the working directory at experiment
    creation, which scatters artifacts when workers run elsewhere.
    """
    return (Path(output_root).resolve() / "mlartifacts").as_uri()


def split_param(key: str, value: str, limit: int = PARAM_VALUE_LIMIT) -> list[tuple[str, str]]:
    """Split an over-long param value into ``key``, ``key/part2``, ... chunks of ``limit`` chars.

    MLflow would otherwise truncate silently (or raise, depending on an environment variable);
    splitting keeps the value exact and deterministic. :func:`join_split_params` reverses it.
    """
    if len(key) > PARAM_KEY_LIMIT:
        raise ValueError(f"param key longer than {PARAM_KEY_LIMIT} chars: {key[:80]}...")
    chunks = [value[i : i + limit] for i in range(0, len(value), limit)] or [""]
    return [(key if i == 0 else f"{key}{PART_MARKER}{i + 1}", c) for i, c in enumerate(chunks)]


def join_split_params(params: Mapping[str, str]) -> dict[str, str]:
    """Reassemble values split by :func:`split_param`; other params pass through unchanged."""
    joined = dict(params)
    for key in sorted(params, key=_part_sort_key):
        base, _, index = key.rpartition(PART_MARKER)
        if base in params and index.isdigit() and int(index) >= 2:
            joined[base] += joined.pop(key)
    return joined


def _part_sort_key(key: str) -> tuple[str, int]:
    base, _, index = key.rpartition(PART_MARKER)
    return (base, int(index)) if index.isdigit() else (key, 0)


def _sqlite_path(uri: str) -> Path | None:
    """Database file of a ``sqlite:///`` URI, or ``None`` for other stores / in-memory."""
    if not uri.startswith("sqlite:///"):
        return None
    path = uri[len("sqlite:///") :].split("?", 1)[0]
    return None if path in ("", ":memory:") else Path(path)


def _is_local_store(uri: str) -> bool:
    """Stores whose default artifact root would be resolved against the current directory."""
    return not uri.startswith(_REMOTE_SCHEMES)


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise first-time initialisation of a local sqlite store across processes.

    MLflow runs its schema migrations when it finds an empty database; several processes doing
    so at once (Tune trials starting together) fail with "table ... already exists" and leave the
    database at a half-migrated version that no later process can open. An advisory ``flock`` on
    ``<db>.lock`` makes the first process migrate while the others wait.
    """
    db = _sqlite_path(uri)
    try:
        import fcntl
    except ImportError:  # not POSIX: no cross-process lock available
        fcntl = None  # type: ignore[assignment]
    if db is None or fcntl is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with open(db.with_name(db.name + ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


SERVER_PROBE_TIMEOUT_S = 10.0


def check_server_reachable(uri: str, timeout: float = SERVER_PROBE_TIMEOUT_S) -> None:
    """For an http(s) tracking server, one TCP connection within ``timeout`` seconds.

    MLflow's client retries a refused or silent server with backoff for about four minutes
    (273 s measured against a closed local port) before it reports; this probe fails in at most
    ``timeout`` seconds, before any model loads. Other stores (sqlite, file) are not probed.
    """
    parsed = urlsplit(uri)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        return
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    try:
        with socket.create_connection((parsed.hostname, port), timeout=timeout):
            pass
    except OSError as error:
        raise ConnectionError(
            f"tracking server {parsed.hostname}:{port} is not reachable within {timeout:g} s "
            f"({error})"
        ) from None


def check_store_writable(uri: str) -> None:
    """For a local sqlite store, the database file opens for writing and its directory takes
    new files (sqlite's journal and the store's lock file), without changing either.

    MLflow opens a read-only store without complaint and reads its experiment; only creating
    the run fails, after the model and data have loaded. Other stores are not probed.
    """
    db = _sqlite_path(uri)
    if db is None:
        return
    directory = db.parent
    while not directory.exists() and directory != directory.parent:
        directory = directory.parent  # the store's directory is created on first use
    try:
        if db.exists():
            os.close(os.open(db, os.O_RDWR))
        with tempfile.TemporaryFile(dir=directory):
            pass
    except OSError as error:
        raise PermissionError(
            f"the sqlite store {db} cannot be written ({error.strerror}: {error.filename})"
        ) from None


def open_client(uri: str) -> MlflowClient:
    """``MlflowClient`` for ``uri``, safe to call from several processes on a fresh store."""
    from mlflow.tracking import MlflowClient

    with _store_lock(uri):
        return MlflowClient(tracking_uri=uri)


def get_or_create_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """Id of experiment ``name``, creating it if missing.

    Handles the race where another process creates the same experiment between our lookup and
    our create (the store answers ``RESOURCE_ALREADY_EXISTS``): we then use theirs. An existing
    experiment keeps its own artifact location.
    """
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(name, artifact_location=artifact_location)
        except MlflowException as err:
            if err.error_code != "RESOURCE_ALREADY_EXISTS":
                raise
            experiment = client.get_experiment_by_name(name)
            if experiment is None:
                raise
    if experiment.lifecycle_stage != "active":
        raise ValueError(
            f"MLflow experiment {name!r} is deleted; restore it or choose another name"
        )
    return experiment.experiment_id


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowTracker(Tracker):
    """A single MLflow run with buffered metric logging.

    Metrics are buffered and sent with ``log_batch`` every ``flush_every`` points, when
    ``flush_interval_s`` has passed since the last send (so the UI stays live when steps are
    slow), and on :meth:`flush` / :meth:`finish`: one ``log_metric`` call costs about 20 ms on
    sqlite, a 50-point batch about 100 ms. A failed send keeps the points buffered.

    ``release_timing=False`` (private work, whose step times follow the sampled batches): the
    run starts and ends at the public time (``privzo.tracking.clock``), each metric is stamped
    with it plus its step number in ms, every ``MLmodel`` carries it as its creation time, and
    what the run writes into a local artifact store has it as its modification time, so nothing
    in the record measures how long steps, windows or the run took.
    """

    def __init__(
        self,
        *,
        uri: str | None,
        experiment: str,
        output_root: Path,
        run_name: str | None,
        tags: Mapping[str, str] | None = None,
        flush_every: int = 100,
        flush_interval_s: float = 30.0,
        release_timing: bool = True,
    ) -> None:
        if flush_every < 1:
            raise ValueError("flush_every must be at least 1")
        self.output_root = Path(output_root).resolve()
        self.uri = uri or default_tracking_uri(self.output_root)
        self.experiment = experiment
        self.run_name = run_name
        self.artifact_location = (
            default_artifact_location(self.output_root) if _is_local_store(self.uri) else None
        )
        self._tags = {k: str(v) for k, v in (tags or {}).items()}
        self._flush_every = flush_every
        self._flush_interval_s = flush_interval_s
        self.release_timing = release_timing
        self._start_ms: int | None = None  # the run's start: the clock of a timing-free record
        self._artifact_uri: str | None = None
        self._client: MlflowClient | None = None
        self._run_id: str | None = None
        self.experiment_id: str | None = None
        self._active = False
        self._buffer: list[Metric] = []
        self._last_flush = time.monotonic()

    @property
    def run_id(self) -> str | None:
        return self._run_id

    @property
    def active(self) -> bool:
        return self._active

    def connect(self) -> None:
        """Open the store and get or create the experiment, without creating a run.

        Lets a caller find out that the store is unreachable before any compute starts.
        """
        if self._client is None:
            check_server_reachable(self.uri)
            check_store_writable(self.uri)
            client = open_client(self.uri)
            self.experiment_id = get_or_create_experiment(
                client, self.experiment, self.artifact_location
            )
            self._client = client

    def start(self) -> None:
        """Open the store, get or create the experiment and create a RUNNING run."""
        if self._run_id is not None:
            raise RuntimeError(f"tracker already started run {self._run_id}")
        self.connect()
        client = self._client
        assert client is not None and self.experiment_id is not None
        start_time = None if self.release_timing else PUBLIC_TIME_MS  # None: MLflow's clock
        run = client.create_run(
            self.experiment_id, start_time=start_time, run_name=self.run_name, tags=self._tags
        )
        self._client, self._run_id, self._active = client, run.info.run_id, True
        self._start_ms, self._artifact_uri = run.info.start_time, run.info.artifact_uri
        self._last_flush = time.monotonic()

    def attach(self, run_id: str) -> None:
        """Log into an existing run instead of creating one: a resumed search's or study's
        parent (marked RUNNING again), or the run a distributed run's launcher created, which
        rank 0 reaches this way (another process owns and ends it)."""
        if self._run_id is not None:
            raise RuntimeError(f"tracker already holds run {self._run_id}")
        self.connect()
        client = self._client
        assert client is not None
        info = client.get_run(run_id).info
        if info.status != "RUNNING":
            client.update_run(run_id, status="RUNNING")
        self._run_id, self._active, self._start_ms = run_id, True, info.start_time
        self._artifact_uri = info.artifact_uri
        self._last_flush = time.monotonic()

    def _require_active(self) -> tuple[MlflowClient, str]:
        if not self._active or self._client is None or self._run_id is None:
            raise RuntimeError("tracker is not active: call start() (or use `with`) first")
        return self._client, self._run_id

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        client, run_id = self._require_active()
        flat = flatten_params(params)
        entries = [Param(k, v) for key, value in flat.items() for k, v in split_param(key, value)]
        for chunk in _chunks(entries, _PARAMS_PER_BATCH):
            client.log_batch(run_id, params=chunk, synchronous=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        from mlflow.entities import Metric

        self._require_active()
        timestamp = self._timestamp(step)
        self._buffer.extend(
            Metric(_metric_key(k), float(v), timestamp, int(step)) for k, v in metrics.items()
        )
        overdue = time.monotonic() - self._last_flush >= self._flush_interval_s
        if len(self._buffer) >= self._flush_every or overdue:
            self.flush()

    def _timestamp(self, step: int) -> int:
        if self.release_timing or self._start_ms is None:
            return int(time.time() * 1000)
        return self._start_ms + int(step)

    @property
    def buffered(self) -> int:
        """Number of metric points not yet sent."""
        return len(self._buffer)

    def flush(self) -> None:
        """Send buffered metrics (in chunks of MLflow's per-request limit)."""
        if self._buffer:
            client, run_id = self._require_active()
            while self._buffer:
                chunk = self._buffer[:_METRICS_PER_BATCH]
                client.log_batch(run_id, metrics=chunk, synchronous=True)
                del self._buffer[: len(chunk)]
        self._last_flush = time.monotonic()

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file to ``artifact_path`` (run root by default) or a directory as
        ``artifact_path or <dir name>``."""
        client, run_id = self._require_active()
        path = Path(path)
        if path.is_dir():
            client.log_artifacts(run_id, str(path), artifact_path=artifact_path or path.name)
        elif path.is_file():
            client.log_artifact(run_id, str(path), artifact_path=artifact_path)
        else:
            raise FileNotFoundError(path)
        self._stamp_artifacts()

    def log_model(self, data_dir: Path, loader_module: str, name: str = "model") -> str:
        """A pyfunc model (MLflow's ``loader_module`` form) saved beside the run's artifacts
        as ``<name>/``: ``mlflow.pyfunc.load_model(uri)`` imports ``loader_module`` and calls
        its ``_load_pyfunc`` on the data. Saved with the client, not the fluent API (which
        would start a run of its own), and with privzo's own requirement, so MLflow does not
        load the model to infer one."""
        import mlflow.pyfunc

        from privzo import __version__

        client, run_id = self._require_active()
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / name
            mlflow.pyfunc.save_model(
                path=str(local),
                loader_module=loader_module,
                data_path=str(data_dir),
                pip_requirements=[f"privzo=={__version__}"],
            )
            self._stamp_model(local)
            client.log_artifacts(run_id, str(local), artifact_path=name)
        self._stamp_artifacts()
        return f"runs:/{run_id}/{name}"

    def log_adapter_model(
        self, model: Any, tokenizer: Any, task: str, base_path: str | None, name: str = "adapter"
    ) -> str | None:
        """The transformers flavor's PEFT form: ``peft/`` holds the adapter, the base is
        referenced (``base_model_path`` for a local one). Saved beside the run's artifacts with
        the client, as ``log_model`` does, with explicit requirements so MLflow does not probe
        the environment. ``mlflow.transformers.load_model(uri)`` returns the PeftModel."""
        import mlflow.transformers
        from mlflow.exceptions import MlflowException

        client, run_id = self._require_active()
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / name
            try:
                mlflow.transformers.save_model(
                    {"model": model, "tokenizer": tokenizer},
                    path=str(local),
                    task=task,
                    base_model_path=base_path,
                    pip_requirements=_installed("torch", "transformers", "peft"),
                )
            except (MlflowException, OSError, ValueError) as error:
                logger.warning("the adapter was not logged as an MLflow model: %s", error)
                return None
            self._stamp_model(local)
            client.log_artifacts(run_id, str(local), artifact_path=name)
        self._stamp_artifacts()
        return f"runs:/{run_id}/{name}"

    def log_table(self, table: pd.DataFrame, artifact_file: str) -> None:
        """``MlflowClient.log_table``: a ``{columns, data}`` JSON artifact the UI lists as a
        table (and can compare across runs). Logging the same name again replaces the table:
        MLflow itself would append the rows (a resumed search would list each trial twice), so
        the second time the file is rewritten in MLflow's layout, whose table tag is set."""
        client, run_id = self._require_active()
        path = check_artifact_file(artifact_file, ".json")
        folder = posixpath.dirname(path) or None
        if path not in {info.path for info in client.list_artifacts(run_id, folder)}:
            client.log_table(run_id, table, path)
        else:
            with tempfile.TemporaryDirectory() as scratch:
                local = Path(scratch) / posixpath.basename(path)
                table.to_json(local, orient="split", index=False, date_format="iso")
                client.log_artifact(run_id, str(local), artifact_path=folder)
        self._stamp_artifacts()

    def log_figure(self, figure: Any, artifact_file: str) -> None:
        """``MlflowClient.log_figure``: the figure saved as a PNG artifact, at the report's dpi."""
        client, run_id = self._require_active()
        path = check_artifact_file(artifact_file, ".png")
        client.log_figure(run_id, figure, path, save_kwargs={"dpi": FIGURE_DPI})
        self._stamp_artifacts()

    def _stamp_model(self, local: Path) -> None:
        """Without released timing, the saved model's ``MLmodel`` says it was created at the
        public time, not when training ended."""
        if self.release_timing:
            return
        import yaml

        path = local / "MLmodel"
        data = yaml.safe_load(path.read_text())
        data["utc_time_created"] = PUBLIC_UTC_TIME_CREATED
        path.write_text(yaml.safe_dump(data, default_flow_style=False))  # as MLflow writes it

    def _stamp_artifacts(self) -> None:
        """Without released timing, give what this run holds in a local artifact store the public
        time: MLflow keeps a logged file's modification time (``shutil.copystat``) and creates
        folders on the clock. The run's folder and the experiment's are stamped too (adding an
        entry touches a folder). A remote store stamps uploads with its own clock."""
        root = None if self.release_timing else _local_path(self._artifact_uri)
        if root is None or not root.is_dir():
            return
        stamp_public_time(root)
        if root.name == "artifacts" and root.parent.name == self._run_id:
            for folder in (root.parent, root.parent.parent):  # not the other runs under them
                stamp_public_time(folder, recursive=False)

    def log_inputs(self, datasets: Sequence[DatasetLineage]) -> None:
        """``MlflowClient.log_inputs`` with entities built here, so MLflow computes no digest or
        schema from data: the digest is the lineage's hash of its public identifiers."""
        from mlflow.entities import Dataset, DatasetInput, InputTag

        client, run_id = self._require_active()
        entries = [
            DatasetInput(
                Dataset(
                    name=item.name,
                    digest=item.digest,
                    source_type=item.source_type,
                    source=json.dumps(dict(item.source), sort_keys=True),
                ),
                tags=[InputTag(DATASET_CONTEXT_TAG, item.context)],
            )
            for item in datasets
        ]
        if entries:
            client.log_inputs(run_id, datasets=entries)

    def set_tags(self, tags: Mapping[str, str]) -> None:
        from mlflow.entities import RunTag

        client, run_id = self._require_active()
        entries = [RunTag(k, str(v)) for k, v in tags.items()]
        for chunk in _chunks(entries, _PARAMS_PER_BATCH):
            client.log_batch(run_id, tags=chunk, synchronous=True)

    def finish(self, status: RunStatus = "FINISHED") -> None:
        """Flush and end the run; if the final flush fails the run is marked FAILED."""
        if status not in _STATUSES:
            raise ValueError(f"status must be one of {_STATUSES}, got {status!r}")
        if not self._active:
            return
        try:
            self.flush()
        except BaseException:
            self._terminate("FAILED")
            raise
        self._terminate(status)

    def _terminate(self, status: RunStatus) -> None:
        client, run_id = self._require_active()
        self._active = False
        end_time = None if self.release_timing else self._start_ms  # None: MLflow's clock
        client.set_terminated(run_id, status=status, end_time=end_time)


def _local_path(uri: str | None) -> Path | None:
    """The folder of a local artifact URI (``file://`` or a plain path); None for others."""
    if not uri:
        return None
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(uri) if parts.scheme == "" else None


def _metric_key(key: str) -> str:
    """Reject bad keys when logged, not at the next flush where they would block the buffer."""
    if not isinstance(key, str) or not key or len(key) > PARAM_KEY_LIMIT:
        raise ValueError(f"metric key must be a non-empty str <= {PARAM_KEY_LIMIT} chars: {key!r}")
    return key


class RunRecord(TypedDict):
    """Everything :func:`read_run` returns about one run."""

    run_id: str
    run_name: str
    experiment_id: str
    status: str
    start_time: int | None
    end_time: int | None
    artifact_uri: str
    params: dict[str, str]
    metrics: dict[str, float]
    history: dict[str, list[tuple[int, float]]]
    tags: dict[str, str]
    artifacts: list[str]


def read_run(uri: str, run_id: str) -> RunRecord:
    """Read back one run: params (split values rejoined), latest metrics, per-key histories
    sorted by step then time, tags (including MLflow's ``mlflow.*`` system tags) and the
    artifact files as paths relative to the run's artifact root."""
    client = open_client(uri)
    run = client.get_run(run_id)
    history = {key: _history(client, run_id, key) for key in run.data.metrics}
    return RunRecord(
        run_id=run.info.run_id,
        run_name=run.info.run_name,
        experiment_id=run.info.experiment_id,
        status=run.info.status,
        start_time=run.info.start_time,
        end_time=run.info.end_time,
        artifact_uri=run.info.artifact_uri,
        params=join_split_params(run.data.params),
        metrics=dict(run.data.metrics),
        history=history,
        tags=dict(run.data.tags),
        artifacts=sorted(_list_artifacts(client, run_id)),
    )


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    points = sorted(client.get_metric_history(run_id, key), key=lambda m: (m.step, m.timestamp))
    return [(m.step, m.value) for m in points]


def metric_history(uri: str, run_id: str, key: str) -> list[tuple[int, float]]:
    """(step, value) of one metric of one run, by step then time."""
    return _history(open_client(uri), run_id, key)


def read_table(uri: str, run_id: str, artifact_file: str) -> pd.DataFrame:
    """A table logged with :meth:`MlflowTracker.log_table`, read back from the run's artifacts
    (MLflow's ``load_table`` would go through the process-global tracking URI)."""
    import pandas as pd

    client = open_client(uri)
    with tempfile.TemporaryDirectory() as scratch:
        local = client.download_artifacts(run_id, artifact_file, scratch)
        data = json.loads(Path(local).read_text())
    return pd.DataFrame(data["data"], columns=data["columns"])


def _list_artifacts(client: MlflowClient, run_id: str, path: str | None = None) -> list[str]:
    files: list[str] = []
    for info in client.list_artifacts(run_id, path):
        if info.is_dir:
            files.extend(_list_artifacts(client, run_id, info.path))
        else:
            files.append(info.path)
    return files
