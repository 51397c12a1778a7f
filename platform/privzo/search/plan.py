"""A search's plan: every point validated, every privacy event calibrated, the bounds known,
before Ray starts a trial."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from privzo.config.run import RunConfig
from privzo.distributed.checks import check_batch, check_layout
from privzo.models.loading import (
    load_tokenizer,
    peek_kind,
    position_limit,
    pretrained_kwargs,
    resolve_kind,
    resolve_source,
)
from privzo.privacy.adjacency import ADD_REMOVE, replace_one
from privzo.privacy.discrete import noise_units
from privzo.privacy.discrete_rdp import MAX_LATTICE_SCALE
from privzo.privacy.truncation import delta_of_exceeding
from privzo.run import plan_privacy
from privzo.search.config import PRIVACY_KEYS, RangeSpec, SearchConfig, base_run_config
from privzo.search.privacy import (
    TrialEvent,
    composition_epsilon,
    draw_geometric_count,
    repeat_and_select_epsilon,
    worst_curve,
)
from privzo.search.resources import trial_resources
from privzo.section import ConfigError
from privzo.tasks import build_task, load_splits, resolve_task_config


@dataclass
class SearchPlan:
    """Everything settled before the first trial: counts, events, the bounds, where to write."""

    search: SearchConfig
    base: RunConfig
    trial_count: int  # fixed, grid size, or the secret geometric draw
    events: list[TrialEvent] = field(default_factory=list)  # one per privacy-relevant point
    derived: dict[str, Any] = field(default_factory=dict)  # e.g. steps from a compute budget
    private: bool = False

    @property
    def delta(self) -> float:
        return self.base.privacy.delta

    def bounds(self, trials_run: int, restarts: int = 0) -> dict[str, Any]:
        """The search's guarantees for ``trials_run`` trials and ``restarts`` attempts that
        trials started over from (see privzo.search.privacy)."""
        if not self.private:
            return {"private": False}
        curve = worst_curve(self.events)
        # an attempt started over released what any trial may (its scores, its records):
        # the curve bounds it as it bounds a trial
        attempts = trials_run + restarts
        records = composition_epsilon(curve, attempts, self.delta)
        trials = self.search.trials
        export = None
        if trials.distribution == "geometric":
            assert trials.mean is not None
            export = repeat_and_select_epsilon(curve, trials.mean, self.delta)
        delta = self.delta + self._truncation_delta(attempts, records, export)
        bounds: dict[str, Any] = {
            "private": True,
            "per_trial_epsilon": self.base.privacy.epsilon,
            "delta": delta,
            "records_epsilon": records,
            "selection": self._selection_text(),
        }
        # Everything the search stores (trials.parquet, every trial's records, the trial
        # count) composes: that is the search's end-to-end bound, whatever the trial count.
        bounds["end_to_end_epsilon"] = records
        # the records state the training set's size, which only replace-one adjacency covers
        grouped = replace_one(records, delta)
        bounds |= {
            "adjacency": ADD_REMOVE,
            "replace_one_epsilon": grouped.epsilon,
            "replace_one_delta": grouped.delta,
        }
        stored = (
            f"composition of {trials_run} trials{_restarts_text(restarts)} (RDP): the best "
            f"trial and every record of the search together are ({records:.3g}, {delta:g})-DP "
            f"under add/remove adjacency given the training set's size N, and "
            f"({grouped.epsilon:.3g}, {grouped.delta:.3g})-DP under replace-one adjacency, "
            "which also covers N"
        )
        if export is None:
            bounds["guarantee"] = stored
            return bounds
        bounds["best_export_epsilon"] = export
        bounds["guarantee"] = (
            f"{stored}; `privzo export-best` releases the best trial alone (no trial count, no "
            f"trial ids, no other trial), which is ({export:.3g}, {delta:g})-DP by "
            f"repeat-and-select (Papernot & Steinke 2022; geometric trial count, mean "
            f"{trials.mean:g}) as long as nothing else of the search is released"
        )
        return bounds

    def _truncation_delta(self, attempts: int, records: float, export: float | None) -> float:
        """What truncating padded Poisson draws adds to the search's δ: the RDP curves bound
        untruncated trials, and some attempt truncates with chance at most (attempts)·max P[a
        trial truncates] (the mean trial count for the repeat-and-select export)."""
        exceed = max(event.exceed_probability for event in self.events)
        added = delta_of_exceeding(attempts * exceed, records)
        if export is not None:
            mean = self.search.trials.mean
            assert mean is not None
            added = max(added, delta_of_exceeding(mean * exceed, export))
        return added

    def _selection_text(self) -> str:
        selection = self.search.selection
        if selection.split == "public":
            return f"public split {selection.public_path} (no privacy cost)"
        scale = noise_units(selection.score_noise_multiplier, selection.score_grid)
        return (
            f"private validation split ({self.base.task.validation_size} examples held out of "
            f"the training data), each score's sum (examples' scores on the grid "
            f"1/{selection.score_grid}) noised with an exact discrete Gaussian of std "
            f"{scale}/{selection.score_grid} = {scale / selection.score_grid:.6g} examples "
            "and accounted"
        )


def _restarts_text(restarts: int) -> str:
    if not restarts:
        return ""
    attempts = "attempt" if restarts == 1 else "attempts"
    return f" and {restarts} earlier {attempts} of trials that started over"


def check_clock_free_decisions(search: SearchConfig) -> None:
    """A private search's decisions may not follow the wall clock. With several trials at once,
    Optuna's next point depends on which trials have reported by then and ASHA stops a trial on
    the results that arrived before its own, so which trials ran and how far would release
    their durations, which the search's guarantee does not cover."""
    concurrency = search.resources.concurrency
    if concurrency == 1:
        return
    chooser = None
    if search.algorithm == "optuna":
        chooser = "algorithm=optuna picks each point from the trials that have reported by then"
    elif search.scheduler.type == "asha":
        chooser = "scheduler.type=asha stops trials on the results that arrived first"
    if chooser is not None:
        raise ConfigError(
            f"resources.concurrency={concurrency} in a private search: {chooser}, so its "
            "decisions follow the trials' durations, which the guarantee does not cover; set "
            "resources.concurrency=1, or search with grid or random points without ASHA"
        )


