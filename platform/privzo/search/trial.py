"""One search trial: a normal privzo run plus the selection score it is compared on.

A trial on a distributed layout (``parallel.strategy`` replica or zero3) is the same run: its
Tune function is the driver that starts the Ray Train workers (``privzo.run.run`` builds the
``TorchTrainer`` and waits on ``fit()``), the scorer's hooks run in the workers, and rank 0's
scores come back in the run's summary and, for ASHA, to Tune as each window is scored.

The trial function reads only its Tune config (no module globals, no environment): the search
config, the point sampled from the space, and where to write. A trial whose directory already
holds a finished run with the same config reports that run instead of training again, so a
resumed search never re-runs finished work. An interrupted trial that cannot resume (its
algorithm keeps no trajectory) starts over, and the attempt it starts over from is counted in its
directory's ``restarts.json``: what that attempt released stays released, so the search's bound
composes it as one more trial.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import writes_trajectory
from privzo.config.run import RunConfig
from privzo.privacy.discrete import discrete_gaussian, noise_units, unit_interval_units
from privzo.run import RunContext, RunHooks, finished_run, run
from privzo.rundir import (
    RunSummary,
    can_resume,
    holds_run,
    read_json_object,
    starts_over,
    unfinished_steps,
    write_json_atomically,
)
from privzo.search.config import SearchConfig, base_run_config
from privzo.search.summary import SCORE
from privzo.tasks.data import read_rows
from privzo.threads import use_threads
from privzo.tracking.tags import PARENT_RUN, SEARCH, TRIAL, run_label

TRIALS_DIR = "trials"
RESTARTS_FILE = "restarts.json"  # in a trial's directory, which starting over keeps


class SelectionScorer:
    """Computes (and for a private split, noises) the score a trial is selected on.

    Each example scores in [0, 1] (accuracy, EM, F1). On a private split each example's score
    is rounded to the grid 1/m (m = ``selection.score_grid``; 0/1 metrics exactly), so the
    integer sum has sensitivity m, and an exact discrete Gaussian N_Z(0, s²) with
    s = ⌈score_noise_multiplier · m⌉ is added (``privzo.privacy.discrete``: integer arithmetic
    on OS entropy, so no floating-point artefact of the draw reaches the release). Only the
    noisy integer is divided by m × the (public) split size. Scores are cached by step so one
    step is released once. ``privzo.search.privacy.TrialEvent`` accounts each release.
    ``earlier`` counts the scores an interrupted attempt of the trial released (a resumed
    trial's record counts every release, not only its own attempt's).
    """

    def __init__(self, search: SearchConfig, private: bool, earlier: int = 0) -> None:
        self.selection = search.selection
        self.noised = private and self.selection.split == "validation"
        self.grid = self.selection.score_grid
        self.noise_scale = noise_units(self.selection.score_noise_multiplier, self.grid)
        self.scores: dict[int, float] = {}
        self.earlier = earlier
        self._public_examples: Any = None

    @property
    def releases(self) -> int:
        return len(self.scores) + self.earlier if self.noised else 0

    def score(self, context: RunContext, step: int) -> float:
        if step not in self.scores:
            self.scores[step] = self._compute(context)
        return self.scores[step]

    def _compute(self, context: RunContext) -> float:
        examples = self._examples(context)
        metric = self.selection.metric or context.task.metric
        batch_size = context.config.optimizer.eval_batch_size
        scores = context.task.example_scores(context.scoring_model, examples, batch_size)
        if metric not in scores:
            raise ValueError(f"selection.metric={metric!r}: the task reports {sorted(scores)}")
        if not self.noised:
            return sum(scores[metric]) / len(examples)
        return self.noised_units(scores[metric]) / (self.grid * len(examples))

    def noised_units(self, example_scores: list[float]) -> int:
        """The sum of the examples' scores on the grid 1/m plus discrete Gaussian noise, as an
        integer number of grid units."""
        total = sum(unit_interval_units(value, self.grid) for value in example_scores)
        return total + discrete_gaussian(self.noise_scale)

    def _examples(self, context: RunContext) -> Any:
        if self.selection.split == "validation":
            assert context.validation is not None, "validated before the search starts"
            return context.validation
        if self._public_examples is None:
            assert self.selection.public_path is not None
            rows = read_rows(self.selection.public_path, "selection.public_path")
            self._public_examples = context.task.encode(rows)
        return self._public_examples


def run_trial(trial_config: dict[str, Any], setup: dict[str, Any]) -> None:
    """The Ray Tune function trainable: ``trial_config`` holds the sampled point, ``setup`` the
    search's fixed settings (search config, directories, the parent run)."""
    from ray import tune
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # one bar per trial and load is noise in logs
    use_threads(setup["threads"])
    search = SearchConfig.model_validate(setup["search"])
    point: dict[str, Any] = {**trial_config["point"], **setup["derived"]}
    config = base_run_config(search, point)
    trial_id = tune.get_context().get_trial_id()
    output_dir = Path(setup["output_dir"]) / TRIALS_DIR / trial_id
    done = finished_run(
        config,
        output_dir,
        cache_dir=Path(setup["cache_dir"]),
        tracking_root=Path(setup["tracking_root"]),
        tracking_uri=setup["tracking_uri"],
    )
    if done is not None:
        tune.report(_report(done, done.extra.get(SCORE)))
        return
    count_restart(config, output_dir)
    evaluate_every = search.scheduler.evaluate_every if search.scheduler.type == "asha" else None
    report = window_reporter(config.parallel.strategy) if evaluate_every else None
    resumes = can_resume(config, output_dir)  # any layout: a distributed trial's checkpoints too
    kept = unfinished_steps(config, output_dir) if resumes else 0
    earlier = _earlier_scores(kept, config.optimizer.steps, evaluate_every)
    scorer = SelectionScorer(search, config.optimizer.is_private, earlier)

    def after_window(context: RunContext, step: int, metrics: dict[str, float]) -> None:
        if evaluate_every and step % evaluate_every == 0 and step < config.optimizer.steps:
            assert report is not None
            report({SCORE: scorer.score(context, step), "step": step, **metrics})

    def final_scores(context: RunContext) -> dict[str, float]:
        score = scorer.score(context, config.optimizer.steps)
        return {SCORE: score, "selection_releases": float(scorer.releases)}

    summary = run(
        config,
        output_dir,
        cache_dir=Path(setup["cache_dir"]),
        progress=False,
        # an interrupted attempt resumes (its released steps are not drawn again); one that
        # cannot resume starts over (a finished attempt returned above)
        overwrite=starts_over(config, output_dir),
        tracking_root=Path(setup["tracking_root"]),
        tracking_uri=setup["tracking_uri"],
        run_name=f"{run_label(config)} {trial_id}",  # trials differ in their hyperparameters
        tags={
            PARENT_RUN: setup["parent_run_id"],
            SEARCH: setup["search_name"],
            TRIAL: trial_id,
        },
        hooks=RunHooks(after_window=after_window, final_scores=final_scores),
    )
    tune.report(_report(summary, summary.extra[SCORE]))


