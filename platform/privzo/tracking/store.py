"""Reading and amending records in an MLflow store, for analysis, searches and studies.

The only module besides ``mlflow_tracker`` that talks to MLflow: the rest of privzo gets plain
records (``StoredRun``) and calls the functions here, so the MLflow client stays in tracking/.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from privzo.tracking.base import RunStatus
from privzo.tracking.mlflow_tracker import join_split_params, metric_history, open_client

__all__ = ["StoredRun", "end_runs", "find_runs", "metric_history", "set_run_tags"]

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
