"""Search configs, plans and the end-to-end privacy of a search (no Ray: seconds)."""

from __future__ import annotations

import json
import math
import os
import statistics
from pathlib import Path

import dp_accounting
import pytest
import yaml

from privzo.config import ConfigError
from privzo.privacy import compute_epsilon
from privzo.search import load_search_config, plan_search
from privzo.search.config import SearchConfig, base_run_config
from privzo.search.export import export_best
from privzo.search.privacy import (
    GEOMETRIC_SHAPE,
    TrialEvent,
    composition_epsilon,
    draw_geometric_count,
    epsilon_of_curve,
    rdp_curve,
    repeat_and_select_epsilon,
    worst_curve,
)
from privzo.search.record import TRIALS_TABLE_ARTIFACT, log_search_parent
from privzo.search.summary import format_table
from privzo.search.tuner import point_seed
from privzo.tracking import make_tracker, read_run, read_table
from privzo.tracking.clock import PUBLIC_TIME_MS


def test_plan_calibrates_each_trial_to_the_same_epsilon(make_search, sentiment_files, cache_dir):
    search = load_search_config(make_search())
    plan = plan_search(search, cache_dir)
    assert plan.trial_count == 4  # 2 × 2 grid
    by_steps = {event.steps: event for event in plan.events}
    assert sorted(by_steps) == [10, 30]
    # more steps at the same (ε, δ) need more noise ...
    assert by_steps[30].noise_multiplier > by_steps[10].noise_multiplier
    for event in plan.events:  # ... and every trial spends the target, to accountant tolerance
        assert event.noise_grid == 1024  # discrete noise, accounted as such
        epsilon = compute_epsilon(
            noise_multiplier=event.noise_multiplier,
            sample_rate=event.sample_rate,
            steps=event.steps,
            delta=1e-5,
            noise_parameters={"grid": event.noise_grid},
        )
        # on the grid Δ = ⌈K/σ⌉ moves in steps of ~σ/K, so ε lands up to ~1.5σ/K below target
        assert 2.0 - 5e-3 * 2.0 <= epsilon <= 2.0
        assert event.score_releases == 1
    bounds = plan.bounds(trials_run=4)
    assert bounds["end_to_end_epsilon"] >= bounds["per_trial_epsilon"]
    assert bounds["end_to_end_epsilon"] == bounds["records_epsilon"]
    # trials.parquet states q = B/N, so N: replace-one covers the records with it
    assert bounds["adjacency"] == "add-remove"
    assert bounds["replace_one_epsilon"] == 2 * bounds["end_to_end_epsilon"]
    assert "under replace-one adjacency, which also covers N" in bounds["guarantee"]
    assert "composition of 4 trials" in bounds["guarantee"]
    # the curves bound untruncated trials: truncating padded Poisson draws adds to δ
    exceed = max(event.exceed_probability for event in plan.events)
    records = bounds["records_epsilon"]
    assert exceed > 0 and bounds["delta"] == 1e-5 + (1 + math.exp(records)) * 4 * exceed
    assert f"{bounds['delta']:g})-DP under add/remove" in bounds["guarantee"]


def test_public_selection_costs_no_score_releases(make_search, sentiment_files, cache_dir):
    public = sentiment_files[1]
    path = make_search(selection={"split": "public", "public_path": str(public)})
    plan = plan_search(load_search_config(path), cache_dir)
    assert all(event.score_releases == 0 for event in plan.events)
    assert "no privacy cost" in plan.bounds(4)["selection"]
    private_plan = plan_search(load_search_config(make_search()), cache_dir)
    assert plan.bounds(4)["end_to_end_epsilon"] < private_plan.bounds(4)["end_to_end_epsilon"]


def test_repeat_and_select_matches_dp_accounting_for_one_event():
    event = TrialEvent(
        steps=200,
        sample_rate=0.02,
        noise_multiplier=1.1,
        score_releases=1,
        score_noise_multiplier=5.0,
    )
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(
        dp_accounting.dp_event.RepeatAndSelectDpEvent(event.dp_event(), 3.0, GEOMETRIC_SHAPE)
    )
    expected = accountant.get_epsilon(1e-5)
    assert repeat_and_select_epsilon(worst_curve([event]), 3.0, 1e-5) == pytest.approx(expected)


