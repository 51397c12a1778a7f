"""The report's plots on small synthetic tables: lines and error bars only through points of
several seeds, a point of one run a plain marker labelled so, titles that say which, and a
memory panel of what a step needs above the weights (measured on CUDA or planned), never a
process's resident memory."""

from __future__ import annotations

import statistics

import pyarrow as pa
import pytest
from matplotlib.container import ErrorbarContainer

from privzo.analysis.plots import close_figure, plot_gap, plot_resources, plot_scaling
from privzo.analysis.runs import SCHEMA
from privzo.analysis.tables import (
    MEASURED,
    PLANNED,
    privacy_gap_table,
    resources_table,
    step_memory_table,
)


def _scaling(seeds: list[int]) -> pa.Table:
    """Two budgets at two model sizes; ``seeds`` per (budget, size), budget-major."""
    rows = []
    for index, (budget, size) in enumerate(
        [(b, s) for b in ("dpzero ε=2", "mezo (non-private)") for s in (1_000, 9_000)]
    ):
        count = seeds[index]
        rows.append(
            {
                "task": "sst2",
                "metric": "accuracy",
                "model": f"m{size}",
                "model_parameters": size,
                "budget": budget,
                "mean": 0.6 + index / 100,
                "std": 0.02 if count > 1 else float("nan"),
                "seeds": count,
            }
        )
    return pa.Table.from_pylist(rows)


def _drawn(figure) -> tuple[list[str], int, str]:
    """The legend's labels (sorted), the axis's error bar containers and its title."""
    axis = figure.axes[0]
    labels = sorted(axis.get_legend_handles_labels()[1])
    bars = sum(isinstance(c, ErrorbarContainer) for c in axis.containers)
    return labels, bars, axis.get_title()


def test_one_seed_everywhere_draws_plain_points_and_says_one_run():
    figure = plot_scaling(_scaling([1, 1, 1, 1]))
    labels, bars, title = _drawn(figure)
    assert bars == 0
    assert labels == ["dpzero ε=2 (one run)", "mezo (non-private) (one run)"]
    for line in figure.axes[0].get_lines():
        assert line.get_linestyle() == "None"  # no trend line through single runs
    assert "over seeds" not in title and "one run per point" in title
    close_figure(figure)


def test_several_seeds_draw_a_line_with_error_bars():
    figure = plot_scaling(_scaling([3, 3, 3, 3]))
    labels, bars, title = _drawn(figure)
    assert bars == 2 and labels == ["dpzero ε=2", "mezo (non-private)"]
    assert title == "sst2: test metric, mean ± std over seeds"
    close_figure(figure)


def test_a_mixed_table_bars_only_the_seeded_points():
    figure = plot_scaling(_scaling([2, 1, 1, 1]))  # dpzero at the small size has two seeds
    labels, bars, title = _drawn(figure)
    assert bars == 1
    assert labels == ["dpzero ε=2", "dpzero ε=2 (one run)", "mezo (non-private) (one run)"]
    (container,) = figure.axes[0].containers
    assert list(container.lines[0].get_xdata()) == [1_000]
    assert "markers: one run" in title
    close_figure(figure)


@pytest.mark.parametrize(("seeds", "lines", "said"), [(1, 0, "one run"), (2, 1, "mean over")])
def test_the_gap_draws_a_trend_only_over_several_seeds(seeds, lines, said):
    gap = privacy_gap_table(_scaling([seeds] * 4))
    assert gap.column("seeds").to_pylist() == [seeds, seeds]
    figure = plot_gap(gap)
    axis = figure.axes[0]
    trends = [line for line in axis.get_lines() if line.get_linestyle() != "None"]
    assert len(trends) == lines + 1  # the zero line is always there
    assert said in axis.get_title()
    close_figure(figure)


# (model parameters, device, strategy, step peak MiB, planned MiB) of one algorithm's runs
MEMORY_RUNS = [
    (2**20, "cuda", "single", 10.0, 3.0),  # 1 Mi fp32 parameters: 4 MiB of weights
    (2**20, "cuda", "single", 12.0, 3.0),
    (2**22, "cpu", "single", 930.0, 7.0),  # a CPU peak is the process's: the plan is shown
    (2**24, "cuda", "zero3", 50.0, 9.0),  # a shard, not the weights: the plan again
    (2**26, None, "single", 930.0, None),  # no device known and no plan: nothing to show
]


def _memory_runs() -> pa.Table:
    rows = [
        {
            "run_id": f"run{index}",
            "model": f"m{size}",
            "model_parameters": size,
            "algorithm": "mezo",
            "private": False,
            "seed": index,
            "device": device,
            "strategy": strategy,
            "dtype": "float32",
            "step_peak_memory_mb": peak,
            "peak_memory_mb": peak,
            "planned_step_mb": planned,
        }
        for index, (size, device, strategy, peak, planned) in enumerate(MEMORY_RUNS)
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_step_memory_is_the_cuda_peak_above_the_weights_else_the_plan():
    rows = step_memory_table(_memory_runs()).to_pylist()
    assert [(row["model_parameters"], row["source"]) for row in rows] == [
        (2**20, MEASURED),
        (2**22, PLANNED),
        (2**24, PLANNED),
    ]
    measured, cpu, zero3 = rows
    assert measured["step_memory_mb"] == pytest.approx(statistics.mean([10.0 - 4, 12.0 - 4]))
    assert measured["std"] == pytest.approx(statistics.stdev([6.0, 8.0]))
    assert measured["seeds"] == 2
    assert (cpu["step_memory_mb"], cpu["std"], cpu["seeds"]) == (7.0, None, 1)
    assert zero3["step_memory_mb"] == 9.0


def test_the_memory_panel_draws_the_step_memory_with_bars_only_over_several_seeds():
    resources = resources_table(_memory_runs())
    figure = plot_resources(resources, step_memory_table(_memory_runs()))
    time, memory = figure.axes
    assert time.get_ylabel() == "mean step time (s)"
    assert memory.get_ylabel() == "MiB above the weights"
    labels = sorted(memory.get_legend_handles_labels()[1])
    assert labels == [f"mezo, {MEASURED}", f"mezo, {PLANNED} (one run)"]
    (bars,) = [c for c in memory.containers if isinstance(c, ErrorbarContainer)]
    assert list(bars.lines[0].get_xdata()) == [2**20]  # the two-seed point alone
    assert list(bars.lines[0].get_ydata()) == pytest.approx([7.0])
    singles = [line for line in memory.get_lines() if line.get_label().endswith("(one run)")]
    assert [list(line.get_ydata()) for line in singles] == [[7.0, 9.0]]
    drawn = [value for line in memory.get_lines() for value in line.get_ydata()]
    assert max(drawn) < 10  # never a process's 930 MiB
    assert "markers: one run" in memory.get_title()
    assert "never the process's resident memory" in figure.get_suptitle()
    close_figure(figure)
