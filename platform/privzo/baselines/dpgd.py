"""DPGD-0th: the naive private zeroth-order method DPZero is compared against.

Per step, with one public direction z (scaled by the sampler's factor s, so the perturbation is
ε·s·z as in DPZero) and per-example differences d_i = (l_i(θ+εsz) − l_i(θ−εsz)) / 2ε, each
example contributes the d-dimensional zeroth-order gradient g_i = d_i·s·z. DPGD-0th clips each
g_i in ℓ2 norm to C, sums, adds N(0, σ²C²·I_d) and divides by the expected batch size B:

    θ ← θ − η · (Σ_i clip_C(g_i) + ξ) / B,   ξ ~ N(0, σ²C² I_d) from a secret generator,

ξ drawn in fp32 as half the sum of four independent draws (Holohan & Braghin 2021, as Opacus'
secure_mode) so that a floating-point attack on one draw's low bits does not apply.

Since ‖g_i‖ = |d_i|·s·‖z‖, clipping g_i is scaling d_i by min(1, C / (|d_i|·s·‖z‖)): the
released vector's signal part lies along z, but its noise is d-dimensional, which is the point
of the comparison (DPZero noises one scalar). One step is the Poisson-subsampled Gaussian
mechanism with ℓ2 sensitivity C under add/remove adjacency, accounted exactly as dpzero.

Memory: the noise vector ξ has d entries and is materialised once per run (one extra copy of
the trainable weights in fp32, plus a 1 MiB scratch its four draws are summed through, and ‖z‖
costs one extra generation pass of z), which is why
the run refuses more than ``optimizer.dpgd_max_parameters`` trainable parameters. The noise
is not public, so no trajectory can rebuild the weights: the run saves them instead.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

from privzo.algorithms.stepper import StepMeter, StepOutcome, Stepper
from privzo.privacy.mechanisms import secret_torch_generator, secure_gaussian_
from privzo.privacy.plan import make_sampler
from privzo.section import ConfigError
from privzo.tasks.micro_batches import losses_in_micro_batches
from privzo.zo.directions import DirectionSampler, step_seed
from privzo.zo.estimators import GradientEstimator
from privzo.zo.schedules import make_schedule
from privzo.zo.step import estimate_differences
from privzo.zo.sweeps import ParameterShard, iter_direction_blocks

if TYPE_CHECKING:
    from privzo.layouts.context import RunContext


def check_dpgd_size(context: RunContext) -> None:
    """Refuse (before training) a model whose d-dimensional noise exceeds the configured cap."""
    optimizer = context.config.optimizer
    parameters = sum(shard.size for shard in context.shards)
    if parameters > optimizer.dpgd_max_parameters:
        raise ConfigError(
            f"optimizer.algorithm='dpgd-0th' with {parameters} trainable parameters exceeds "
            f"optimizer.dpgd_max_parameters={optimizer.dpgd_max_parameters}: its noise is a "
            f"{parameters}-dimensional vector ({parameters * 4 / 2**20:.0f} MiB more in fp32); "
            "raise the cap, choose a smaller view (model.trainable=lora or bitfit), or use dpzero"
        )


def direction_norm(shards: list[ParameterShard], sampler: DirectionSampler, seed: int) -> float:
    """‖z(seed)‖ over the trainable shards: one extra generation pass of the direction."""
    squares = 0.0
    for shard in shards:
        for _local, direction in iter_direction_blocks(shard, sampler, seed):
            squares += float(direction.double().square().sum())
    return math.sqrt(squares)


def clip_coefficients(differences: torch.Tensor, vector_norm: float, clip: float) -> torch.Tensor:
    """Per-example coefficients c_i of z such that c_i·z = g_i·min(1, C/‖g_i‖), g_i = d_i·z/‖z‖
    scaled to norm |d_i|·vector_norm: so |c_i|·vector_norm ≤ C for every example."""
    norms = differences.double().abs() * vector_norm
    factors = torch.clamp(clip / norms.clamp(min=1e-300), max=1.0)
    return differences.double() * factors


class DpgdStepper(Stepper):
    """Zeroth-order differences, per-example vector clipping, d-dimensional Gaussian noise."""

    def __init__(self, context: RunContext, meter: StepMeter) -> None:
        super().__init__(context, meter)
        config, plan = context.config, context.plan
        assert plan.private and plan.noise_multiplier is not None
        self.sampler = make_sampler(config, plan, len(context.train))
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )
        self.clip = context.config.privacy.clip
        self.noise_std = plan.noise_multiplier * self.clip
        self.expected_batch_size = plan.expected_batch_size
        self._noise: torch.Tensor | None = None
        self._generator: torch.Generator | None = None

    def start(self) -> None:
        device = self.context.loaded.device
        dimension = sum(shard.tensor.numel() for shard in self.context.shards)
        self._noise = torch.empty(dimension, dtype=torch.float32, device=device)
        self._generator = secret_torch_generator(device)

    def finish(self) -> None:
        self._noise = None
        self._generator = None

    def step(self, step: int) -> StepOutcome:
        with self.meter.measure():
            return self._step(step)

    def _step(self, step: int) -> StepOutcome:
        context, config = self.context, self.context.config
        seed = step_seed(config.seed, step)
        perturber = context.perturber
        indices = self.sampler.next_batch()
        batch = context.task.collate(context.train, indices) if len(indices) else None
        scale = perturber.sampler.scale(seed, perturber.sizes)
        epsilon = config.optimizer.perturbation_scale
        differences, mean_loss = estimate_differences(
            perturber,
            seed,
            epsilon * scale,
            epsilon,
            batch,
            len(indices),
            lambda b: losses_in_micro_batches(
                lambda chunk: context.task.per_example_loss(context.scoring_model, chunk),
                b,
                config.optimizer.physical_batch_size,
            ),
        )
        differences, nonfinite = GradientEstimator.sanitize(differences)
        self.nonfinite += nonfinite
        vector_norm = scale * direction_norm(context.shards, perturber.sampler, seed)
        coefficients = clip_coefficients(differences, vector_norm, self.clip)
        learning_rate = self.schedule(step)
        signal = float(coefficients.sum()) / self.expected_batch_size
        perturber.update(seed, -learning_rate * signal * scale)  # restores θ and steps along z
        self._add_noise(-learning_rate / self.expected_batch_size)
        return StepOutcome(learning_rate, mean_loss, empty=not len(indices))

    @torch.no_grad()
    def _add_noise(self, coefficient: float) -> None:
        """θ += coefficient·ξ with ξ ~ N(0, σ²C² I_d), drawn whole into the d-dim fp32 buffer
        as a sum of four secret draws (``secure_gaussian_``, as Opacus' secure_mode), so the
        floating-point attack on one Gaussian draw does not apply.

        The sum is formed in fp32 and rounded once to the weights' dtype: casting ξ to bf16
        first would round the noise itself, and its low bits are what hides the signal.
        """
        assert self._noise is not None and self._generator is not None
        secure_gaussian_(self._noise, self.noise_std, self._generator)
        offset = 0
        for shard in self.context.shards:
            size = shard.tensor.numel()
            noise = self._noise[offset : offset + size].view_as(shard.tensor)
            if shard.tensor.dtype == torch.float32:
                shard.tensor.add_(noise, alpha=coefficient)
            else:
                shard.tensor.copy_(shard.tensor.float().add_(noise, alpha=coefficient))
            offset += size
