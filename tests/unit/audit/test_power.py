"""The audit's power: the separation ceiling of the aligning scores and the ε_lb expected at a
given separation, against closed forms and the one-run bound itself."""

from __future__ import annotations

import math

import pytest

from privzo.audit.power import (
    audit_power,
    expected_correct,
    expected_epsilon,
    separation_ceiling,
)
from privzo.privacy.audit import BOUNDS, epsilon_lower_bound

KS = [10, 20, 50, 100, 250, 500]


def test_the_ceiling_is_the_closed_form_and_zero_without_in_canaries():
    # the shipped MeZO config: 800 steps of 64 over 2000 rows and about 500 in-canaries
    assert separation_ceiling(800, 64, 2000, 500) == pytest.approx(math.sqrt(51200 / 1_250_000))
    assert separation_ceiling(800, 64, 2000, 0) == 0.0
    # K directions a step release K coordinates: 200 steps of 4 count as 800 steps of one
    four = separation_ceiling(200, 64, 2000, 500, directions=4)
    assert four == separation_ceiling(800, 64, 2000, 500)


@pytest.mark.parametrize("k", [10, 250, 500])
def test_expected_guesses_go_from_chance_to_all_right(k):
    assert expected_correct(0.0, 1000, k) == k  # chance: half of the 2k guesses right
    assert expected_correct(12.0, 1000, k) == 2 * k
    counts = [expected_correct(mu, 1000, k) for mu in (0.5, 1.0, 2.0, 4.0)]
    assert counts == sorted(counts) and counts[0] < counts[-1]


def test_expected_epsilon_is_zero_at_chance_and_the_perfect_bound_when_separated():
    assert expected_epsilon(0.0, 1000, KS, delta=1e-5, alpha=0.05) == 0.0
    level = 0.05 / (len(KS) * len(BOUNDS))
    perfect = max(epsilon_lower_bound(1000, 2 * k, 2 * k, delta=1e-5, alpha=level) for k in KS)
    assert expected_epsilon(12.0, 1000, KS, delta=1e-5, alpha=0.05) == pytest.approx(perfect)
    grid = [expected_epsilon(mu, 1000, KS, delta=1e-5, alpha=0.05) for mu in (1, 2, 3, 6)]
    assert grid == sorted(grid) and 0 < grid[0] < grid[-1] <= perfect


def test_the_shipped_mezo_audit_cannot_be_expected_to_show_its_leak():
    power = audit_power(
        steps=800,
        batch_size=64,
        training_rows=2000,
        canaries_in=500,
        canaries=1000,
        ks=KS,
        delta=1e-5,
        alpha=0.05,
    )
    assert power.separation_ceiling == pytest.approx(0.2024, abs=1e-4)
    assert power.epsilon_at_ceiling < 0.1
    # 300 times the steps lifts the ceiling √300 times, to where the bound shows ε ≥ 4 is not
    # yet reached with the default sweep of k but is with a single k = 250
    longer = separation_ceiling(240_000, 64, 2000, 500)
    assert expected_epsilon(longer, 1000, [250], delta=1e-5, alpha=0.05) >= 4.0
