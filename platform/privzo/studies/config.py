"""Study configs: a named study type (``type:``) and its settings.

``type: scaling`` crosses models × tasks × privacy budgets × algorithms × seeds over a base run;
each cell is a run (or, with ``search:``, a search). Zero-shot needs no cell of its own: every
trained cell scores the base model before training (``metric_before``), which the report reads.

```yaml
type: scaling
name: tiny-scaling
base: ../runs/tiny-dpzero.yaml
models: [demo-opt-s, demo-opt-m, demo-opt-l]     # model.name_or_path values or model YAMLs
tasks: [null]                                   # null = the base's task; or task YAMLs
private_algorithms: [dpzero]
epsilons: [2.0]
non_private_algorithms: [mezo]
seeds: [0]
directions: [1]                                 # optional: K per step of zeroth-order cells
audit:                                          # optional: audit cells (``privzo audit``)
  canaries: 1000
  algorithms: [dpzero, mezo]                    # null = every arm
  epsilons: [2.0]                               # null = every ε (non-private arms: by algorithm)
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator

from privzo.algorithms.config import MAX_DIRECTIONS
from privzo.algorithms.registry import names
from privzo.audit.config import AuditConfig
from privzo.config.loading import (
    OverBase,
    apply_overrides,
    read_yaml,
    validate_section,
)
from privzo.section import ConfigError, Section
from privzo.synthetic.config import SyntheticStudyConfig


class StudyAuditConfig(AuditConfig):
    """``privzo audit``'s settings plus which of the study's trained cells get an audit cell
    (the same run trained again with canaries; a null filter selects every value)."""

    algorithms: list[str] | None = Field(None, description="Arms to audit; null = every arm.")
    epsilons: list[float] | None = Field(
        None,
        description="Private budgets to audit; null = every ε. Non-private arms are "
        "selected by algorithms alone.",
    )
    models: list[str] | None = Field(None, description="Models to audit; null = every model.")

    def settings(self) -> AuditConfig:
        """The audit's own settings, without the study's filters."""
        return AuditConfig.model_validate(self.model_dump(include=set(AuditConfig.model_fields)))

    def selects(self, model: str, algorithm: str, epsilon: float | None) -> bool:
        return (
            (self.models is None or model in self.models)
            and (self.algorithms is None or algorithm in self.algorithms)
            and (epsilon is None or self.epsilons is None or epsilon in self.epsilons)
        )


class ScalingStudyConfig(OverBase):
    """Models × tasks × (ε per private algorithm, and non-private algorithms) × seeds."""

    type: Literal["scaling"] = "scaling"
    name: str = Field(min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    base: list[str] = Field(description="Run config file(s) every cell starts from.")
    overrides: dict[str, Any] = Field(default_factory=dict)
    models: list[str] = Field(
        min_length=1, description="model.name_or_path values, or model config YAML files."
    )
    tasks: list[str | None] = Field(
        [None], description="Task config YAML files; null = the base's."
    )
    private_algorithms: list[str] = Field(default_factory=lambda: ["dpzero"])
    epsilons: list[float] = Field(default_factory=list, description="ε per private cell.")
    non_private_algorithms: list[str] = Field(default_factory=lambda: ["mezo"])
    seeds: list[int] = Field(
        default_factory=lambda: [0], min_length=1, description="Data and direction seeds."
    )
    directions: list[int] = Field(
        default_factory=lambda: [1],
        min_length=1,
        description="optimizer.directions_per_step of each zeroth-order algorithm's cells "
        "(DP-AggZO for K > 1; its private cells set privacy.noise_grid: null, since the "
        "default pld accountant bounds one rounded scalar per step, not a rounded K-vector); "
        "other algorithms' cells train once, with 1.",
    )
    search: str | None = Field(
        None,
        description="A search config: each private cell runs this search (its base replaced "
        "by the cell's run) instead of one run, and reports the best trial.",
    )
    experiment: str | None = Field(None, description="MLflow experiment; null = the study name.")
    audit: StudyAuditConfig | None = Field(
        None, description="Audit cells: selected cells trained again with canaries and audited."
    )

    @model_validator(mode="after")
    def _consistent(self) -> ScalingStudyConfig:
        private, non_private = names(private=True), names(private=False)
        for algorithm in self.private_algorithms:
            if algorithm not in private:
                raise ValueError(
                    f"private_algorithms: {algorithm!r} is not a private algorithm; "
                    f"allowed: {private}"
                )
        for algorithm in self.non_private_algorithms:
            if algorithm not in non_private:
                raise ValueError(
                    f"non_private_algorithms: {algorithm!r} is not a non-private algorithm; "
                    f"allowed: {non_private}"
                )
        if any(epsilon <= 0 for epsilon in self.epsilons):
            raise ValueError(f"epsilons: every ε must be positive (got {self.epsilons})")
        if self.private_algorithms and not self.epsilons:
            raise ValueError("private_algorithms need at least one value in epsilons")
        if not self.epsilons and not self.non_private_algorithms:
            raise ValueError("the study has no trained cells: give epsilons or a non-private one")
        self._check_directions()
        for name, values in (
            ("models", self.models),
            ("seeds", self.seeds),
            ("directions", self.directions),
        ):
            if len(set(values)) != len(values):
                raise ValueError(f"{name}: repeated values {values}")
        if self.audit is not None:
            self._check_audit(self.audit)
        return self

    def _check_directions(self) -> None:
        wrong = [k for k in self.directions if not 1 <= k <= MAX_DIRECTIONS]
        if wrong:
            raise ValueError(f"directions: {wrong} out of range; allowed: 1..{MAX_DIRECTIONS}")
        arms = [*self.private_algorithms, *self.non_private_algorithms]
        if self.directions != [1] and not set(arms) & set(names(directions=True)):
            raise ValueError(
                f"directions: {self.directions} applies only to {names(directions=True)}, "
                f"and the study trains none of them ({arms})"
            )

    def _check_audit(self, audit: StudyAuditConfig) -> None:
        arms = [*self.private_algorithms, *self.non_private_algorithms]
        for name, chosen, allowed in (
            ("algorithms", audit.algorithms, arms),
            ("epsilons", audit.epsilons, self.epsilons),
            ("models", audit.models, self.models),
        ):
            unknown = [value for value in chosen or [] if value not in allowed]
            if unknown:
                raise ValueError(f"audit.{name}: {unknown} not in the study's {allowed}")
        budgets: list[tuple[str, float | None]] = [
            (a, e) for a in self.private_algorithms for e in self.epsilons
        ]
        budgets += [(a, None) for a in self.non_private_algorithms]
        if not any(audit.selects(m, a, e) for m in self.models for a, e in budgets):
            raise ValueError("audit: its algorithms, epsilons and models select no cell")


STUDY_TYPES: dict[str, type[Section]] = {
    "scaling": ScalingStudyConfig,
    "synthetic-quadratic": SyntheticStudyConfig,
}
"""``type:`` in a study YAML → its config class (more study types register here)."""


def register_study_type(name: str, config_class: type[Section]) -> None:
    STUDY_TYPES[name] = config_class


def load_study_config(path: str | Path, overrides: list[str] | None = None) -> Section:
    """Read a study YAML; file paths in it are resolved relative to the file."""
    path = Path(path).expanduser()
    data = apply_overrides(read_yaml(path), overrides or [])
    study_type = data.get("type")
    if study_type not in STUDY_TYPES:
        raise ConfigError(
            f"{path}: type={study_type!r} is not a study type; allowed: {sorted(STUDY_TYPES)}"
        )
    _resolve_paths(data, path.parent)
    return validate_section(STUDY_TYPES[study_type], data, str(path))


def _resolve_paths(data: dict[str, Any], root: Path) -> None:
    """Relative YAML paths (base, model / task files, search) become absolute."""

    def resolve(item: Any) -> Any:
        if isinstance(item, str) and item.endswith((".yaml", ".yml")):
            return str((root / item).resolve())
        return item

    audit = data.get("audit")
    if isinstance(audit, dict) and isinstance(audit.get("models"), list):
        audit["models"] = [resolve(item) for item in audit["models"]]
    for key in ("base", "models", "tasks"):
        value = data.get(key)
        if isinstance(value, list):
            data[key] = [resolve(item) for item in value]
        elif isinstance(value, str):
            data[key] = resolve(value)
    if isinstance(data.get("search"), str):
        data["search"] = resolve(data["search"])
