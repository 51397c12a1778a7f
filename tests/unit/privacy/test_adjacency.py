"""The replace-one guarantee that covers a private run's whole release, N included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from privzo.privacy.adjacency import ADD_REMOVE, REPLACE_ONE, record_fields, replace_one


def _gaussian_delta(epsilon: float, sensitivity_over_sigma: float) -> float:
    """The Gaussian mechanism's exact δ(ε) (Balle & Wang 2018) for a shift of
    ``sensitivity_over_sigma`` noise scales."""
    a = sensitivity_over_sigma
    return float(norm.cdf(a / 2 - epsilon / a) - math.exp(epsilon) * norm.cdf(-a / 2 - epsilon / a))


def test_the_laplace_mechanisms_replace_one_epsilon_is_exactly_twice():
    """Pure ε: a replacement moves the sum from +C to -C, twice the add/remove shift, and the
    largest log-density ratio of the Laplace noise is then exactly 2C/b."""
    clip, scale = 1.0, 0.8
    grid = np.linspace(-20, 20, 400001)
    log_ratio = (np.abs(grid + clip) - np.abs(grid - clip)) / scale
    grouped = replace_one(clip / scale, 0.0)
    assert grouped.epsilon == pytest.approx(float(np.max(np.abs(log_ratio))), rel=1e-12)
    assert grouped.delta == 0.0 and grouped.adjacency == REPLACE_ONE


@pytest.mark.parametrize(("epsilon", "sigma"), [(0.5, 2.0), (1.0, 1.0), (2.0, 0.7)])
def test_the_group_bound_holds_for_the_gaussian_mechanism(epsilon, sigma):
    """The replace-one shift is 2C: its exact δ at 2ε never exceeds the bound's (1 + e^ε)·δ."""
    delta = _gaussian_delta(epsilon, 1 / sigma)
    grouped = replace_one(epsilon, delta)
    assert grouped.epsilon == 2 * epsilon
    assert grouped.delta == pytest.approx((1 + math.exp(epsilon)) * delta, rel=1e-12)
    assert _gaussian_delta(grouped.epsilon, 2 / sigma) <= grouped.delta


def test_the_bound_caps_delta_and_refuses_impossible_inputs():
    assert replace_one(20.0, 1e-5).delta == 1.0
    with pytest.raises(ValueError, match="epsilon >= 0"):
        replace_one(-1.0, 1e-5)
    with pytest.raises(ValueError, match="delta <= 1"):
        replace_one(1.0, 2.0)


def test_records_state_the_adjacency_only_for_a_guarantee():
    fields = record_fields(1.5, 1e-5)
    assert fields["adjacency"] == ADD_REMOVE
    assert fields["replace_one_epsilon"] == 3.0
    assert fields["replace_one_delta"] == pytest.approx((1 + math.exp(1.5)) * 1e-5)
    assert record_fields(None, None) == {
        "adjacency": None,
        "replace_one_epsilon": None,
        "replace_one_delta": None,
    }
