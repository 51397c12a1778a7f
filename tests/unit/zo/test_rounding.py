"""Unbiased half-precision updates: stochastic rounding and the applied update's projection."""

from __future__ import annotations

import pytest
import torch

from privzo.bench.kernel_check import update_projection
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
