"""The numeric accountant against dp_accounting's closed-form PLDs, and the LMO-DP mechanism."""

from __future__ import annotations

import math

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld

from conftest import LMO_PARAMETERS
from privzo.config import ConfigError, load_config
from privzo.privacy import (
    accountant_from_state,
    calibrate_noise_multiplier,
    compute_epsilon,
    get_mechanism,
    make_accountant,
)
from privzo.privacy.accountants.numeric import GaussianNoise, LaplaceNoise, LmoNoise, one_step_pld

LMO = LMO_PARAMETERS


def _dp_accounting_epsilon(mechanism, sigma, sample_rate, steps, delta):
    inner = (
        dp_accounting.GaussianDpEvent(sigma)
        if mechanism == "gaussian"
        else dp_accounting.LaplaceDpEvent(sigma)
    )
    event = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(sample_rate, inner), steps
    )
    accountant = pld.PLDAccountant(value_discretization_interval=1e-4)
    return accountant.compose(event).get_epsilon(delta)


@pytest.mark.parametrize(
    ("mechanism", "sigma", "sample_rate", "steps"),
    [
        ("gaussian", 1.0, 0.01, 1000),
        ("gaussian", 0.8, 0.125, 12),
        ("laplace", 1.0, 0.01, 1000),
        ("laplace", 2.0, 0.05, 300),
    ],
)
def test_numeric_matches_dp_accounting_pld_within_one_percent(mechanism, sigma, sample_rate, steps):
    numeric = compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=sample_rate,
        steps=steps,
        delta=1e-5,
        mechanism=mechanism,
        accountant="numeric",
    )
    reference = _dp_accounting_epsilon(mechanism, sigma, sample_rate, steps, 1e-5)
    assert numeric == pytest.approx(reference, rel=0.01)


def _binned_lower_bound(noise, sigma, sample_rate, epsilons, width=1e-4, reach=40.0):
    """δ(ε) of one step on a partition of [−reach·σ, reach·σ + 1] into bins of width·σ, each bin
    one outcome with its exact masses: a post-processing of the outcome (and outcomes dropped
    outside the range only remove non-negative terms), so it is below the true δ(ε)."""
    edges = np.arange(-reach * sigma, reach * sigma + 1 + width * sigma, width * sigma)
    mu0 = np.clip(noise.interval_mass(edges[:-1] / sigma, edges[1:] / sigma), 0, None)
    mu1 = np.clip(noise.interval_mass((edges[:-1] - 1) / sigma, (edges[1:] - 1) / sigma), 0, None)
    mixture = (1 - sample_rate) * mu0 + sample_rate * mu1
    return np.array(
        [
            max(
                np.clip(mixture - math.exp(e) * mu0, 0, None).sum(),
                np.clip(mu0 - math.exp(e) * mixture, 0, None).sum(),
            )
            for e in epsilons
        ]
    )


@pytest.mark.parametrize(
    ("noise", "sigma", "sample_rate"),
    [
        (GaussianNoise(), 0.8, 0.125),
        (LaplaceNoise(), 1.0, 0.5),
        (LmoNoise(**LMO), 0.5, 1.0),  # ε up to its largest loss (δ = 0 beyond about 2.3)
        (LmoNoise(**LMO), 1.0, 0.125),
    ],
    ids=["gaussian", "laplace", "lmo-full-batch", "lmo-subsampled"],
)
def test_one_step_bound_is_above_a_ten_times_finer_lower_bound(noise, sigma, sample_rate):
    """Bins carry their largest loss, so the one-step δ(ε) is certified from above: at every ε it
    is at or above a lower bound on a 10x finer grid, and it costs less than 0.01 in ε (at or below
    the lower bound at ε − 0.01; the 1e-12 is the LMO tail mass beyond the bins, counted as δ).
    With each bin's average loss instead, the LMO full-batch δ(2.25) was 2e-5 below the lower
    bound."""
    epsilons = np.linspace(0.0, 3.0, 25)
    pld_one_step = one_step_pld(noise, sigma, sample_rate, interval=1e-4)
    certified = np.array([pld_one_step.get_delta_for_epsilon(e) for e in epsilons])
    lower = _binned_lower_bound(noise, sigma, sample_rate, epsilons)
    assert np.all(certified >= lower)
    assert (lower > 1e-6).sum() >= 3  # the comparison covers more than the δ = 0 region
    shifted = _binned_lower_bound(noise, sigma, sample_rate, epsilons - 0.01)
    assert np.all(certified <= shifted + 1e-12)


