"""The ``privacy`` section of a run config: the target guarantee and how it is met and accounted.

Which accountant may account which mechanism is the accountants' to say
(``privzo.privacy.accountants``); the run config checks it across sections at load.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from privzo.section import Section

__all__ = [
    "DEFAULT_NOISE_GRID",
    "LMO_MIN_GAMMA_SHAPE",
    "MAX_CLIP",
    "LmoConfig",
    "MechanismName",
    "PrivacyConfig",
]

# The mechanisms a config may choose; tests/unit/algorithms/test_registry.py ties it to the
# mechanism registry and to what the accountants bound.
MechanismName = Literal["gaussian", "laplace", "lmo"]
DEFAULT_NOISE_GRID = 1024

MAX_CLIP = 1e6
"""Largest ``privacy.clip``. C bounds each per-example loss difference (or, for the first-order
baselines, gradient norm) and scales the noise, σ·C, added in fp32. Loss differences of real
models are O(1) to O(100), so a C above 1e6 clips nothing and only scales the noise: the noised
sum is then ≥ 1e6·σ while the signal stays O(B·100), and the fp32 step moves every weight by
noise alone (clip=1e30 finished with weights around 1e26; clip=1e308 overflowed fp32 at step
1). The shipped configs use C ≤ 50."""


LMO_MIN_GAMMA_SHAPE = 0.05
"""Below it a Gamma(shape) draw underflows to R = 0 (noise scale σC/R infinite) too often:
numpy's sampler returns 0 with probability about exp(-744·shape), 1e-16 at 0.05, 8e-4 at
0.01."""


class LmoConfig(Section):
    """LMO-DP noise: Laplace(0, 1/R)·σC with R drawn from a weighted mixture of Gamma(shape,
    scale), Exponential(rate) and Uniform(low, high) (privzo.privacy.mechanisms.LmoMechanism).
    The defaults are illustrative, not values from the LMO-DP paper."""

    weights: list[float] = Field(
        default_factory=lambda: [0.4, 0.3, 0.3],
        description="Mixture weights of the Gamma, Exponential and Uniform parts (sum to 1).",
    )
    gamma_shape: float = Field(3.0, ge=LMO_MIN_GAMMA_SHAPE)
    gamma_scale: float = Field(0.5, gt=0)
    exponential_rate: float = Field(1.0, gt=0)
    uniform_low: float = Field(0.5, gt=0)
    uniform_high: float = Field(1.5, gt=0)

    @model_validator(mode="after")
    def _valid_mixture(self) -> LmoConfig:
        if len(self.weights) != 3 or any(w < 0 for w in self.weights):
            raise ValueError(
                f"privacy.lmo.weights={self.weights}: three non-negative weights (Gamma, "
                "Exponential, Uniform) are required"
            )
        if abs(sum(self.weights) - 1.0) > 1e-9:
            raise ValueError(f"privacy.lmo.weights={self.weights} must sum to 1")
        if self.uniform_high <= self.uniform_low:
            raise ValueError(
                f"privacy.lmo.uniform_high={self.uniform_high} must exceed "
                f"uniform_low={self.uniform_low}"
            )
        return self


class PrivacyConfig(Section):
    """The target guarantee and how it is met and accounted."""

    epsilon: float = Field(2.0, gt=0)
    delta: float = Field(1e-5, ge=0, lt=1)
    clip: float = Field(1.0, gt=0, description="Per-example clipping threshold C (≤ 1e6).")
    noise_multiplier: float | None = Field(
        None, gt=0, description="Fixed σ; when null, σ is calibrated to (epsilon, delta)."
    )
    accountant: Literal["pld", "rdp", "pure", "numeric"] = "pld"
    sampler: Literal["poisson", "shuffle"] = "poisson"
    max_batch_size: int | None = Field(
        None,
        ge=1,
        description="With task.pad_to='max_length': the public number of rows each worker's "
        "batch is filled to (the whole batch's with one worker: each of parallel.workers draws "
        "its own share). A Poisson draw above it keeps a secret, uniformly random "
        "max_batch_size of its examples, and the chance of that in any share over all steps is "
        "taken from delta (truncated Poisson sampling); a bound that would take more than half "
        "of delta is refused. null = the smallest bound (a multiple of "
        "optimizer.physical_batch_size) whose share is at most 1 % of delta; a worker's slice "
        "of the batch for shuffled batches.",
    )
    adjacency: Literal["add-remove"] = "add-remove"
    mechanism: MechanismName | None = Field(
        None,
        description="The scalar noise of a zeroth-order private run; null = the algorithm's "
        "(dpzero: gaussian, dpzo-laplace: laplace). 'lmo' needs accountant 'numeric'.",
    )
    lmo: LmoConfig = Field(default_factory=LmoConfig)
    noise_grid: int | None = Field(
        DEFAULT_NOISE_GRID,
        ge=16,
        le=2**20,
        description="Grid points per noise scale σC of a zeroth-order run's scalar noise: γ·k "
        "with γ = σC/noise_grid and k an exact discrete Gaussian / Laplace (or, for lmo, the "
        "rounded Laplace given its random scale) drawn with integer arithmetic (safe from "
        "floating-point attacks) and accounted as such. null = numpy's float sampler and the "
        "continuous accountants (not safe from those attacks).",
    )

    @field_validator("clip")
    @classmethod
    def _bounded_clip(cls, clip: float) -> float:
        if clip > MAX_CLIP:
            raise ValueError(
                "a threshold this large clips nothing and scales the noise past what a float32 "
                "step carries (see privzo.config.MAX_CLIP); allowed: 0 < clip ≤ 1e6"
            )
        return clip
