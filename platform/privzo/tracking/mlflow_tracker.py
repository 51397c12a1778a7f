"""MLflow backend for :class:`~privzo.tracking.base.Tracker`, built on ``MlflowClient``.

Why the client API and not ``mlflow.start_run`` / ``mlflow.log_metric``: the fluent API keeps the
active run and tracking URI in process-global state (and reads ``MLFLOW_*`` environment
variables), which breaks as soon as two runs share a process (Tune trials, tests). Here every
run owns its client and URI explicitly.

``import mlflow`` is slow, so it is deferred until a tracker actually starts.
"""

from __future__ import annotations

import contextlib
import json
import posixpath
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from privzo.tracking.base import (
    DatasetLineage,
    MetricPoint,
    RunStatus,
    Tracker,
    TrackingRunLostError,
    TrackingStoreError,
    check_artifact_file,
    flatten_params,
)
from privzo.tracking.clock import PUBLIC_TIME_MS, stamp_mlmodel
from privzo.tracking.mlflow_models import save_adapter_model, save_pyfunc_model
from privzo.tracking.store import (
    PARAM_KEY_LIMIT,
    artifact_failures,
    check_server_reachable,
    check_store_writable,
    default_artifact_location,
    default_tracking_uri,
    get_or_create_experiment,
    is_local_store,
    open_client,
    split_param,
    stamp_run_artifacts,
    store_failures,
    store_label,
)

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.entities import Metric
    from mlflow.tracking import MlflowClient

__all__ = ["MlflowTracker"]

DATASET_CONTEXT_TAG = "mlflow.data.context"  # MLflow's tag for a dataset's role in a run
FIGURE_DPI = 120
"""Resolution of logged figures (the report's PNGs use the same)."""
_PARAMS_PER_BATCH = 100  # MAX_PARAMS_TAGS_PER_BATCH
_METRICS_PER_BATCH = 1000  # MAX_METRICS_PER_BATCH
_STATUSES: tuple[RunStatus, ...] = ("FINISHED", "FAILED", "KILLED")

_T = TypeVar("_T")


