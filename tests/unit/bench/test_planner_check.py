"""``privzo bench planner``'s cases and table, without its runs (they hold a real-size model)."""

from __future__ import annotations

import pytest

from privzo.bench.planner_check import (
    Case,
    Measured,
    agreement,
    case_config,
    cases,
    planned_worker_bytes,
    table,
)
from privzo.planner import cpu_worker_bytes


def _measured(case: Case, peaks: list[float], gradients: list[float]) -> Measured:
    return Measured(
        case, peaks, 3000.0, step_time_s=3.0, forward_time_s=1.0, projected_gradients=gradients
    )


def test_cases_refuse_an_unknown_name_before_anything_runs():
    assert len(cases(["mezo", "dpzero"], ["float32"], ["single", "zero3"])) == 4
    with pytest.raises(ValueError, match="unknown layout zero2; known: single, replica"):
        cases(["mezo"], ["float32"], ["zero3", "zero2"])


def test_a_case_evaluates_one_forward_of_a_workers_share():
    config = case_config(
        Case("dpzero", "bfloat16", "zero3-offload"),
        "tiny-opt",
        steps=2,
        batch_size=8,
        max_length=32,
    )
    assert (config.parallel.strategy, config.parallel.workers) == ("zero3", 2)
    assert config.parallel.offload == "cpu" and config.model.dtype == "bfloat16"
    assert config.task.test_size == config.optimizer.eval_batch_size == 4


def test_the_table_compares_the_worst_worker_and_mezo_with_its_single_run():
    single = _measured(Case("mezo", "float32", "single"), [6000.0], [2.0, -4.0])
    zero3 = _measured(Case("mezo", "float32", "zero3"), [2500.0, 3000.0], [2.0, -4.2])
    dpzero = _measured(Case("dpzero", "float32", "zero3"), [3000.0, 3000.0], [1.0, 1.0])
    assert zero3.planned_over_measured == 1.0 and zero3.step_over_two_forwards == 1.5
    assert agreement(zero3, single) == pytest.approx(0.05)
    assert agreement(dpzero, single) is None  # secret batches and noise: nothing to agree with
    lines = table([single, zero3, dpzero], "title").splitlines()
    assert lines[2].split()[-1] == "ref"
    assert lines[3].split()[1:] == ["2,500,", "3,000", "3,000", "1.00", "1.50", "5.0e-02"]
    assert lines[4].split()[-1] == "—"


def test_the_planner_is_asked_for_the_forward_a_worker_makes():
    """A DPZero worker pads its share (4 of a batch of 8) to the privacy plan's bound; MeZO's
    forwards its share."""
    shape = {"steps": 2, "batch_size": 8, "max_length": 32}
    dpzero = Case("dpzero", "float32", "replica")
    config = case_config(dpzero, "opt-1.3b", **shape)
    layout = {"strategy": "replica", "workers": 2, "dtype": "float32", "seq_len": 32}
    padded = cpu_worker_bytes("opt-1.3b", batch_size=31, **layout)
    assert planned_worker_bytes(dpzero, config, padded_rows=31) == padded
    mezo = Case("mezo", "float32", "replica")
    share = cpu_worker_bytes("opt-1.3b", batch_size=4, **layout)
    assert planned_worker_bytes(mezo, case_config(mezo, "opt-1.3b", **shape), None) == share
    assert share < padded
