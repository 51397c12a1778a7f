"""Reading runs back from an MLflow store, and amending finished ones, for analysis, searches,
studies and tests.

The rest of privzo gets plain records (:class:`RunRecord`, :class:`StoredRun`) from here, so the
MLflow client stays in ``privzo.tracking``.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict

from privzo.tracking.base import RunStatus
from privzo.tracking.store import join_split_params, open_client

if TYPE_CHECKING:
    import pandas as pd
    from mlflow.tracking import MlflowClient

__all__ = [
    "RunRecord",
    "StoredRun",
    "end_runs",
    "find_runs",
    "metric_history",
    "read_run",
    "read_table",
    "set_run_tags",
]

MAX_RESULTS = 50000


@dataclass(frozen=True)
class StoredRun:
    """One run as the store holds it: latest metrics, params (split values rejoined), tags."""

    run_id: str
    status: str
    tags: dict[str, str]
    metrics: dict[str, float]
    params: dict[str, str]


def find_runs(uri: str, experiment: str, filter_string: str = "") -> list[StoredRun] | None:
    """The runs of ``experiment`` matching MLflow's ``filter_string``; None if there is no such
    experiment."""
    client = open_client(uri)
    found = client.get_experiment_by_name(experiment)
    if found is None:
        return None
    runs = client.search_runs(
        [found.experiment_id], filter_string=filter_string, max_results=MAX_RESULTS
    )
    return [
        StoredRun(
            run_id=run.info.run_id,
            status=run.info.status,
            tags=dict(run.data.tags),
            metrics=dict(run.data.metrics),
            params=join_split_params(run.data.params),
        )
        for run in runs
    ]


def set_run_tags(uri: str, run_id: str, tags: Mapping[str, str]) -> None:
    """Add or overwrite tags of a finished run (a study marks the search trial it stands on)."""
    client = open_client(uri)
    for key, value in tags.items():
        client.set_tag(run_id, key, value)


def end_runs(
    uri: str, run_ids: Iterable[str], status: RunStatus, *, release_timing: bool = True
) -> None:
    """Set the runs' final status (a search ends its stopped or interrupted trials KILLED).
    ``release_timing=False`` (private trials): each ends at its own start, which is the public
    time (``privzo.tracking.clock``), not when the search closed it."""
    client = open_client(uri)
    for run_id in run_ids:
        end_time = None if release_timing else client.get_run(run_id).info.start_time
        client.set_terminated(run_id, status=status, end_time=end_time)


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
