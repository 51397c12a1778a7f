"""Unbiased half-precision updates: stochastic rounding and the applied update's projection."""

from __future__ import annotations

import pytest
import torch

from privzo.bench.kernel_check import (
    FLIPPED_DIFFERENCE_ULPS,
    FLIPPED_ROUNDINGS_BOUND,
    NORMAL_RTOL,
    flipped_roundings,
    update_projection,
)
from privzo.zo.rounding import stochastic_round

HALF = [torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_rounding_picks_a_neighbour_and_keeps_exact_values(dtype):
    torch.manual_seed(0)
    values = torch.cat([torch.randn(4096) * 0.02, torch.tensor([0.0, -0.0, 1e-30, -1e-30])])
    uniforms = torch.rand(values.numel())
    rounded = stochastic_round(values, uniforms, dtype).float()
    below = torch.nextafter(values.to(dtype), torch.tensor(-float("inf"), dtype=dtype)).float()
    above = torch.nextafter(values.to(dtype), torch.tensor(float("inf"), dtype=dtype)).float()
    assert bool(
        (
            (rounded >= torch.minimum(below, values)) & (rounded <= torch.maximum(above, values))
        ).all()
    )
    exact = values.to(dtype).float()
    assert torch.equal(stochastic_round(exact, uniforms, dtype).float(), exact)


@pytest.mark.parametrize("dtype", HALF)
def test_stochastic_rounding_is_unbiased_for_one_value(dtype):
    value = torch.tensor(0.0123)
    count = 1 << 18
    uniforms = (torch.arange(count, dtype=torch.float64) / count).float()  # an even grid
    rounded = stochastic_round(value.expand(count).contiguous(), uniforms, dtype)
    assert float(rounded.double().mean()) == pytest.approx(float(value), rel=1e-6)
    nearest = value.to(dtype)
    assert bool((rounded != nearest).any())  # both neighbours occur


def _projection(dtype: torch.dtype, magnitude: float, size: int, steps: int) -> float:
    return update_projection(torch.device("cpu"), dtype, magnitude, size, steps)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("magnitude", [1e-6, 1e-5])
def test_half_precision_update_lands_in_expectation(dtype, magnitude):
    """2¹⁶ weights keep the estimate's noise near 0.03 at these sizes (the full 2²⁰ check,
    down to 1e-7, is the slow test below)."""
    assert _projection(dtype, magnitude, 1 << 16, 100) == pytest.approx(1.0, abs=0.05)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("magnitude", [1e-7, 1e-6, 1e-5])
def test_half_precision_update_projection_over_a_million_weights(dtype, magnitude):
    assert _projection(dtype, magnitude, 1 << 20, 100) == pytest.approx(1.0, abs=0.05)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("scale", [0.02, 0.0])  # weights, and biases that start at zero
def test_last_bit_differences_of_z_stay_within_replays_tolerance(dtype, scale):
    """Two copies updated with the same uniforms and z apart by the kernels' stated tolerance
    (as a GPU's and a CPU's normals are): few elements differ, each by at most two ulps of the
    tensor's largest weight, though a flipped element that later shrinks is many of its own
    ulps away."""
    generator = torch.Generator().manual_seed(0)
    size = 1 << 16
    ours = (torch.randn(size, generator=generator) * scale).to(dtype)
    theirs = ours.clone()
    for _step in range(10):
        z = torch.randn(size, generator=generator)
        nearby = z * (1 + NORMAL_RTOL * torch.randn(size, generator=generator))
        coefficient = float(torch.randn((), generator=generator)) * 1.5e-4
        uniforms = torch.rand(size, generator=generator)
        ours = stochastic_round(ours.float() + coefficient * z, uniforms, dtype)
        theirs = stochastic_round(theirs.float() + coefficient * nearby, uniforms, dtype)
    fraction, largest = flipped_roundings(theirs, ours)
    assert 0 < fraction <= FLIPPED_ROUNDINGS_BOUND
    assert largest <= FLIPPED_DIFFERENCE_ULPS