UNIFORM_ONLY = LMO | {"weights": [0.0, 0.0, 1.0]}


@pytest.mark.parametrize(
    "noise",
    [GaussianNoise(), LaplaceNoise(), LmoNoise(**LMO), LmoNoise(**UNIFORM_ONLY)],
    ids=["gaussian", "laplace", "lmo", "lmo-uniform-only"],
)
def test_log_density_is_the_tails_derivative(noise):
    """The bins' largest losses come from log_density: it must be −d/dt P(X > t), also at the
    small t where the uniform part switches to its series."""
    t = np.array([1e-7, 1e-4, 2e-3, 0.3, 1.0, 4.0, 40.0])
    step = 1e-6 * np.maximum(t, 1e-3)
    derivative = (noise.tail(np.maximum(t - step, 0)) - noise.tail(t + step)) / (
        t + step - np.maximum(t - step, 0)
    )
    np.testing.assert_allclose(np.exp(noise.log_density(t)), derivative, rtol=1e-5)
    np.testing.assert_array_equal(noise.log_density(-t), noise.log_density(t))
    # far out, where e^{-low·t} underflows, the log density stays finite (no 0/0 loss)
    assert np.all(np.isfinite(noise.log_density(np.array([1e3, 1e6, 1e12]))))


def test_numeric_calibration_matches_pld_calibration():
    common = dict(epsilon=2.0, delta=1e-5, sample_rate=0.05, steps=200, mechanism="gaussian")
    numeric = calibrate_noise_multiplier(accountant="numeric", **common)
    reference = calibrate_noise_multiplier(accountant="pld", **common)
    assert numeric == pytest.approx(reference, rel=0.01)
    spent = compute_epsilon(
        noise_multiplier=numeric,
        sample_rate=0.05,
        steps=200,
        delta=1e-5,
        accountant="numeric",
    )
    assert spent <= 2.0 * (1 + 1e-9)


def test_lmo_with_an_almost_fixed_scale_is_accounted_like_laplace():
    """Uniform R on [0.999, 1.001] only: the LMO noise is Laplace(1) up to 0.1 % in scale."""
    narrow = LMO | {"weights": [0.0, 0.0, 1.0], "uniform_low": 0.999, "uniform_high": 1.001}
    lmo = compute_epsilon(
        noise_multiplier=1.5,
        sample_rate=0.02,
        steps=500,
        delta=1e-5,
        mechanism="lmo",
        accountant="numeric",
        noise_parameters=narrow,
    )
    laplace = _dp_accounting_epsilon("laplace", 1.5, 0.02, 500, 1e-5)
    assert lmo == pytest.approx(laplace, rel=0.01)


def test_lmo_draws_follow_the_tail_the_accountant_uses():
    mechanism = get_mechanism("lmo", **LMO)
    draws = np.array([mechanism.sample(1.0) for _ in range(40_000)])
    tail = LmoNoise(**LMO).tail
    for t in (0.25, 1.0, 4.0, 20.0):
        expected = float(tail(np.array(t)))
        observed = float((draws > t).mean())
        standard_error = math.sqrt(expected * (1 - expected) / len(draws))
        assert abs(observed - expected) < 5 * standard_error, t
    assert abs(float((draws < 0).mean()) - 0.5) < 5 * math.sqrt(0.25 / len(draws))


def test_lmo_calibration_meets_the_target_and_state_round_trips():
    sigma = calibrate_noise_multiplier(
        epsilon=3.0,
        delta=1e-5,
        sample_rate=0.125,
        steps=12,
        mechanism="lmo",
        accountant="numeric",
        noise_parameters=LMO,
    )
    accountant = make_accountant("numeric", "lmo", sigma, 0.125, noise_parameters=LMO)
    accountant.step(12)
    assert accountant.epsilon(1e-5) <= 3.0 * (1 + 1e-9)
    assert accountant.epsilon_at(12, 1e-5) > 0.99 * 3.0  # σ is the smallest, within 1e-3
    rebuilt = accountant_from_state(accountant.state_dict())
    assert rebuilt.noise_parameters == LMO and rebuilt.steps == 12
    assert rebuilt.epsilon(1e-5) == pytest.approx(accountant.epsilon(1e-5), rel=1e-12)