def test_ray_still_keeps_the_trials_where_the_adapter_reads_them():
    """``privzo.search.ray_adapter`` reads a ResultGrid's private experiment analysis; this
    fails, naming the adapter, if a Ray upgrade moves it."""
    import inspect

    from ray.tune import ResultGrid

    from privzo.search import ray_adapter

    assert "self._experiment_analysis" in inspect.getsource(ResultGrid.__init__)
    with pytest.raises(RuntimeError, match="no _experiment_analysis"):
        ray_adapter.result_grid_trials(object())


def test_worst_curve_bounds_every_event_and_composition_grows():
    events = [
        TrialEvent(steps=100, sample_rate=0.05, noise_multiplier=1.0),
        TrialEvent(steps=400, sample_rate=0.05, noise_multiplier=1.6),
    ]
    worst = worst_curve(events)
    for event in events:
        assert (worst >= rdp_curve(event.dp_event())).all()
    one, three = composition_epsilon(worst, 1, 1e-5), composition_epsilon(worst, 3, 1e-5)
    assert 0 < one < three
    # the repeat-and-select bound for a mean of 3 trials is below composing 10 trials
    assert repeat_and_select_epsilon(worst, 3.0, 1e-5) < composition_epsilon(worst, 10, 1e-5)


def test_geometric_search_reports_composition_for_what_it_stores(make_search, cache_dir):
    """A search keeps every trial's records, so its end-to-end ε is the composition over the
    trials that ran, whatever the trial count; repeat-and-select covers only the best trial
    exported alone (privzo export-best). Before: the repeat-and-select ε was reported as the
    search's end-to-end ε."""
    geometric = {"algorithm": "random", "trials": {"distribution": "geometric", "mean": 3}}
    plan = plan_search(load_search_config(make_search(**geometric)), cache_dir, trial_count=10)
    bounds = plan.bounds(trials_run=10)
    assert bounds["end_to_end_epsilon"] == bounds["records_epsilon"]
    assert bounds["best_export_epsilon"] < bounds["records_epsilon"]
    assert "privzo export-best" in bounds["guarantee"]
    assert "composition of 10 trials" in bounds["guarantee"]
    fixed = plan_search(load_search_config(make_search()), cache_dir)
    assert "best_export_epsilon" not in fixed.bounds(trials_run=4)


def test_repeat_and_select_points_come_from_secret_randomness(make_search):
    geometric = {"algorithm": "random", "trials": {"distribution": "geometric", "mean": 3}}
    search = load_search_config(make_search(**geometric))
    assert len({point_seed(search) for _ in range(8)}) > 1  # not replayable from the config
    assert point_seed(load_search_config(make_search(seed=7))) == 7
    assert point_seed(load_search_config(make_search())) == 0


def test_export_best_refuses_a_directory_without_a_finished_search(tmp_path):
    with pytest.raises(ConfigError, match="holds no finished search"):
        export_best(tmp_path, tmp_path / "export")
    assert not (tmp_path / "export").exists()


@pytest.mark.parametrize("private", [True, False])
def test_export_best_copies_contents_without_the_trials_times(tmp_path, private):
    """A trial's file times (its config written at its start, its trajectory at its end) give
    its duration: the export copies contents only, and a private search's export reads the
    public time throughout."""
    trial = tmp_path / "search" / "trials" / "t1"
    (trial / "model").mkdir(parents=True)
    files = {"config.yaml": "seed: 0\n", "trajectory.parquet": "rows", "model/weights": "w"}
    for name, text in files.items():
        (trial / name).write_text(text)
    (trial / "summary.json").write_text(json.dumps({"epsilon": 1.0, "tracking_run_id": "r"}))
    search = {"private": private, "best_trial": "t1", "end_to_end_epsilon": 2.0, "delta": 1e-5}
    (tmp_path / "search" / "search_summary.json").write_text(json.dumps(search))
    trial_times = {}
    for offset, path in enumerate([*trial.rglob("*"), trial], start=1):
        os.utime(path, (1e9 + offset, 1e9 + offset))  # distinct times, long past
        trial_times[path.relative_to(trial)] = 1e9 + offset

    exported = tmp_path / "export"
    export_best(tmp_path / "search", exported)
    for name, text in files.items():
        assert (exported / name).read_text() == text
    times = {path.stat().st_mtime for path in [exported, *exported.rglob("*")]}
    if private:
        assert times == {PUBLIC_TIME_MS / 1000}
    else:
        copied = {(exported / name).stat().st_mtime for name in files}
        assert not copied & set(trial_times.values())


