"""The report's plots (matplotlib, Agg backend: no display needed).

Each ``plot_*`` function returns its figure; :func:`save_figure` writes it as a PNG, and the
report also hands it to the run's tracker (MLflow's ``log_figure``) before :func:`close_figure`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

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
    """Peak memory and step time against model size, a line per algorithm. Private runs
    withhold both: an algorithm with no figures gets no line and no legend entry, and the
    figure's title names it."""
    plt = _pyplot()
    shown, withheld = split_withheld(resources)
    figure, (memory, time) = plt.subplots(1, 2, figsize=(11, 4))
    for algorithm, group in shown.items():
        memory.plot(group["model_parameters"], group["peak_memory_mb"], marker="o", label=algorithm)
        time.plot(group["model_parameters"], group["mean_step_time_s"], marker="o", label=algorithm)
    if withheld:
        figure.suptitle(
            f"not shown: {', '.join(withheld)} (a private run withholds its time and memory: "
            "they depend on which records were sampled)",
            fontsize="small",
        )
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
        if shown:
            axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def plot_cost(cost: pa.Table) -> Figure:
    """Task metric against the steps and the forward passes each budget spent (log axes), a
    point per model and budget, error bars = std over seeds; a budget with no forward-pass
    count (a first-order algorithm) appears only against steps."""
    plt = _pyplot()
    frame = cost.to_pandas()
    figure, axes = plt.subplots(1, 2, figsize=(11, 4))
    for budget, group in frame.groupby("budget", sort=False):
        for axis, column in zip(axes, ("steps", "forward_passes"), strict=True):
            shown = group.dropna(subset=[column])
            if len(shown):
                axis.errorbar(
                    shown[column].astype(float),
                    shown["mean"],
                    yerr=shown["std"].fillna(0.0),
                    marker="o",
                    linestyle="none",
                    capsize=3,
                    label=budget,
                )
    metric = frame["metric"].iloc[0] if len(frame) else "metric"
    for axis, label in zip(axes, ("steps", "forward passes (2 × batch × K × steps)"), strict=True):
        axis.set_xscale("log")
        axis.set_xlabel(label)
        axis.set_ylabel(metric)
        axis.set_title(f"test {metric} against {label.split(' (')[0]}", fontsize="medium")
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def split_withheld(resources: pa.Table) -> tuple[dict[str, Any], list[str]]:
    """The algorithms with measured figures (their rows, by model size) and those whose runs
    all withheld them."""
    frame = resources.to_pandas()
    shown, withheld = {}, []
    for algorithm, group in frame.groupby("algorithm"):
        if group[["peak_memory_mb", "mean_step_time_s"]].isna().all(axis=None):
            withheld.append(str(algorithm))
        else:
            shown[str(algorithm)] = group.sort_values("model_parameters")
    return shown, withheld


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


def plot_audits(audits: pa.Table) -> Figure:
    """Per audited cell, the claimed ε (the accountant's) beside the audit's lower bound ε_lb
    at confidence 1 − α; a non-private cell has no claimed ε, its bar is the measured leakage."""
    plt = _pyplot()
    frame = audits.to_pandas()
    labels = [
        f"{model}\n{budget}" + (f"\nseed {seed}" if frame["seed"].nunique() > 1 else "")
        for model, budget, seed in zip(frame["model"], frame["budget"], frame["seed"], strict=True)
    ]
    positions = list(range(len(labels)))
    figure, axis = plt.subplots(figsize=(max(5.5, 1.4 * len(labels)), 4))
    claimed = frame["epsilon_claimed"].fillna(0.0)
    axis.bar([x - 0.2 for x in positions], claimed, width=0.4, label="ε claimed (accountant)")
    bars = axis.bar(
        [x + 0.2 for x in positions],
        frame["epsilon_lower_bound"],
        width=0.4,
        label="ε_lb (audit)",
    )
    axis.bar_label(bars, fmt="%.2f", fontsize="small")  # an ε_lb of 0 shows as "0.00"
    for bar, verdict in zip(bars, frame["verdict"], strict=True):
        if verdict == "VIOLATED":
            bar.set_color("red")
    axis.set_xticks(positions, labels, fontsize="small")
    axis.set_ylim(bottom=0.0)
    axis.set_ylabel("ε")
    confidence = ", ".join(f"{1 - alpha:.0%}" for alpha in sorted(set(frame["alpha"])))
    axis.set_title(
        f"audited ε lower bound (confidence {confidence}) vs claimed ε", fontsize="medium"
    )
    axis.legend(fontsize="small")
    figure.tight_layout()
    return figure