def _chunks(items: Sequence[_T], size: int) -> Iterator[Sequence[_T]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


class MlflowTracker(Tracker):
    """A single MLflow run with buffered metric logging.

    Metrics are buffered and sent with ``log_batch`` every ``flush_every`` points, when
    ``flush_interval_s`` has passed since the last send (so the UI stays live when steps are
    slow), and on :meth:`flush` / :meth:`finish`: every call is a database round trip, so one
    batch costs far less than its points sent one by one. A failed send keeps the points
    buffered.

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
            default_artifact_location(self.output_root) if is_local_store(self.uri) else None
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
        with store_failures(self.uri):
            info = self._find_run(client, run_id).info
            if info.status != "RUNNING":
                client.update_run(run_id, status="RUNNING")
        self._run_id, self._active, self._start_ms = run_id, True, info.start_time
        self._artifact_uri = info.artifact_uri
        self._last_flush = time.monotonic()

    def _find_run(self, client: MlflowClient, run_id: str) -> Any:
        from mlflow.exceptions import MlflowException

        try:
            return client.get_run(run_id)
        except MlflowException as error:
            if error.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
        raise TrackingRunLostError(f"{store_label(self.uri)} holds no run {run_id}")

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
        """Send buffered metrics (in chunks of MLflow's per-request limit); a store that fails
        raises ``TrackingStoreError`` and the points stay buffered."""
        if self._buffer:
            client, run_id = self._require_active()
            with store_failures(self.uri):
                while self._buffer:
                    chunk = self._buffer[:_METRICS_PER_BATCH]
                    client.log_batch(run_id, metrics=chunk, synchronous=True)
                    del self._buffer[: len(chunk)]
        self._last_flush = time.monotonic()

    def unsent(self) -> tuple[MetricPoint, ...]:
        return tuple(MetricPoint(m.key, m.value, m.step) for m in self._buffer)

    def metric_steps(self, key: str) -> frozenset[int]:
        buffered = {m.step for m in self._buffer if m.key == key}
        return self._stored_steps(key) | buffered

    def _stored_steps(self, key: str) -> frozenset[int]:
        client, run_id = self._require_active()
        with store_failures(self.uri):
            return frozenset(m.step for m in client.get_metric_history(run_id, key))

    def log_missing(self, points: Sequence[MetricPoint]) -> int:
        """The points whose (key, step) the run lacks, stamped as ``log_metrics`` stamps them
        and stored now."""
        from mlflow.entities import Metric

        self._require_active()
        held = {key: self._stored_steps(key) for key in {point.key for point in points}}
        missing = [p for p in points if p.step not in held[p.key]]
        self._buffer.extend(
            Metric(p.key, p.value, self._timestamp(p.step), p.step) for p in missing
        )
        self.flush()
        return len(missing)

    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        """Upload a file to ``artifact_path`` (run root by default) or a directory as
        ``artifact_path or <dir name>``."""
        client, run_id = self._require_active()
        path = Path(path)
        if not (path.is_dir() or path.is_file()):
            raise FileNotFoundError(path)
        with artifact_failures(self._artifact_uri):  # a full disk: one line, not shutil's
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=artifact_path or path.name)
            else:
                client.log_artifact(run_id, str(path), artifact_path=artifact_path)
        self._stamp_artifacts()

    def log_model(self, data_dir: Path, loader_module: str, name: str = "model") -> str | None:
        """A pyfunc model saved beside the run's artifacts as ``<name>/`` (see
        :func:`~privzo.tracking.mlflow_models.save_pyfunc_model`). Saved with the client, not
        the fluent API, which would start a run of its own."""
        return self._log_saved(name, lambda path: save_pyfunc_model(path, data_dir, loader_module))

    def log_adapter_model(
        self, model: Any, tokenizer: Any, task: str, base_path: str | None, name: str = "adapter"
    ) -> str | None:
        """The adapter in the transformers flavor's PEFT form, saved beside the run's artifacts
        as ``log_model`` does (see :func:`~privzo.tracking.mlflow_models.save_adapter_model`)."""
        return self._log_saved(
            name, lambda path: save_adapter_model(path, model, tokenizer, task, base_path)
        )

    def _log_saved(self, name: str, save: Callable[[Path], bool]) -> str | None:
        """Save a model into a scratch folder, give its ``MLmodel`` the public time where timing
        is not released, and log it as ``<name>/``; its URI, or None where saving failed."""
        client, run_id = self._require_active()
        with tempfile.TemporaryDirectory() as scratch:
            local = Path(scratch) / name
            if not save(local):
                return None
            if not self.release_timing:
                stamp_mlmodel(local)
            with artifact_failures(self._artifact_uri):
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

    def _stamp_artifacts(self) -> None:
        """Without released timing, what this run holds in a local artifact store gets the
        public time (see :func:`~privzo.tracking.store.stamp_run_artifacts`)."""
        if not self.release_timing and self._run_id is not None:
            stamp_run_artifacts(self._artifact_uri, self._run_id)

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
            with contextlib.suppress(TrackingStoreError):  # the flush's error says it first
                self._terminate("FAILED")
            raise
        self._terminate(status)

    def _terminate(self, status: RunStatus) -> None:
        client, run_id = self._require_active()
        self._active = False
        end_time = None if self.release_timing else self._start_ms  # None: MLflow's clock
        with store_failures(self.uri):
            client.set_terminated(run_id, status=status, end_time=end_time)


def _metric_key(key: str) -> str:
    """Reject bad keys when logged, not at the next flush where they would block the buffer."""
    if not isinstance(key, str) or not key or len(key) > PARAM_KEY_LIMIT:
        raise ValueError(f"metric key must be a non-empty str <= {PARAM_KEY_LIMIT} chars: {key!r}")
    return key