def test_geometric_trial_count_has_the_configured_mean():
    draws = [draw_geometric_count(3.0) for _ in range(4000)]
    assert min(draws) >= 1
    assert statistics.mean(draws) == pytest.approx(3.0, rel=0.08)
    assert draw_geometric_count(1.0) == 1


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"space": {}}, "space is empty"),
        ({"space": {"privacy.epsilon": [1, 2]}}, "privacy.epsilon: not searchable"),
        ({"space": {"privacy.clip": []}}, "empty list"),
        ({"space": {"optimizer.steps": {"low": 10, "high": 20}}}, "must be a list of values"),
        (
            {
                "space": {"privacy.clip": {"low": 1.0, "high": 0.5}},
                "algorithm": "random",
                "trials": {"count": 2},
            },
            "must be below high",
        ),
        ({"algorithm": "random"}, "needs trials.count"),
        (
            {"algorithm": "optuna", "trials": {"distribution": "geometric", "mean": 3}},
            "needs independent trials",
        ),
        ({"trials": {"distribution": "geometric"}}, "needs mean"),
        (
            {"algorithm": "random", "trials": {"distribution": "geometric", "mean": 3}, "seed": 0},
            "secret randomness",
        ),
        ({"selection": {"split": "public"}}, "needs public_path"),
        ({"budget": {"mode": "derive-steps"}}, "needs budget.max_forward_passes"),
        (
            {
                "space": {"optimizer.batch_size": [4, 16]},
                "budget": {"max_forward_passes": 400, "mode": "derive-steps"},
            },
            "derive-steps' with optimizer.batch_size in space",
        ),
        (
            {
                "space": {"optimizer.directions_per_step": [1, 4]},
                "budget": {"max_forward_passes": 400, "mode": "derive-steps"},
            },
            "derive-steps' with optimizer.directions_per_step in space",
        ),
    ],
)
def test_bad_search_configs_fail_at_load(make_search, change, message):
    path = make_search()
    data = {**yaml.safe_load(path.read_text()), **change}
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=message):
        load_search_config(path)


SPACE = {"privacy.clip": [0.5, 1.0], "optimizer.steps": [10, 30]}  # make_search's


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"budget": {"max_forward_passes": 200}}, "costs 480 forward passes"),
        ({"overrides": {"task.validation_size": None}}, "needs task.validation_size"),
        ({"overrides": {"privacy.epsilon": 1e-4}}, "cannot be met"),
        ({"overrides": {"task.label_words": ["great", "Great"]}}, "map to equal tokens"),
        ({"overrides": {"optimizer.algorithm": "dpzo-laplace"}}, "cannot account"),
        (
            {"selection": {"split": "public", "public_path": "/no/such/file.jsonl"}},
            "does not exist",
        ),
        ({"space": {"optimizer.batch_size": [8, 1000]}}, "exceeds the"),
        ({"space": {"optimizer.learning_rate": [-1.0]}}, "greater than 0"),
        ({"overrides": {"tracking.log_private_diagnostics": True}}, "log_private_diagnostics"),
        ({"overrides": {"privacy.noise_grid": 2**17}}, "grid of at most 65536"),
        (
            {"algorithm": "optuna", "trials": {"count": 2}, "resources": {"concurrency": 2}},
            "resources.concurrency=2 in a private search: algorithm=optuna",
        ),
        (
            {"scheduler": {"type": "asha"}, "resources": {"concurrency": 2}},
            "resources.concurrency=2 in a private search: scheduler.type=asha",
        ),
        (
            {"space": {**SPACE, "optimizer.directions_per_step": [1, 4]}},
            "directions_per_step=4 with privacy.noise_grid",
        ),
        (
            {
                "space": {**SPACE, "optimizer.directions_per_step": [1, 4]},
                "overrides": {"privacy.noise_grid": None},
                "budget": {"max_forward_passes": 1000},
            },
            r"costs 1920 forward passes \(2 × 8 × 4 direction\(s\) × 30 steps\)",
        ),
    ],
)
def test_searches_that_cannot_run_fail_in_the_plan(make_search, cache_dir, change, message):
    path = make_search(**change)
    with pytest.raises(ConfigError, match=message):
        plan_search(load_search_config(path), cache_dir)


