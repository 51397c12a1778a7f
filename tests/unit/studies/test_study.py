"""Studies and their report: real MLflow (sqlite in a temp dir), tiny models."""

from __future__ import annotations

import json
import re
import statistics
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import yaml
from mlflow.entities import Metric

from privzo.analysis import build_report
from privzo.analysis.plots import distinct_curves, split_withheld
from privzo.analysis.tables import PLANNED
from privzo.config import ConfigError
from privzo.run import TrainingLoop
from privzo.studies import load_study_config, run_study
from privzo.studies.cells import cell_config, expand_cells
from privzo.tracking import make_tracker, open_client, read_run, read_table, ui_address
from privzo.tracking.clock import PUBLIC_TIME_MS

# (model, parameters) × seed: (accuracy before, private after, non-private after)
LOGGED = {
    ("small", 1_000): {0: (0.50, 0.60, 0.70), 1: (0.52, 0.64, 0.74)},
    ("large", 9_000): {0: (0.55, 0.71, 0.80), 1: (0.57, 0.69, 0.84)},
}


def _log_fixture_runs(uri: str) -> None:
    """Training runs as privzo records them (tags, final metrics, ε history), plus a parent."""
    client = open_client(uri)
    experiment = client.create_experiment("fixture")
    parent = client.create_run(experiment, tags={"privzo.role": "study", "privzo.study": "s"})
    client.set_terminated(parent.info.run_id)
    for (model, size), seeds in LOGGED.items():
        for seed, (before, private, public) in seeds.items():
            for algorithm, after, epsilon in (("dpzero", private, "2"), ("mezo", public, None)):
                tags = {
                    "mlflow.parentRunId": parent.info.run_id,
                    "privzo.model": model,
                    "privzo.model_parameters": str(size),
                    "privzo.task": "sst2",
                    "privzo.metric": "accuracy",
                    "privzo.algorithm": algorithm,
                    "privzo.private": str(epsilon is not None).lower(),
                    "privzo.study": "s",
                    "privzo.cell": f"{model}-{algorithm}-{seed}",
                    "privzo.seed": str(seed),
                    "privzo.device": "cpu",  # its peaks are the process's: never plotted
                }
                if model == "small":  # a shape the planner models
                    tags["privzo.planned_step_mb"] = f"{size / 100:.3f}"
                if epsilon:
                    tags["privzo.epsilon"] = epsilon
                run = client.create_run(experiment, tags=tags).info.run_id
                sampler = "poisson" if epsilon else "shuffle"
                client.log_param(run, "privacy.sampler", sampler)
                metrics = {
                    "final_accuracy_before": before,
                    "final_accuracy_after": after,
                    "final_peak_memory_mb": size / 10 + seed,
                    "final_step_peak_memory_mb": 930.0,
                    "final_mean_step_time_s": size / 1e5,
                }
                points = [Metric(k, v, 0, 100) for k, v in metrics.items()]
                if epsilon:
                    points += [Metric("epsilon_spent", 0.5 * s, 0, 25 * s) for s in (1, 2, 3, 4)]
                client.log_batch(run, metrics=points)
                client.set_terminated(run)
    unfinished = client.create_run(experiment, tags={"privzo.model": "small", "privzo.study": "s"})
    client.log_batch(unfinished.info.run_id, metrics=[Metric("final_accuracy_after", 0.0, 0, 1)])


def _squeezed(markdown: str) -> str:
    """A Markdown table with its cells' padding removed: ``| a | b |`` whatever the widths."""
    return re.sub(r"\| +", "| ", re.sub(r" +\|", " |", markdown))


