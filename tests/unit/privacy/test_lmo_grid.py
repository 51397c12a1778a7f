"""LMO on the grid: k = round(X/γ) for X its continuous Laplace(σC/R) noise, drawn
exactly given R, released as γ·(S + k), and accounted as the continuous LMO at K/Δ."""

from __future__ import annotations

import math
import secrets
import time
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from conftest import LMO_PARAMETERS
from privzo.config import ConfigError, load_config
from privzo.distributed.collectives import WorkerGroup
from privzo.distributed.estimators import distribute_estimator
from privzo.privacy import compute_epsilon, get_mechanism, make_accountant
from privzo.privacy import discrete as discrete_module
from privzo.privacy.accountants.numeric import LmoNoise
from privzo.privacy.discrete import geometric_exp, grid_sensitivity, rounded_laplace
from privzo.privacy.plan import mechanism_parameters, plan_privacy
from privzo.zo.estimators import RELEASE_LIMIT, estimator_for, make_estimator

LMO = LMO_PARAMETERS


def _chi_square(counts: dict[int, int], pmf: dict[int, float], draws: int) -> tuple[float, int]:
    """Pearson's statistic over the cells of pmf with an expected count ≥ 5, plus one cell for
    the rest; returns (statistic, degrees of freedom)."""
    cells = [k for k, p in pmf.items() if p * draws >= 5]
    statistic = sum((counts.get(k, 0) - pmf[k] * draws) ** 2 / (pmf[k] * draws) for k in cells)
    rest_expected = draws * (1 - sum(pmf[k] for k in cells))
    rest_observed = draws - sum(counts.get(k, 0) for k in cells)
    if rest_expected >= 5:
        statistic += (rest_observed - rest_expected) ** 2 / rest_expected
        return statistic, len(cells)
    return statistic, len(cells) - 1


def _rounded_laplace_pmf(scale: float, reach: int) -> dict[int, float]:
    """P(round(X) = k) for X ~ Laplace(0, scale), from the Laplace CDF directly."""

    def cdf(x: float) -> float:
        return 0.5 * math.exp(x / scale) if x < 0 else 1 - 0.5 * math.exp(-x / scale)

    return {k: cdf(k + 0.5) - cdf(k - 0.5) for k in range(-reach, reach + 1)}


# chi-square 0.9999 quantiles for the degrees of freedom used below are below 3·dof + 25
def _passes(statistic: float, dof: int) -> bool:
    return statistic < 3 * dof + 25


@pytest.mark.parametrize("scale", [Fraction(7, 10), Fraction(5, 2)])
def test_rounded_laplace_draws_the_rounded_laplace_pmf(scale):
    """20000 draws against P(round(X) = k) from the Laplace CDF; the same statistic rejects
    the pmf of floor(X) (a wrong formula) by far."""
    draws = 20000
    values = [rounded_laplace(scale) for _ in range(draws)]
    assert all(type(v) is int for v in values)
    counts = {k: values.count(k) for k in set(values)}
    pmf = _rounded_laplace_pmf(float(scale), 80)
    assert _passes(*_chi_square(counts, pmf, draws))
    floor_pmf = {k: _floor_pmf(float(scale), k) for k in pmf}
    assert not _passes(*_chi_square(counts, floor_pmf, draws))
    mean_abs = sum(abs(k) * p for k, p in pmf.items())
    spread = math.sqrt(sum(k * k * p for k, p in pmf.items()) / draws)
    assert abs(sum(abs(v) for v in values) / draws - mean_abs) < 5 * spread


def _floor_pmf(scale: float, k: int) -> float:
    def cdf(x: float) -> float:
        return 0.5 * math.exp(x / scale) if x < 0 else 1 - 0.5 * math.exp(-x / scale)

    return cdf(k + 1) - cdf(k)


@pytest.mark.parametrize("rate", [Fraction(3, 7), Fraction(5, 2)])
def test_geometric_exp_has_ratio_exp_minus_rate(rate):
    draws = 20000
    values = [geometric_exp(rate) for _ in range(draws)]
    ratio = math.exp(-float(rate))
    pmf = {g: (1 - ratio) * ratio**g for g in range(200)}
    counts = {g: values.count(g) for g in set(values)}
    assert min(values) >= 0 and _passes(*_chi_square(counts, pmf, draws))


def test_a_huge_scale_takes_as_few_coins_as_a_small_one(monkeypatch):
    """b = 10¹²: the geometric is drawn as a uniform remainder plus whole units, so a draw
    takes about as many uniform integers as at b = 3, and its size is b's (mean |k| ≈ b)."""
    calls = [0]
    real = secrets.randbelow

    def counting(limit: int) -> int:  # the real sampler, counted
        calls[0] += 1
        return real(limit)

    monkeypatch.setattr(discrete_module.secrets, "randbelow", counting)
    per_draw = {}
    for scale in (Fraction(3), Fraction(10**12)):
        calls[0] = 0
        start = time.perf_counter()
        values = [rounded_laplace(scale) for _ in range(2000)]
        per_draw[scale] = (calls[0] / 2000, (time.perf_counter() - start) / 2000)
        mean_abs = sum(abs(v) for v in values) / 2000
        assert mean_abs == pytest.approx(float(scale), rel=0.15)
    coins_small, _ = per_draw[Fraction(3)]
    coins_huge, seconds_huge = per_draw[Fraction(10**12)]
    assert coins_huge < 2 * coins_small + 5
    assert seconds_huge < 0.01  # a bound far above one draw; a loop over b would take hours


