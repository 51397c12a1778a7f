"""A hyperparameter search under a fixed privacy budget, on Ray Tune, recorded in MLflow.

plan (privzo.search.plan) → parent MLflow run → Tune trials (each a normal privzo run and a
child MLflow run) → ``trials.parquet``, ``search_summary.json`` and a printed table. A search
directory remembers its parent run and trial count, so running the same search again resumes
it: Tune restores its experiment and finished trials are not run again.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from privzo.algorithms.registry import writes_trajectory
from privzo.distributed.cluster import RayCluster, RayTarget, choose_cluster, connect_ray
from privzo.distributed.launch import ray_runtime_env
from privzo.distributed.storage import alive_nodes, check_cluster_storage
from privzo.rundir import SUMMARY_FILE as RUN_SUMMARY_FILE
from privzo.rundir import (
    read_json_object,
    write_json_atomically,
    write_text_atomically,
)
from privzo.search.config import SearchConfig
from privzo.search.plan import SearchPlan, plan_search
from privzo.search.ray_adapter import result_grid_trials
from privzo.search.resources import TrialResources, check_trial_resources
from privzo.search.summary import SCORE, SearchBounds, SearchSummary, TrialRow
from privzo.search.trial import TRIALS_DIR, run_trial
from privzo.section import ConfigError
from privzo.tracking import Tracker, connect_tracker, end_runs, find_runs, make_tracker
from privzo.tracking.tags import BEST_MODEL_URI

STATE_FILE = "search_state.json"
TRIALS_FILE = "trials.parquet"
SUMMARY_FILE = "search_summary.json"
SEARCH_CONFIG_FILE = "search_config.yaml"
TRIALS_TABLE_ARTIFACT = "trials.json"  # the trials as an MLflow table (log_table), for the UI
TUNE_DIR = "tune"
TUNE_NAME = "search"


@dataclass
class SearchState:
    """What a resumed search reuses: its parent run and its (secretly drawn) trial count."""

    fingerprint: str
    trial_count: int
    parent_run_id: str | None

    @classmethod
    def load(cls, path: Path) -> SearchState | None:
        return cls(**json.loads(path.read_text())) if path.is_file() else None

    def save(self, path: Path) -> None:
        write_json_atomically(path, asdict(self))


def search_fingerprint(search: SearchConfig) -> str:
    text = json.dumps(search.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def run_search(
    search: SearchConfig,
    output_dir: Path,
    *,
    cache_dir: Path,
    cluster: RayTarget | None = None,
    num_cpus: int | None = None,
    tracking_uri: str | None = None,
    tracking_root: Path | None = None,
    tags: dict[str, str] | None = None,
    progress: bool = True,
    echo: Callable[[str], None] = print,
) -> SearchSummary:
    """Plan, run (or resume) and record the search; returns the search summary.

    Without a tracking URI the MLflow store is sqlite under ``tracking_root`` (default
    ``output_dir``), shared by the parent run and every trial. ``num_cpus`` is what a local Ray
    (started when ``cluster`` points to no running one) may schedule: the cores this process
    may use, which Ray would otherwise take from the machine; a joined cluster keeps its own.
    """
    output_dir = Path(output_dir).resolve()
    tracking_root = Path(tracking_root or output_dir).resolve()
    state_path = output_dir / STATE_FILE
    state = SearchState.load(state_path)
    fingerprint = search_fingerprint(search)
    if state is not None and state.fingerprint != fingerprint:
        raise ConfigError(
            f"--output-dir {str(output_dir)!r} holds a different search; choose another "
            "directory (a search resumes only with exactly the same config)"
        )
    plan = plan_search(search, cache_dir, trial_count=state.trial_count if state else None)
    local = _local_resources(cluster, num_cpus)
    if local is not None:  # a search the machine cannot run is refused before Ray starts
        check_trial_resources(search, plan.base, local)
    echo(start_ray(cluster, num_cpus).line())
    _check_cluster(plan, output_dir, tracking_uri)  # before the tracker writes a local store
    resources = _check_resources(plan)
    tracker = _parent_tracker(plan, output_dir, tracking_root, tracking_uri, tags or {})
    output_dir.mkdir(parents=True, exist_ok=True)
    if state is None:
        tracker.start()
        state = SearchState(fingerprint, plan.trial_count, tracker.run_id)
        state.save(state_path)
        tracker.log_params(search.model_dump(mode="json"))
        write_text_atomically(
            output_dir / SEARCH_CONFIG_FILE,
            yaml.safe_dump(search.model_dump(mode="json"), sort_keys=False),
        )
    else:
        echo(f"resuming the search in {output_dir}")
        if state.parent_run_id is not None:
            tracker.attach(state.parent_run_id)
        else:
            tracker.start()
    with tracker:
        places = _Places(output_dir, cache_dir, tracking_root, tracking_uri)
        results = _fit(plan, state, places, resources, progress)
        summary = _record(plan, results, output_dir, tracker)
        if summary.interrupted:
            tracker.finish("KILLED")
    echo("\n".join(summary.lines()))
    if summary.interrupted:
        echo(f"the search was interrupted; run the same command again to resume it in {output_dir}")
    return summary


def _parent_tracker(
    plan: SearchPlan,
    output_dir: Path,
    tracking_root: Path,
    tracking_uri: str | None,
    extra_tags: dict[str, str],
) -> Tracker:
    tracking, base = plan.base.tracking, plan.base
    tags = {
        "privzo.role": "search",
        "privzo.model": base.model.name_or_path,
        "privzo.task": base.task.name,
        "privzo.algorithm": base.optimizer.algorithm,
        "privzo.search_algorithm": plan.search.algorithm,
    }
    if plan.private:
        tags["privzo.epsilon"] = f"{base.privacy.epsilon:g}"
    tracker = make_tracker(
        tracking.backend,
        uri=tracking.uri or tracking_uri,
        experiment=tracking.experiment,
        output_root=tracking_root,
        run_name=f"search-{output_dir.name}",
        tags={**tags, **extra_tags},
        release_timing=base.releases_diagnostics,  # the trials' times add up to the search's
    )
    return connect_tracker(tracker, tracking.uri or tracking_uri)


def start_ray(cluster: RayTarget | None, num_cpus: int | None) -> RayCluster:
    """Join the cluster ``cluster`` points to (keeping its own CPU count) or start a local Ray with
    ``num_cpus``; trials import this privzo, not a node's."""
    return connect_ray(cluster, ray_runtime_env({}), num_cpus)