def test_directions_per_step_is_searched_at_one_privacy_cost(make_search, cache_dir):
    """K does not change a trial's privacy event: the same events as the search without it."""
    plain = make_search(overrides={"privacy.noise_grid": None})
    events = plan_search(load_search_config(plain), cache_dir).events
    path = make_search(
        space={**SPACE, "optimizer.directions_per_step": [1, 2]},
        overrides={"privacy.noise_grid": None},
    )
    plan = plan_search(load_search_config(path), cache_dir)
    assert plan.events == events and len(events) == 2


def test_derived_steps_fill_the_compute_budget(make_search, sentiment_files, cache_dir):
    path = make_search(
        space={"privacy.clip": [0.5, 1.0]},
        budget={"max_forward_passes": 400, "mode": "derive-steps"},
    )
    plan = plan_search(load_search_config(path), cache_dir)
    assert plan.derived == {"optimizer.steps": 25}  # 400 / (2 × batch 8)
    assert {event.steps for event in plan.events} == {25}


def test_search_config_round_trips_and_resolves_base_paths(make_search):
    search = load_search_config(make_search(), ["seed=3"])
    assert search.seed == 3 and Path(search.base[0]).is_absolute()
    assert SearchConfig.model_validate(search.model_dump(mode="json")) == search


def test_asha_counts_every_intermediate_score_as_a_release(make_search, cache_dir):
    path = make_search(
        algorithm="random",
        trials={"count": 2},
        scheduler={"type": "asha", "evaluate_every": 5},
    )
    plan = plan_search(load_search_config(path), cache_dir)
    assert {event.steps: event.score_releases for event in plan.events} == {10: 2, 30: 6}
    bad = make_search(scheduler={"type": "asha", "evaluate_every": 7})
    with pytest.raises(ConfigError, match=r"multiple of the base run's tracking\.log_every=5"):
        plan_search(load_search_config(bad), cache_dir)


def test_search_overrides_merge_into_the_base_section(make_search):
    """`overrides.optimizer.steps=40` sets one key of the base's optimizer section; the other
    keys (algorithm, batch size) survive, and the file's dotted overrides stay."""
    path = make_search(space={"privacy.clip": [0.5, 1.0]}, overrides={"tracking.log_every": 2})
    search = load_search_config(path, ["overrides.optimizer.steps=40"])
    assert search.overrides == {"tracking.log_every": 2, "optimizer.steps": 40}
    config = base_run_config(search, {"privacy.clip": 0.5})
    assert config.optimizer.steps == 40
    assert (config.optimizer.algorithm, config.optimizer.batch_size) == ("dpzero", 8)
    assert config.tracking.log_every == 2 and config.tracking.experiment == "search-test"
    assert config.privacy.clip == 0.5


def test_an_override_replaces_a_dotted_key_of_the_space(make_search, cache_dir):
    """`space.optimizer.steps=[20]` replaces the space's `optimizer.steps` entry (the shorter
    search the command tour runs), and `overrides.tracking.log_every=3` the file's dotted
    override; the other entries stay."""
    path = make_search(overrides={"tracking.log_every": 2})  # space: privacy.clip, steps
    overrides = ["space.optimizer.steps=[20]", "overrides.tracking.log_every=3"]
    search = load_search_config(path, overrides)
    assert search.space == {"privacy.clip": [0.5, 1.0], "optimizer.steps": [20]}
    assert search.overrides == {"tracking.log_every": 3}
    assert plan_search(search, cache_dir).trial_count == 2


def test_a_search_override_of_a_searched_key_is_refused(make_search):
    path = make_search()  # space: privacy.clip, optimizer.steps
    with pytest.raises(ConfigError, match=r"overrides\.optimizer\.steps: .*searched"):
        load_search_config(path, ["overrides.optimizer.steps=40"])


def test_search_table_prints_epsilon_and_sigma_to_the_same_places():
    """ε 1.999 and 2 in one column print to the same decimal places: "1.999" and "2.000"."""
    row = {"trial_id": "t0", "noise_multiplier": 2.0, "epsilon": 2.0, "metric_after": 0.5}
    rows = [
        row | {"selection_score": 0.7, "status": "finished"},
        row | {"trial_id": "t1", "epsilon": 1.9994, "selection_score": 0.6, "status": "finished"},
    ]
    for item in rows:
        item |= {"peak_memory_mb": None, "wall_time_s": None}
    summary = {"space": [], "trials": rows, "best_trial": "t0", "metric": "accuracy"}
    lines = format_table(summary).splitlines()
    assert "2.000  2.000" in lines[1] and "2.000  1.999" in lines[2]


