"""The report's plots on small synthetic tables: lines and error bars only through points of
several seeds, a point of one run a plain marker labelled so, titles that say which, and no
memory panel (a run's records hold its process's peak, not the model's)."""

from __future__ import annotations

import pyarrow as pa
import pytest
from matplotlib.container import ErrorbarContainer

from privzo.analysis.plots import close_figure, plot_gap, plot_resources, plot_scaling
from privzo.analysis.tables import privacy_gap_table


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


def test_the_resources_figure_has_no_memory_panel_and_says_why():
    resources = pa.Table.from_pylist(
        [
            {
                "model": "m",
                "model_parameters": size,
                "algorithm": algorithm,
                "private": algorithm == "dpzero",
                "peak_memory_mb": 930.0 if algorithm == "mezo" else None,
                "step_peak_memory_mb": 930.0 if algorithm == "mezo" else None,
                "mean_step_time_s": size / 1e5 if algorithm == "mezo" else None,
                "runs": 1,
            }
            for size in (1_000, 9_000)
            for algorithm in ("dpzero", "mezo")
        ]
    )
    figure = plot_resources(resources)
    assert len(figure.axes) == 1
    axis = figure.axes[0]
    assert axis.get_ylabel() == "mean step time (s)"
    assert [line.get_label() for line in axis.get_lines()] == ["mezo"]
    note = figure.get_suptitle()
    assert "memory not plotted" in note and "not shown: dpzero" in note
    close_figure(figure)