def plan_search(
    search: SearchConfig, cache_dir: Path, trial_count: int | None = None
) -> SearchPlan:
    """Validate the search and calibrate every privacy event; raises ConfigError.

    Checks the base run's task against the model's tokenizer (not its weights, which may be
    tens of GB), so a bad template or label word fails here rather than in every trial.
    """
    base = base_run_config(search)
    private = base.optimizer.is_private
    if private and base.mechanism != "gaussian":
        raise ConfigError(
            f"optimizer.algorithm={base.optimizer.algorithm!r}: a search's end-to-end bound is "
            "computed in RDP, which cannot account the subsampled Laplace mechanism; search "
            "with a Gaussian algorithm (dpzero)"
        )
    if private and base.tracking.log_private_diagnostics:
        raise ConfigError(
            "tracking.log_private_diagnostics=true in a private search: every trial would log "
            "its exact validation metrics, training loss and times, which the search's "
            "guarantee does not cover; turn it off (the selection score is released noised)"
        )
    if private:
        check_clock_free_decisions(search)
    if private and (base.noise_grid or 0) > MAX_LATTICE_SCALE:
        raise ConfigError(
            f"privacy.noise_grid={base.noise_grid} in a private search: the search bounds a "
            "gridded trial's RDP by sums over the noise's lattice, done up to noise_grid="
            f"{MAX_LATTICE_SCALE}; use a grid of at most {MAX_LATTICE_SCALE}"
        )
    distributed = base.parallel.strategy != "single"  # trials run Ray Train workers
    if distributed:
        check_layout(base)
        trial_resources(search, base)  # what a distributed trial's driver may not take
    _check_selection(search, base)
    _check_task(base, cache_dir)
    count = trial_count or _trial_count(search)
    plan = SearchPlan(search, base, count, private=private)
    dataset_size = _dataset_size(base)
    for combination in _privacy_points(search, base):
        config = base_run_config(search, combination)
        derived = _derive_steps(search, config)
        if derived:
            config = base_run_config(search, {**combination, **derived})
            plan.derived = derived
        _check_compute_budget(search, config, combination)
        privacy = plan_privacy(config, dataset_size)
        if distributed:  # a batch every worker can take a share of, for every trial
            check_batch(config, privacy.expected_batch_size)
        if private:
            assert privacy.noise_multiplier is not None
            plan.events.append(
                TrialEvent(
                    steps=config.optimizer.steps,
                    sample_rate=privacy.sample_rate,
                    noise_multiplier=privacy.noise_multiplier,
                    score_releases=_score_releases(search, config),
                    score_noise_multiplier=search.selection.score_noise_multiplier,
                    score_grid=search.selection.score_grid,
                    noise_grid=config.noise_grid,
                    directions=config.optimizer.directions_per_step,
                    exceed_probability=privacy.run_exceed_probability,
                )
            )
    _check_other_points(search)
    return plan


def _trial_count(search: SearchConfig) -> int:
    if search.algorithm == "grid":
        size = search.grid_size()
        if search.trials.count not in (None, size):
            raise ConfigError(
                f"trials.count={search.trials.count}: algorithm='grid' runs every point once "
                f"({size} points); drop trials.count or set it to {size}"
            )
        return size
    if search.trials.distribution == "geometric":
        assert search.trials.mean is not None
        return draw_geometric_count(search.trials.mean)
    assert search.trials.count is not None
    return search.trials.count


