"""The ``optimizer`` section of a run config: the training algorithm and its schedule.

What each algorithm is (family, mechanisms, layouts, views, its stepper) is registered in
``privzo.algorithms.registry``, which reads this section; the noise each one adds, which decides
the privacy rules at load, in ``privzo.algorithms.noise``, which this section reads.
"""

from __future__ import annotations

from typing import Any, Literal, get_args

from pydantic import Field, field_validator, model_validator

from privzo.algorithms.noise import NOISE
from privzo.section import Section

__all__ = [
    "ALGORITHMS",
    "FIRST_ORDER_PHYSICAL_BATCH_SIZE",
    "MAX_DIRECTIONS",
    "MAX_LEARNING_RATE",
    "MAX_PERTURBATION_SCALE",
    "MAX_STEPS",
    "MIN_PERTURBATION_SCALE",
    "PADDED_SHAPE_ALGORITHMS",
    "AlgorithmName",
    "FirstOrderConfig",
    "OptimizerConfig",
]

# The algorithms a config may choose; tests/unit/algorithms/test_registry.py ties it to the
# registry's keys and to the noise table.
AlgorithmName = Literal["mezo", "dpzero", "dpzo-laplace", "dpsgd", "adamw", "dpgd-0th"]
ALGORITHMS: tuple[str, ...] = get_args(AlgorithmName)

PADDED_SHAPE_ALGORITHMS = ("mezo", "dpzero", "dpzo-laplace")
"""The algorithms whose forwards can take the public shape of ``task.pad_to='max_length'``:
the zeroth-order stepper's (the baselines collate their own batches)."""

MAX_DIRECTIONS = 1024
"""Largest ``optimizer.directions_per_step``: each direction costs two forwards and four
sweeps over the trainable weights, so 1024 makes a step about a thousand times dearer; the
trajectory holds K released scalars a row."""

MAX_STEPS = 10_000_000
"""Largest ``optimizer.steps``: what the accountant can carry. Calibrating σ with the PLD
accountant takes minutes at 10^7 steps and longer beyond (docs/measurements.md, "Other
timings"); 10^7 is also 100× the longest runs in the MeZO and DPZero papers, and the
trajectory holds one row per step in memory."""

MAX_LEARNING_RATE = 10.0
"""Largest ``optimizer.learning_rate``: shipped runs use 1e-7 to 5e-2, and a step of η ≫ 1
only drives the weights to overflow (a run that a replay then refuses)."""

MIN_PERTURBATION_SCALE = 1e-8
MAX_PERTURBATION_SCALE = 1.0
"""Range of ``optimizer.perturbation_scale``: the loss difference over 2·scale is rounding
noise below 1e-8 (fp32 weights), and above 1 it stops approximating a derivative."""

FIRST_ORDER_PHYSICAL_BATCH_SIZE = 16
"""The first-order baselines' chunk when ``optimizer.physical_batch_size`` is null: a backward
keeps a gradient per example (Opacus), so their memory grows with the chunk, and 16 was their
default before the setting was shared with the zeroth-order loop."""


class FirstOrderConfig(Section):
    """Options of the first-order baselines (dpsgd, adamw); zeroth-order runs ignore them."""

    update_rule: Literal["sgd", "adamw"] | None = Field(
        None, description="null = sgd for dpsgd (DP-SGD), adamw for adamw."
    )
    weight_decay: float = Field(0.0, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict) and "physical_batch_size" in data:
            raise ValueError(
                "physical_batch_size moved to optimizer.physical_batch_size (one setting for "
                "every algorithm); set it there and remove it from optimizer.first_order"
            )
        return data


class OptimizerConfig(Section):
    """The training algorithm and its schedule."""

    algorithm: str = "dpzero"
    steps: int = Field(500, gt=0)  # and ≤ MAX_STEPS (_bounded)
    learning_rate: float = Field(
        1e-4,
        gt=0,
        le=MAX_LEARNING_RATE,
        description="Step size η; 0 < learning_rate ≤ 10 (fine-tuning uses 1e-7 to 1e-2; "
        "beyond 10 a step only overflows the weights).",
    )
    lr_schedule: Literal["constant", "linear"] = "constant"
    perturbation_scale: float = Field(
        1e-3,
        ge=MIN_PERTURBATION_SCALE,
        le=MAX_PERTURBATION_SCALE,
        description="ZO smoothing radius (MeZO's ε); 1e-8 ≤ perturbation_scale ≤ 1 (runs use "
        "1e-3; below 1e-8 the loss difference is rounding noise, above 1 it is no longer a "
        "derivative and large radii overflow the weights).",
    )
    direction: Literal["gaussian", "sphere", "rademacher"] = "gaussian"
    directions_per_step: int = Field(
        1,
        ge=1,
        le=MAX_DIRECTIONS,
        description="K directions per zeroth-order step (DP-AggZO): 2K forwards, each "
        "example's K loss differences clipped together to L2 norm privacy.clip, Gaussian noise "
        "σC on each of the K sums, θ ← θ − (η/K) Σ g_k z_k. Private runs need the continuous "
        "Gaussian mechanism for K > 1 (the same ε as K = 1 at the same σ). 1 = DPZero / MeZO.",
    )
    generator: Literal["auto", "philox", "torch-blocks"] = Field(
        "auto",
        description="Generator of the directions: counter-based 'philox' (replays on any device; "
        "on CUDA drawn inside fused Triton kernels) or 'torch-blocks' (the device's torch "
        "generator per 65,536-element block, faster on CPU, replays on the device type it ran "
        "on); 'auto' is philox on CUDA, torch-blocks on CPU.",
    )
    batch_size: int = Field(16, ge=1, description="Expected batch size (Poisson: p·N).")
    eval_batch_size: int = Field(64, ge=1)
    physical_batch_size: int | None = Field(
        None,
        ge=1,
        description="Most examples per forward (and backward): larger batches run in chunks "
        "of at most this many, at the same perturbation for a zeroth-order step (the same "
        "per-example losses, peak memory of the chunk). null = the whole batch in one forward "
        "for the zeroth-order algorithms, and 16 for the first-order baselines, whose "
        "per-example gradients grow with the chunk (Opacus' BatchMemoryManager for dpsgd).",
    )
    first_order: FirstOrderConfig = Field(default_factory=FirstOrderConfig)
    dpgd_max_parameters: int = Field(
        50_000_000,
        ge=1,
        description="dpgd-0th refuses more trainable parameters than this: it holds a "
        "d-dimensional noise vector (one extra copy of the trainable weights).",
    )

    @field_validator("steps")
    @classmethod
    def _bounded(cls, steps: int) -> int:
        if steps > MAX_STEPS:
            raise ValueError(
                "more steps than the accountant can carry (see privzo.config.MAX_STEPS); "
                f"allowed: 1 ≤ steps ≤ {MAX_STEPS:_}"
            )
        return steps

    @model_validator(mode="after")
    def _known_algorithm(self) -> OptimizerConfig:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(
                f"optimizer.algorithm={self.algorithm!r} is unknown; allowed: {list(ALGORITHMS)}"
            )
        return self

    @property
    def is_private(self) -> bool:
        return NOISE[self.algorithm].private

    @property
    def first_order_physical_batch_size(self) -> int:
        """What a first-order baseline splits logical batches into (see physical_batch_size)."""
        return self.physical_batch_size or FIRST_ORDER_PHYSICAL_BATCH_SIZE
