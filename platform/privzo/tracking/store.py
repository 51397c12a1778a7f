"""Opening an MLflow store: its URIs, the first process's schema migration, probes that fail
fast on a bad store, its failures as one line, experiments, and how param values longer than
MLflow's limit are stored.

``import mlflow`` is slow, so every function here imports it only when called.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from privzo.dirlock import waited_lock
from privzo.tracking.base import TrackingStoreError
from privzo.tracking.blank_store import seed_new_store
from privzo.tracking.clock import stamp_public_time

if TYPE_CHECKING:
    from mlflow.tracking import MlflowClient

__all__ = [
    "PARAM_KEY_LIMIT",
    "artifact_failures",
    "check_server_reachable",
    "check_store_writable",
    "default_artifact_location",
    "default_tracking_uri",
    "get_or_create_experiment",
    "is_local_store",
    "join_split_params",
    "local_artifact_path",
    "open_client",
    "split_param",
    "stamp_run_artifacts",
    "store_failures",
    "store_label",
    "ui_address",
    "ui_lines",
]

PARAM_VALUE_LIMIT = 6000
"""MLflow's maximum param value length (``MAX_PARAM_VAL_LENGTH``). Longer values are split."""
PARAM_KEY_LIMIT = 250
"""MLflow's maximum param/metric/tag key length."""
PART_MARKER = "/part"
"""Suffix of continuation keys for split params: ``key``, ``key/part2``, ``key/part3``, ..."""
_REMOTE_SCHEMES = ("http://", "https://", "databricks")


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


def store_label(uri: str) -> str:
    """How messages name a store: a sqlite store by its file, others by their host alone (a
    server's URI may hold credentials)."""
    db = _sqlite_path(uri)
    if db is not None:
        return f"the MLflow store {db}"
    host = urlsplit(uri).hostname
    return f"the MLflow server at {host}" if host else "the MLflow store"


@contextlib.contextmanager
def store_failures(uri: str) -> Iterator[None]:
    """MLflow's errors from a store that stopped taking writes, as one line naming the store
    and the reason (its innermost error: sqlite's, not the SQL around it)."""
    from mlflow.exceptions import MlflowException

    try:
        yield
    except MlflowException as error:
        raise TrackingStoreError(
            f"{store_label(uri)} failed: {_innermost_reason(error)}"
        ) from error


@contextlib.contextmanager
def artifact_failures(destination: str | None) -> Iterator[None]:
    """A run's artifacts that cannot be copied into its artifact store (a full disk, a folder
    made unwritable) as one line naming the reason and where it was writing: the file where
    the error names it (not the scratch copy it came from), else ``destination``."""
    try:
        yield
    except TrackingStoreError:
        raise
    except OSError as error:
        reason = error.strerror or str(error) or type(error).__name__
        target = error.filename2 or error.filename or destination
        where = f" ({target})" if target else ""
        raise TrackingStoreError(f"the MLflow artifact store failed: {reason}{where}") from error


def _innermost_reason(error: BaseException) -> str:
    """The first line of the error at the bottom of ``error``'s causes (sqlite's "database or
    disk is full" under SQLAlchemy's and MLflow's wrappers, which add SQL and links)."""
    while error.__cause__ is not None or error.__context__ is not None:
        error = error.__cause__ or error.__context__  # type: ignore[assignment]
    return (str(error).strip().splitlines() or [type(error).__name__])[0]


def is_local_store(uri: str) -> bool:
    """Stores whose default artifact root would be resolved against the current directory."""
    return not uri.startswith(_REMOTE_SCHEMES)


def local_artifact_path(uri: str | None) -> Path | None:
    """The folder of a local artifact URI (``file://`` or a plain path); None for others."""
    if not uri:
        return None
    parts = urlsplit(uri)
    if parts.scheme == "file":
        return Path(unquote(parts.path))
    return Path(uri) if parts.scheme == "" else None


def stamp_run_artifacts(artifact_uri: str | None, run_id: str) -> None:
    """Give what run ``run_id`` holds in a local artifact store the public time: MLflow keeps
    a logged file's modification time (``shutil.copystat``) and creates folders on the clock.
    The run's folder and the experiment's are stamped too (adding an entry touches a folder),
    not the other runs under them. A remote store stamps uploads with its own clock."""
    root = local_artifact_path(artifact_uri)
    if root is None or not root.is_dir():
        return
    stamp_public_time(root)
    if root.name == "artifacts" and root.parent.name == run_id:
        for folder in (root.parent, root.parent.parent):
            stamp_public_time(folder, recursive=False)


