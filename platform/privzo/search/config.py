"""The search config: a base run, a space over its hyperparameters, how trials are drawn,
selected and budgeted. Validated at load like a run config, so a bad search fails before Ray
starts.

```yaml
base: ../runs/tiny-dpzero.yaml        # one or more run configs, relative to this file
overrides: {task.validation_size: 200}
space:
  privacy.clip: [5.0, 20.0]           # a list: one of these values
  optimizer.learning_rate: {low: 1.0e-4, high: 1.0e-3, log: true}   # a range
  optimizer.steps: [200, 400]         # privacy-relevant keys must be lists
algorithm: random                     # grid | random | optuna
trials: {count: 4}                    # or {distribution: geometric, mean: 3}
selection: {split: validation}        # private validation split, noised scores
```
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from privzo.algorithms.registry import check_capabilities
from privzo.config.loading import (
    OverBase,
    apply_overrides,
    load_config,
    read_yaml,
    validate_section,
    with_values,
)
from privzo.config.run import RunConfig
from privzo.extras import require_extra
from privzo.privacy.discrete import DEFAULT_SCORE_GRID
from privzo.section import Section

# Keys a search may vary. The privacy budget (ε, δ) is fixed: it is what every trial meets.
SEARCHABLE = (
    "privacy.clip",
    "optimizer.learning_rate",
    "optimizer.steps",
    "optimizer.batch_size",
    "optimizer.perturbation_scale",
    "optimizer.direction",
    "optimizer.lr_schedule",
    "optimizer.directions_per_step",
)
# Keys that change a trial's privacy event (σ is calibrated from steps and sampling rate):
# they must be finite lists so the worst trial is known before the search starts.
PRIVACY_KEYS = ("optimizer.steps", "optimizer.batch_size")


class RangeSpec(Section):
    """A continuous (or integer) range sampled uniformly, or log-uniformly."""

    low: float
    high: float
    log: bool = False
    integer: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> RangeSpec:
        if not self.low < self.high:
            raise ValueError(f"low={self.low} must be below high={self.high}")
        if self.log and self.low <= 0:
            raise ValueError(f"log=true needs low > 0 (got {self.low})")
        return self


class TrialsConfig(Section):
    """How many trials run: a fixed count, or a random count (for repeat-and-select).

    A random count is drawn once per search from a geometric distribution with the given mean,
    from the operating system's entropy: Papernot & Steinke's bound for releasing only the best
    trial needs the count random and kept secret.
    """

    count: int | None = Field(None, ge=1, description="Fixed number of trials (grid: all points).")
    distribution: Literal["fixed", "geometric"] = "fixed"
    mean: float | None = Field(None, ge=1, description="Mean trial count (geometric).")

    @model_validator(mode="after")
    def _consistent(self) -> TrialsConfig:
        if self.distribution == "fixed" and self.mean is not None:
            raise ValueError("mean is for distribution='geometric'; use count for a fixed number")
        if self.distribution == "geometric" and (self.mean is None or self.count is not None):
            raise ValueError("distribution='geometric' needs mean (and no count)")
        return self


class SelectionConfig(Section):
    """Which split trials are compared on, and what releasing the score costs."""

    split: Literal["validation", "public"] = Field(
        "validation",
        description="'validation': task.validation_size examples held out of the private "
        "training data, scores noised and accounted; 'public': public_path, no privacy cost.",
    )
    public_path: str | None = Field(None, description="A public labelled file (split=public).")
    metric: str | None = Field(None, description="The task metric; null = the task's main one.")
    mode: Literal["max", "min"] = "max"
    score_noise_multiplier: float = Field(
        5.0,
        gt=0,
        description="Discrete Gaussian noise on the validation sum (each example scores in "
        "[0, 1], so the sum has sensitivity 1): std = this many examples (rounded up to the "
        "score grid).",
    )
    score_grid: int = Field(
        DEFAULT_SCORE_GRID,
        ge=1,
        le=2**20,
        description="Grid points per example of the noised validation sum: each example's score "
        "is rounded to 1/score_grid, and the integer sum gets an exact discrete Gaussian "
        "(safe from floating-point attacks) of std ceil(score_noise_multiplier × score_grid).",
    )

    @model_validator(mode="after")
    def _public_has_path(self) -> SelectionConfig:
        if self.split == "public" and not self.public_path:
            raise ValueError("split='public' needs public_path (a labelled file)")
        if self.split == "validation" and self.public_path:
            raise ValueError("public_path is for split='public'")
        return self


class SchedulerConfig(Section):
    """Early stopping on the selection score (each intermediate score is a release too)."""

    type: Literal["none", "asha"] = "none"
    evaluate_every: int = Field(100, ge=1, description="Steps between intermediate scores.")
    grace_period: int = Field(1, ge=1, description="Scores a trial reports before it may stop.")
    reduction_factor: int = Field(2, ge=2)


class BudgetConfig(Section):
    """A compute budget per trial, in forward passes (2 per example per step)."""

    max_forward_passes: int | None = Field(None, ge=1)
    mode: Literal["reject", "derive-steps"] = Field(
        "reject",
        description="'reject': a space point over the budget is an error; 'derive-steps': "
        "steps = budget ÷ (2 × batch size), so neither steps nor batch size may be searched.",
    )


class ResourcesConfig(Section):
    """Ray resources per trial and how many trials run at once. A distributed trial's workers
    take theirs from the base's ``parallel`` section (``privzo.search.resources``)."""

    cpus_per_trial: float = Field(1, gt=0)
    gpus_per_trial: float = Field(0, ge=0)
    concurrency: int = Field(1, ge=1)