def _check_cluster(plan: SearchPlan, output_dir: Path, tracking_uri: str | None) -> None:
    """On a cluster of several nodes, trials run on every node: Tune's state and the trials'
    run directories (under --output-dir) and the tracking store must be reachable from all."""
    tracking = plan.base.tracking
    check_cluster_storage(
        alive_nodes(),
        str(output_dir),
        tracking.uri or tracking_uri,
        storage_setting="--output-dir",
        uri_allowed=False,
        tracking=tracking.backend != "none",
    )


def _local_resources(ray_target: RayTarget | None, num_cpus: int | None) -> dict[str, float] | None:
    """What a local Ray not yet started will schedule (``num_cpus`` CPUs, the GPUs torch sees);
    None when joining a cluster or when Ray already runs (its own counts are checked)."""
    import ray

    target = ray_target or RayTarget()
    choice = choose_cluster(target.address, target.env_address, target.file_text())
    if choice.joins or num_cpus is None or ray.is_initialized():
        return None
    import torch

    return {"CPU": float(num_cpus), "GPU": float(torch.cuda.device_count())}


def _check_resources(plan: SearchPlan) -> TrialResources:
    """A trial (and, for distributed trials, every concurrent one) must fit on the cluster, or
    Tune would wait for it forever."""
    import ray

    return check_trial_resources(plan.search, plan.base, dict(ray.cluster_resources()))


