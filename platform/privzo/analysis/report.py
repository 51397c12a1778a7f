"""The study report: runs → Parquet tables → PNG plots → a Markdown report that embeds them."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from privzo.analysis.markdown import frame_markdown, resources_markdown, scaling_markdown
from privzo.analysis.plots import (
    close_figure,
    plot_audits,
    plot_cost,
    plot_epsilon_steps,
    plot_gap,
    plot_resources,
    plot_scaling,
    save_figure,
)
from privzo.analysis.runs import load_audits, load_runs
from privzo.analysis.tables import (
    audit_table,
    cells_table,
    cost_table,
    privacy_gap_table,
    resources_table,
    sampling_table,
    scaling_table,
    step_memory_table,
)
from privzo.tracking import Tracker, metric_history

REPORT_FILE = "report.md"
REPORT_ARTIFACT_DIR = "report"  # where a tracked report goes in the run's artifacts
MAX_EPSILON_CURVES = 12  # more lines than this make the ε plot unreadable
# counts as whole numbers even where a null made their column float
COST_FORMATS = {
    "steps": ",.0f",
    "directions": ".0f",
    "forward_passes": ",.0f",
    "mean": ".3f",
    "std": ".3f",
}


def build_report(
    tracking_uri: str,
    experiment: str,
    output_dir: Path,
    *,
    study: str | None = None,
    echo: Callable[[str], None] = print,
    tracker: Tracker | None = None,
    artifact_dir: str = REPORT_ARTIFACT_DIR,
) -> Path:
    """Write runs.parquet, the tables (Parquet), the plots (PNG) and report.md; return its path.

    With a ``tracker`` (the study's parent run) the report goes to it under ``artifact_dir``:
    the files as artifacts, the tables through ``log_table`` and the plots through
    ``log_figure``, so the MLflow UI shows them as tables and images: ``cells.json`` is every
    run side by side, ``scaling.json`` and ``scaling.png`` the comparison by model size.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    runs = load_runs(tracking_uri, experiment, study)
    scaling = scaling_table(runs)
    gap = privacy_gap_table(scaling)
    resources = resources_table(runs)
    step_memory = step_memory_table(runs)
    cost = cost_table(runs)
    tables = {
        "scaling": scaling,
        "cells": cells_table(runs),
        "privacy_gap": gap,
        "resources": resources,
        "step_memory": step_memory,
        "cost": cost,
    }
    for name, table in {"runs": runs, **tables}.items():
        pq.write_table(table, output_dir / f"{name}.parquet")
    figures = {
        "scaling.png": plot_scaling(scaling),
        "privacy_gap.png": plot_gap(gap),
        "resources.png": plot_resources(resources, step_memory),
        "cost.png": plot_cost(cost),
        "epsilon_steps.png": plot_epsilon_steps(_epsilon_histories(tracking_uri, runs)),
    }
    text = _markdown(experiment, study, runs, scaling, gap, resources, step_memory, cost)
    audits = load_audits(tracking_uri, experiment, study)
    if audits.num_rows:
        table = audit_table(audits)
        pq.write_table(table, output_dir / "audits.parquet")
        figures["audits.png"] = plot_audits(table)
        text += _audit_section(table)
    for name, figure in figures.items():
        save_figure(figure, output_dir / name)
        if tracker is not None:
            tracker.log_figure(figure, f"{artifact_dir}/{name}")
        close_figure(figure)
    path = output_dir / REPORT_FILE
    path.write_text(text)
    if tracker is not None:
        tables["sampling"] = sampling_table(runs)
        _log_report(tracker, output_dir, tables, artifact_dir)
    echo(scaling_markdown(scaling))
    echo(f"report: {path}")
    return path


def _log_report(
    tracker: Tracker, output_dir: Path, tables: dict[str, pa.Table], artifact_dir: str
) -> None:
    """The report's files (the PNGs went through ``log_figure``) and its tables as MLflow
    tables, ``<artifact_dir>/<name>.json``."""
    for path in sorted(output_dir.iterdir()):
        if path.is_file() and path.suffix != ".png":
            tracker.log_artifact(path, artifact_dir)
    for name, table in tables.items():
        tracker.log_table(table.to_pandas(), f"{artifact_dir}/{name}.json")


def _epsilon_histories(tracking_uri: str, runs: pa.Table) -> dict[str, list[tuple[int, float]]]:
    private = [row for row in runs.to_pylist() if row["private"]][:MAX_EPSILON_CURVES]
    histories = {}
    for row in private:
        label = f"{row['model']} ε={row['epsilon_target']:g} seed {row['seed']}"
        histories[label] = metric_history(tracking_uri, row["run_id"], "epsilon_spent")
    return histories


def _markdown(
    experiment: str,
    study: str | None,
    runs: pa.Table,
    scaling: pa.Table,
    gap: pa.Table,
    resources: pa.Table,
    step_memory: pa.Table,
    cost: pa.Table,
) -> str:
    title = f"Study {study}" if study else f"Experiment {experiment}"
    return "\n".join(
        [
            f"# {title}: scaling report",
            "",
            f"{runs.num_rows} finished runs from MLflow experiment `{experiment}`. Values are the "
            f"task metric on the test split, {_values_are(scaling)}; zero-shot is the base model "
            "before training.",
            "",
            "## Task metric by model size and privacy budget",
            "",
            scaling_markdown(scaling),
            "![scaling](scaling.png)",
            "",
            "How each arm drew its batches:",
            "",
            frame_markdown(sampling_table(runs)),
            "## Privacy gap (non-private − private)",
            "",
            frame_markdown(gap, {"gap": ".3f"}),
            "![privacy gap](privacy_gap.png)",
            "",
            "## Peak memory and step time",
            "",
            resources_markdown(resources),
            "`peak_memory_mb` and `step_peak_memory_mb` are the process's peak (on CPU its "
            "resident memory, interpreter and libraries included), not what a step adds above "
            "the model: they are not plotted.",
            "",
            "What one step needs above the weights: the CUDA allocator's step peak minus the "
            "weights (parameters × dtype) where runs measured it with a whole model per GPU, "
            "else the planner's estimate (one forward's activations, eager attention: an "
            "upper bound); `source` says which.",
            "",
            frame_markdown(step_memory, {"step_memory_mb": ".1f", "std": ".1f"}),
            "![resources](resources.png)",
            "",
            "## Task metric against steps and forward passes",
            "",
            "Forward passes are 2 × batch × K × steps for a zeroth-order step with K "
            "directions (the expected batch of a Poisson run); `-` for algorithms that take "
            "no such step.",
            "",
            frame_markdown(cost, COST_FORMATS),
            "![metric against steps and forward passes](cost.png)",
            "",
            "## ε spent against steps",
            "",
            "![epsilon against steps](epsilon_steps.png)",
            "",
        ]
    )


def _values_are(scaling: pa.Table) -> str:
    """Mean ± std over seeds only where a cell has several; one seed has no spread."""
    seeds = scaling.column("seeds").to_pylist() if scaling.num_rows else []
    if all(count > 1 for count in seeds) and seeds:
        return "mean ± std over seeds"
    if any(count > 1 for count in seeds):
        return "mean ± std over seeds where a cell has several, else one run"
    return "one run per cell (one seed: no spread to show)"


def _audit_section(table: pa.Table) -> str:
    """The audited cells' Markdown: their table (``audit_table``) and plot."""
    formats = {"epsilon_claimed": ".3f", "epsilon_lower_bound": ".3f", "tightness": ".2f"}
    return "\n".join(
        [
            "## Audited ε vs claimed ε",
            "",
            "Each audited cell is its run trained again with M canaries, each added by a secret "
            "fair coin (`privzo audit`, Steinke, Nasr and Jagielski 2023). ε_lb holds at "
            "confidence 1 − alpha, from the best of k guesses per side over the scores tried "
            "(Bonferroni-corrected); `VIOLATED` means ε_lb exceeds the accountant's ε. A "
            "non-private cell's ε_lb is its measured leakage.",
            "",
            frame_markdown(table.drop_columns(["alpha"]), formats),
            "![audited against claimed epsilon](audits.png)",
            "",
        ]
    )