def test_report_tables_equal_the_logged_means_and_stds(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    _log_fixture_runs(uri)
    tags = {"privzo.role": "study", "privzo.study": "s"}
    tracker = make_tracker(
        "mlflow", uri=uri, experiment="fixture", output_root=tmp_path, run_name="p", tags=tags
    )
    with tracker:
        path = build_report(
            uri, "fixture", tmp_path / "report", study="s", echo=lambda _: None, tracker=tracker
        )

    runs = pq.read_table(tmp_path / "report" / "runs.parquet")
    assert runs.num_rows == 8  # the parent and the unfinished run are left out
    scaling = pq.read_table(tmp_path / "report" / "scaling.parquet").to_pylist()
    cell = {(row["model"], row["budget"]): row for row in scaling}
    for (model, _), seeds in LOGGED.items():
        for index, budget in enumerate(("zero-shot", "dpzero ε=2", "mezo (non-private)")):
            values = [logged[index] for logged in seeds.values()]
            row = cell[(model, budget)]
            assert row["mean"] == pytest.approx(statistics.mean(values))
            assert row["std"] == pytest.approx(statistics.stdev(values))
            assert row["seeds"] == 2
    gap = pq.read_table(tmp_path / "report" / "privacy_gap.parquet").to_pylist()
    assert {row["model"]: row["gap"] for row in gap} == pytest.approx(
        {"small": (0.72 - 0.62), "large": (0.82 - 0.70)}
    )
    resources = pq.read_table(tmp_path / "report" / "resources.parquet").to_pylist()
    small_dpzero = next(
        r for r in resources if r["model"] == "small" and r["algorithm"] == "dpzero"
    )
    assert small_dpzero["peak_memory_mb"] == pytest.approx(100.5)
    step_memory = pq.read_table(tmp_path / "report" / "step_memory.parquet").to_pylist()
    assert [(row["model"], row["algorithm"]) for row in step_memory] == [
        ("small", "dpzero"),
        ("small", "mezo"),
    ]  # "large" has no planner figure, and a CPU peak is no step's memory
    for row in step_memory:
        assert row["source"] == PLANNED and row["seeds"] == 2
        assert row["step_memory_mb"] == pytest.approx(10.0)

    text = _squeezed(path.read_text())
    logged = read_run(uri, tracker.run_id)
    for name in ("scaling.png", "privacy_gap.png", "resources.png", "epsilon_steps.png"):
        image = tmp_path / "report" / name
        assert image.stat().st_size > 1000 and image.read_bytes()[:4] == b"\x89PNG"
        assert f"]({name})" in text
        assert f"report/{name}" in logged["artifacts"]  # through log_figure
    assert "report/report.md" in logged["artifacts"]
    for name in ("scaling", "cells", "privacy_gap", "resources", "step_memory", "sampling"):
        assert {"path": f"report/{name}.json", "type": "table"} in json.loads(
            logged["tags"]["mlflow.loggedArtifacts"]
        )
    cells = read_table(uri, tracker.run_id, "report/cells.json")  # every run, side by side
    assert not [c for c in cells.columns if "time" in c or "memory" in c]  # no side channel
    expected = sorted(
        (size, algorithm, seed, values[0], values[1 if algorithm == "dpzero" else 2])
        for (_, size), seeds in LOGGED.items()
        for seed, values in seeds.items()
        for algorithm in ("dpzero", "mezo")
    )
    assert [
        (r.model_parameters, r.algorithm, r.seed, r.metric_before, r.metric_after)
        for r in cells.itertuples()
    ] == expected
    names = {run["run_id"]: run["run_name"] for run in runs.to_pylist()}
    assert [names[run_id] for run_id in cells["run_id"]] == [
        read_run(uri, run_id)["run_name"] for run_id in cells["run_id"]
    ]
    logged_scaling = read_table(uri, tracker.run_id, "report/scaling.json")
    pd.testing.assert_frame_equal(
        logged_scaling,
        pq.read_table(tmp_path / "report" / "scaling.parquet").to_pandas(),
        check_dtype=False,
    )
    assert "0.510 ± 0.014" in text  # small zero-shot: mean 0.51, std √2·0.01
    assert "| small | 1,000 | 0.510 ± 0.014 | 0.620 ± 0.028 | 0.720 ± 0.028 |" in text
    assert "| dpzero | True | Poisson, from secret randomness" in text
    assert "| mezo | False | seeded shuffle, fixed-size batches (repeatable) | 4 |" in text
    assert "| sst2 | large | 9,000 | dpzero ε=2 |" in text  # the gap table's sizes as 9,000
    assert "9000" not in text


def test_identical_epsilon_curves_are_drawn_once():
    """Runs with the same σ, q and T spend ε identically: one line, labelled with all of them."""
    same = [(25, 0.5), (50, 1.0)]
    curves = distinct_curves({"s ε=2 seed 0": same, "m ε=2 seed 0": same, "s ε=4": [(25, 0.9)]})
    assert curves == {tuple(same): ["s ε=2 seed 0", "m ε=2 seed 0"], ((25, 0.9),): ["s ε=4"]}


def _study_file(tmp_path: Path, sentiment_files, **study) -> Path:
    train, test = sentiment_files
    base = {
        "model": {"name_or_path": "tiny-opt"},
        "task": {"train_path": str(train), "test_path": str(test)},
        "optimizer": {"steps": 6, "batch_size": 8, "learning_rate": 1e-3},
        "tracking": {"log_every": 3},
    }
    (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
    data = {
        "type": "scaling",
        "name": "tiny",
        "base": "base.yaml",
        "models": ["tiny-opt"],
        "epsilons": [2.0, 4.0],
        "non_private_algorithms": ["mezo"],
        **study,
    }
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _stop_at_step(step: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl+C (what it raises) as the loop is about to take ``step``, once."""
    real_step = TrainingLoop.step

    def stop(self, index):
        if index == step:
            monkeypatch.undo()
            raise KeyboardInterrupt
        return real_step(self, index)

    monkeypatch.setattr(TrainingLoop, "step", stop)


def test_study_resumed_reruns_nothing_finished_and_reports(
    tmp_path, sentiment_files, cache_dir, monkeypatch
):
    """A finished cell is not run again; a cell stopped by Ctrl+C goes on from its own
    trajectory into its MLflow run (each step drawn once); a changed config is refused."""
    study = load_study_config(_study_file(tmp_path, sentiment_files))
    assert [cell.name for cell in expand_cells(study)] == [
        "tiny-opt-task-dpzero-eps2-seed0",
        "tiny-opt-task-dpzero-eps4-seed0",
        "tiny-opt-task-mezo-nonprivate-seed0",
    ]
    output = tmp_path / "study"
    echoed: list[str] = []
    options = {"cache_dir": cache_dir, "progress": False, "echo": echoed.append}
    first = run_study(study, output, max_cells=1, **options)  # stops after one cell
    assert first["complete"] is False and first["cells_finished"] == 1
    done = output / "cells" / "tiny-opt-task-dpzero-eps2-seed0" / "summary.json"
    mtime = done.stat().st_mtime_ns

    stopped = output / "cells" / "tiny-opt-task-dpzero-eps4-seed0"
    _stop_at_step(4, monkeypatch)  # inside the second window of the second cell
    with pytest.raises(KeyboardInterrupt):
        run_study(study, output, **options)
    kept = pq.read_table(stopped / "trajectory.parquet").to_pylist()
    killed_run = json.loads((stopped / "resume.json").read_text())["tracking_run_id"]
    uri = f"sqlite:///{output / 'mlflow.db'}"
    assert [row["step"] for row in kept] == [0, 1, 2, 3]
    assert read_run(uri, killed_run)["status"] == "KILLED"

    second = run_study(study, output, **options)
    assert second["complete"] is True and second["cells_finished"] == 3
    assert done.stat().st_mtime_ns == mtime  # not run again
    assert second["parent_run_id"] == first["parent_run_id"]
    rows = pq.read_table(stopped / "trajectory.parquet").to_pylist()
    assert [row["step"] for row in rows] == list(range(6)) and rows[:4] == kept
    resumed = json.loads((stopped / "summary.json").read_text())
    assert resumed["tracking_run_id"] == killed_run and resumed["steps"] == 6
    assert read_run(uri, killed_run)["status"] == "FINISHED"
    assert json.loads((stopped / "privacy.json").read_text())["steps_accounted"] == 6

    client = open_client(f"sqlite:///{output / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("tiny").experiment_id
    # the complete study says how to see its cells side by side in the MLflow UI
    assert (
        f"mlflow ui --backend-store-uri {uri}\n  tiny: {ui_address(experiment_id=experiment)}"
        in (echoed[-1])
    )
    children = client.search_runs(
        [experiment], filter_string=f"tags.mlflow.parentRunId = '{first['parent_run_id']}'"
    )
    assert sorted(c.data.tags["privzo.cell"] for c in children) == sorted(
        cell.name for cell in expand_cells(study)
    )
    assert all(c.info.status == "FINISHED" for c in children)
    summaries = {
        c.data.tags["privzo.cell"]: json.loads(
            (output / "cells" / c.data.tags["privzo.cell"] / "summary.json").read_text()
        )
        for c in children
    }
    assert summaries["tiny-opt-task-dpzero-eps4-seed0"]["epsilon"] <= 4.0 * (1 + 1e-6)
    scaling = pq.read_table(output / "report" / "scaling.parquet").to_pylist()
    assert {row["budget"] for row in scaling} == {
        "zero-shot",
        "dpzero ε=2",
        "dpzero ε=4",
        "mezo (non-private)",
    }
    private_4 = next(row for row in scaling if row["budget"] == "dpzero ε=4")
    assert private_4["mean"] == pytest.approx(
        summaries["tiny-opt-task-dpzero-eps4-seed0"]["accuracy_after"]
    )
    resources = {
        r["algorithm"]: r
        for r in pq.read_table(output / "report" / "resources.parquet").to_pylist()
    }
    assert resources["dpzero"]["private"] and resources["dpzero"]["peak_memory_mb"] is None
    assert resources["mezo"]["peak_memory_mb"] > 0  # non-private: measured and released
    # the plot draws mezo only, and names dpzero as withheld instead of an empty legend entry
    shown, withheld = split_withheld(pq.read_table(output / "report" / "resources.parquet"))
    assert list(shown) == ["mezo"] and withheld == ["dpzero"]
    samplers = {
        row["algorithm"]: row["sampler"]
        for row in pq.read_table(output / "report" / "runs.parquet").to_pylist()
    }
    assert samplers == {"dpzero": "poisson", "mezo": "shuffle"}  # the baseline repeats
    report = (output / "report" / "report.md").read_text()
    resources_lines = report.split("## Peak memory and step time", 1)[1].splitlines()
    dpzero_line = next(line for line in resources_lines if "| dpzero " in line)
    assert dpzero_line.count("withheld") == 3
    artifacts = [a.path for a in client.list_artifacts(first["parent_run_id"], "report")]
    assert "report/report.md" in artifacts and "report/scaling.png" in artifacts

    changed = study.model_copy(update={"overrides": {"optimizer.learning_rate": 2e-3}})
    with pytest.raises(
        ConfigError,
        match=r"study cell 1/3 tiny-opt-task-dpzero-eps2-seed0: .*holds a run of another config",
    ):
        run_study(changed, output, **options)
    assert done.stat().st_mtime_ns == mtime  # its released steps kept


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"type": "scalingg"}, "not a study type"),
        ({"models": []}, "at least 1"),
        ({"private_algorithms": ["mezo"]}, "not a private algorithm"),
        ({"non_private_algorithms": ["dpzero"]}, "not a non-private algorithm"),
        ({"epsilons": [-1.0]}, "must be positive"),
        ({"epsilons": []}, "need at least one value in epsilons"),
        ({"models": ["tiny-opt", "tiny-opt"]}, "repeated values"),
        ({"name": "bad name"}, "name"),
        ({"audit": {"algorithms": ["dpsgd"]}}, r"audit\.algorithms: \['dpsgd'\] not in the study"),
        ({"audit": {"epsilons": [8.0]}}, r"audit\.epsilons: \[8\.0\] not in the study"),
        ({"audit": {"algorithms": ["dpzero"], "epsilons": []}}, "select no cell"),
        ({"audit": {"canaries": 1}}, "canaries"),
        ({"audit": {"alpha": 1.5}}, "alpha"),
    ],
)
def test_bad_study_configs_fail_at_load(tmp_path, sentiment_files, change, message):
    path = _study_file(tmp_path, sentiment_files, **change)
    with pytest.raises(ConfigError, match=message):
        load_study_config(path)


def test_directions_add_k_cells_to_zeroth_order_arms_only(tmp_path, sentiment_files):
    path = _study_file(
        tmp_path,
        sentiment_files,
        epsilons=[2.0],
        non_private_algorithms=["mezo", "adamw"],
        directions=[1, 16],
    )
    study = load_study_config(path)
    cells = expand_cells(study)
    assert [cell.name for cell in cells] == [
        "tiny-opt-task-dpzero-eps2-seed0",
        "tiny-opt-task-dpzero-k16-eps2-seed0",
        "tiny-opt-task-mezo-nonprivate-seed0",
        "tiny-opt-task-mezo-k16-nonprivate-seed0",
        "tiny-opt-task-adamw-nonprivate-seed0",  # first-order: one cell, one direction
    ]
    configs = [cell_config(study, cell) for cell in cells]
    assert [c.optimizer.directions_per_step for c in configs] == [1, 16, 1, 16, 1]
    # K > 1 needs the continuous Gaussian: the private K-cell alone leaves the grid
    assert configs[0].privacy.noise_grid is not None
    assert configs[1].privacy.noise_grid is None
    assert configs[1].privacy.epsilon == configs[0].privacy.epsilon == 2.0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"directions": [0]}, r"directions: \[0\] out of range; allowed: 1\.\.1024"),
        ({"directions": [1, 16, 16]}, "directions: repeated values"),
        ({"directions": []}, "at least 1"),
        (
            {"directions": [16], "private_algorithms": ["dpsgd"], "non_private_algorithms": []},
            "applies only to",
        ),
    ],
)
def test_bad_directions_fail_at_load(tmp_path, sentiment_files, change, message):
    with pytest.raises(ConfigError, match=message):
        load_study_config(_study_file(tmp_path, sentiment_files, **change))


def test_a_bad_cell_fails_before_any_cell_runs(tmp_path, sentiment_files, cache_dir):
    path = _study_file(tmp_path, sentiment_files, overrides={"optimizer.steps": 0})
    study = load_study_config(path)
    with pytest.raises(ConfigError, match=r"optimizer\.steps"):
        run_study(study, tmp_path / "study", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "study").exists()


def test_a_missing_model_in_the_third_cell_fails_before_any_cell_trains(
    tmp_path, sentiment_files, cache_dir
):
    """Every cell's model, task and budget are checked before the first trains: the two cells
    of the good model are not trained before the bad one is found."""
    missing = tmp_path / "no-such-model"
    path = _study_file(tmp_path, sentiment_files, models=["tiny-opt", str(missing)], epsilons=[2])
    study = load_study_config(path)
    bad = expand_cells(study)[2].name
    assert bad.startswith(str(missing).replace("/", "_"))
    with pytest.raises(ConfigError, match=rf"study cell 3/4 {bad}: .*no such directory"):
        run_study(study, tmp_path / "study", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "study").exists()


def test_an_unreachable_budget_in_a_later_cell_fails_before_any_cell_trains(
    tmp_path, sentiment_files, cache_dir
):
    """The privacy plan of every cell too: ε = 1e-9 cannot be reached."""
    path = _study_file(tmp_path, sentiment_files, epsilons=[2.0, 1e-9])
    study = load_study_config(path)
    with pytest.raises(ConfigError, match=r"study cell 2/3 tiny-opt-task-dpzero-eps1e-09-seed0"):
        run_study(study, tmp_path / "study", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "study").exists()


def test_audit_cells_run_after_the_cells_resume_and_fill_the_report(
    tmp_path, sentiment_files, cache_dir
):
    """Both arms audited with 20 canaries (k = 5): a third invocation reruns nothing, and the
    report's table and plot hold each audit's ε claimed, ε_lb, verdict, M and k."""
    audit = {"canaries": 20, "ks": [5], "scores": ["black-box", "white-box-likelihood"]}
    path = _study_file(tmp_path, sentiment_files, epsilons=[2.0], audit=audit)
    study = load_study_config(path)
    output = tmp_path / "study"
    options = {"cache_dir": cache_dir, "progress": False, "echo": lambda _: None}
    first = run_study(study, output, max_cells=3, **options)  # both cells and one audit
    assert (first["cells_finished"], first["audit_cells"], first["audit_cells_finished"]) == (
        2,
        2,
        1,
    )
    assert first["complete"] is False and not (output / "report").exists()
    audits = sorted((output / "audits").iterdir())
    done = output / "audits" / "tiny-opt-task-dpzero-eps2-seed0-audit" / "audit.json"
    assert [d.name for d in audits] == [done.parent.name] and done.is_file()
    mtime = done.stat().st_mtime_ns

    second = run_study(study, output, **options)
    assert second["complete"] is True and second["audit_cells_finished"] == 2
    assert done.stat().st_mtime_ns == mtime  # the finished audit was not run again
    records = {
        d.name: json.loads((d / "audit.json").read_text())
        for d in sorted((output / "audits").iterdir())
    }
    assert set(second["audits"]) == set(records)
    assert run_study(study, output, **options)["audits"] == second["audits"]  # nothing reruns
    assert done.stat().st_mtime_ns == mtime

    table = pq.read_table(output / "report" / "audits.parquet").to_pylist()
    by_budget = {row["budget"]: row for row in table}
    assert set(by_budget) == {"dpzero ε=2", "mezo (non-private)"}
    for name, record in records.items():
        row = by_budget["dpzero ε=2" if "dpzero" in name else "mezo (non-private)"]
        assert row["epsilon_lower_bound"] == pytest.approx(record["epsilon_lower_bound"])
        assert row["verdict"] == record["verdict"]
        assert (row["canaries"], row["k"]) == (20, record["best"]["k"]) == (20, 5)
        assert row["correct"] == f"{record['best']['correct']}/10"
    private = by_budget["dpzero ε=2"]
    assert private["epsilon_claimed"] == pytest.approx(records[done.parent.name]["epsilon_claimed"])
    assert private["verdict"] == "consistent" and private["model"] == "tiny-opt"
    assert by_budget["mezo (non-private)"]["epsilon_claimed"] is None
    assert by_budget["mezo (non-private)"]["verdict"] == "not private"
    image = output / "report" / "audits.png"
    assert image.stat().st_size > 1000 and image.read_bytes()[:4] == b"\x89PNG"
    client = open_client(f"sqlite:///{output / 'mlflow.db'}")
    logged = {a.path for a in client.list_artifacts(second["parent_run_id"], "report")}
    assert {"report/audits.png", "report/audits.parquet"} <= logged  # the plot via log_figure
    # a study of a private arm, its private cell and that cell's audit release no clock
    private_runs = [
        second["parent_run_id"],
        records[done.parent.name]["tracking_run_id"],
        records[done.parent.name]["audited_run_id"],
    ]
    for run_id in private_runs:
        info = client.get_run(run_id).info
        assert info.start_time == info.end_time == PUBLIC_TIME_MS, run_id
    report = (output / "report" / "report.md").read_text()
    assert "## Audited ε vs claimed ε" in report and "](audits.png)" in report
    section = report.split("## Audited ε vs claimed ε", 1)[1].splitlines()
    line = next(line for line in section if "| dpzero ε=2 " in line)
    cells = [cell.strip() for cell in line.strip("|").split("|")]
    assert f"{private['epsilon_lower_bound']:.3f}" in cells and "consistent" in cells
    # the audited runs (trained with canaries) stay out of the scaling tables
    runs = pq.read_table(output / "report" / "runs.parquet").to_pylist()
    assert sorted(row["cell"] for row in runs) == [
        "tiny-opt-task-dpzero-eps2-seed0",
        "tiny-opt-task-mezo-nonprivate-seed0",
    ]


@pytest.mark.parametrize(
    ("audit", "message"),
    [
        ({"canaries": 20, "ks": [15]}, r"study audit cell 1/3 .*-audit: ks=\[15\]"),
        ({"canaries": 65}, r"study audit cell 1/3 .*-audit: --canaries=65: more canaries than"),
    ],
)
def test_a_bad_audit_cell_fails_before_any_cell_trains(
    tmp_path, sentiment_files, cache_dir, audit, message
):
    """k against M, and M against the 64 training rows, before the first trained cell."""
    path = _study_file(tmp_path, sentiment_files, audit=audit)
    study = load_study_config(path)
    with pytest.raises(ConfigError, match=message):
        run_study(study, tmp_path / "study", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "study").exists()


def test_synthetic_study_is_recorded_in_mlflow_and_not_rerun(tmp_path):
    path = tmp_path / "synthetic.yaml"
    data = {
        "type": "synthetic-quadratic",
        "dimensions": [4, 16],
        "patterns": ["rank-log-d"],
        "steps": 20,
        "dataset_size": 10,
        "grid": {"learning_rates": [0.1], "clip_thresholds": [1.0]},
        "algorithm_grids": {"dp-gd": {"learning_rates": [0.1], "clip_thresholds": [1.0]}},
        "seeds": [0],
    }
    path.write_text(yaml.safe_dump(data))
    study = load_study_config(path)
    output = tmp_path / "synthetic"
    summary = run_study(study, output, progress=False, echo=lambda _: None)
    client = open_client(f"sqlite:///{output / 'mlflow.db'}")
    run = client.get_run(summary["parent_run_id"])
    assert run.info.status == "FINISHED" and run.data.params["steps"] == "20"
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"synthetic_table.md", "synthetic_gradient_norm.png", "synthetic_best.json"} <= artifacts
    best = read_table(f"sqlite:///{output / 'mlflow.db'}", run.info.run_id, "synthetic_best.json")
    assert sorted(set(best["dimension"])) == [4, 16] and {"mean", "learning_rate"} <= set(best)
    table = (output / "synthetic_table.md").read_text()
    assert "dpzero" in table.lower() and "dpgd-0th" in table.lower()
    again = run_study(study, output, progress=False, echo=lambda _: None)
    assert again == summary  # reused, not run again


def test_study_overrides_merge_into_the_base_section(tmp_path, sentiment_files):
    path = _study_file(tmp_path, sentiment_files)
    study = load_study_config(path, ["overrides.optimizer.steps=9"])
    config = cell_config(study, expand_cells(study)[0])
    assert config.optimizer.steps == 9
    assert (config.optimizer.batch_size, config.optimizer.learning_rate) == (8, 1e-3)


@pytest.mark.slow
def test_ctrl_c_in_a_study_prints_one_line_and_exits_130(tmp_path, cache_dir):
    """Interrupted inside its first cell, ``privzo study`` says so in one line, no traceback."""
    import signal
    import subprocess
    import sys

    from conftest import REPO

    command = [sys.executable, "-u", "-m", "privzo", "study"]
    command += [str(REPO / "configs" / "studies" / "tiny-scaling.yaml")]
    command += ["--output-dir", str(tmp_path / "study"), "--cache-dir", str(cache_dir)]
    command += ["overrides.optimizer.steps=100000", "overrides.tracking.backend=none"]
    study = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first = study.stdout.readline()  # the handler runs: the interrupt lands inside privzo
    assert "cell 1/6" in first, first
    study.send_signal(signal.SIGINT)
    _out, err = study.communicate(timeout=120)
    assert study.returncode == 130, err
    assert "Traceback" not in err, err
    assert err.strip().splitlines()[-1] == "privzo study: interrupted"