@dataclass(frozen=True)
class _Places:
    """Where a search's trials write and read."""

    output_dir: Path
    cache_dir: Path
    tracking_root: Path
    tracking_uri: str | None


def _fit(
    plan: SearchPlan,
    state: SearchState,
    places: _Places,
    resources: TrialResources,
    progress: bool,
) -> Any:
    from ray import tune
    from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback

    search, output_dir = plan.search, places.output_dir
    setup = {
        "search": search.model_dump(mode="json"),
        "derived": plan.derived,
        "output_dir": str(output_dir),
        "tracking_root": str(places.tracking_root),
        "cache_dir": str(Path(places.cache_dir).resolve()),
        "tracking_uri": places.tracking_uri,
        "parent_run_id": state.parent_run_id,
        "search_name": output_dir.name,
        # each trial's torch threads: the CPUs Tune reserves for it, so trials never share cores
        # (a distributed trial's driver trains nothing: its workers set their own)
        "threads": max(1, int(resources.driver.get("CPU", 1))),
    }
    # the fixed settings travel beside the sampled point, so Tune's tables show only the point
    trainable = tune.with_resources(
        tune.with_parameters(run_trial, setup=setup), resources.tune_spec()
    )
    param_space = {"point": tune_param_space(search)}
    experiment = output_dir / TUNE_DIR / TUNE_NAME
    if tune.Tuner.can_restore(str(experiment)):
        tuner = tune.Tuner.restore(
            str(experiment), trainable=trainable, param_space=param_space, resume_errored=True
        )
    else:
        tuner = tune.Tuner(
            trainable,
            param_space=param_space,
            tune_config=_tune_config(plan),
            run_config=tune.RunConfig(
                name=TUNE_NAME,
                storage_path=str(output_dir / TUNE_DIR),
                verbose=1 if progress else 0,
                failure_config=tune.FailureConfig(max_failures=0),
                # Tune's result files, without its automatic TensorBoard logger (not installed);
                # a private search's results lose Tune's timing fields first
                callbacks=[*_withheld(plan), CSVLoggerCallback(), JsonLoggerCallback()],
            ),
        )
    return tuner.fit()


def _withheld(plan: SearchPlan) -> list[Any]:
    """The callbacks that keep what a private search's trials may not release out of Tune's
    records: its timing fields and trials' start and report times (``privzo.search.withhold``)."""
    if not plan.private:
        return []
    from privzo.search.withhold import WithholdTiming

    return [WithholdTiming()]


def tune_param_space(search: SearchConfig) -> dict[str, Any]:
    from ray import tune

    point: dict[str, Any] = {}
    for key, spec in search.space.items():
        if isinstance(spec, list):
            point[key] = tune.grid_search(spec) if search.algorithm == "grid" else tune.choice(spec)
        elif spec.integer:
            sampler = tune.lograndint if spec.log else tune.randint
            point[key] = sampler(int(spec.low), int(spec.high) + 1)
        else:
            point[key] = (tune.loguniform if spec.log else tune.uniform)(spec.low, spec.high)
    return point


def _tune_config(plan: SearchPlan) -> Any:
    from ray import tune
    from ray.tune.schedulers import ASHAScheduler
    from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter

    from privzo.search.withhold import public_trial_dirname

    search = plan.search
    concurrency = search.resources.concurrency
    if search.algorithm == "optuna":
        from ray.tune.search.optuna import OptunaSearch

        searcher: Any = ConcurrencyLimiter(OptunaSearch(seed=point_seed(search)), concurrency)
    else:  # a generator, not a Searcher: it takes the concurrency limit itself
        searcher = BasicVariantGenerator(
            random_state=point_seed(search), max_concurrent=concurrency
        )
    scheduler = None
    if search.scheduler.type == "asha":
        releases = max(event.score_releases for event in plan.events) if plan.events else None
        scheduler = ASHAScheduler(
            time_attr="training_iteration",
            max_t=releases or _max_scores(plan),
            grace_period=search.scheduler.grace_period,
            reduction_factor=search.scheduler.reduction_factor,
        )
    return tune.TuneConfig(
        metric=SCORE,
        mode=search.selection.mode,
        search_alg=searcher,
        scheduler=scheduler,
        num_samples=1 if search.algorithm == "grid" else plan.trial_count,
        # Tune's default folder name ends in the trial's creation date
        trial_dirname_creator=public_trial_dirname if plan.private else None,
    )


