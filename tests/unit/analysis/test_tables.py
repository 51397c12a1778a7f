"""The report's cost table: each budget's metric beside the steps and forward passes it spent
(2 × batch × K × steps for a zeroth-order step), K-direction arms kept apart from K = 1."""

from __future__ import annotations

import statistics

import pyarrow as pa
import pytest

from privzo.analysis.markdown import frame_markdown
from privzo.analysis.plots import close_figure, plot_cost
from privzo.analysis.report import COST_FORMATS
from privzo.analysis.runs import SCHEMA
from privzo.analysis.tables import cost_table, forward_passes, scaling_table

# (algorithm, private, K, steps, seed, accuracy after); batch 8, one model, ε = 6 when private
RUNS = [
    ("dpzero", True, 1, 1000, 0, 0.70),
    ("dpzero", True, 1, 1000, 1, 0.74),
    ("dpzero", True, 16, 100, 0, 0.80),
    ("dpzero", True, 16, 100, 1, 0.78),
    ("mezo", False, 1, 1000, 0, 0.90),
    ("dpsgd", True, 1, 50, 0, 0.85),
]


def _runs() -> pa.Table:
    rows = [
        {
            "run_id": f"run{index}",
            "model": "small",
            "model_parameters": 1000,
            "task": "sst2",
            "metric": "accuracy",
            "algorithm": algorithm,
            "private": private,
            "epsilon_target": 6.0 if private else None,
            "seed": seed,
            "steps": steps,
            "batch_size": 8,
            "directions": k,
            "metric_before": 0.5,
            "metric_after": after,
        }
        for index, (algorithm, private, k, steps, seed, after) in enumerate(RUNS)
    ]
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def test_forward_passes_are_two_per_example_and_direction_of_zeroth_order_steps():
    assert forward_passes(_runs()) == [
        2 * 8 * 1 * 1000,
        2 * 8 * 1 * 1000,
        2 * 8 * 16 * 100,
        2 * 8 * 16 * 100,
        2 * 8 * 1 * 1000,
        None,  # DP-SGD takes no zeroth-order step
    ]


def test_cost_table_sets_each_budget_against_its_steps_and_forward_passes():
    cost = {row["budget"]: row for row in cost_table(_runs()).to_pylist()}
    assert list(cost) == ["dpsgd ε=6", "dpzero ε=6", "dpzero K=16 ε=6", "mezo (non-private)"]
    one, many = cost["dpzero ε=6"], cost["dpzero K=16 ε=6"]
    assert (one["steps"], one["directions"], one["forward_passes"]) == (1000, 1, 16_000)
    assert (many["steps"], many["directions"], many["forward_passes"]) == (100, 16, 25_600)
    assert one["mean"] == pytest.approx(statistics.mean([0.70, 0.74]))
    assert many["mean"] == pytest.approx(statistics.mean([0.80, 0.78]))
    assert many["std"] == pytest.approx(statistics.stdev([0.80, 0.78]))
    assert many["seeds"] == 2 and cost["mezo (non-private)"]["seeds"] == 1
    assert cost["dpsgd ε=6"]["forward_passes"] is None
    # the scaling table keeps the K = 16 arm apart too, not averaged into DPZero's
    scaling = {row["budget"]: row["mean"] for row in scaling_table(_runs()).to_pylist()}
    assert scaling["dpzero K=16 ε=6"] == pytest.approx(0.79)
    assert scaling["dpzero ε=6"] == pytest.approx(0.72)


def test_cost_markdown_and_plot_show_forward_passes_where_counted():
    cost = cost_table(_runs())
    text = frame_markdown(cost, COST_FORMATS)
    line = next(row for row in text.splitlines() if "dpzero K=16" in row)
    assert "25,600" in line and "0.790" in line
    dpsgd = next(row for row in text.splitlines() if "dpsgd" in row)
    assert "| 50 " in dpsgd and "| - " in dpsgd
    figure = plot_cost(cost)
    against_steps, against_passes = figure.axes
    assert "dpsgd ε=6" in against_steps.get_legend_handles_labels()[1]
    assert against_passes.get_legend_handles_labels()[1] == [
        "dpzero ε=6",
        "dpzero K=16 ε=6",
        "mezo (non-private)",
    ]
    close_figure(figure)