def test_the_search_parent_logs_its_trials_as_an_mlflow_table(tmp_path):
    rows = [
        {
            "trial_id": "t0",
            "status": "finished",
            "privacy.clip": 1.0,
            "selection_score": 0.7,
            "metric_after": 0.8,
            "tracking_run_id": "abc",
            "peak_memory_mb": None,
        },
        {
            "trial_id": "t1",
            "status": "stopped",
            "privacy.clip": 4.0,
            "selection_score": None,
            "metric_after": None,
            "tracking_run_id": None,
            "peak_memory_mb": None,
        },
    ]
    summary = {"trials": rows, "best_trial": "t0", "trials_run": 2, "trials_finished": 1}
    summary["best_model_uri"] = "runs:/abc/model"
    tracker = make_tracker("mlflow", uri=None, experiment="s", output_root=tmp_path, run_name="p")
    with tracker:
        log_search_parent(tracker, summary, tmp_path)
    logged = read_table(tracker.uri, tracker.run_id, TRIALS_TABLE_ARTIFACT)
    assert logged["trial_id"].tolist() == ["t0", "t1"]
    assert logged["privacy.clip"].tolist() == [1.0, 4.0]
    assert logged["selection_score"].iloc[0] == 0.7 and logged["selection_score"].isna().iloc[1]
    record = read_run(tracker.uri, tracker.run_id)
    assert record["tags"]["privzo.best_run_id"] == "abc"
    assert record["tags"]["privzo.best_model_uri"] == "runs:/abc/model"
    assert TRIALS_TABLE_ARTIFACT in record["artifacts"]


def test_a_gridded_trial_is_accounted_at_its_noise_to_sensitivity_ratio():
    """Δ = ⌈K/σ⌉ grid units of sensitivity: the event's ratio is K/Δ ≤ σ, never σ itself."""
    gridded = TrialEvent(steps=100, sample_rate=0.05, noise_multiplier=1.3, noise_grid=1024)
    continuous = TrialEvent(steps=100, sample_rate=0.05, noise_multiplier=1.3)
    assert gridded.effective_noise_multiplier == 1024 / 788 < 1.3
    assert epsilon_of_curve(worst_curve([gridded]), 1e-5) > epsilon_of_curve(
        worst_curve([continuous]), 1e-5
    )


def test_tunes_timing_fields_are_withheld_from_a_result():
    from privzo.search.withhold import TIMING_FIELDS, withhold_timing

    result = {field: 1.5 for field in TIMING_FIELDS} | {"selection_score": 0.7, "step": 10}
    result["training_iteration"] = 2
    assert withhold_timing(result) == {"selection_score": 0.7, "step": 10, "training_iteration": 2}


def test_a_private_selection_score_is_exact_discrete_noise_on_its_grid(make_search, cache_dir):
    """Each released score × m × size is an integer: the examples' 0/1 scores on the grid 1/m
    plus an integer discrete Gaussian draw of scale ⌈σ_s·m⌉ (no float noise reaches it)."""
    from privzo.run import build_context
    from privzo.search.trial import SelectionScorer

    search = load_search_config(make_search())
    context = build_context(base_run_config(search), cache_dir, progress=False)
    scorer = SelectionScorer(search, private=True)
    size, grid = len(context.validation), 1024  # selection.score_grid's default
    accuracy = context.task.evaluate(context.scoring_model, context.validation, 8)["accuracy"]
    exact_units = round(accuracy * size) * grid
    scale = math.ceil(5.0 * grid)  # selection.score_noise_multiplier's default
    noise = []
    for step in range(1, 41):
        units = scorer.score(context, step) * grid * size
        assert units == pytest.approx(round(units), abs=1e-6)
        noise.append(round(units) - exact_units)
    assert scorer.releases == 40 and scorer.score(context, 40) == scorer.score(context, 40)
    assert 0.6 * scale < statistics.pstdev(noise) < 1.5 * scale  # 40 draws: ±11 % (1 sd)


