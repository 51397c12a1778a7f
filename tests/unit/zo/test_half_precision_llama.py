"""A bf16 Llama under the virtual perturbation: the two perturbed evaluations of a step leave its
weights bit for bit as they were, and the stochastically rounded update is unbiased."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from privzo.zo.directions import DirectionSampler, step_seed
from privzo.zo.estimators import MeanEstimator
from privzo.zo.perturbation import VirtualPerturber, make_perturber
from privzo.zo.step import zo_step
from privzo.zo.sweeps import full_shards
from tiny_families import tiny_family_model

VOCAB = 64


def _bf16_llama():
    model = tiny_family_model("llama", VOCAB, dtype=torch.bfloat16)
    shards = full_shards(model.named_parameters())
    return model, shards, make_perturber(model, shards, DirectionSampler("gaussian"))


def test_the_perturbed_evaluations_of_a_step_leave_bf16_llama_weights_bit_for_bit():
    model, _shards, perturber = _bf16_llama()
    assert isinstance(perturber, VirtualPerturber)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    inputs = torch.randint(0, VOCAB, (4, 12), generator=torch.Generator().manual_seed(0))
    targets = torch.randint(0, VOCAB, (4,), generator=torch.Generator().manual_seed(1))

    def loss_fn(batch: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(
            model(input_ids=batch).logits[:, -1].float(), targets, reduction="none"
        )

    plain = loss_fn(inputs)
    for step in range(2):  # learning rate 0: the step's evaluations only, no update
        record = zo_step(
            step=step,
            seed=step_seed(7, step),
            perturber=perturber,
            batch=inputs,
            batch_size=4,
            loss_fn=loss_fn,
            estimator=MeanEstimator(),
            learning_rate=0.0,
            perturbation_scale=1e-2,
        )
        assert record.projected_gradient != 0  # the two evaluations saw θ ± εz
    for name, parameter in model.named_parameters():
        assert torch.equal(parameter, before[name]), name
    assert torch.equal(loss_fn(inputs), plain)


def _bf16_spacing(values: torch.Tensor) -> torch.Tensor:
    """The gap between the two bf16 numbers around each fp32 value (8 significant bits)."""
    _mantissa, exponent = torch.frexp(values)
    return torch.ldexp(torch.ones_like(values), exponent - 8)


def test_the_rounded_update_of_bf16_llama_is_unbiased_over_seeds():
    """θ ← round(θ + c·z) for 24 seeds, c below half a bf16 spacing of most weights (nearest
    rounding would drop those updates). Each element's residual r − (θ + c·z), signed by z and
    divided by its spacing, lies in [−1, 1] and has mean 0 when the rounding is unbiased, so by
    Hoeffding's inequality the mean of n of them exceeds √(2·ln(2/α)/n) with probability at
    most α = 1e-6. Round-to-nearest on the same values is shown to exceed that bound."""
    _model, shards, perturber = _bf16_llama()
    sampler = DirectionSampler("gaussian")
    start = [shard.tensor.detach().clone() for shard in shards]
    coefficient = 2e-5
    residuals, nearest = [], []
    for seed in range(24):
        for shard, original in zip(shards, start, strict=True):
            shard.tensor.copy_(original)
        perturber.update(seed, coefficient)
        for shard, original in zip(shards, start, strict=True):
            z = sampler.slice(seed, shard.name, shard.size, 0, shard.size).view_as(original)
            target = original.float() + coefficient * z
            keep = (z != 0) & (target != 0)
            spacing = _bf16_spacing(target)
            sign = torch.sign(z)
            rounded = shard.tensor.float()
            residuals.append(((rounded - target) * sign / spacing)[keep])
            to_nearest = target.to(torch.bfloat16).float()
            nearest.append(((to_nearest - target) * sign / spacing)[keep])
    stochastic = torch.cat(residuals).double()
    n = stochastic.numel()
    bound = math.sqrt(2 * math.log(2 / 1e-6) / n)
    assert bool((stochastic.abs() <= 1).all())
    assert abs(float(stochastic.mean())) <= bound, (float(stochastic.mean()), bound, n)
    assert float(torch.cat(nearest).double().mean()) < -bound  # nearest loses the small steps