def window_reporter(strategy: str) -> Callable[[dict[str, Any]], None]:
    """How a trial's window scores (ASHA's rungs) reach Tune, from where ``after_window`` runs.

    A single trial's hook runs in the Tune function: ``tune.report``. A distributed trial's runs
    in its Ray Train workers (every rank that evaluates), which have no Tune session: rank 0
    hands the scores to Ray's ``TuneReportCallback``, made here in the trial, which forwards to
    the trial's session what it is given. The callback is not put on the trainer's RunConfig,
    where it would forward every window's ``ray.train.report`` (a checkpoint barrier): Tune would
    count windows as ASHA's iterations, and the score is computed after the window's report.
    """
    from ray import tune

    if strategy == "single":
        return tune.report
    from ray.tune.integration.ray_train import TuneReportCallback

    return _ToTune(TuneReportCallback())


class _ToTune:
    """Rank 0's reports, through a ``TuneReportCallback`` (pickled to the workers with it)."""

    def __init__(self, callback: Any) -> None:
        self.callback = callback

    def __call__(self, metrics: dict[str, Any]) -> None:
        import ray.train

        if ray.train.get_context().get_world_rank() == 0:  # the run's reporting rank
            # the callback reads only its metrics; Ray Train passes its run context first
            self.callback.after_report(None, [metrics], None)


def count_restart(config: RunConfig, trial_dir: Path) -> int:
    """Count, before it is cleared, an unfinished attempt of a trial without a trajectory that
    this one starts over from; returns the trial's count of such attempts. A trial with a
    trajectory starts over only when its attempt saved no window, and a window's scores and
    metrics go out only once it is saved: that attempt released nothing."""
    count = restarts(trial_dir)
    if writes_trajectory(config):
        return count
    if holds_run(trial_dir) and starts_over(config, trial_dir):
        count += 1
        write_json_atomically(trial_dir / RESTARTS_FILE, {"restarts": count})
    return count


def restarts(trial_dir: Path) -> int:
    """How many attempts of the trial in ``trial_dir`` were started over (0 if none)."""
    record = read_json_object(Path(trial_dir) / RESTARTS_FILE) or {}
    return int(record.get("restarts", 0))


def _earlier_scores(done: int, steps: int, evaluate_every: int | None) -> int:
    """Intermediate scores an interrupted attempt released: one at each multiple of
    ``evaluate_every`` (below ``steps``) of the ``done`` steps it kept. A window's steps are
    kept (the single run's resume point, the distributed run's committed checkpoint) before its
    score is reported, so this may count one score a kill kept from going out (the record errs
    on the side of more releases)."""
    if not evaluate_every:
        return 0
    return min(done, steps - 1) // evaluate_every


def _report(summary: RunSummary, score: float | None) -> dict[str, float | None]:
    """What Tune sees of a finished trial: public, per-trial numbers only."""
    keys = ("metric_after", "epsilon", "noise_multiplier", "steps", "peak_memory_mb", "wall_time_s")
    record = summary.to_dict()
    report = {key: record[key] for key in keys if record.get(key) is not None}
    report[SCORE] = score
    report["step"] = summary.steps
    return report