class SearchConfig(OverBase):
    base: list[str] = Field(description="Run config file(s) the trials start from.")
    overrides: dict[str, Any] = Field(default_factory=dict)
    space: dict[str, list[Any] | RangeSpec]
    algorithm: Literal["grid", "random", "optuna"] = "random"
    trials: TrialsConfig = Field(default_factory=TrialsConfig)
    selection: SelectionConfig = Field(default_factory=SelectionConfig)
    scheduler: SchedulerConfig = Field(default_factory=SchedulerConfig)
    budget: BudgetConfig = Field(default_factory=BudgetConfig)
    resources: ResourcesConfig = Field(default_factory=ResourcesConfig)
    seed: int | None = Field(
        None,
        ge=0,
        description=(
            "Seed of the search algorithm's draws (public); null = 0. Not with "
            "trials.distribution=geometric, whose points come from secret randomness."
        ),
    )
    experiment: str | None = Field(None, description="MLflow experiment; null = the base's.")

    @model_validator(mode="after")
    def _consistent(self) -> SearchConfig:
        _check_space(self)
        for key in self.overrides:
            if key in self.space:  # every trial would take the space's value instead
                raise ValueError(
                    f"overrides.{key}: {key} is searched (space.{key}); change its values in "
                    "space, or remove it from space to fix it for every trial"
                )
        if self.algorithm == "optuna":
            require_extra("optuna", "algorithm='optuna'")
        if self.algorithm == "grid" and self.trials.distribution != "fixed":
            raise ValueError(
                "algorithm='grid' runs every point once: use trials.distribution=fixed"
            )
        if self.trials.distribution != "fixed" and (
            self.algorithm != "random" or self.scheduler.type != "none"
        ):
            raise ValueError(
                "trials.distribution='geometric' (repeat-and-select) needs independent trials: "
                "algorithm='random' and scheduler.type='none' (Optuna and ASHA adapt to "
                "earlier scores)"
            )
        if self.trials.distribution != "fixed" and self.seed is not None:
            # With public points the exported best trial's point would give away its index,
            # and the trials would not be the independent draws repeat-and-select needs.
            raise ValueError(
                "seed: trials.distribution='geometric' draws every trial's point from secret "
                "randomness (repeat-and-select needs independent trials); drop seed"
            )
        fixed = self.trials.distribution == "fixed"
        if self.algorithm != "grid" and fixed and not self.trials.count:
            raise ValueError(f"algorithm={self.algorithm!r} needs trials.count")
        if self.budget.mode == "derive-steps":
            if self.budget.max_forward_passes is None:
                raise ValueError("budget.mode='derive-steps' needs budget.max_forward_passes")
            if "optimizer.steps" in self.space:
                raise ValueError(
                    "budget.mode='derive-steps' derives optimizer.steps: drop it from space"
                )
            for key in ("optimizer.batch_size", "optimizer.directions_per_step"):
                if key in self.space:  # one derived T would serve every B and K
                    raise ValueError(
                        f"budget.mode='derive-steps' with {key} in space: steps are derived "
                        f"once for the search; search {key} with mode 'reject' and "
                        "optimizer.steps in space, or fix it"
                    )
        return self

    def grid_size(self) -> int:
        return math.prod(len(values) for values in self.space.values() if isinstance(values, list))


def _check_space(search: SearchConfig) -> None:
    if not search.space:
        raise ValueError("space is empty: give at least one key to search")
    for key, spec in search.space.items():
        if key not in SEARCHABLE:
            raise ValueError(f"space.{key}: not searchable; allowed: {list(SEARCHABLE)}")
        if isinstance(spec, list):
            if not spec:
                raise ValueError(f"space.{key}: empty list of values")
            if len(set(map(repr, spec))) != len(spec):
                raise ValueError(f"space.{key}: repeated values {spec}")
        elif key in PRIVACY_KEYS:
            raise ValueError(
                f"space.{key}: must be a list of values (it sets the privacy event of a trial, "
                "which the end-to-end accounting must know before the search starts)"
            )
        elif search.algorithm == "grid":
            raise ValueError(f"space.{key}: algorithm='grid' needs a list of values, not a range")


def load_search_config(path: str | Path, overrides: list[str] | None = None) -> SearchConfig:
    """Read a search YAML (``key.sub=value`` overrides apply to the search config itself);
    base paths are resolved relative to the search file."""
    path = Path(path).expanduser()
    data = apply_overrides(read_yaml(path), overrides or [])
    if isinstance(data.get("base"), str):
        data["base"] = [data["base"]]
    if isinstance(data.get("base"), list):
        data["base"] = [str((path.parent / item).resolve()) for item in data["base"]]
    return validate_section(SearchConfig, data, str(path))


def base_run_config(search: SearchConfig, values: dict[str, Any] | None = None) -> RunConfig:
    """The base run with the search's overrides and one point's values (dotted keys)."""
    dotted = {**search.overrides, **(values or {})}
    if search.experiment:
        dotted["tracking.experiment"] = search.experiment
    source = " + ".join(search.base) + (f" with {values}" if values else "")
    bases: list[str | Path] = [*search.base]  # load_config takes an (invariant) list of either
    config = with_values(load_config(bases), dotted, source)
    check_capabilities(config)  # what the algorithm cannot do is refused with the search
    return config
