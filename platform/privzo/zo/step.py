"""One zeroth-order step as a small function with named stages.

    evaluate at θ+εz → l⁺ ; evaluate at θ−εz → l⁻ ;
    d = (l⁺ − l⁻)/2ε in fp32 → estimator (clip → aggregate → noise → scale) → g ;
    update: θ ← θ − ηg·z  (fused with the restore for in-place fp32 weights)

With K directions per step (``optimizer.directions_per_step``, DP-AggZO) the two evaluations
run for each z_k (θ restored between directions), the estimator turns the [B, K] differences
into g_1..g_K, and θ ← θ − (η/K) Σ_k g_k z_k: the last direction's update fused with its
restore (``Perturber.update_all``): with fp32 weights and fused passes one pass over θ for
all K terms, else one sweep each.

An empty (Poisson) batch makes no forward pass (g is pure noise) but the same three sweeps, so
replay never needs the realised batch size, which a private run does not release.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from privzo.zo.directions import direction_seeds
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
    # directions 2..K of a step with several (their seeds follow from ``seed``)
    extra_projected_gradients: tuple[float, ...] = ()
    extra_direction_scales: tuple[float, ...] = ()

    @property
    def projected_gradients(self) -> tuple[float, ...]:
        return (self.projected_gradient, *self.extra_projected_gradients)


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
    directions: int = 1,
) -> StepRecord:
    seeds = direction_seeds(seed, directions)
    scales = [perturber.sampler.scale(each, perturber.sizes) for each in seeds]
    columns, losses = [], []
    for index, (each, scale) in enumerate(zip(seeds, scales, strict=True)):
        differences, mean_loss = estimate_differences(
            perturber,
            each,
            perturbation_scale * scale,
            perturbation_scale,
            batch,
            batch_size,
            loss_fn,
        )
        if index < directions - 1:
            perturber.update(each, 0.0)  # back to θ before the next direction
        columns.append(differences)
        losses.append(mean_loss)
    estimate = estimator.estimate(columns[0] if directions == 1 else torch.stack(columns, 1))
    gradients = estimate.projected_gradients
    perturber.update_all(seeds, update_coefficients(learning_rate, gradients, scales))
    return StepRecord(
        step=step,
        seed=seed,
        projected_gradient=gradients[0],
        learning_rate=learning_rate,
        batch_size=estimate.batch_size,
        direction_scale=scales[0],
        nonfinite=estimate.nonfinite,
        mean_loss=sum(losses) / directions,
        extra_projected_gradients=tuple(gradients[1:]),
        extra_direction_scales=tuple(scales[1:]),
    )


def update_coefficients(
    learning_rate: float, gradients: Sequence[float], scales: Sequence[float]
) -> list[float]:
    """−(η/K)·g_k·s_k for each direction: the coefficients training and replay apply (with
    one direction exactly the single-direction step's −η·g·s)."""
    share = learning_rate / len(gradients)
    return [-share * gradient * scale for gradient, scale in zip(gradients, scales, strict=True)]


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
