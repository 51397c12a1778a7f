"""Floating-point-safe scalar noise: the exact discrete samplers, the estimator on the grid, and
the accountants of the discrete mechanisms."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import dp_accounting
import numpy as np
import pytest
import torch

from privzo.config import ConfigError, load_config
from privzo.privacy import calibrate_noise_multiplier, compute_epsilon
from privzo.privacy.accountants import make_accountant
from privzo.privacy.discrete import (
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    grid_sensitivity,
    noise_units,
    unit_interval_units,
)
from privzo.privacy.plan import mechanism_parameters, plan_privacy
from privzo.zo.estimators import estimator_for, make_estimator

GRID = {"grid": 1024}


# --- the samplers ---------------------------------------------------------------------------


@pytest.mark.parametrize("gamma", [Fraction(1, 2), Fraction(23, 10)])
def test_bernoulli_exp_comes_up_with_probability_exp_minus_gamma(gamma):
    draws = 20000
    hits = sum(bernoulli_exp(gamma) for _ in range(draws))
    expected = math.exp(-float(gamma))
    spread = math.sqrt(expected * (1 - expected) / draws)
    assert abs(hits / draws - expected) < 5 * spread


def _moments(weights: dict[int, float]) -> tuple[float, float]:
    total = sum(weights.values())
    mean = sum(k * w for k, w in weights.items()) / total
    return mean, sum(k * k * w for k, w in weights.items()) / total - mean**2


@pytest.mark.parametrize(
    ("sampler", "weight"),
    [
        (discrete_gaussian, lambda k, s: math.exp(-k * k / (2 * s * s))),
        (discrete_laplace, lambda k, s: math.exp(-abs(k) / s)),
    ],
)
def test_discrete_samplers_draw_integers_with_the_exact_distribution(sampler, weight):
    """Small scale 3, so the law is checked against the exact pmf point by point."""
    scale, draws = 3, 30000
    values = [sampler(scale) for _ in range(draws)]
    assert all(type(v) is int for v in values)
    pmf = {k: weight(k, scale) for k in range(-60, 61)}
    total = sum(pmf.values())
    mean, variance = _moments(pmf)
    assert abs(sum(values) / draws - mean) < 5 * math.sqrt(variance / draws)
    empirical = sum(v * v for v in values) / draws
    assert empirical == pytest.approx(variance, rel=0.05)
    for k in (0, 1, -2, 4):
        frequency = values.count(k) / draws
        probability = pmf[k] / total
        assert abs(frequency - probability) < 5 * math.sqrt(probability / draws)


def test_samplers_refuse_a_scale_that_is_not_a_positive_integer():
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="integer"):
            discrete_gaussian(bad)
        with pytest.raises(ValueError, match="integer"):
            discrete_laplace(bad)


# --- the estimator on the grid ----------------------------------------------------------------


def test_the_released_noisy_sum_lies_on_the_grid():
    """g·B/γ is an integer: rounded clipped values plus an integer draw, scaled once."""
    sigma, clip, batch = 1.3, 0.5, 4.0
    estimator = make_estimator(
        "gaussian",
        clip=clip,
        noise_multiplier=sigma,
        expected_batch_size=batch,
        noise_parameters=GRID,
    )
    unit = sigma * clip / 1024
    for differences in (torch.tensor([0.1, -0.3, 2.0]), torch.zeros(0)):
        for _ in range(20):
            released = estimator.estimate(differences).projected_gradient * batch / unit
            assert abs(released - round(released)) < 1e-6
            assert round(released) != 0 or differences.numel() == 0  # noise was added


def test_a_contribution_beyond_the_clip_moves_the_sum_by_the_sensitivity_at_most():
    sigma = 1.3
    estimator = make_estimator(
        "gaussian", clip=0.5, noise_multiplier=sigma, expected_batch_size=4, noise_parameters=GRID
    )
    units = estimator.to_units(estimator.clip_each(torch.tensor([1e9, -1e9, 0.25, 0.0])))
    assert units.tolist() == [
        grid_sensitivity(1024, sigma),
        -grid_sensitivity(1024, sigma),
        round(0.25 / estimator.unit),
        0.0,
    ]
    assert grid_sensitivity(1024, sigma) == math.ceil(1024 / sigma) == 788


@pytest.mark.parametrize(("mechanism", "factor"), [("gaussian", 1.0), ("laplace", 2.0)])
def test_the_noise_on_the_grid_has_the_variance_of_its_scale(mechanism, factor):
    """Var = σ²C² (Gaussian) or 2σ²C² (Laplace), with 6000 draws (±~2 % spread)."""
    sigma, clip, batch, draws = 1.5, 2.0, 1.0, 6000
    estimator = make_estimator(
        mechanism,
        clip=clip,
        noise_multiplier=sigma,
        expected_batch_size=batch,
        noise_parameters=GRID,
    )
    values = torch.tensor(
        [estimator.estimate(torch.zeros(0)).projected_gradient for _ in range(draws)],
        dtype=torch.float64,
    )
    assert float(values.var()) == pytest.approx(factor * (sigma * clip) ** 2, rel=0.1)
    assert abs(float(values.mean())) < 5 * math.sqrt(factor) * sigma * clip / math.sqrt(draws)
    assert estimator.mechanism.variance(sigma * clip) == pytest.approx(
        factor * (sigma * clip) ** 2, rel=1e-5
    )


# --- configuration and plan -------------------------------------------------------------------


def test_a_private_zeroth_order_run_draws_on_the_grid_by_default():
    config = load_config(None, ["optimizer.algorithm=dpzero", "optimizer.steps=50"])
    assert config.privacy.noise_grid == 1024 and mechanism_parameters(config) == GRID
    plan = plan_privacy(config, 1000)
    assert plan.noise_parameters == GRID
    estimator = estimator_for(config, plan)
    assert estimator.mechanism.grid == 1024
    assert plan.epsilon == pytest.approx(
        compute_epsilon(
            noise_multiplier=plan.noise_multiplier,
            sample_rate=plan.sample_rate,
            steps=50,
            delta=plan.mechanism_delta,  # δ less what truncating padded batches takes
            noise_parameters=GRID,
        )
    )
    continuous = load_config(None, ["optimizer.algorithm=dpzero", "privacy.noise_grid=null"])
    assert mechanism_parameters(continuous) is None
    dpsgd = load_config(None, ["optimizer.algorithm=dpsgd"])  # d-dim noise: no scalar grid
    assert mechanism_parameters(dpsgd) is None


@pytest.mark.parametrize(
    "overrides",
    [
        ["optimizer.algorithm=dpzero", "privacy.accountant=rdp"],
        ["optimizer.algorithm=dpzero", "privacy.accountant=numeric"],
        ["optimizer.algorithm=dpzero", "privacy.noise_grid=8"],
    ],
)
def test_an_accountant_or_grid_that_cannot_bound_the_discrete_noise_is_refused(overrides):
    with pytest.raises(ConfigError, match="noise_grid"):
        load_config(None, overrides)


def test_accountants_for_continuous_noise_refuse_a_grid():
    for name in ("rdp", "numeric"):
        with pytest.raises(ValueError, match="discrete"):
            make_accountant(name, "gaussian", 1.0, 0.01, noise_parameters=GRID)


# --- accounting --------------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.9, 1.2636, 2.5])
def test_discrete_gaussian_epsilon_is_at_or_just_above_the_continuous_one(sigma):
    """Δ = ⌈K/σ⌉ ≥ K/σ, so the discrete mechanism pays at most the rounding of the sensitivity
    (< 0.5 % at K = 1024 here); T = 1000, q = 0.016."""
    common = dict(noise_multiplier=sigma, sample_rate=0.016, steps=1000, delta=1e-5)
    continuous = compute_epsilon(**common)
    discrete = compute_epsilon(**common, noise_parameters=GRID)
    assert continuous <= discrete <= 1.005 * continuous


def test_with_an_exact_grid_ratio_discrete_and_continuous_gaussian_agree():
    """σ = 1: Δ = K exactly, and the discrete Gaussian's PLD matches the continuous one."""
    common = dict(noise_multiplier=1.0, sample_rate=0.016, steps=1000, delta=1e-5)
    continuous = compute_epsilon(**common)
    assert compute_epsilon(**common, noise_parameters=GRID) == pytest.approx(continuous, rel=1e-6)


