"""MLflow runs → an Arrow table with one row per finished training run.

Columns come from the tags every privzo run carries (model, model size, task, metric,
algorithm, ε, study cell and seed) and its final metrics, so the tables below never parse
run names.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from privzo.section import ConfigError
from privzo.tracking import StoredRun, find_runs, tags

_TAGS = {
    tags.MODEL: "model",
    tags.MODEL_PARAMETERS: "model_parameters",
    tags.TASK: "task",
    tags.METRIC: "metric",
    tags.ALGORITHM: "algorithm",
    tags.PRIVATE: "private",
    tags.EPSILON: "epsilon",
    tags.STUDY: "study",
    tags.CELL: "cell",
    tags.SEED: "seed",
    tags.DEVICE: "device",
    tags.STRATEGY: "strategy",
}
RUN_NAME_TAG = "mlflow.runName"  # MLflow's own tag for the name the UI shows
_METRICS = (
    "final_epsilon",
    "final_delta",
    "final_noise_multiplier",
    "final_peak_memory_mb",
    "final_step_peak_memory_mb",
    "final_mean_step_time_s",
    "final_wall_time_s",
)
SCHEMA = pa.schema(
    [
        ("run_id", pa.string()),
        ("run_name", pa.string()),
        ("model", pa.string()),
        ("model_parameters", pa.int64()),
        ("task", pa.string()),
        ("metric", pa.string()),
        ("algorithm", pa.string()),
        ("private", pa.bool_()),
        ("epsilon_target", pa.float64()),
        ("study", pa.string()),
        ("cell", pa.string()),
        ("seed", pa.int64()),
        ("steps", pa.int64()),
        ("batch_size", pa.int64()),
        ("directions", pa.int64()),
        ("sampler", pa.string()),
        ("device", pa.string()),  # the device type the model ran on; None where not known
        ("strategy", pa.string()),
        ("dtype", pa.string()),
        ("planned_step_mb", pa.float64()),
        ("metric_before", pa.float64()),
        ("metric_after", pa.float64()),
        *[(name.removeprefix("final_"), pa.float64()) for name in _METRICS],
    ]
)


def load_runs(tracking_uri: str, experiment: str, study: str | None = None) -> pa.Table:
    """Finished privzo training runs of ``experiment`` (only ``study``'s, if given).

    Search and study parent runs are left out; a search's trials are left out too, except the
    best trial a study cell stands on (tagged with the cell).
    """
    query = "attributes.status = 'FINISHED'"
    if study is not None:
        query += f" and tags.`{tags.STUDY}` = '{study}'"
    runs = find_runs(tracking_uri, experiment, query)
    if runs is None:
        raise ConfigError(f"--experiment {experiment!r}: no such experiment in the tracking store")
    rows = [_row(run) for run in runs if _is_training_run(run, study)]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def _is_training_run(run: StoredRun, study: str | None) -> bool:
    found = run.tags
    if tags.ROLE in found or tags.MODEL not in found or tags.AUDIT in found:
        return False  # a search / study parent, an audited run (canaries), not a privzo run
    return study is None or tags.CELL in found


def _row(run: StoredRun) -> dict[str, Any]:
    found, metrics, params = run.tags, run.metrics, run.params
    row: dict[str, Any] = {"run_id": run.run_id, "run_name": found.get(RUN_NAME_TAG)}
    for tag, column in _TAGS.items():
        row[column] = found.get(tag)
    row["model_parameters"] = _int(row["model_parameters"])
    row["private"] = row["private"] == "true"
    row["epsilon_target"] = float(row.pop("epsilon")) if row.get("epsilon") else None
    row["seed"] = _int(row["seed"] if row["seed"] is not None else params.get("seed"))
    row["steps"] = _int(params.get("optimizer.steps"))
    row["batch_size"] = _int(params.get("optimizer.batch_size"))
    row["directions"] = _int(params.get("optimizer.directions_per_step")) or 1
    row["sampler"] = params.get("privacy.sampler")
    row["device"] = row["device"] or _configured_device(params.get("model.device"))
    row["strategy"] = row["strategy"] or params.get("parallel.strategy") or "single"
    row["dtype"] = params.get("model.dtype")
    planned = found.get(tags.PLANNED_STEP_MB)
    row["planned_step_mb"] = float(planned) if planned else None
    metric = row["metric"] or "accuracy"
    row["metric"] = metric
    row["metric_before"] = metrics.get(f"final_{metric}_before")
    row["metric_after"] = metrics.get(f"final_{metric}_after")
    for name in _METRICS:
        row[name.removeprefix("final_")] = metrics.get(name)
    return row


def _configured_device(device: str | None) -> str | None:
    """The device type of a run without the device tag, where its config names one ('auto'
    names none: it depends on the machine)."""
    if device is None or device == "auto":
        return None
    return device.partition(":")[0]


def _int(value: Any) -> int | None:
    return int(value) if value not in (None, "", "None") else None


AUDIT_SCHEMA = pa.schema(
    [
        ("audit_run_id", pa.string()),
        ("audited_run_id", pa.string()),
        ("cell", pa.string()),
        ("model", pa.string()),
        ("model_parameters", pa.int64()),
        ("algorithm", pa.string()),
        ("private", pa.bool_()),
        ("epsilon_target", pa.float64()),
        ("seed", pa.int64()),
        ("directions", pa.int64()),
        ("epsilon_claimed", pa.float64()),
        ("epsilon_lower_bound", pa.float64()),
        ("verdict", pa.string()),
        ("canaries", pa.int64()),
        ("k", pa.int64()),
        ("correct", pa.int64()),
        ("guesses", pa.int64()),
        ("alpha", pa.float64()),
    ]
)


def load_audits(tracking_uri: str, experiment: str, study: str | None = None) -> pa.Table:
    """Finished audits (``privzo audit``'s MLflow runs) of ``experiment``, one row each, with
    the audited run's model, algorithm and budget (read from the audited run, their parent)."""
    query = f"attributes.status = 'FINISHED' and tags.`{tags.AUDIT}` = 'true'"
    if study is not None:
        query += f" and tags.`{tags.STUDY}` = '{study}'"
    runs = find_runs(tracking_uri, experiment, query) or []
    audited = {run.run_id: run for run in runs if tags.AUDIT_VERDICT not in run.tags}
    rows = [
        _audit_row(run, audited[run.tags[tags.PARENT_RUN]])
        for run in runs
        if tags.AUDIT_VERDICT in run.tags and run.tags.get(tags.PARENT_RUN) in audited
    ]
    rows.sort(key=lambda row: (row["model_parameters"] or 0, row["cell"] or ""))
    return pa.Table.from_pylist(rows, schema=AUDIT_SCHEMA)


def _audit_row(audit: StoredRun, audited: StoredRun) -> dict[str, Any]:
    training = _row(audited)
    metrics = audit.metrics
    return {
        "audit_run_id": audit.run_id,
        "audited_run_id": audited.run_id,
        **{key: training[key] for key in ("cell", "model", "model_parameters", "algorithm")},
        **{key: training[key] for key in ("private", "epsilon_target", "seed", "directions")},
        "epsilon_claimed": metrics.get("epsilon_claimed"),  # absent for a non-private run
        "epsilon_lower_bound": metrics["epsilon_lower_bound"],
        "verdict": audit.tags[tags.AUDIT_VERDICT],
        "canaries": _int(metrics.get("canaries")),
        "k": _int(metrics.get("best_k")),
        "correct": _int(metrics.get("correct_guesses")),
        "guesses": _int(metrics.get("guesses")),
        "alpha": metrics.get("alpha"),
    }
