"""``RunConfig``: the sections of one run, composed, and the checks that span sections.

Each section lives beside the code it configures; what ties them together (the noise an
algorithm adds decides which privacy settings apply, a layout limits the forwards) is checked
here, at load.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from privzo.algorithms.config import PADDED_SHAPE_ALGORITHMS, OptimizerConfig
from privzo.algorithms.noise import NOISE
from privzo.config.tasks import PadTo, TaskConfig
from privzo.layouts.config import ParallelConfig
from privzo.models.config import ModelConfig
from privzo.privacy.accountants import ACCOUNTANTS, accountants_for
from privzo.privacy.config import PrivacyConfig
from privzo.section import Section
from privzo.tracking.config import TrackingConfig

__all__ = ["RunConfig"]


class RunConfig(Section):
    """Everything one run needs; the unit that is saved beside its results."""

    model: ModelConfig = Field(default_factory=ModelConfig)
    task: TaskConfig = Field(default_factory=TaskConfig)
    optimizer: OptimizerConfig = Field(default_factory=OptimizerConfig)
    privacy: PrivacyConfig = Field(default_factory=PrivacyConfig)
    parallel: ParallelConfig = Field(default_factory=ParallelConfig)
    tracking: TrackingConfig = Field(default_factory=TrackingConfig)
    seed: int = Field(0, ge=0, description="Public seed of the perturbation directions.")
    eval_before: bool = True
    save_model: bool = Field(
        False, description="Also save the fine-tuned weights (the trajectory alone rebuilds them)."
    )

    @model_validator(mode="after")
    def _private_settings_consistent(self) -> RunConfig:
        _check_zero3_forwards(self)
        _check_padding(self)
        if not self.optimizer.is_private:
            return self
        mechanism = self.mechanism
        assert mechanism is not None  # every private algorithm adds a mechanism's noise
        if self.privacy.sampler != "poisson":
            raise ValueError(
                f"privacy.sampler={self.privacy.sampler!r} with a private algorithm: the "
                "accountants here assume Poisson sampling; allowed: 'poisson'"
            )
        name = self.privacy.accountant
        accountant = ACCOUNTANTS[name]
        if not accountant.bounds(mechanism):
            raise ValueError(
                f"privacy.accountant={name!r} with optimizer.algorithm="
                f"{self.optimizer.algorithm!r} cannot account the {mechanism!r} mechanism: the "
                f"{accountant.title} accountant bounds only {list(accountant.mechanisms)}; "
                f"allowed: {accountants_for(mechanism)}"
            )
        if not accountant.allows_zero_delta and self.privacy.delta <= 0:
            raise ValueError(
                f"privacy.delta={self.privacy.delta}: approximate DP needs 0 < delta < 1"
            )
        # several directions on a grid: check_directions names the accountants that bound it
        one_direction = self.optimizer.directions_per_step == 1
        if (
            self.noise_grid is not None
            and one_direction
            and not accountant.bounds(mechanism, grid=True)
        ):
            raise ValueError(
                f"privacy.accountant={name!r} with privacy.noise_grid={self.noise_grid}: it "
                f"accounts only the continuous {mechanism} mechanism, and the run draws discrete "
                f"noise on a grid; allowed: {accountants_for(mechanism, grid=True)}, or "
                "privacy.noise_grid=null for the float sampler (not safe from floating-point "
                "attacks)"
            )
        _check_test_split_is_not_private(self)
        return self

    @property
    def releases_diagnostics(self) -> bool:
        """Whether data-dependent figures (training loss, times, peak memory, counts, exact
        validation metrics) may be released: always for a non-private run, for a private one
        only with ``tracking.log_private_diagnostics`` (outside its guarantee)."""
        return not self.optimizer.is_private or self.tracking.log_private_diagnostics

    @property
    def pad_to(self) -> PadTo:
        """How training batches are padded: ``task.pad_to``, or by default ``max_length`` for a
        private run of an algorithm that supports it (its shapes then reveal nothing of the
        data), ``batch`` otherwise."""
        if self.task.pad_to is not None:
            return self.task.pad_to
        padded = self.optimizer.algorithm in PADDED_SHAPE_ALGORITHMS
        return "max_length" if padded and self.optimizer.is_private else "batch"

    @property
    def noise_grid(self) -> int | None:
        """The grid of this run's scalar noise (None: continuous, or no scalar noise)."""
        if not NOISE[self.optimizer.algorithm].scalar:
            return None
        return self.privacy.noise_grid

    @property
    def mechanism(self) -> str | None:
        if not self.optimizer.is_private:
            return None
        return self.privacy.mechanism or NOISE[self.optimizer.algorithm].default_mechanism


def _check_test_split_is_not_private(config: RunConfig) -> None:
    """A private run's test metrics are released exactly, so its test rows must not be the
    private training file's: with ``task.train_path`` alone the test split would be carved out
    of it. (Other sources have their own test split: data_dir's test file, a preset's hub split,
    the built-in dataset's.)"""
    task = config.task
    if task.train_path is None or task.test_path is not None:
        return
    if config.tracking.log_private_diagnostics:
        return  # the user releases data-dependent figures outside the guarantee
    raise ValueError(
        "task.train_path without task.test_path in a private run: the test split would be "
        "carved out of the private training file and its metrics released exactly, outside the "
        "guarantee; give task.test_path (a separate, public test file), or set "
        "tracking.log_private_diagnostics=true to release them anyway"
    )


def _check_padding(config: RunConfig) -> None:
    """Refuse a public shape the algorithm cannot take, and a batch bound with nothing to
    bound."""
    algorithm = config.optimizer.algorithm
    if config.task.pad_to == "max_length" and algorithm not in PADDED_SHAPE_ALGORITHMS:
        raise ValueError(
            f"task.pad_to='max_length' with optimizer.algorithm={algorithm!r}: its batches are "
            f"collated by its own loop; allowed: 'batch' (or null), or an algorithm of "
            f"{list(PADDED_SHAPE_ALGORITHMS)}"
        )
    if config.privacy.max_batch_size is not None and config.pad_to != "max_length":
        raise ValueError(
            f"privacy.max_batch_size={config.privacy.max_batch_size} bounds the padded batches "
            f"of task.pad_to='max_length', but this run pads to {config.pad_to!r}; unset it"
        )


def _check_zero3_forwards(config: RunConfig) -> None:
    """Refuse at load micro-batches under zero3. (Which algorithms a layout runs is the
    registry's to say: ``privzo.algorithms.registry.check_capabilities``, run by preflight.)"""
    if config.parallel.strategy == "zero3" and config.optimizer.physical_batch_size is not None:
        # every ZeRO-3 forward gathers the weights collectively, so all ranks must make the
        # same number of forwards; micro-batches of Poisson batches of different sizes do not
        raise ValueError(
            f"optimizer.physical_batch_size={config.optimizer.physical_batch_size} with "
            "parallel.strategy='zero3': ranks would make different numbers of forwards, and "
            "each ZeRO-3 forward is a collective; allowed: null (or strategy 'single'/'replica')"
        )