def test_lmo_variance_is_infinite_with_an_exponential_part_and_finite_without():
    assert math.isinf(get_mechanism("lmo", **LMO).variance(1.0))
    finite = LMO | {"weights": [0.5, 0.0, 0.5]}
    # 2·(0.5/(0.5²·2·1) + 0.5/(0.5·1.5))
    assert get_mechanism("lmo", **finite).variance(1.0) == pytest.approx(2 * (1.0 + 2 / 3))


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["privacy.mechanism=lmo"], "privacy.accountant"),  # pld cannot account lmo
        # on the grid lmo is accounted by the numeric accountant only
        (["privacy.mechanism=lmo", "privacy.accountant=pure"], "privacy.accountant"),
        (["privacy.mechanism=cauchy"], "privacy.mechanism"),
        (
            [
                "privacy.mechanism=lmo",
                "privacy.accountant=numeric",
                "privacy.lmo.weights=[0.5,0.6,0]",
            ],
            "privacy.lmo",
        ),
        (["privacy.lmo.uniform_high=0.1"], "uniform_high"),
        (["privacy.lmo.gamma_shape=0"], "gamma_shape"),
        (["privacy.lmo.gamma_shape=0.01"], "gamma_shape"),  # R underflows to 0: ZeroDivisionError
    ],
)
def test_bad_mechanism_settings_fail_at_load(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, overrides)


@pytest.mark.parametrize(
    "overrides",
    [
        ["optimizer.algorithm=mezo", "privacy.mechanism=lmo"],
        ["optimizer.algorithm=dpgd-0th", "privacy.mechanism=lmo", "privacy.accountant=numeric"],
    ],
)
def test_a_mechanism_the_algorithm_does_not_add_is_refused_by_its_registry_entry(overrides):
    from privzo.algorithms.registry import check_capabilities

    with pytest.raises(ConfigError, match=r"privacy\.mechanism"):
        check_capabilities(load_config(None, overrides))


def test_lmo_run_records_its_mechanism_parameters_and_epsilon(tmp_path, sentiment_files, cache_dir):
    from privzo.run import run
    from privzo.tracking import read_run

    train, test = sentiment_files
    config = load_config(
        None,
        [
            "model.name_or_path=tiny-opt",
            f"task.train_path={train}",
            f"task.test_path={test}",
            "optimizer.steps=12",
            "optimizer.batch_size=8",
            "tracking.log_every=5",
            "privacy.epsilon=3",
            "privacy.mechanism=lmo",
            "privacy.accountant=numeric",
            "privacy.noise_grid=null",  # the float sampler, chosen explicitly
            "privacy.lmo.gamma_shape=4",
        ],
    )
    summary = run(config, tmp_path / "runs" / "lmo", cache_dir=cache_dir, progress=False)
    assert summary["mechanism"] == "lmo" and summary["accountant"] == "numeric"
    assert summary["mechanism_parameters"] == LMO | {"gamma_shape": 4.0}
    assert 0 < summary["epsilon"] <= 3.0 * (1 + 1e-9)
    expected = compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=8 / 64,
        steps=12,
        delta=1e-5 - summary["truncation_delta"],  # the rest of δ is truncation's
        mechanism="lmo",
        accountant="numeric",
        noise_parameters=summary["mechanism_parameters"],
    )
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert record["params"]["privacy.mechanism"] == "lmo"
    assert float(record["params"]["privacy.lmo.gamma_shape"]) == 4.0
    assert record["metrics"]["final_epsilon"] == pytest.approx(summary["epsilon"])


def test_lmo_refuses_a_gamma_shape_whose_draws_underflow_to_zero():
    """At shape 0.01 about 8e-4 of Gamma draws are exactly 0.0, and σC / R raised
    ZeroDivisionError mid-run; such shapes are refused, valid ones draw finite noise."""
    with pytest.raises(ValueError, match="gamma_shape"):
        get_mechanism("lmo", **{**LMO, "weights": [1.0, 0.0, 0.0], "gamma_shape": 0.01})
    mechanism = get_mechanism("lmo", **{**LMO, "weights": [1.0, 0.0, 0.0], "gamma_shape": 0.05})
    assert all(math.isfinite(mechanism.sample(1.0)) for _ in range(2000))
