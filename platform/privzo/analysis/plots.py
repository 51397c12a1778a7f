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


ONE_RUN = "one run"


def plot_scaling(scaling: pa.Table) -> Figure:
    """Task metric against model size, a colour per budget: a line with error bars (std over
    seeds) through the points with several seeds; a point of one run is a plain marker labelled
    so, since one run has no spread to show and two such points make no trend."""
    plt = _pyplot()
    frame = scaling.to_pandas()
    tasks = list(dict.fromkeys(frame["task"])) or ["-"]
    figure, axes = plt.subplots(1, len(tasks), figsize=(5.5 * len(tasks), 4), squeeze=False)
    for axis, task in zip(axes[0], tasks, strict=True):
        rows = frame[frame["task"] == task]
        for index, (budget, group) in enumerate(rows.groupby("budget", sort=False)):
            group = group.sort_values("model_parameters")
            sizes, means = group["model_parameters"], group["mean"]
            _seeded_series(axis, sizes, means, group, budget, index, errors=group["std"])
        axis.set_xscale("log")
        axis.set_xlabel("model parameters")
        axis.set_ylabel(rows["metric"].iloc[0] if len(rows) else "metric")
        axis.set_title(f"{task}: test metric, {_over_seeds(rows['seeds'])}", fontsize="medium")
        if len(rows):
            axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


def _seeded_series(
    axis: Any, sizes: Any, values: Any, group: Any, label: str, index: int, errors: Any = None
) -> None:
    """One series: a plain marker per point of single runs, and a line through the points with
    several seeds (with ``errors`` as error bars where given)."""
    _seeded_points(axis, sizes, values, group, label, index)
    several = group["seeds"] > 1
    if not several.any():
        return
    style = {"color": f"C{index}", "marker": "o", "label": label}
    if errors is None:
        axis.plot(sizes[several], values[several], **style)
    else:
        axis.errorbar(sizes[several], values[several], yerr=errors[several], capsize=3, **style)


def _seeded_points(axis: Any, sizes: Any, values: Any, group: Any, label: str, index: int) -> None:
    """The points of one run each (``group``'s ``seeds`` is 1): markers, no line, no bars."""
    single = (group["seeds"] <= 1).to_numpy()
    if single.any():
        axis.plot(
            sizes[single],
            values[single],
            color=f"C{index}",
            marker="s",
            linestyle="none",
            label=f"{label} ({ONE_RUN})",
        )


def _over_seeds(seeds: Any, mean: str = "mean ± std over seeds") -> str:
    """What a point is, for a title: a mean over seeds only where some point has several."""
    if len(seeds) == 0 or (seeds <= 1).all():
        return ONE_RUN + " per point"
    if (seeds > 1).all():
        return mean
    return f"{mean}; markers: {ONE_RUN}"


def plot_gap(gap: pa.Table) -> Figure:
    """Non-private minus private metric against model size, a colour per (budget, reference):
    a line through the points whose means have several seeds on both sides, a plain marker
    for a point of single runs."""
    plt = _pyplot()
    frame = gap.to_pandas()
    figure, axis = plt.subplots(figsize=(5.5, 4))
    groups = frame.groupby(["task", "private", "non_private"])
    for index, ((task, private, reference), group) in enumerate(groups):
        group = group.sort_values("model_parameters")
        label = f"{task}: {reference} − {private}"
        _seeded_series(axis, group["model_parameters"], group["gap"], group, label, index)
    axis.axhline(0.0, color="grey", linewidth=0.8)
    axis.set_xscale("log")
    axis.set_xlabel("model parameters")
    axis.set_ylabel("privacy gap (non-private − private)")
    what = _over_seeds(frame["seeds"], "mean over seeds")
    axis.set_title(f"Test metric lost to privacy ({what})", fontsize="medium")
    if len(frame):
        axis.legend(fontsize="small")
    figure.tight_layout()
    return figure


MEMORY_NOTE = (
    "memory: the CUDA allocator's step peak minus the weights where runs measured it, else the "
    "planner's estimate (one forward's activations, an upper bound); never the process's "
    "resident memory"
)


def plot_resources(resources: pa.Table, step_memory: pa.Table) -> Figure:
    """Two panels against model size: mean step time, a line per algorithm, and what one step
    needs above the weights (``step_memory_table``), a series per algorithm and source, with a
    line and error bars only through points of several seeds. Private runs withhold their
    times: such an algorithm gets no time line, and the figure's title names it."""
    plt = _pyplot()
    shown, withheld = split_withheld(resources)
    figure, (time, memory) = plt.subplots(1, 2, figsize=(12, 4.4))
    for algorithm, group in shown.items():
        time.plot(group["model_parameters"], group["mean_step_time_s"], marker="o", label=algorithm)
    notes = [MEMORY_NOTE]
    if withheld:
        notes.append(
            f"step time not shown: {', '.join(withheld)} (a private run withholds its time: "
            "it depends on which records were sampled)"
        )
    figure.suptitle("\n".join(notes), fontsize="x-small")
    time.set_xscale("log")
    time.set_xlabel("model parameters")
    time.set_ylabel("mean step time (s)")
    time.set_title("Mean wall time of one step (measured, this machine)", fontsize="medium")
    time.set_ylim(bottom=0)  # a zero baseline, so a 5 % difference looks like 5 %
    if shown:
        time.legend(fontsize="small")
    _plot_step_memory(memory, step_memory)
    figure.tight_layout()
    return figure


def _plot_step_memory(axis: Any, step_memory: pa.Table) -> None:
    frame = step_memory.to_pandas()
    for index, ((algorithm, source), group) in enumerate(frame.groupby(["algorithm", "source"])):
        group = group.sort_values("model_parameters")
        sizes, values = group["model_parameters"], group["step_memory_mb"]
        label = f"{algorithm}, {source}"
        _seeded_series(axis, sizes, values, group, label, index, errors=group["std"])
    axis.set_xscale("log")
    axis.set_xlabel("model parameters")
    axis.set_ylabel("MiB above the weights")
    what = _over_seeds(frame["seeds"])
    axis.set_title(f"Memory one step needs ({what})", fontsize="medium")
    axis.set_ylim(bottom=0)
    if len(frame):
        axis.legend(fontsize="small")


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
    """The algorithms with measured step times (their rows, by model size) and those whose runs
    all withheld them."""
    frame = resources.to_pandas()
    shown, withheld = {}, []
    for algorithm, group in frame.groupby("algorithm"):
        if group["mean_step_time_s"].isna().all():
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
