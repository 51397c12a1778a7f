"""PNG plots for the report (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_scaling(scaling: pa.Table, path: Path) -> Path:
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
        axis.set_title(task)
        axis.legend(fontsize="small")
    return _save(figure, path)


def plot_gap(gap: pa.Table, path: Path) -> Path:
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
    if len(frame):
        axis.legend(fontsize="small")
    return _save(figure, path)


def plot_resources(resources: pa.Table, path: Path) -> Path:
    """Peak memory and step time against model size, a line per algorithm."""
    plt = _pyplot()
    frame = resources.to_pandas()
    figure, (memory, time) = plt.subplots(1, 2, figsize=(11, 4))
    for algorithm, group in frame.groupby("algorithm"):
        group = group.sort_values("model_parameters")
        memory.plot(group["model_parameters"], group["peak_memory_mb"], marker="o", label=algorithm)
        time.plot(group["model_parameters"], group["mean_step_time_s"], marker="o", label=algorithm)
    for axis, label in ((memory, "peak memory (MB)"), (time, "mean step time (s)")):
        axis.set_xscale("log")
        axis.set_xlabel("model parameters")
        axis.set_ylabel(label)
        if len(frame):
            axis.legend(fontsize="small")
    return _save(figure, path)


def plot_epsilon_steps(histories: dict[str, list[tuple[int, float]]], path: Path) -> Path:
    """ε spent against steps, a line per private run (from the runs' logged histories)."""
    plt = _pyplot()
    figure, axis = plt.subplots(figsize=(5.5, 4))
    for label, points in histories.items():
        steps, values = zip(*points, strict=True) if points else ((), ())
        axis.plot(steps, values, label=label)
    axis.set_xlabel("step")
    axis.set_ylabel("ε spent")
    if histories:
        axis.legend(fontsize="x-small")
    return _save(figure, path)


def _save(figure, path: Path) -> Path:
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    _pyplot().close(figure)
    return path