@contextlib.contextmanager
def _store_lock(uri: str) -> Iterator[None]:
    """Serialise first-time initialisation of a local sqlite store across processes.

    MLflow runs its schema migrations when it finds an empty database; several processes doing
    so at once (Tune trials starting together) fail with "table ... already exists" and leave the
    database at a half-migrated version that no later process can open. An advisory ``flock`` on
    ``<db>.lock`` makes the first process migrate while the others wait.
    """
    db = _sqlite_path(uri)
    if db is None:
        yield
        return
    db.parent.mkdir(parents=True, exist_ok=True)
    with waited_lock(db.with_name(db.name + ".lock")):
        yield


SERVER_PROBE_TIMEOUT_S = 10.0


def check_server_reachable(uri: str, timeout: float = SERVER_PROBE_TIMEOUT_S) -> None:
    """For an http(s) tracking server, one TCP connection within ``timeout`` seconds.

    MLflow's client retries a refused or silent server with backoff for minutes before it
    reports (docs/measurements.md, "Other timings"); this probe fails in at most ``timeout``
    seconds, before any model loads. Other stores (sqlite, file) are not probed.
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
        db = _sqlite_path(uri)
        if db is not None:
            seed_new_store(db)
        return MlflowClient(tracking_uri=uri)


# Earlier MLflow 3 UIs open an experiment in the view its kind tag names; later ones (3.17) open
# the GenAI view unless the address asks for the classic one (CLASSIC_VIEW_QUERY), and an
# experiment reached from the list opens on GenAI's overview unless the browser remembers the
# "Model training" switch. privzo's runs are compared by metrics and tags: the classic view.
EXPERIMENT_KIND_TAG = "mlflow.experimentKind"
CLASSIC_EXPERIMENT_KIND = "custom_model_development"
CLASSIC_VIEW_QUERY = "workflowType=machine_learning"
UI_HOST = "http://127.0.0.1:5000"
"""Where ``mlflow ui`` serves by default."""
# The UI nests child runs under their parent only while the table is sorted by creation time;
# sorted by run name (which starts with the algorithm and ε), a study's cells and a search's
# trials are rows of their own, side by side.
RUNS_BY_NAME_QUERY = "orderByKey=tags.%60mlflow.runName%60&orderByAsc=true"


def ui_address(host: str = UI_HOST, experiment_id: str | None = None) -> str:
    """The address of ``mlflow ui``'s classic view of runs and charts: the experiment list, or
    with ``experiment_id`` that experiment's runs table, its child runs flat (sorted by name)."""
    if experiment_id is None:
        return f"{host}/#/experiments?{CLASSIC_VIEW_QUERY}"
    return f"{host}/#/experiments/{experiment_id}/runs?{CLASSIC_VIEW_QUERY}&{RUNS_BY_NAME_QUERY}"


def ui_lines(uri: str, experiments: list[str]) -> list[str]:
    """How to open ``experiments`` of the store ``uri`` in the MLflow UI: the ``mlflow ui``
    command for a local store (a tracking server serves its UI itself), then each existing
    experiment's runs address (see :func:`ui_address`); nothing for a hosted store."""
    if uri.startswith(("http://", "https://")):
        host, lines = uri.rstrip("/"), []
    elif is_local_store(uri):
        host, lines = UI_HOST, [f"mlflow ui --backend-store-uri {uri}"]
    else:
        return []  # Databricks: its workspace has its own addresses
    client = open_client(uri)
    for name in experiments:
        experiment = client.get_experiment_by_name(name)
        if experiment is not None:
            lines.append(f"  {name}: {ui_address(host, experiment.experiment_id)}")
    return lines


def get_or_create_experiment(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    """Id of experiment ``name``, creating it (in MLflow's classic view) if missing.

    Handles the race where another process creates the same experiment between our lookup and
    our create (the store answers ``RESOURCE_ALREADY_EXISTS``): we then use theirs. An existing
    experiment keeps its own artifact location and view.
    """
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is None:
        try:
            return client.create_experiment(
                name,
                artifact_location=artifact_location,
                tags={EXPERIMENT_KIND_TAG: CLASSIC_EXPERIMENT_KIND},
            )
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