def point_seed(search: SearchConfig) -> int:
    """The random search's seed: the public ``seed`` (default 0), or for repeat-and-select a
    secret one, so each trial's point is an independent draw nobody can replay (Tune keeps
    the generator's state in the search directory, with the secret trial count)."""
    if search.trials.distribution == "geometric":
        return secrets.randbits(32)
    return search.seed or 0


def _max_scores(plan: SearchPlan) -> int:
    every = plan.search.scheduler.evaluate_every
    return max(1, math.ceil(plan.base.optimizer.steps / every))


def _record(plan: SearchPlan, results: Any, output_dir: Path, tracker: Tracker) -> SearchSummary:
    """trials.parquet, the summary and the parent run's metrics, tags and artifacts."""
    import pandas as pd

    # ResultGrid keeps Tune's trial objects (id, config) in the order of its results; the
    # statuses come from the saved experiment state, which is what a resume starts from (after
    # Ctrl+C the in-memory trials all read TERMINATED)
    trials = result_grid_trials(results)
    saved = _saved_statuses(results.experiment_path)
    rows = [
        _trial_row(trial, saved.get(trial.trial_id, trial.status), result, output_dir, plan)
        for trial, result in zip(trials, results, strict=True)
    ]
    rows.sort(key=lambda row: row["trial_id"])
    pd.DataFrame(rows).to_parquet(output_dir / TRIALS_FILE, index=False)
    stopped = {row["trial_id"] for row in rows if row["status"] == "stopped"}
    _close_stopped_children(tracker, plan, stopped)
    trials_run = sum(row["status"] != "pending" for row in rows)
    best = best_trial(rows, plan.search.selection.mode)
    summary = SearchSummary(
        interrupted=any(row["status"] in UNFINISHED for row in rows),
        trials_run=trials_run,
        trials_finished=sum(row["status"] == "finished" for row in rows),
        best_trial=best,
        space=list(plan.search.space),
        metric=next((row["metric"] for row in rows if row["metric"]), None),
        bounds=SearchBounds(**plan.bounds(trials_run=trials_run)),
        best_model_uri=best_model_uri(rows, best, plan),
        trials=rows,
    )
    record = summary.to_dict()
    write_json_atomically(output_dir / SUMMARY_FILE, record)
    log_search_parent(tracker, record, output_dir)
    return summary


# Tune statuses of a trial the search has not finished with (an interrupted search)
UNFINISHED = ("pending", "running", "paused")
_RUN_KEYS = (
    "metric",
    "metric_after",
    "metric_before",
    "epsilon",
    "delta",
    "replace_one_epsilon",
    "replace_one_delta",
    "noise_multiplier",
    "sample_rate",
    "steps",
    "peak_memory_mb",
    "mean_step_time_s",
    "wall_time_s",
    "tracking_run_id",
    "selection_releases",
)


def _saved_statuses(experiment_path: str) -> dict[str, str]:
    from ray.tune import ExperimentAnalysis

    return {trial.trial_id: trial.status for trial in ExperimentAnalysis(experiment_path).trials}


def _trial_row(
    trial: Any, status: str, result: Any, output_dir: Path, plan: SearchPlan
) -> TrialRow:
    """One trials.parquet row: the point, the trial's layout, the run's summary fields and how
    the trial ended."""
    summary_path = output_dir / TRIALS_DIR / trial.trial_id / RUN_SUMMARY_FILE
    summary = read_json_object(summary_path) or {}
    row: TrialRow = {"trial_id": trial.trial_id, "status": _status(status, summary)}
    row.update(trial.config["point"])
    # the layout is not searchable: every trial runs the base's (and overrides') parallel keys
    parallel = plan.base.parallel
    row.update({"strategy": parallel.strategy, "workers": parallel.workers})
    row.update({key: summary.get(key) for key in _RUN_KEYS})
    row[SCORE] = summary.get(SCORE, (result.metrics or {}).get(SCORE))
    return row