def test_lmo_draws_on_the_grid_follow_the_rounded_tail_the_accountant_uses():
    """P(k ≥ j) = P(X/γ ≥ j − ½) = tail((j − ½)/K) of the unit-scale LMO noise."""
    grid, draws = 16, 30000
    mechanism = get_mechanism("lmo", **LMO, grid=grid)
    values = np.array([mechanism.sample_units() for _ in range(draws)])
    tail = LmoNoise(**LMO).tail
    for j in (1, 4, 16, 64, 320):
        expected = float(tail(np.array((j - 0.5) / grid)))
        observed = float((values >= j).mean())
        assert abs(observed - expected) < 5 * math.sqrt(expected * (1 - expected) / draws), j
    assert abs(float((values == 0).mean()) - (1 - 2 * float(tail(np.array(0.5 / grid))))) < 0.01


def test_a_tiny_gamma_shape_draws_without_error_and_releases_a_clamped_grid_value():
    """Shape 0.05 (the smallest allowed) puts a fifth of R below 1e-13: k is then beyond 2⁵³
    units, and sometimes beyond the float range. No ZeroDivisionError nor OverflowError, and
    the release is clamp(S + k, ±2⁵²) units: on the grid and finite."""
    tiny = LMO | {"weights": [1.0, 0.0, 0.0], "gamma_shape": 0.05}
    sigma, clip, batch = 1.0, 1.0, 4.0
    estimator = make_estimator(
        "lmo",
        clip=clip,
        noise_multiplier=sigma,
        expected_batch_size=batch,
        noise_parameters=tiny | {"grid": 64},
    )
    unit = sigma * clip / 64
    twin = distribute_estimator(estimator, WorkerGroup(0, 1))  # rank 0 adds the draw, reduces
    released = [
        each.estimate(torch.tensor([0.3, -0.7])).projected_gradient * batch / unit
        for each in (estimator, twin)
        for _ in range(1500)
    ]
    assert all(math.isfinite(value) for value in released)
    assert all(abs(value) <= RELEASE_LIMIT for value in released)
    assert all(value == round(value) for value in released)
    assert any(abs(value) == RELEASE_LIMIT for value in released)  # huge draws were clamped
    mechanism = get_mechanism("lmo", **tiny, grid=64)
    noise = [mechanism.sample(1.0) for _ in range(300)]  # ±inf beyond floats, never an error
    assert not any(math.isnan(value) for value in noise)


# --- configuration, plan and accountant --------------------------------------------------------


def test_lmo_runs_on_the_default_grid_and_is_accounted_at_the_grid_sensitivity():
    config = load_config(None, ["privacy.mechanism=lmo", "privacy.accountant=numeric"])
    assert config.noise_grid == 1024
    parameters = mechanism_parameters(config)
    assert parameters == config.privacy.lmo.model_dump(mode="json") | {"grid": 1024}
    plan = plan_privacy(config, 1000)
    assert estimator_for(config, plan).mechanism.grid == 1024
    sigma = plan.noise_multiplier
    # ε is spent at δ less what truncating padded batches takes
    steps, delta = config.optimizer.steps, plan.mechanism_delta
    common = dict(sample_rate=plan.sample_rate, steps=steps, delta=delta)
    common |= dict(mechanism="lmo", accountant="numeric")
    effective = 1024 / grid_sensitivity(1024, sigma)
    gridded = compute_epsilon(noise_multiplier=sigma, noise_parameters=parameters, **common)
    mixture = {k: v for k, v in parameters.items() if k != "grid"}
    at_ratio = compute_epsilon(noise_multiplier=effective, noise_parameters=mixture, **common)
    assert gridded == at_ratio and plan.epsilon == pytest.approx(gridded)
    assert gridded >= compute_epsilon(noise_multiplier=sigma, noise_parameters=mixture, **common)
    assert gridded <= config.privacy.epsilon * (1 + 1e-9)
    with pytest.raises(ConfigError, match=r"privacy\.accountant"):
        load_config(None, ["privacy.mechanism=lmo", "privacy.accountant=pld"])


def test_the_numeric_accountant_refuses_a_grid_for_gaussian_and_laplace():
    for mechanism in ("gaussian", "laplace"):
        with pytest.raises(ValueError, match="discrete"):
            make_accountant("numeric", mechanism, 1.0, 0.01, noise_parameters={"grid": 1024})


def test_a_run_with_lmo_on_the_grid_releases_grid_values(tmp_path, tiny_run_config, cache_dir):
    from privzo.run import run

    config = tiny_run_config(
        "optimizer.algorithm=dpzero",
        "privacy.mechanism=lmo",
        "privacy.accountant=numeric",
        "privacy.epsilon=3",
        "optimizer.steps=4",
        "tracking.backend=none",
        "eval_before=false",
    )
    summary = run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    assert summary["mechanism_parameters"]["grid"] == 1024
    plan_sigma = summary["noise_multiplier"]
    unit = plan_sigma * config.privacy.clip / 1024
    batch = config.optimizer.batch_size
    gradients = pq.read_table(tmp_path / "run" / "trajectory.parquet")
    for g in gradients.column("projected_gradient").to_pylist():
        units = g * batch / unit
        assert abs(units - round(units)) < 1e-6 * max(1.0, abs(units))