def test_score_releases_are_accounted_at_the_discrete_noise_ratio(make_search, cache_dir):
    """The search's ε composes each score release as N_Z(0, s²) with sensitivity m, s = ⌈σ_s·m⌉:
    the accountant's ε for exactly that event, not the continuous σ_s."""
    path = make_search(selection={"split": "validation", "score_noise_multiplier": 5.3})
    plan = plan_search(load_search_config(path), cache_dir)
    scale = math.ceil(5.3 * 1024)
    for event in plan.events:
        assert (event.score_grid, event.score_releases) == (1024, 1)
        assert event.effective_score_noise_multiplier == scale / 1024 > 5.3

    def epsilon(event: TrialEvent, score_ratio: float) -> float:
        accountant = dp_accounting.rdp.RdpAccountant()
        step = dp_accounting.PoissonSampledDpEvent(
            event.sample_rate, dp_accounting.GaussianDpEvent(event.effective_noise_multiplier)
        )
        accountant.compose(step, event.steps)
        accountant.compose(dp_accounting.GaussianDpEvent(score_ratio), event.score_releases)
        return accountant.get_epsilon(1e-5)

    for event in plan.events:
        per_trial = epsilon_of_curve(worst_curve([event]), 1e-5)
        assert per_trial == pytest.approx(epsilon(event, scale / 1024), rel=1e-9)
        assert per_trial < epsilon(event, 5.3)
    assert "discrete Gaussian of std 5428/1024" in plan.bounds(4)["selection"]


def test_an_attempt_a_trial_started_over_from_composes_like_a_trial(make_search, cache_dir):
    """What a restarted trial's earlier attempt released (its scores) stays released: the
    search's bound, its δ and its words count the attempt as one more trial."""
    plan = plan_search(load_search_config(make_search()), cache_dir)
    once, restarted, more = plan.bounds(3), plan.bounds(3, restarts=1), plan.bounds(4)
    assert restarted["end_to_end_epsilon"] == more["end_to_end_epsilon"]
    assert restarted["end_to_end_epsilon"] > once["end_to_end_epsilon"]
    assert restarted["delta"] == more["delta"] > once["delta"]
    words = "composition of 3 trials and 1 earlier attempt of trials that started over (RDP)"
    assert words in restarted["guarantee"]
    assert "earlier attempt" not in once["guarantee"]


def test_a_trial_without_a_trajectory_counts_each_attempt_it_starts_over_from(
    tmp_path, tiny_run_config
):
    """An interrupted dpsgd trial cannot resume: the attempt it starts over from is counted in
    its directory, and starting over (which clears the run's records) keeps the count."""
    from privzo.rundir import ResumePoint, prepare_output_dir, write_config, write_resume_point
    from privzo.search.trial import count_restart, restarts

    trial_dir = tmp_path / "trial"
    first_order = tiny_run_config("optimizer.algorithm=dpsgd")
    assert count_restart(first_order, trial_dir) == 0  # a first attempt: nothing before it
    prepare_output_dir(trial_dir)
    write_config(trial_dir, first_order)  # an attempt began, and was interrupted
    assert count_restart(first_order, trial_dir) == 1
    prepare_output_dir(trial_dir)  # the new attempt clears the old one's records
    assert restarts(trial_dir) == 1
    write_config(trial_dir, first_order)  # interrupted again
    assert count_restart(first_order, trial_dir) == 2 == restarts(trial_dir)
    # a DPZero trial goes on from its trajectory, or, when it saved no window (released
    # nothing), starts over: neither loses an attempt
    zeroth_order, resumable = tiny_run_config(), tmp_path / "resumable"
    prepare_output_dir(resumable)
    write_config(resumable, zeroth_order)
    assert count_restart(zeroth_order, resumable) == 0  # no window saved
    write_resume_point(resumable, ResumePoint("abc123", None))
    assert count_restart(zeroth_order, resumable) == 0 == restarts(resumable)


def test_a_private_searchs_tune_experiment_is_kept_beside_its_directory(tmp_path):
    """Tune names its state files after each session's start: a private search keeps them out
    of its directory (one found inside is moved out), a non-private one inside."""
    from privzo.search.tuner import tune_dir

    output = tmp_path / "search"
    assert tune_dir(output, private=False) == output / "tune"
    (output / "tune" / "search").mkdir(parents=True)
    (output / "tune" / "search" / "experiment_state-x.json").write_text("{}")
    beside = tune_dir(output, private=True)
    assert beside == tmp_path / "search.tune-state" and not (output / "tune").exists()
    assert (beside / "search" / "experiment_state-x.json").read_text() == "{}"
    assert tune_dir(output, private=True) == beside
