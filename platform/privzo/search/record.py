"""What a search leaves behind: ``trials.parquet``, ``search_summary.json`` and the parent
MLflow run's metrics, tags and artifacts, from Tune's results and the trials' run summaries."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import writes_trajectory
from privzo.rundir import SUMMARY_FILE as RUN_SUMMARY_FILE
from privzo.rundir import read_json_object, write_atomically, write_json_atomically
from privzo.search.plan import SearchPlan
from privzo.search.ray_adapter import result_grid_trials
from privzo.search.summary import SCORE, SearchBounds, SearchSummary, TrialRow
from privzo.search.trial import TRIALS_DIR, restarts
from privzo.tracking import Tracker, end_runs, find_runs
from privzo.tracking.tags import BEST_MODEL_URI, PARENT_RUN, TRIAL

TRIALS_FILE = "trials.parquet"
SUMMARY_FILE = "search_summary.json"
SEARCH_CONFIG_FILE = "search_config.yaml"
TRIALS_TABLE_ARTIFACT = "trials.json"  # the trials as an MLflow table (log_table), for the UI


def record_search(
    plan: SearchPlan, results: Any, output_dir: Path, tracker: Tracker
) -> SearchSummary:
    """trials.parquet, the summary and the parent run's metrics, tags and artifacts."""
    import pandas as pd

    # ResultGrid keeps Tune's trial objects (id, config) in the order of its results; the
    # statuses come from the saved experiment state, which is what a resume starts from (after
    # Ctrl+C the in-memory trials all read TERMINATED)
    trials = result_grid_trials(results)
    saved = _saved_statuses(results.experiment_path)
    rows = [
        _trial_row(trial, saved.get(trial.trial_id, trial.status), result, output_dir, plan)
        for trial, result in zip(trials, results, strict=True)
    ]
    rows.sort(key=lambda row: row["trial_id"])
    # written whole or not at all: a search killed while writing keeps the last complete table
    write_atomically(output_dir / TRIALS_FILE, pd.DataFrame(rows).to_parquet(index=False))
    stopped = {row["trial_id"] for row in rows if row["status"] == "stopped"}
    _close_stopped_children(tracker, plan, stopped)
    trials_run = sum(_started(row, output_dir) for row in rows)
    restarted = sum(row["restarts"] for row in rows)
    best = best_trial(rows, plan.search.selection.mode)
    summary = SearchSummary(
        interrupted=any(row["status"] in UNFINISHED for row in rows),
        trials_run=trials_run,
        trials_finished=sum(row["status"] == "finished" for row in rows),
        restarts=restarted,
        best_trial=best,
        space=list(plan.search.space),
        metric=next((row["metric"] for row in rows if row["metric"]), None),
        bounds=SearchBounds(**plan.bounds(trials_run=trials_run, restarts=restarted)),
        best_model_uri=best_model_uri(rows, best, plan),
        trials=rows,
    )
    record = summary.to_dict()
    write_json_atomically(output_dir / SUMMARY_FILE, record)
    log_search_parent(tracker, record, output_dir)
    return summary


# Tune statuses of a trial the search has not finished with (an interrupted search)
UNFINISHED = ("pending", "running", "paused")
_RUN_KEYS = (
    "metric",
    "metric_after",
    "metric_before",
    "epsilon",
    "delta",
    "replace_one_epsilon",
    "replace_one_delta",
    "noise_multiplier",
    "sample_rate",
    "steps",
    "peak_memory_mb",
    "mean_step_time_s",
    "wall_time_s",
    "tracking_run_id",
    "selection_releases",
)


def _started(row: TrialRow, output_dir: Path) -> bool:
    """Whether a trial counts in the search's composition: it ran, or Tune lists it as pending
    again after an interrupt while an attempt's records are on disk (what it released composes
    whether or not it finished)."""
    return row["status"] != "pending" or (output_dir / TRIALS_DIR / row["trial_id"]).exists()


def _saved_statuses(experiment_path: str) -> dict[str, str]:
    from ray.tune import ExperimentAnalysis

    return {trial.trial_id: trial.status for trial in ExperimentAnalysis(experiment_path).trials}


