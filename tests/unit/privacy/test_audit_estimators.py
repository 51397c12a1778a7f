"""The audit's other estimators (privzo.privacy.audit): the one-run f-DP bound with a Gaussian
trade-off and TPR at a fixed FPR with Clopper–Pearson intervals, against closed forms, the
binomial bound, an independent accountant and simulated Gaussian mechanisms."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from scipy import stats

from privzo.privacy.audit import (
    audit_guesses,
    clopper_pearson,
    count_correct,
    epsilon_lower_bound,
    fdp_epsilon_lower_bound,
    fdp_rejects,
    gaussian_delta,
    gaussian_floor,
    gaussian_mu,
    tpr_at_fpr,
)


@pytest.mark.parametrize(("epsilon", "delta"), [(0.5, 1e-3), (1.0, 1e-5), (4.0, 1e-5), (8.0, 1e-6)])
def test_gaussian_mu_matches_dp_accounting(epsilon, delta):
    sigma = dp_accounting.get_sigma_gaussian(epsilon, delta)
    assert gaussian_mu(epsilon, delta) == pytest.approx(1 / sigma, rel=1e-6)


def test_gaussian_delta_at_epsilon_zero_is_the_total_variation():
    # ε = 0: δ = Φ(μ/2) − Φ(−μ/2), the total variation between N(0, 1) and N(μ, 1)
    assert gaussian_delta(0.0, 1.0) == pytest.approx(stats.norm.cdf(0.5) - stats.norm.cdf(-0.5))


def test_one_guess_cannot_reject_anything():
    # P[one right guess] can be 1 for a leaky run, so one right guess is never evidence at α < ½
    assert not fdp_rejects(1, 1, 1, gaussian_floor(50.0), alpha=0.05)


@pytest.mark.parametrize(("guesses", "canaries"), [(100, 1000), (200, 1000), (1000, 1000)])
def test_perfect_guesses_give_the_most_their_number_allows(guesses, canaries):
    best = fdp_epsilon_lower_bound(canaries, guesses, guesses, delta=1e-5, alpha=0.05)
    one_wrong = fdp_epsilon_lower_bound(canaries, guesses, guesses - 1, delta=1e-5, alpha=0.05)
    binomial = epsilon_lower_bound(canaries, guesses, guesses, delta=1e-5, alpha=0.05)
    assert best > one_wrong and best > binomial  # a Gaussian trade-off is the tighter claim
    # at the bound μ(ε_lb, δ) is just rejected; a little more μ is not
    assert fdp_rejects(canaries, guesses, guesses, gaussian_floor(gaussian_mu(best, 1e-5)), 0.05)
    higher = gaussian_mu(best + 1e-3, 1e-5)
    assert not fdp_rejects(canaries, guesses, guesses, gaussian_floor(higher), 0.05)


def test_the_guides_worked_value():
    # 100 right of 100 among 1000 canaries at δ = 1e-5, α = 0.05: 5.55, the binomial bound 3.47
    assert fdp_epsilon_lower_bound(1000, 100, 100, delta=1e-5, alpha=0.05) == pytest.approx(
        5.549, abs=1e-3
    )
    assert epsilon_lower_bound(1000, 100, 100, delta=1e-5, alpha=0.05) == pytest.approx(
        3.465, abs=1e-3
    )


@pytest.mark.parametrize("correct", [0, 480, 500, 520])
def test_chance_guesses_give_zero(correct):
    assert fdp_epsilon_lower_bound(1000, 1000, correct, delta=1e-5, alpha=0.05) == 0.0


def test_monotone_in_right_guesses():
    bounds = [
        fdp_epsilon_lower_bound(1000, 200, v, delta=1e-5, alpha=0.05) for v in range(140, 201, 10)
    ]
    assert bounds == sorted(bounds) and bounds[0] < bounds[-1]


@pytest.mark.parametrize("epsilon", [2.0, 4.0])
def test_the_bound_stays_below_a_simulated_gaussian_mechanisms_epsilon(epsilon):
    """Each canary's score is μ·coin + N(0, 1): exactly μ-GDP in each coin, with μ = μ(ε, δ).
    A valid bound falls below ε (at 95 % each); a useful one is not far below it."""
    mu, bounds = gaussian_mu(epsilon, 1e-5), []
    for seed in range(5):
        rng = np.random.default_rng(seed)
        included = rng.random(1000) < 0.5
        scores = mu * included + rng.normal(size=1000)
        results = audit_guesses(scores, included, [10, 50, 100, 250, 500], delta=1e-5, alpha=0.05)
        bounds.append(max(row.fdp_epsilon_lower_bound for row in results))
    assert max(bounds) < epsilon
    assert np.mean(bounds) > epsilon / 3


def test_clopper_pearson_closed_forms():
    # none of n: the upper end solves (1 − p)^n = α/2; all of n: the lower end p^n = α/2
    assert clopper_pearson(0, 50, 0.05) == pytest.approx((0.0, 1 - 0.025 ** (1 / 50)))
    assert clopper_pearson(50, 50, 0.05) == pytest.approx((0.025 ** (1 / 50), 1.0))
    low, high = clopper_pearson(30, 100, 0.05)
    assert stats.binom.sf(29, 100, low) == pytest.approx(0.025)
    assert stats.binom.cdf(30, 100, high) == pytest.approx(0.025)


def test_tpr_at_fpr_of_separated_and_random_scores():
    included = np.arange(1000) >= 500
    separated = tpr_at_fpr(np.arange(1000.0), included, 0.01, delta=1e-5, alpha=0.05)
    # the loosest threshold with at most 1 % of the 500 out-canaries above it lets 5 through
    assert separated.tpr == 1.0 and separated.false_positives == 5
    assert separated.true_positives == 500 and separated.canaries_out == 500
    fpr_high = stats.beta.ppf(0.975, 6, 495)
    expected = math.log((0.025 ** (1 / 500) - 1e-5) / fpr_high)
    assert separated.epsilon_estimate == pytest.approx(expected)
    scores = np.random.default_rng(0).normal(size=1000)
    chance = tpr_at_fpr(scores, included, 0.05, delta=1e-5, alpha=0.05)
    assert chance.false_positives <= 25 and chance.tpr < 0.1
    assert chance.epsilon_estimate == 0.0


def test_sweep_results_carry_both_bounds():
    scores, included = np.arange(1000.0), np.arange(1000) >= 500
    (row,) = audit_guesses(scores, included, [100], delta=1e-5, alpha=0.05)
    assert count_correct(scores, included, 100) == (100, 100)
    assert row.fdp_epsilon_lower_bound == pytest.approx(
        fdp_epsilon_lower_bound(1000, 200, 200, delta=1e-5, alpha=0.025), abs=1e-5
    )
    assert row.fdp_epsilon_lower_bound > row.epsilon_lower_bound > 0
