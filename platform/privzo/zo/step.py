"""One zeroth-order step as a small function with named stages.

    evaluate at θ+εz → l⁺ ; evaluate at θ−εz → l⁻ ;
    d = (l⁺ − l⁻)/2ε in fp32 → estimator (clip → aggregate → noise → scale) → g ;
    update: θ ← θ − ηg·z  (fused with the restore for in-place fp32 weights)

An empty (Poisson) batch makes no forward pass (g is pure noise) but the same three sweeps, so
replay never needs the realised batch size, which a private run does not release.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from privzo.zo.estimators import GradientEstimator
from privzo.zo.perturbation import Perturber

# Maps a batch to per-example losses (any dtype; the step casts them to fp32).
LossFunction = Callable[[Any], torch.Tensor]


@dataclass(frozen=True)
class StepRecord:
    """What a step releases and replay needs (a trajectory row), plus local diagnostics."""

    step: int
    seed: int
    projected_gradient: float
    learning_rate: float
    batch_size: int
    direction_scale: float
    nonfinite: int
    mean_loss: float  # of (l⁺ + l⁻)/2 over the batch; computed on private data, never released


def zo_step(
    *,
    step: int,
    seed: int,
    perturber: Perturber,
    batch: Any,
    batch_size: int,
    loss_fn: LossFunction,
    estimator: GradientEstimator,
    learning_rate: float,
    perturbation_scale: float,
) -> StepRecord:
    direction_scale = perturber.sampler.scale(seed, perturber.sizes)
    radius = perturbation_scale * direction_scale
    differences, mean_loss = estimate_differences(
        perturber, seed, radius, perturbation_scale, batch, batch_size, loss_fn
    )
    estimate = estimator.estimate(differences)
    perturber.update(seed, -learning_rate * estimate.projected_gradient * direction_scale)
    return StepRecord(
        step=step,
        seed=seed,
        projected_gradient=estimate.projected_gradient,
        learning_rate=learning_rate,
        batch_size=estimate.batch_size,
        direction_scale=direction_scale,
        nonfinite=estimate.nonfinite,
        mean_loss=mean_loss,
    )


def estimate_differences(
    perturber: Perturber,
    seed: int,
    radius: float,
    perturbation_scale: float,
    batch: Any,
    batch_size: int,
    loss_fn: LossFunction,
) -> tuple[torch.Tensor, float]:
    """Per-example (l⁺ − l⁻)/2ε in fp32; leaves the model at θ − εz until the update.

    Public because DPGD-0th (``privzo.baselines.dpgd``) forms the same differences and clips
    them as vectors instead of scalars.
    """
    perturber.perturb(seed, radius)
    losses_plus = loss_fn(batch).float() if batch_size else None
    perturber.perturb(seed, -radius)
    if losses_plus is None:
        return torch.zeros(0, dtype=torch.float32), float("nan")
    losses_minus = loss_fn(batch).float()
    differences = (losses_plus - losses_minus) / (2.0 * perturbation_scale)
    mean_loss = ((losses_plus + losses_minus) / 2).mean()
    # one device-to-host copy per step (the differences and the mean loss together): each
    # copy waits for the device, and a GPU step is a few tens of milliseconds
    on_host = torch.cat([differences, mean_loss.unsqueeze(0)]).cpu()
    return on_host[:-1], float(on_host[-1])
