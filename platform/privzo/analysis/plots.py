"""The report's plots (matplotlib, Agg backend: no display needed).

Each ``plot_*`` function returns its figure; :func:`save_figure` writes it as a PNG, and the
report also hands it to the run's tracker (MLflow's ``log_figure``) before :func:`close_figure`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa

if TYPE_CHECKING:
    from matplotlib.figure import Figure


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scaling(scaling: pa.Table) -> Figure:
    """Task metric against model size: a line per budget, error bars = std over seeds."""
    plt = _pyplot()
    frame = scaling.to_pandas()
    tasks = list(dict.fromkeys(frame["task"])) or ["-"]
    figure, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        rows = frame[frame["task"] == task]
        for budget, group in rows.groupby("budget", sort=False):
            group = group.sort_values("model_parameters")
            axis.errorbar(
                group["model_parameters"],
                group["mean"],
                yerr=group["std"].fillna(0.0),
                marker="o",
                capsize=3,
                label=budget,
            )
        axis.set_xscale("log")
        axis.set_xlabel("model parameters")
        axis.set_ylabel(rows["metric"].iloc[0] if len(rows) else "metric")
        axis.set_title(f"{task}: test metric, mean ± std over seeds", fontsize="medium")
        axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_gap(gap: pa.Table) -> Figure:
    """Non-private minus private metric against model size, a line per private budget."""
    plt = _pyplot()
    frame = gap.to_pandas()
    figure, axis = plt.subplots(figsize=(5.5, 4))
    for (task, private, reference), group in frame.groupby(["task", "private", "non_private"]):
        group = group.sort_values("model_parameters")
        axis.plot(
            group["model_parameters"],
            group["gap"],
            marker="o",
            label=f"{task}: {reference} − {private}",
        )
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("model parameters")
    axis.set_ylabel("privacy gap (non-private − private)")
    axis.set_title("Test metric lost to privacy (mean over seeds)", fontsize="medium")
    if len(frame):
        axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_resources(resources: pa.Table) -> Figure:
    """Peak memory and step time against model size, a line per algorithm (private runs withhold
    both, so their lines are absent unless diagnostics were on)."""
    plt = _pyplot()
    frame = resources.to_pandas()
    figure, (memory, time) = plt.subplots(1, 2, figsize=(11, 4))
    for algorithm, group in frame.groupby("algorithm"):
        group = group.sort_values("model_parameters")
        memory.plot(group["model_parameters"], group["peak_memory_mb"], marker="o", label=algorithm)
        time.plot(group["model_parameters"], group["mean_step_time_s"], marker="o", label=algorithm)
    panels = (
        (memory, "peak memory (MB)", "Peak memory of a run (measured, per process)"),
        (time, "mean step time (s)", "Mean wall time of one step (measured, this machine)"),
    )
    for axis, label, title in panels:
        axis.set_xscale("log")
        axis.set_xlabel("model parameters")
        axis.set_ylabel(label)
        axis.set_title(title, fontsize="medium")
        axis.set_ylim(bottom=0)  # a zero baseline, so a 5 % difference looks like 5 %
        if len(frame):
            axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_epsilon_steps(histories: dict[str, list[tuple[int, float]]]) -> Figure:
    """ε spent against steps from the runs' logged histories, one line per distinct curve:
    runs with the same (σ, q, T) spend ε identically, and their lines would hide each other."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(6.5, 4))
    curves = distinct_curves(histories)
    for points, labels in curves.items():
        steps, values = zip(*points, strict=True) if points else ((), ())
        shown = labels[0] if len(labels) == 1 else f"{labels[0]} and {len(labels) - 1} more"
        axis.plot(steps, values, marker=".", label=shown)
    axis.set_xlabel("step")
    axis.set_ylabel("ε spent (accountant, at the run's δ)")
    axis.set_title("Privacy spent during training", fontsize="medium")
    axis.set_ylim(bottom=0)
    if curves:
        axis.legend(fontsize="x-small")
    figure.tight_layout()
    return figure


def distinct_curves(
    histories: dict[str, list[tuple[int, float]]],
) -> dict[tuple[tuple[int, float], ...], list[str]]:
    """Each distinct (step, value) curve with the labels of the runs that drew it."""
    curves: dict[tuple[tuple[int, float], ...], list[str]] = {}
    for label, points in histories.items():
        curves.setdefault(tuple(points), []).append(label)
    return curves


FIGURE_DPI = 120


def save_figure(figure: Figure, path: Path) -> Path:
    figure.savefig(path, dpi=FIGURE_DPI)
    return path


def close_figure(figure: Figure) -> None:
    _pyplot().close(figure)