@pytest.mark.parametrize("accountant", ["pld", "pure"])
def test_discrete_laplace_epsilon_is_at_or_just_above_the_continuous_one(accountant):
    common = dict(
        noise_multiplier=1.37,
        sample_rate=0.016,
        steps=1000,
        mechanism="laplace",
        accountant=accountant,
        delta=1e-5,
    )
    continuous = compute_epsilon(**common)
    discrete = compute_epsilon(**common, noise_parameters=GRID)
    assert continuous <= discrete <= 1.005 * continuous


@pytest.mark.parametrize(
    ("mechanism", "accountant"), [("gaussian", "pld"), ("laplace", "pld"), ("laplace", "pure")]
)
def test_calibration_meets_the_target_for_the_discrete_mechanism(mechanism, accountant):
    common = dict(
        sample_rate=0.016, steps=1000, delta=1e-5, mechanism=mechanism, accountant=accountant
    )
    sigma = calibrate_noise_multiplier(epsilon=2.0, **common, noise_parameters=GRID)
    assert compute_epsilon(noise_multiplier=sigma, **common, noise_parameters=GRID) <= 2.0
    continuous = calibrate_noise_multiplier(epsilon=2.0, **common)
    # the same noise up to the sensitivity's rounding (Δ = ⌈K/σ⌉: up to σ/K relative, 0.8 %
    # for the pure Laplace's σ ≈ 8.5) and the calibration's tolerance
    assert sigma == pytest.approx(continuous, rel=continuous / 1024 + 2e-3)
    assert compute_epsilon(noise_multiplier=sigma * 0.99, **common, noise_parameters=GRID) > 2.0


