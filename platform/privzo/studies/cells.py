"""The cells of a scaling study: one trained configuration each (model × task × algorithm ×
budget × seed), its run config, and every cell's checks before the first one trains."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import check_capabilities, names
from privzo.config.loading import load_config, with_values
from privzo.config.run import RunConfig
from privzo.models.architecture import count_parameters
from privzo.models.shapes import resolve_named_shape
from privzo.preflight import preflight
from privzo.section import ConfigError
from privzo.studies.config import ScalingStudyConfig

NON_PRIVATE_SAMPLER = "shuffle"  # private cells keep Poisson sampling, what the accountant assumes


@dataclass(frozen=True)
class Cell:
    """One trained configuration of the study."""

    model: str
    task: str | None
    algorithm: str
    epsilon: float | None  # None: non-private
    seed: int
    directions: int = 1  # optimizer.directions_per_step

    @property
    def name(self) -> str:
        model = Path(self.model).stem if self.model.endswith((".yaml", ".yml")) else self.model
        task = Path(self.task).stem if self.task else "task"
        budget = f"eps{self.epsilon:g}" if self.epsilon is not None else "nonprivate"
        arm = self.algorithm if self.directions == 1 else f"{self.algorithm}-k{self.directions}"
        return f"{model.replace('/', '_')}-{task}-{arm}-{budget}-seed{self.seed}"


def expand_cells(study: ScalingStudyConfig) -> list[Cell]:
    """Models outermost, so the smallest model's cells finish (and report) first: in order of
    their parameter counts where the planner knows every model's shape (a mixed list of OPT,
    Llama, Qwen2 or Mistral sizes), else in the order given."""
    cells = []
    for model in models_by_size(study.models):
        for task in study.tasks:
            for seed in study.seeds:
                for algorithm in study.private_algorithms:
                    for k in directions_of(study, algorithm):
                        cells += [
                            Cell(model, task, algorithm, eps, seed, k) for eps in study.epsilons
                        ]
                for algorithm in study.non_private_algorithms:
                    cells += [
                        Cell(model, task, algorithm, None, seed, k)
                        for k in directions_of(study, algorithm)
                    ]
    return cells


def directions_of(study: ScalingStudyConfig, algorithm: str) -> list[int]:
    """The study's ``directions`` for an algorithm whose step takes several, else [1]."""
    return study.directions if algorithm in names(directions=True) else [1]


def models_by_size(models: list[str]) -> list[str]:
    """``models`` from the fewest parameters up, counted from their named shapes or hub ids
    (``privzo.models.shapes``; no weights are read), or as given when one is not known."""
    counts: dict[str, int] = {}
    for model in models:
        count = _planned_parameters(model)
        if count is None:
            return list(models)
        counts[model] = count
    return sorted(models, key=counts.__getitem__)


def _planned_parameters(model: str) -> int | None:
    name = load_config([model]).model.name_or_path if model.endswith((".yaml", ".yml")) else model
    named = resolve_named_shape(name)
    return None if named is None else count_parameters(named[1])


def cell_config(study: ScalingStudyConfig, cell: Cell) -> RunConfig:
    files: list[str | Path] = list(study.base)
    values: dict[str, Any] = dict(study.overrides)
    if cell.model.endswith((".yaml", ".yml")):
        files.append(cell.model)
    else:
        values["model.name_or_path"] = cell.model
    if cell.task:
        files.append(cell.task)
    values.update(
        {
            "optimizer.algorithm": cell.algorithm,
            "seed": cell.seed,
            "task.data_seed": cell.seed,
            "tracking.experiment": study.experiment or study.name,
        }
    )
    if cell.directions > 1:
        values["optimizer.directions_per_step"] = cell.directions
    if cell.epsilon is not None:
        values["privacy.epsilon"] = cell.epsilon
        if cell.directions > 1:
            # pld (the default accountant) bounds one rounded scalar, not a K-vector; continuous
            # noise runs a K > 1 cell under the DPZero cells' accountant (check_directions)
            values["privacy.noise_grid"] = None
    else:
        # A non-private baseline needs no secret Poisson batches, and with them its score moved
        # run to run (four runs of one study: MeZO 0.610 to 0.806); a seeded shuffle repeats.
        values["privacy.sampler"] = NON_PRIVATE_SAMPLER
    config = with_values(load_config(files), values, f"study cell {cell.name}")
    check_capabilities(config)  # what the algorithm cannot do is refused with the study
    return config


def check_cells(study: ScalingStudyConfig, cells: list[Cell]) -> dict[str, RunConfig]:
    """Every cell's config, model source, task, data and privacy plan, checked without loading
    weights or writing anything; a bad one is named with its place in the study."""
    configs = {cell.name: cell_config(study, cell) for cell in cells}
    for index, cell in enumerate(cells, start=1):
        try:
            preflight(configs[cell.name])  # the run's own checks, no directory or store
        except (ValueError, OSError) as error:  # ConfigError, and a file that cannot be read
            raise ConfigError(f"study cell {index}/{len(cells)} {cell.name}: {error}") from None
    return configs