def _trial_row(
    trial: Any, status: str, result: Any, output_dir: Path, plan: SearchPlan
) -> TrialRow:
    """One trials.parquet row: the point, the trial's layout, the run's summary fields and how
    the trial ended."""
    trial_dir = output_dir / TRIALS_DIR / trial.trial_id
    summary = read_json_object(trial_dir / RUN_SUMMARY_FILE) or {}
    row: TrialRow = {"trial_id": trial.trial_id, "status": _status(status, summary)}
    row.update(trial.config["point"])
    # the layout is not searchable: every trial runs the base's (and overrides') parallel keys
    parallel = plan.base.parallel
    row.update({"strategy": parallel.strategy, "workers": parallel.workers})
    row.update({key: summary.get(key) for key in _RUN_KEYS})
    row[SCORE] = summary.get(SCORE, (result.metrics or {}).get(SCORE))
    row["restarts"] = restarts(trial_dir)
    return row


def _status(tune_status: str, summary: dict[str, Any]) -> str:
    if summary and tune_status in ("TERMINATED", "ERROR"):
        return "finished"
    if tune_status == "TERMINATED":  # ended without a summary: stopped early by the scheduler
        return "stopped"
    return tune_status.lower()  # error, or pending / running / paused when interrupted


def best_trial(rows: list[TrialRow], mode: str) -> str | None:
    """The finished trial with the best selection score (never the test metric)."""
    scored = [row for row in rows if row["status"] == "finished" and row[SCORE] is not None]
    if not scored:
        return None
    pick = max if mode == "max" else min
    return str(pick(scored, key=lambda row: row[SCORE])["trial_id"])


def _close_stopped_children(tracker: Tracker, plan: SearchPlan, stopped: set[str]) -> None:
    """End as KILLED the child runs of trials that did not finish on their own: still RUNNING
    (an interrupted attempt) or FAILED because the scheduler stopped them mid-run."""
    uri = getattr(tracker, "uri", None)
    if uri is None or tracker.run_id is None:
        return
    query = f"tags.{PARENT_RUN} = '{tracker.run_id}'"
    children = find_runs(uri, plan.base.tracking.experiment, query) or []
    unfinished = [
        child.run_id
        for child in children
        if child.status == "RUNNING"
        or (child.status == "FAILED" and child.tags.get(TRIAL) in stopped)
    ]
    end_runs(uri, unfinished, "KILLED", release_timing=plan.base.releases_diagnostics)


def best_model_uri(rows: list[TrialRow], best: str | None, plan: SearchPlan) -> str | None:
    """The best trial's logged model (``runs:/<its run>/model``): runs that keep a trajectory
    log one (the base reference plus the trajectory, rebuilt by replay when loaded)."""
    row = next((row for row in rows if row["trial_id"] == best), {})
    if not row.get("tracking_run_id") or not writes_trajectory(plan.base):
        return None
    return f"runs:/{row['tracking_run_id']}/model"


def log_search_parent(tracker: Tracker, summary: Mapping[str, Any], output_dir: Path) -> None:
    """The search's parent run, from search_summary.json's content: best-trial metrics and
    tags, the trials as an MLflow table (``trials.json``, shown in the UI) and the search's files
    as artifacts."""
    import pandas as pd

    trials: list[TrialRow] = summary["trials"]
    best = next((row for row in trials if row["trial_id"] == summary["best_trial"]), {})
    metrics = {
        "trials_run": summary["trials_run"],
        "trials_finished": summary["trials_finished"],
        "restarts": summary.get("restarts"),
        "best_selection_score": best.get(SCORE),
        "best_metric_after": best.get("metric_after"),
        "end_to_end_epsilon": summary.get("end_to_end_epsilon"),
        "records_epsilon": summary.get("records_epsilon"),
        "per_trial_epsilon": summary.get("per_trial_epsilon"),
    }
    tracker.log_metrics(
        {key: float(value) for key, value in metrics.items() if value is not None}, step=0
    )
    tags = {"privzo.best_trial": str(summary["best_trial"])}
    if best.get("tracking_run_id"):
        tags["privzo.best_run_id"] = str(best["tracking_run_id"])
    if summary.get("best_model_uri"):
        tags[BEST_MODEL_URI] = summary["best_model_uri"]
    if summary.get("guarantee"):
        tags["privzo.guarantee"] = summary["guarantee"]
    tracker.set_tags(tags)
    tracker.log_table(pd.DataFrame(summary["trials"]), TRIALS_TABLE_ARTIFACT)
    for name in (TRIALS_FILE, SUMMARY_FILE, SEARCH_CONFIG_FILE):
        if (output_dir / name).is_file():
            tracker.log_artifact(output_dir / name)
