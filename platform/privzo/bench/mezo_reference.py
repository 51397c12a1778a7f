"""MeZO's step as the paper's code writes it, the reference privzo's step is compared with.

Re-expressed from ``MeZO/large_models/trainer.py`` (``zo_perturb_parameters``, ``zo_step``,
``zo_update``): each sweep seeds torch's global generator with the step's seed and, parameter
by parameter, draws ``z = torch.normal(0, 1, size)`` and writes ``param.data = param.data +
scale * z * eps`` (a new tensor per parameter, not in place). Four sweeps: +ε, −2ε, +ε to
restore, then a separate update ``param.data = param.data - lr * g * z`` (weight decay 0).
The loss is the mean of the per-example losses of one forward, as in MeZO.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


@torch.no_grad()
def _perturb(parameters: list[nn.Parameter], seed: int, scale: float) -> None:
    torch.manual_seed(seed)
    for parameter in parameters:
        z = torch.normal(
            mean=0,
            std=1,
            size=parameter.data.size(),
            device=parameter.data.device,
            dtype=parameter.data.dtype,
        )
        parameter.data = parameter.data + scale * z


@torch.no_grad()
def mezo_reference_step(
    parameters: list[nn.Parameter],
    seed: int,
    loss: Callable[[], torch.Tensor],
    eps: float,
    learning_rate: float,
) -> float:
    """One MeZO step; returns the projected gradient."""
    _perturb(parameters, seed, eps)
    loss_plus = loss().mean()
    _perturb(parameters, seed, -2 * eps)
    loss_minus = loss().mean()
    _perturb(parameters, seed, eps)
    projected_gradient = ((loss_plus - loss_minus) / (2 * eps)).item()  # MeZO's one sync
    _perturb(parameters, seed, -learning_rate * projected_gradient)
    return projected_gradient
