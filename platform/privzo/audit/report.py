"""The audit's outputs besides audit.json: score distributions, their plot, the MLflow child."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from privzo.audit.config import ScoreName
from privzo.config.run import RunConfig
from privzo.tracking import connect_tracker, make_tracker
from privzo.tracking.tags import AUDIT, AUDIT_VERDICT, PARENT_RUN

QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


def score_distribution(scores: np.ndarray, included: np.ndarray) -> dict[str, dict[str, float]]:
    """Mean, std and quantiles of the in- and out-canaries' scores (no single canary's)."""
    summary: dict[str, dict[str, float]] = {}
    for label, members in (("in", scores[included]), ("out", scores[~included])):
        summary[label] = {"count": int(members.size)}
        if members.size:
            summary[label].update(mean=float(members.mean()), std=float(members.std()))
            for q in QUANTILES:
                summary[label][f"q{int(q * 100):02d}"] = float(np.quantile(members, q))
    return summary


def plot_scores(values: Mapping[ScoreName, np.ndarray], included: np.ndarray, path: Path) -> Path:
    """One histogram per score: in-canaries against out-canaries."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(values), figsize=(4.5 * len(values), 3.5), squeeze=False)
    for axis, (name, scores) in zip(axes[0], values.items(), strict=True):
        bins = np.histogram_bin_edges(scores, bins=40)
        axis.hist(scores[included], bins=bins, alpha=0.6, label="in (trained on)")
        axis.hist(scores[~included], bins=bins, alpha=0.6, label="out")
        axis.set_title(name, fontsize="medium")
        axis.set_xlabel("score (higher: guessed in)")
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def child_metrics(record: dict[str, Any]) -> dict[str, float]:
    """The numbers of audit.json that MLflow charts (counts and bounds only)."""
    best = record["best"]
    metrics = {
        "epsilon_lower_bound": record["epsilon_lower_bound"],
        "alpha": record["alpha"],
        "canaries": float(record["canaries"]),
        "best_k": float(best["k"]),
        "guesses": float(best["guesses"]),
        "correct_guesses": float(best["correct"]),
    }
    for row in record["estimators"]:  # each estimator's ε, e.g. epsilon_one_run_f_dp_gaussian
        metrics[f"epsilon_{row['estimator'].replace('-', '_')}"] = row["epsilon"]
    if record["epsilon_claimed"] is not None:
        metrics["epsilon_claimed"] = record["epsilon_claimed"]
    return metrics


def record_child_run(
    config: RunConfig,
    record: dict[str, Any],
    artifacts: list[Path],
    output_dir: Path,
    tracking_uri: str | None,
    extra_tags: Mapping[str, str] | None = None,
) -> str | None:
    """An MLflow run under the audited run (``PARENT_RUN``) holding the audit."""
    tracking = config.tracking
    tags = {**(extra_tags or {}), AUDIT: "true", AUDIT_VERDICT: record["verdict"]}
    if record["audited_run_id"]:
        tags[PARENT_RUN] = str(record["audited_run_id"])
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=output_dir,
        run_name=f"{output_dir.name}-audit",
        tags=tags,
        release_timing=not config.optimizer.is_private,
    )
    connect_tracker(tracker, tracking.uri or tracking_uri)
    with tracker:
        tracker.log_params(
            {
                "canaries": record["canaries"],
                "alpha": record["alpha"],
                "delta": record["delta"],
                "best_score": record["best"]["score"],
                "white_box": record["white_box"],
            }
        )
        tracker.log_metrics(child_metrics(record), step=0)
        for path in artifacts:
            tracker.log_artifact(path)
    record["tracking_run_id"] = tracker.run_id
    return tracker.run_id
