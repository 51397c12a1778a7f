"""The synthetic quadratic study's config (DPZero paper, §5.1 and Appendix B.1).

```yaml
type: synthetic-quadratic
dimensions: [20, 50, 100, 200, 500, 1000, 2000]
patterns: [rank-d, rank-sqrt-d, rank-log-d]   # how tr(A)/‖A‖ grows with d
algorithms: [dpzero, dpgd-0th, dp-gd]
privacy: {epsilon: 2.0, delta: 1.0e-6}
steps: 300
dataset_size: 10000
directions_per_step: 1                        # DPZero's (DP-AggZO above 1)
grid: {learning_rates: [...], clip_thresholds: [...]}
algorithm_grids: {dpgd-0th: {clip_thresholds: [...]}}   # optional per-algorithm overrides
seeds: [0, 1, 2]
```
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final, Literal

from pydantic import Field, field_validator, model_validator

from privzo.config.loading import apply_overrides, read_yaml, validate_section
from privzo.privacy import ACCOUNTANTS
from privzo.section import ConfigError, Section

__all__ = [
    "ALGORITHM_NAMES",
    "PATTERN_NAMES",
    "STUDY_TYPE",
    "SearchGrid",
    "StudyPrivacy",
    "SyntheticStudyConfig",
    "build_synthetic_config",
    "load_synthetic_config",
]

STUDY_TYPE: Final = "synthetic-quadratic"
# Kept in step with the registries in quadratic.py / algorithms.py (a test checks it); listed
# here so the config module validates names without importing the numerics.
PATTERN_NAMES: tuple[str, ...] = ("rank-d", "rank-sqrt-d", "rank-log-d")
ALGORITHM_NAMES: tuple[str, ...] = ("dpzero", "dpgd-0th", "dp-gd")
# A dense d × n data matrix in fp64 is held per (pattern, dimension, seed): cap its size.
MAX_DIMENSION = 20_000
MAX_DATASET_SIZE = 200_000


def _check_unique_names(field: str, values: list[str], allowed: tuple[str, ...]) -> list[str]:
    if not values:
        raise ValueError(f"{field} is empty; allowed: a non-empty subset of {list(allowed)}")
    for value in values:
        if value not in allowed:
            raise ValueError(f"{field} has unknown {value!r}; allowed: {list(allowed)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{field}={values!r} repeats a name; allowed: each at most once")
    return values


def _check_positive_grid(field: str, values: list[float]) -> list[float]:
    if not values:
        raise ValueError(f"{field} is empty; allowed: a non-empty list of numbers > 0")
    bad = [value for value in values if not value > 0]
    if bad:
        raise ValueError(f"{field} has {bad[0]!r}; allowed: numbers > 0")
    if len(set(values)) != len(values):
        raise ValueError(f"{field}={values!r} repeats a value; allowed: distinct numbers")
    return values


class SearchGrid(Section):
    """The learning-rate × clipping grid searched at every (pattern, dimension) point."""

    learning_rates: list[float] = Field(default_factory=lambda: [0.01, 0.03, 0.1, 0.3, 1.0])
    clip_thresholds: list[float] = Field(default_factory=lambda: [0.3, 1.0, 3.0, 10.0])

    @field_validator("learning_rates")
    @classmethod
    def _learning_rates(cls, values: list[float]) -> list[float]:
        return _check_positive_grid("learning_rates", values)

    @field_validator("clip_thresholds")
    @classmethod
    def _clip_thresholds(cls, values: list[float]) -> list[float]:
        return _check_positive_grid("clip_thresholds", values)


class GridOverride(Section):
    """Per-algorithm replacements for either list of the shared grid."""

    learning_rates: list[float] | None = None
    clip_thresholds: list[float] | None = None

    @field_validator("learning_rates")
    @classmethod
    def _learning_rates(cls, values: list[float] | None) -> list[float] | None:
        return None if values is None else _check_positive_grid("learning_rates", values)

    @field_validator("clip_thresholds")
    @classmethod
    def _clip_thresholds(cls, values: list[float] | None) -> list[float] | None:
        return None if values is None else _check_positive_grid("clip_thresholds", values)


class StudyPrivacy(Section):
    """The (ε, δ) every algorithm meets at every grid point, and the accountant calibrating σ."""

    epsilon: float = Field(2.0, gt=0)
    delta: float = Field(1e-6, gt=0, lt=1)
    accountant: str = "pld"

    @field_validator("accountant")
    @classmethod
    def _accountant(cls, value: str) -> str:
        if value not in ACCOUNTANTS or value == "pure":
            allowed = [name for name in ACCOUNTANTS if name != "pure"]
            raise ValueError(f"accountant={value!r} is not usable here; allowed: {allowed}")
        return value


class SyntheticStudyConfig(Section):
    """DPZero vs DPGD-0th vs DP-GD on f_i(x) = ½ (x − ξ_i)ᵀ A (x − ξ_i), full batch."""

    type: Literal["synthetic-quadratic"] = STUDY_TYPE
    dimensions: list[int] = Field(default_factory=lambda: [20, 50, 100, 200, 500, 1000, 2000])
    patterns: list[str] = Field(default_factory=lambda: list(PATTERN_NAMES))
    algorithms: list[str] = Field(default_factory=lambda: list(ALGORITHM_NAMES))
    privacy: StudyPrivacy = Field(default_factory=StudyPrivacy)
    steps: int = Field(300, ge=1, le=100_000)
    dataset_size: int = Field(10_000, ge=2, le=MAX_DATASET_SIZE)
    data_mean: float = Field(1.0, description="Each coordinate of ξ_i is N(data_mean, data_std²).")
    data_std: float = Field(1.0, gt=0)
    directions_per_step: int = Field(
        1,
        ge=1,
        le=1024,
        description="DPZero's directions per step (DP-AggZO above 1): each example's "
        "differences clipped together to ℓ2 norm C, noise σC on each; the same σ and ε.",
    )
    grid: SearchGrid = Field(default_factory=SearchGrid)
    algorithm_grids: dict[str, GridOverride] = Field(default_factory=dict)
    seeds: list[int] = Field(default_factory=lambda: [0, 1, 2])

    @field_validator("dimensions")
    @classmethod
    def _dimensions(cls, values: list[int]) -> list[int]:
        allowed = f"distinct integers in [2, {MAX_DIMENSION}]"
        if not values:
            raise ValueError(f"dimensions is empty; allowed: a non-empty list of {allowed}")
        bad = [value for value in values if not 2 <= value <= MAX_DIMENSION]
        if bad:
            raise ValueError(f"dimensions has {bad[0]!r}; allowed: {allowed}")
        if len(set(values)) != len(values):
            raise ValueError(f"dimensions={values!r} repeats a value; allowed: {allowed}")
        return sorted(values)

    @field_validator("patterns")
    @classmethod
    def _patterns(cls, values: list[str]) -> list[str]:
        return _check_unique_names("patterns", values, PATTERN_NAMES)

    @field_validator("algorithms")
    @classmethod
    def _algorithms(cls, values: list[str]) -> list[str]:
        return _check_unique_names("algorithms", values, ALGORITHM_NAMES)

    @field_validator("algorithm_grids")
    @classmethod
    def _algorithm_grids(cls, values: dict[str, GridOverride]) -> dict[str, GridOverride]:
        for name in values:
            if name not in ALGORITHM_NAMES:
                raise ValueError(
                    f"algorithm_grids has unknown {name!r}; allowed: {list(ALGORITHM_NAMES)}"
                )
        return values

    @field_validator("seeds")
    @classmethod
    def _seeds(cls, values: list[int]) -> list[int]:
        if not values:
            raise ValueError("seeds is empty; allowed: a non-empty list of distinct integers >= 0")
        bad = [value for value in values if value < 0]
        if bad:
            raise ValueError(f"seeds has {bad[0]!r}; allowed: integers >= 0")
        if len(set(values)) != len(values):
            raise ValueError(f"seeds={values!r} repeats a value; allowed: distinct integers")
        return values

    @model_validator(mode="after")
    def _unused_overrides(self) -> SyntheticStudyConfig:
        unused = sorted(set(self.algorithm_grids) - set(self.algorithms))
        if unused:
            raise ValueError(
                f"algorithm_grids names {unused}, which are not run; allowed: a subset of "
                f"algorithms={self.algorithms}"
            )
        return self

    def grid_for(self, algorithm: str) -> SearchGrid:
        """The shared grid with this algorithm's overrides applied."""
        override = self.algorithm_grids.get(algorithm)
        if override is None:
            return self.grid
        return SearchGrid(
            learning_rates=override.learning_rates or self.grid.learning_rates,
            clip_thresholds=override.clip_thresholds or self.grid.clip_thresholds,
        )


def build_synthetic_config(data: dict[str, Any], source: str = "<dict>") -> SyntheticStudyConfig:
    """Validate a mapping (``type`` must be ``synthetic-quadratic``); ConfigError if invalid."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a mapping at the top level")
    if data.get("type", STUDY_TYPE) != STUDY_TYPE:
        raise ConfigError(
            f"invalid config ({source}):\n  type: unknown study type (got {data['type']!r}); "
            f"allowed: {STUDY_TYPE!r}"
        )
    return validate_section(SyntheticStudyConfig, data, source)


def load_synthetic_config(
    path: str | Path, overrides: list[str] | None = None
) -> SyntheticStudyConfig:
    """Read a study YAML, apply ``key.sub=value`` overrides, validate."""
    path = Path(path).expanduser()
    return build_synthetic_config(apply_overrides(read_yaml(path), overrides or []), str(path))
