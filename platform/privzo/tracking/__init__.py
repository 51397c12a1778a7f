"""Experiment tracking: one :class:`Tracker` interface, backends chosen by name.

Importing this package does not import MLflow (slow to import); that happens when a run starts.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from privzo.tracking.base import (
    DatasetLineage,
    MetricPoint,
    NoopTracker,
    RunStatus,
    Tracker,
    TrackingRunLostError,
    TrackingStoreError,
    flatten_params,
    is_metric_point,
)
from privzo.tracking.blank_store import keep_blank_stores_in
from privzo.tracking.mlflow_tracker import MlflowTracker
from privzo.tracking.reader import (
    RunRecord,
    StoredRun,
    end_runs,
    find_runs,
    metric_history,
    read_run,
    read_table,
    set_run_tags,
)
from privzo.tracking.store import (
    check_server_reachable,
    check_store_writable,
    default_artifact_location,
    default_tracking_uri,
    get_or_create_experiment,
    join_split_params,
    open_client,
    split_param,
    ui_address,
    ui_lines,
)

TRACKERS: dict[str, type[Tracker]] = {"mlflow": MlflowTracker, "none": NoopTracker}
"""Backend name (as written in configs) -> tracker class."""


def make_tracker(
    backend: str,
    *,
    uri: str | None,
    experiment: str,
    output_root: Path,
    run_name: str | None,
    tags: Mapping[str, str] | None = None,
    release_timing: bool = True,
) -> Tracker:
    """Build (but do not start) the tracker for ``backend``.

    ``uri=None`` means a local sqlite store under ``output_root`` (see
    :func:`default_tracking_uri`); the library never reads ``MLFLOW_TRACKING_URI`` itself, the
    caller decides. ``release_timing=False`` (private work): no record carries wall-clock
    time, only the public one of ``privzo.tracking.clock`` (see :class:`MlflowTracker`).
    """
    try:
        cls = TRACKERS[backend]
    except KeyError:
        allowed = ", ".join(sorted(TRACKERS))
        raise ValueError(f"unknown tracking backend {backend!r}; allowed: {allowed}") from None
    return cls(  # type: ignore[call-arg]
        uri=uri,
        experiment=experiment,
        output_root=output_root,
        run_name=run_name,
        tags=tags,
        release_timing=release_timing,
    )


__all__ = [
    "TRACKERS",
    "DatasetLineage",
    "MetricPoint",
    "MlflowTracker",
    "NoopTracker",
    "RunRecord",
    "RunStatus",
    "StoredRun",
    "Tracker",
    "TrackingRunLostError",
    "TrackingStoreError",
    "check_server_reachable",
    "check_store_writable",
    "default_artifact_location",
    "default_tracking_uri",
    "end_runs",
    "find_runs",
    "flatten_params",
    "get_or_create_experiment",
    "is_metric_point",
    "join_split_params",
    "keep_blank_stores_in",
    "make_tracker",
    "metric_history",
    "open_client",
    "probe_tracking_store",
    "read_run",
    "read_table",
    "set_run_tags",
    "split_param",
    "ui_address",
    "ui_lines",
]


def connect_tracker(tracker: Tracker, uri: str | None) -> Tracker:
    """Reach the tracker's store now, so an unreachable or bad store fails before compute."""
    from privzo.section import ConfigError

    try:
        tracker.connect()
    except Exception as error:  # MLflow raises many types for an unreachable or bad store
        raise ConfigError(
            f"tracking.uri={uri!r}: cannot open the tracking store "
            f"({type(error).__name__}: {error}); fix the URI or set tracking.backend=none"
        ) from None
    return tracker


def probe_tracking_store(backend: str, uri: str | None, output_root: Path) -> None:
    """Checked before any model loads: an http(s) tracking server takes a connection within
    10 s (MLflow's own client retries for minutes before it reports), and a sqlite store
    (``uri`` or, when None, the default one under ``output_root``) can be written."""
    from privzo.section import ConfigError

    if backend != "mlflow":
        return
    store = uri or default_tracking_uri(output_root)
    try:
        check_server_reachable(store)
        check_store_writable(store)
    except (ConnectionError, PermissionError) as error:
        raise ConfigError(
            f"tracking.uri={uri!r}: {error}; fix the URI or its permissions, or set "
            "tracking.backend=none"
        ) from None