def test_the_privacy_command_calibrates_for_the_discrete_mechanism(capsys):
    from privzo.cli import main

    common = ["--delta", "1e-5", "--sample-rate", "0.016", "--steps", "200", "--json"]
    assert main(["privacy", "calibrate", "--epsilon", "2", *common, "--noise-grid", "1024"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["noise_grid"] == 1024
    assert record["noise_multiplier"] == pytest.approx(
        calibrate_noise_multiplier(
            epsilon=2, delta=1e-5, sample_rate=0.016, steps=200, noise_parameters=GRID
        )
    )
    assert (
        main(["privacy", "epsilon", "--noise-multiplier", "1", *common, "--noise-grid", "8"]) == 2
    )
    assert "--noise-grid 8 must be an integer ≥ 16" in capsys.readouterr().err


@pytest.mark.parametrize(("mechanism", "accountant"), [("gaussian", "pld"), ("laplace", "pure")])
def test_a_discrete_accountant_state_keeps_its_grid(mechanism, accountant):
    from privzo.privacy.accountants import accountant_from_state

    gridded = make_accountant(accountant, mechanism, 1.3, 0.02, noise_parameters=GRID)
    gridded.step(5)
    state = json.loads(json.dumps(gridded.state_dict()))
    assert state["noise_parameters"] == GRID
    assert accountant_from_state(state).epsilon(1e-5) == gridded.epsilon(1e-5)
    with pytest.raises(ValueError, match="noise_parameters"):
        make_accountant(accountant, mechanism, 1.3, 0.02).load_state_dict(state)


def test_a_score_sum_on_its_grid_has_sensitivity_m_and_noise_of_at_least_its_std():
    assert noise_units(5.0, 1024) == 5120
    assert noise_units(0.1, 10) == 2  # the float 0.1 is above 1/10: never rounded down
    assert noise_units(5.3, 1024) == math.ceil(Fraction(5.3) * 1024) == 5428
    scores = [0.0, 1.0, 0.37, 0.5, 0.999]
    units = [unit_interval_units(value, 8) for value in scores]
    assert units == [0, 8, 3, 4, 8] and all(0 <= unit <= 8 for unit in units)
    for bad in (-0.01, 1.01, math.nan):
        with pytest.raises(ValueError, match=r"\[0, 1\]"):
            unit_interval_units(bad, 8)
    with pytest.raises(ValueError, match="grid"):
        noise_units(5.0, 0)


def _lattice_divergences(scale: int, shift: int, rate: float, alpha: float) -> tuple[float, float]:
    """(D_α(p_q‖p₀), D_α(p₀‖p_q)) of the subsampled discrete Gaussian, by brute force on a wide
    lattice (±2000 at scale 16: the rest of the mass is below e^{-7800})."""
    from scipy.special import logsumexp

    points = np.arange(-2000, 2001, dtype=np.float64)
    log_p0 = -(points**2) / (2 * scale**2)
    log_p0 -= logsumexp(log_p0)
    log_p1 = -((points - shift) ** 2) / (2 * scale**2)
    log_p1 -= logsumexp(log_p1)
    log_mix = np.logaddexp(math.log1p(-rate) + log_p0, math.log(rate) + log_p1)
    remove = logsumexp(alpha * log_mix + (1 - alpha) * log_p0) / (alpha - 1)
    add = logsumexp(alpha * log_p0 + (1 - alpha) * log_mix) / (alpha - 1)
    return float(remove), float(add)


def test_the_search_bounds_a_gridded_step_in_both_directions_at_every_order():
    """A search's curve for a gridded trial is at or above the discrete step's Rényi divergence
    in both directions (brute force), integer and fractional orders; at integer orders the
    remove direction is the continuous closed form at K/Δ exactly."""
    from privzo.privacy.discrete_rdp import subsampled_discrete_gaussian_rdp
    from privzo.privacy.dp_accounting_adapter import RDP_ORDERS
    from privzo.search.privacy import TrialEvent, rdp_curve

    grid, sigma, rate = 16, 1.25, 0.1
    shift = grid_sensitivity(grid, sigma)
    assert shift == 13
    event = TrialEvent(steps=1, sample_rate=rate, noise_multiplier=sigma, noise_grid=grid)
    curve = event.curve()
    lattice = subsampled_discrete_gaussian_rdp(grid, shift, rate, RDP_ORDERS)
    closed = rdp_curve(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(grid / shift))
    )
    for index, alpha in enumerate(RDP_ORDERS):
        if alpha > 20:
            break
        remove, add = _lattice_divergences(grid, shift, rate, float(alpha))
        assert curve[index] >= max(remove, add) * (1 - 1e-12)
        if alpha == int(alpha):
            assert lattice[index] == pytest.approx(add, rel=1e-9)
            assert closed[index] == pytest.approx(remove, rel=1e-9)
        else:
            assert lattice[index] == pytest.approx(max(remove, add), rel=1e-9)
