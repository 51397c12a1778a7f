"""The search's Ray Tune experiment: the trainable, the parameter space, the searcher and
scheduler, and where the trials write; created anew or restored from where it is kept.

Tune names its state files after each session's start (``experiment_state-<date>_<time>.json``,
the searcher's beside it) and keeps clocks in them: the session's start and running time, the
trials' storage timestamps, Ray's session folder, Optuna's trial start and end times. A private
search's directory is a release, so Tune's experiment is kept beside it (``tune_dir``), as the
operator's own, like the console; a non-private one keeps it inside.
"""

from __future__ import annotations

import math
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.search.config import SearchConfig
from privzo.search.plan import SearchPlan
from privzo.search.resources import TrialResources
from privzo.search.summary import SCORE
from privzo.search.trial import run_trial

TUNE_DIR = "tune"
TUNE_NAME = "search"
PRIVATE_TUNE_SUFFIX = ".tune-state"  # beside a private search's directory: DIR.tune-state


@dataclass(frozen=True)
class SearchPlaces:
    """Where a search's trials write and read."""

    output_dir: Path
    cache_dir: Path
    tracking_root: Path
    tracking_uri: str | None


def fit(
    plan: SearchPlan,
    parent_run_id: str | None,
    places: SearchPlaces,
    resources: TrialResources,
    progress: bool,
) -> Any:
    """Tune's fit of the search's trials (a new experiment, or the saved one restored); its
    ResultGrid."""
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
        "parent_run_id": parent_run_id,
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
    storage = tune_dir(output_dir, plan.private)
    experiment = storage / TUNE_NAME
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
                storage_path=str(storage),
                verbose=1 if progress else 0,
                failure_config=tune.FailureConfig(max_failures=0),
                # Tune's result files, without its automatic TensorBoard logger (not installed);
                # a private search's results lose Tune's timing fields first
                callbacks=[*_withheld(plan), CSVLoggerCallback(), JsonLoggerCallback()],
            ),
        )
    return tuner.fit()


def tune_dir(output_dir: Path, private: bool) -> Path:
    """Where Tune keeps a search's experiment: ``DIR/tune``, or for a private search
    ``DIR.tune-state`` beside it (its state there from an earlier privzo is moved out first)."""
    inside = output_dir / TUNE_DIR
    if not private:
        return inside
    beside = output_dir.with_name(output_dir.name + PRIVATE_TUNE_SUFFIX)
    if inside.is_dir() and not beside.exists():
        import shutil

        shutil.move(inside, beside)
    return beside


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