def _status(tune_status: str, summary: dict[str, Any]) -> str:
    if summary and tune_status in ("TERMINATED", "ERROR"):
        return "finished"
    if tune_status == "TERMINATED":  # ended without a summary: stopped early by the scheduler
        return "stopped"
    return tune_status.lower()  # error, or pending / running / paused when interrupted


def best_trial(rows: list[TrialRow], mode: str) -> str | None:
    """The finished trial with the best selection score (never the test metric)."""
    scored = [row for row in rows if row["status"] == "finished" and row[SCORE] is not None]
    if not scored:
        return None
    pick = max if mode == "max" else min
    return str(pick(scored, key=lambda row: row[SCORE])["trial_id"])


def _close_stopped_children(tracker: Tracker, plan: SearchPlan, stopped: set[str]) -> None:
    """End as KILLED the child runs of trials that did not finish on their own: still RUNNING
    (an interrupted attempt) or FAILED because the scheduler stopped them mid-run."""
    uri = getattr(tracker, "uri", None)
    if uri is None or tracker.run_id is None:
        return
    query = f"tags.mlflow.parentRunId = '{tracker.run_id}'"
    children = find_runs(uri, plan.base.tracking.experiment, query) or []
    unfinished = [
        child.run_id
        for child in children
        if child.status == "RUNNING"
        or (child.status == "FAILED" and child.tags.get("privzo.trial") in stopped)
    ]
    end_runs(uri, unfinished, "KILLED", release_timing=plan.base.releases_diagnostics)


def best_model_uri(rows: list[TrialRow], best: str | None, plan: SearchPlan) -> str | None:
    """The best trial's logged model (``runs:/<its run>/model``): runs that keep a trajectory
    log one (the base reference plus the trajectory, rebuilt by replay when loaded)."""
    row = next((row for row in rows if row["trial_id"] == best), {})
    if not row.get("tracking_run_id") or not writes_trajectory(plan.base):
        return None
    return f"runs:/{row['tracking_run_id']}/model"


def log_search_parent(tracker: Tracker, summary: Mapping[str, Any], output_dir: Path) -> None:
    """The search's parent run, from search_summary.json's content: best-trial metrics and
    tags, the trials as an MLflow table (``trials.json``, shown in the UI) and the search's files
    as artifacts."""
    import pandas as pd

    trials: list[TrialRow] = summary["trials"]
    best = next((row for row in trials if row["trial_id"] == summary["best_trial"]), {})
    metrics = {
        "trials_run": summary["trials_run"],
        "trials_finished": summary["trials_finished"],
        "best_selection_score": best.get(SCORE),
        "best_metric_after": best.get("metric_after"),
        "end_to_end_epsilon": summary.get("end_to_end_epsilon"),
        "records_epsilon": summary.get("records_epsilon"),
        "per_trial_epsilon": summary.get("per_trial_epsilon"),
    }
    tracker.log_metrics(
        {key: float(value) for key, value in metrics.items() if value is not None}, step=0
    )
    tags = {"privzo.best_trial": str(summary["best_trial"])}
    if best.get("tracking_run_id"):
        tags["privzo.best_run_id"] = str(best["tracking_run_id"])
    if summary.get("best_model_uri"):
        tags[BEST_MODEL_URI] = summary["best_model_uri"]
    if summary.get("guarantee"):
        tags["privzo.guarantee"] = summary["guarantee"]
    tracker.set_tags(tags)
    tracker.log_table(pd.DataFrame(summary["trials"]), TRIALS_TABLE_ARTIFACT)
    for name in (TRIALS_FILE, SUMMARY_FILE, SEARCH_CONFIG_FILE):
        if (output_dir / name).is_file():
            tracker.log_artifact(output_dir / name)