def _check_selection(search: SearchConfig, base: RunConfig) -> None:
    selection = search.selection
    if selection.split == "validation" and not base.task.validation_size:
        raise ConfigError(
            "selection.split='validation' needs task.validation_size in the base run (examples "
            "held out of the private training data to compare trials on); or select on a "
            "public split (selection.split=public, selection.public_path=FILE)"
        )
    if selection.split == "public":
        assert selection.public_path is not None
        if not Path(selection.public_path).expanduser().is_file():
            raise ConfigError(f"selection.public_path={selection.public_path!r} does not exist")
    if search.scheduler.type == "asha":
        log_every = base.tracking.log_every
        if search.scheduler.evaluate_every % log_every:
            raise ConfigError(
                f"scheduler.evaluate_every={search.scheduler.evaluate_every}: must be a multiple "
                f"of the base run's tracking.log_every={log_every} (scores are taken at the end "
                "of a logging window)"
            )


def _check_task(base: RunConfig, cache_dir: Path) -> None:
    from transformers import AutoConfig

    source = resolve_source(base.model, cache_dir, progress=False)
    try:
        hf_config = AutoConfig.from_pretrained(source, **pretrained_kwargs(base.model))
        tokenizer = load_tokenizer(base.model, source)
    except OSError as error:  # a hub id that does not exist or cannot be reached
        raise ConfigError(
            f"model.name_or_path={base.model.name_or_path!r}: cannot load its tokenizer ({error})"
        ) from None
    kind = resolve_kind(base.model, hf_config)
    task_config = resolve_task_config(base.task, kind)
    build_task(task_config, tokenizer, kind, position_limit(hf_config, base.model))


def _dataset_size(base: RunConfig) -> int:
    task_config = resolve_task_config(base.task, peek_kind(base.model))
    return len(load_splits(task_config).train)


def _privacy_points(search: SearchConfig, base: RunConfig) -> list[dict[str, Any]]:
    """Every combination of the privacy-relevant values the space allows (lists only)."""
    keys = [key for key in PRIVACY_KEYS if key in search.space]
    value_lists = [search.space[key] for key in keys]
    assert all(isinstance(values, list) for values in value_lists)
    return [dict(zip(keys, values, strict=True)) for values in itertools.product(*value_lists)]


def _derive_steps(search: SearchConfig, config: RunConfig) -> dict[str, Any]:
    budget = search.budget
    if budget.mode != "derive-steps":
        return {}
    assert budget.max_forward_passes is not None
    per_step = forward_passes(config) // config.optimizer.steps
    steps = budget.max_forward_passes // per_step
    if steps < 1:
        raise ConfigError(
            f"budget.max_forward_passes={budget.max_forward_passes}: less than one step at "
            f"batch size {config.optimizer.batch_size} (a step costs 2 × batch size × "
            "directions per step forwards)"
        )
    return {"optimizer.steps": steps}


def _check_compute_budget(search: SearchConfig, config: RunConfig, point: dict[str, Any]) -> None:
    limit = search.budget.max_forward_passes
    if limit is None:
        return
    directions = _most_directions(search, config)
    cost = forward_passes(config) * directions // config.optimizer.directions_per_step
    if cost > limit:
        raise ConfigError(
            f"budget.max_forward_passes={limit}: the space point {point or '(base)'} costs "
            f"{cost} forward passes (2 × {config.optimizer.batch_size} × {directions} "
            f"direction(s) × {config.optimizer.steps} steps); shrink the space or raise the "
            "budget"
        )


def _most_directions(search: SearchConfig, config: RunConfig) -> int:
    """The largest ``optimizer.directions_per_step`` a trial of the search may take."""
    spec = search.space.get("optimizer.directions_per_step")
    if spec is None:
        return config.optimizer.directions_per_step
    return int(max(spec) if isinstance(spec, list) else spec.high)


def forward_passes(config: RunConfig) -> int:
    """Expected forward passes of a zeroth-order run: two per example per direction per
    step."""
    optimizer = config.optimizer
    return 2 * optimizer.batch_size * optimizer.directions_per_step * optimizer.steps


def _score_releases(search: SearchConfig, config: RunConfig) -> int:
    """How many noised selection scores one trial releases."""
    if search.selection.split == "public":
        return 0
    if search.scheduler.type != "asha":
        return 1
    steps, every = config.optimizer.steps, search.scheduler.evaluate_every
    return steps // every + (1 if steps % every else 0)


def _check_other_points(search: SearchConfig) -> None:
    """Every value of the non-privacy keys must make a valid run config on its own."""
    for key, spec in search.space.items():
        if key in PRIVACY_KEYS:
            continue
        values = spec if isinstance(spec, list) else [spec.low, spec.high]
        for value in values:
            if isinstance(spec, RangeSpec) and spec.integer:
                value = int(value)
            base_run_config(search, {key: value})
