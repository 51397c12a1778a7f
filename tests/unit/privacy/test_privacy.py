"""Tests of privzo.privacy: accountants against closed forms, calibration, noise, sampling, budget.

Accountant tolerances: dp_accounting's PLD at discretization 1e-4 is pessimistic, so against an
exact closed form we require 0 <= ε_pld − ε_exact <= 1e-4 (it is ~1e-8 for one Gaussian step).
"""

from __future__ import annotations

import copy
import inspect
import json
import math
import pickle
import time

import dp_accounting
import numpy as np
import pytest
from dp_accounting import pld as dp_pld
from dp_accounting import rdp as dp_rdp
from scipy import optimize, stats

from conftest import LMO_PARAMETERS
from privzo.privacy import (
    ACCOUNTANTS,
    MECHANISMS,
    BudgetExceededError,
    BudgetLedger,
    EpsilonCurve,
    GaussianMechanism,
    LaplaceMechanism,
    PoissonSampler,
    SecretGenerator,
    ShuffleSampler,
    accountant_from_state,
    calibrate_noise_multiplier,
    check_feasible,
    compute_epsilon,
    get_accountant,
    get_mechanism,
    make_accountant,
)
from privzo.privacy.accountants import PureLaplaceAccountant

DELTA = 1e-5
PLD_TOLERANCE = 1e-4


def analytic_gaussian_epsilon(sigma: float, delta: float) -> float:
    """ε(δ) of one Gaussian mechanism with sensitivity 1 and std σ (Balle & Wang 2018, Thm 8)."""

    def gap(eps: float) -> float:
        tail = stats.norm.cdf(1 / (2 * sigma) - eps * sigma)
        head = math.exp(eps) * stats.norm.cdf(-1 / (2 * sigma) - eps * sigma)
        return tail - head - delta

    return optimize.brentq(gap, 0.0, 100.0, xtol=1e-12)


def analytic_gaussian_sigma(epsilon: float, delta: float) -> float:
    """The σ at which one Gaussian mechanism is exactly (ε, δ)-DP."""
    return optimize.brentq(lambda s: analytic_gaussian_epsilon(s, delta) - epsilon, 0.1, 100)


def reference_event(mechanism: str, sigma: float, p: float, steps: int) -> dp_accounting.DpEvent:
    inner = (
        dp_accounting.GaussianDpEvent(sigma)
        if mechanism == "gaussian"
        else dp_accounting.LaplaceDpEvent(sigma)
    )
    return dp_accounting.SelfComposedDpEvent(dp_accounting.PoissonSampledDpEvent(p, inner), steps)


# --- accountants vs closed forms ---------------------------------------------------------------


@pytest.mark.parametrize("sigma", [2.0, 5.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-8])
def test_pld_one_gaussian_step_matches_analytic_gaussian_mechanism(sigma, delta):
    exact = analytic_gaussian_epsilon(sigma, delta)
    eps = compute_epsilon(noise_multiplier=sigma, sample_rate=1.0, steps=1, delta=delta)
    assert 0.0 <= eps - exact <= PLD_TOLERANCE


def test_rdp_one_gaussian_step_is_an_upper_bound_on_the_analytic_epsilon():
    exact = analytic_gaussian_epsilon(2.0, DELTA)
    rdp = compute_epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=1, delta=DELTA, accountant="rdp"
    )
    assert exact < rdp < 1.2 * exact


@pytest.mark.parametrize("b", [0.5, 3.0])
@pytest.mark.parametrize("delta", [1e-5, 1e-2])
def test_pld_one_laplace_step_matches_closed_form(b, delta):
    # Laplace(b), sensitivity 1: δ(ε) = 1 − exp((ε − 1/b)/2), so ε(δ) = 1/b + 2·log(1 − δ).
    exact = 1 / b + 2 * math.log1p(-delta)
    eps = compute_epsilon(
        noise_multiplier=b, sample_rate=1.0, steps=1, delta=delta, mechanism="laplace"
    )
    assert abs(eps - exact) <= PLD_TOLERANCE


@pytest.mark.parametrize(("sigma", "steps"), [(1.0, 1), (2.0, 5), (0.5, 40)])
def test_pure_accountant_without_subsampling_is_steps_over_sigma(sigma, steps):
    for delta in (0.0, DELTA):
        eps = compute_epsilon(
            noise_multiplier=sigma,
            sample_rate=1.0,
            steps=steps,
            delta=delta,
            mechanism="laplace",
            accountant="pure",
        )
        assert eps == pytest.approx(steps / sigma, rel=1e-12)


def test_pld_laplace_composition_is_below_basic_composition():
    basic = 10 / 2.0  # ε = T/σ: ten (1/2)-DP steps
    eps = compute_epsilon(
        noise_multiplier=2.0, sample_rate=1.0, steps=10, delta=DELTA, mechanism="laplace"
    )
    assert 0.3 * basic < eps < basic


def test_pure_accountant_subsampled_formula():
    p, sigma, steps = 0.05, 2.0, 37
    expected = steps * math.log(1 + p * (math.exp(1 / sigma) - 1))
    eps = compute_epsilon(
        noise_multiplier=sigma,
        sample_rate=p,
        steps=steps,
        delta=0.0,
        mechanism="laplace",
        accountant="pure",
    )
    assert eps == pytest.approx(expected, rel=1e-12)
    assert eps < steps / sigma  # amplification by subsampling helps


def test_pld_is_tighter_than_rdp_for_subsampled_gaussian():
    kwargs = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 1000, "delta": DELTA}
    pld = compute_epsilon(**kwargs, accountant="pld")
    rdp = compute_epsilon(**kwargs, accountant="rdp")
    assert pld < rdp
    assert pld > 0.7 * rdp


@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
def test_stateful_pld_matches_dp_accounting_pld_accountant(mechanism):
    sigma, p, steps = 1.5, 0.05, 200
    accountant = make_accountant("pld", mechanism, sigma, p)
    accountant.step(150)
    accountant.step(50)
    reference = dp_pld.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(reference_event(mechanism, sigma, p, steps))
    assert accountant.epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-6)


def test_stateful_rdp_matches_dp_accounting_rdp_accountant():
    sigma, p, steps = 1.2, 0.02, 700
    accountant = make_accountant("rdp", "gaussian", sigma, p)
    accountant.step(steps)
    reference = dp_rdp.RdpAccountant().compose(reference_event("gaussian", sigma, p, steps))
    assert accountant.epsilon(DELTA) == pytest.approx(reference.get_epsilon(DELTA), rel=1e-9)


# --- calibration -------------------------------------------------------------------------------

ROUND_TRIPS = [
    ("gaussian", "pld", 1.0, 0.02, 300),
    ("laplace", "pld", 1.0, 0.02, 300),
    ("gaussian", "rdp", 1.0, 0.02, 300),
    ("laplace", "pure", 1.0, 0.02, 300),
]


@pytest.mark.parametrize(("mechanism", "accountant", "epsilon", "p", "steps"), ROUND_TRIPS)
def test_calibrate_round_trip_meets_target_with_minimal_noise(
    mechanism, accountant, epsilon, p, steps
):
    kwargs = {"sample_rate": p, "steps": steps, "mechanism": mechanism, "accountant": accountant}
    sigma = calibrate_noise_multiplier(epsilon=epsilon, delta=DELTA, **kwargs)
    spent = compute_epsilon(noise_multiplier=sigma, delta=DELTA, **kwargs)
    assert epsilon * 0.99 <= spent <= epsilon * (1 + 1e-9)
    assert compute_epsilon(noise_multiplier=0.99 * sigma, delta=DELTA, **kwargs) > epsilon


def test_calibrated_pld_sigma_for_one_gaussian_step_matches_analytic_sigma():
    exact = analytic_gaussian_sigma(1.0, DELTA)
    sigma = calibrate_noise_multiplier(epsilon=1.0, delta=DELTA, sample_rate=1.0, steps=1)
    assert exact <= sigma <= exact * 1.002


def test_pure_calibration_is_the_exact_inverse():
    sigma = calibrate_noise_multiplier(
        epsilon=2.0, delta=0.0, sample_rate=0.1, steps=50, mechanism="laplace", accountant="pure"
    )
    expected = 1 / math.log1p(math.expm1(2.0 / 50) / 0.1)
    assert sigma == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize(
    ("mechanism", "accountant"), [("gaussian", "rdp"), ("laplace", "pure"), ("gaussian", "pld")]
)
def test_calibrate_unattainable_target_raises(mechanism, accountant):
    with pytest.raises(ValueError, match=r"cannot meet epsilon=1e-06.*noise_multiplier"):
        calibrate_noise_multiplier(
            epsilon=1e-6,
            delta=1e-10,
            sample_rate=1.0,
            steps=10000,
            mechanism=mechanism,
            accountant=accountant,
        )


def test_calibrate_target_met_without_noise_raises():
    # An example is sampled at all with probability 1e-7 < δ: (ε, δ) holds for any σ.
    with pytest.raises(ValueError, match=r"met even at noise_multiplier=0: .* <= delta"):
        calibrate_noise_multiplier(epsilon=1.0, delta=1e-5, sample_rate=1e-7, steps=1)


def test_calibrate_does_not_search_below_the_noise_floor():
    # Pure-DP Laplace would already need σ ≈ 0.03 < MIN_NOISE_MULTIPLIER = 0.05 here.
    with pytest.raises(ValueError, match=r"met even at noise_multiplier=0.05 \(accountant 'pld'\)"):
        calibrate_noise_multiplier(
            epsilon=30.0, delta=DELTA, sample_rate=1e-3, steps=1, mechanism="laplace"
        )


# --- noise -------------------------------------------------------------------------------------


def test_mechanism_registry_and_names():
    assert set(MECHANISMS) == {"gaussian", "laplace", "lmo"}
    lmo = LMO_PARAMETERS
    for name, cls in MECHANISMS.items():
        mechanism = get_mechanism(name, **(lmo if name == "lmo" else {}))
        assert isinstance(mechanism, cls)
        assert mechanism.name == name
    assert get_mechanism("gaussian") is not get_mechanism("gaussian")


@pytest.mark.parametrize("name", ["gaussian", "laplace"])
def test_two_mechanism_instances_draw_different_noise(name):
    first, second = get_mechanism(name), get_mechanism(name)
    a = [first.sample(1.0) for _ in range(8)]
    b = [second.sample(1.0) for _ in range(8)]
    assert a != b
    assert len(set(a)) == len(a)


@pytest.mark.parametrize(
    ("mechanism", "expected_std"),
    [(GaussianMechanism(), 2.0), (LaplaceMechanism(), 2.0 * math.sqrt(2))],
)
def test_noise_mean_and_std(mechanism, expected_std):
    n = 20000
    draws = np.array([mechanism.sample(2.0) for _ in range(n)])
    assert abs(draws.mean()) < 5 * expected_std / math.sqrt(n)
    assert draws.std() == pytest.approx(expected_std, rel=0.04)
    assert mechanism.variance(2.0) == pytest.approx(expected_std**2)


def test_secret_generator_takes_no_seed_and_never_clones_its_state():
    assert list(inspect.signature(SecretGenerator).parameters) == []
    mechanism = GaussianMechanism()
    for clone in (copy.deepcopy(mechanism), pickle.loads(pickle.dumps(mechanism))):
        assert [clone.sample(1.0) for _ in range(4)] != [mechanism.sample(1.0) for _ in range(4)]
    assert "secret" in repr(SecretGenerator())


@pytest.mark.parametrize("scale", [0, -1.0, float("nan"), float("inf"), "1", True])
def test_mechanism_rejects_bad_scale(scale):
    with pytest.raises(ValueError, match="scale="):
        GaussianMechanism().sample(scale)


def test_unknown_mechanism_lists_allowed():
    with pytest.raises(ValueError, match=r"mechanism='cauchy' is unknown; allowed: \['gaussian'"):
        get_mechanism("cauchy")


# --- sampling ----------------------------------------------------------------------------------


def test_poisson_rate_within_statistical_bound():
    n, p, steps = 1000, 0.05, 400
    sampler = PoissonSampler(n, p)
    assert sampler.expected_batch_size == pytest.approx(50.0)
    counts = np.zeros(n, dtype=np.int64)
    for _ in range(steps):
        batch = sampler.next_batch()
        assert batch.dtype == np.int64
        assert np.all(np.diff(batch) > 0)  # sorted, no duplicates
        assert batch.size == 0 or (batch[0] >= 0 and batch[-1] < n)
        counts[batch] += 1
    total, trials = counts.sum(), n * steps
    sd = math.sqrt(trials * p * (1 - p))
    assert abs(total - trials * p) < 5 * sd
    # Every example gets its fair share (Binomial(400, 0.05): mean 20, sd ≈ 4.4).
    assert counts.min() > 0 and counts.max() < 50


def test_poisson_batches_are_sometimes_empty_when_p_times_n_is_small():
    sampler = PoissonSampler(10, 0.01)
    sizes = [sampler.next_batch().size for _ in range(200)]
    assert 0 in sizes
    assert any(size > 0 for size in sizes)
    assert len(set(sizes)) > 1  # sizes vary


def test_two_poisson_samplers_draw_different_batches():
    a, b = PoissonSampler(1000, 0.5), PoissonSampler(1000, 0.5)
    assert not np.array_equal(a.next_batch(), b.next_batch())


def test_poisson_full_rate_takes_everything():
    assert np.array_equal(PoissonSampler(7, 1.0).next_batch(), np.arange(7))


def test_shuffle_sampler_fixed_size_seeded_and_reshuffles_each_epoch():
    n, b = 10, 3
    first = ShuffleSampler(n, b, seed=7)
    again = ShuffleSampler(n, b, seed=7)
    other = ShuffleSampler(n, b, seed=8)
    batches = [first.next_batch() for _ in range(6)]  # two epochs of 3 batches
    assert all(batch.size == b and batch.dtype == np.int64 for batch in batches)
    assert all(np.array_equal(x, again.next_batch()) for x in batches)
    assert any(not np.array_equal(x, other.next_batch()) for x in batches)
    epoch_one, epoch_two = np.concatenate(batches[:3]), np.concatenate(batches[3:])
    assert len(set(epoch_one.tolist())) == 9 and len(set(epoch_two.tolist())) == 9
    assert not np.array_equal(epoch_one, epoch_two)
    assert first.epoch == 1
    assert first.expected_batch_size == 3.0


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda: PoissonSampler(0, 0.1), r"dataset_size=0 .*>= 1"),
        (lambda: PoissonSampler(2.5, 0.1), r"dataset_size=2.5 must be an integer"),
        (lambda: PoissonSampler(10, 0.0), r"sample_rate=0.0 .*\(0, 1\]"),
        (lambda: PoissonSampler(10, 1.5), r"sample_rate=1.5 .*\(0, 1\]"),
        (lambda: PoissonSampler(10, float("nan")), r"sample_rate=nan"),
        (lambda: ShuffleSampler(10, 0, 0), r"batch_size=0 .*\[1, 10\]"),
        (lambda: ShuffleSampler(10, 11, 0), r"batch_size=11 .*\[1, 10\]"),
        (lambda: ShuffleSampler(10, 2, -1), r"seed=-1 .*>= 0"),
    ],
)
def test_sampler_validation(make, match):
    with pytest.raises(ValueError, match=match):
        make()


# --- stateful accountant and ledger ------------------------------------------------------------


def test_accountant_steps_and_epsilon_grow_from_zero():
    accountant = make_accountant("rdp", "gaussian", 1.0, 0.01)
    assert accountant.steps == 0
    assert accountant.epsilon(DELTA) == 0.0
    values = []
    for _ in range(3):
        accountant.step(100)
        values.append(accountant.epsilon(DELTA))
    assert accountant.steps == 300
    assert 0 < values[0] < values[1] < values[2]
    assert accountant.epsilon_at(300, DELTA) == values[2]


def test_accountant_state_dict_round_trip_through_json():
    accountant = make_accountant("pld", "laplace", 1.3, 0.02)
    accountant.step(25)
    state = json.loads(json.dumps(accountant.state_dict()))
    assert state == {
        "name": "pld",
        "mechanism": "laplace",
        "noise_multiplier": 1.3,
        "sample_rate": 0.02,
        "steps": 25,
        "value_discretization_interval": 1e-4,
        "noise_parameters": None,
    }
    restored = accountant_from_state(state)
    assert restored.steps == 25
    assert restored.epsilon(DELTA) == accountant.epsilon(DELTA)
    fresh = make_accountant("pld", "laplace", 1.3, 0.02)
    fresh.load_state_dict(state)
    assert fresh.steps == 25


class CountingAccountant(PureLaplaceAccountant):
    """The pure accountant, counting its ε evaluations (uncached ones)."""

    evaluations = 0

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        type(self).evaluations += 1
        return super()._compute_epsilon(steps, delta)


def test_ledger_books_authorized_windows_without_evaluating_epsilon():
    ledger = BudgetLedger(CountingAccountant("laplace", 1.0, 1.0), 3.5, 0.0)  # ε = 1 a step
    with pytest.raises(BudgetExceededError, match=r"4 steps would spend epsilon=4"):
        ledger.authorize(4)
    assert ledger.authorize(3) == pytest.approx(3.0) and ledger.authorized_steps == 3
    before = CountingAccountant.evaluations
    ledger.book(2)
    ledger.book(1)
    assert ledger.accountant.steps == 3 and CountingAccountant.evaluations == before
    with pytest.raises(BudgetExceededError):  # past the authorized steps: checked as spend()
        ledger.book(1)
    assert ledger.accountant.steps == 3


def test_epsilon_curve_hands_out_no_value_of_steps_not_done_yet():
    """The thread runs ahead of training: a window takes the values up to its own end only,
    and those after it stay for the windows that reach them."""
    counts = [10, 20, 25]
    curve = EpsilonCurve(lambda: make_accountant("pld", "gaussian", 1.1, 0.02), DELTA, counts)
    assert curve._done.wait(timeout=600)  # the thread has run ahead of every window
    assert [steps for steps, _ in curve.take_ready(through=12)] == [10]
    assert [steps for steps, _ in curve.take_through(20)] == [20]
    assert [steps for steps, _ in curve.take_ready()] == [25]
    assert curve.take_rest() == []


def test_a_closed_epsilon_curve_stops_after_the_value_in_progress():
    """A run that stops early ends the curve's thread before it exits: the values computed are
    kept, the rest are not computed, and the thread is gone when ``close`` returns."""
    counts = list(range(10, 100_010, 10))  # far more than the few taken before close
    curve = EpsilonCurve(lambda: make_accountant("pld", "gaussian", 1.1, 0.02), DELTA, counts)
    first = curve.take_through(10)
    curve.close()
    assert not curve._thread.is_alive() and [steps for steps, _ in first] == [10]
    computed = curve.take_rest()
    assert len(computed) < len(counts) - 1  # stopped, not run to the end
    assert [steps for steps, _ in computed] == counts[1 : 1 + len(computed)]


def test_epsilon_curve_computes_each_window_once_off_the_calling_thread():
    sigma, rate = 1.1, 0.02
    counts = [10, 20, 25]
    curve = EpsilonCurve(lambda: make_accountant("pld", "gaussian", sigma, rate), DELTA, counts)
    taken = curve.take_ready() + curve.take_rest()
    assert [steps for steps, _ in taken] == counts  # each once, in step order
    expected = [
        compute_epsilon(noise_multiplier=sigma, sample_rate=rate, steps=steps, delta=DELTA)
        for steps in counts
    ]
    assert [epsilon for _, epsilon in taken] == pytest.approx(expected, rel=1e-9)
    assert curve.take_rest() == []

    def broken() -> PureLaplaceAccountant:
        raise ValueError("no accountant")

    with pytest.raises(RuntimeError, match="no accountant"):
        EpsilonCurve(broken, DELTA, counts).take_rest()


def test_load_state_dict_refuses_other_settings():
    accountant = make_accountant("pld", "gaussian", 1.0, 0.01)
    state = accountant.state_dict() | {"noise_multiplier": 2.0}
    with pytest.raises(ValueError, match=r"noise_multiplier=2\.0"):
        accountant.load_state_dict(state)
    with pytest.raises(ValueError, match="missing"):
        accountant_from_state({"name": "pld"})


def test_ledger_state_round_trips_and_refuses_other_settings():
    """What privacy.json and a distributed checkpoint hold: a fresh ledger of the same plan takes
    over the steps booked; another budget, δ, σ, q or accountant is refused, nothing stepped."""
    ledger = BudgetLedger(make_accountant("pld", "gaussian", 1.2, 0.02), 3.0, DELTA)
    ledger.book(40)
    state = json.loads(json.dumps(ledger.state_dict()))
    resumed = BudgetLedger(make_accountant("pld", "gaussian", 1.2, 0.02), 3.0, DELTA)
    resumed.load_state_dict(state)
    assert resumed.accountant.steps == 40
    assert resumed.epsilon_spent == ledger.epsilon_spent
    others = {
        "budget": BudgetLedger(make_accountant("pld", "gaussian", 1.2, 0.02), 4.0, DELTA),
        "delta": BudgetLedger(make_accountant("pld", "gaussian", 1.2, 0.02), 3.0, 1e-6),
        "sigma": BudgetLedger(make_accountant("pld", "gaussian", 1.3, 0.02), 3.0, DELTA),
        "rate": BudgetLedger(make_accountant("pld", "gaussian", 1.2, 0.03), 3.0, DELTA),
        "accountant": BudgetLedger(make_accountant("rdp", "gaussian", 1.2, 0.02), 3.0, DELTA),
        "mechanism": BudgetLedger(make_accountant("pld", "laplace", 1.2, 0.02), 3.0, DELTA),
    }
    for name, other in others.items():
        with pytest.raises(ValueError, match="state has"):
            other.load_state_dict(state)
        assert other.accountant.steps == 0, name


def test_ledger_refuses_to_overspend_and_does_not_step_on_refusal():
    # Laplace with p = 1 under the pure accountant: exactly 1/σ = 1 per step.
    ledger = BudgetLedger(make_accountant("pure", "laplace", 1.0, 1.0), 3.5, 0.0)
    assert [ledger.spend() for _ in range(3)] == pytest.approx([1.0, 2.0, 3.0])
    assert not ledger.can_spend()
    with pytest.raises(BudgetExceededError, match=r"epsilon=4 > budget 3.5"):
        ledger.spend()
    assert ledger.accountant.steps == 3
    assert ledger.epsilon_spent == pytest.approx(3.0)
    assert ledger.remaining == pytest.approx(0.5)
    with pytest.raises(BudgetExceededError):
        ledger.spend(2)
    assert ledger.accountant.steps == 3
    assert issubclass(BudgetExceededError, RuntimeError)


def test_ledger_spends_exactly_a_calibrated_budget_and_no_more():
    kwargs = {"sample_rate": 0.05, "steps": 100}
    sigma = calibrate_noise_multiplier(epsilon=0.5, delta=DELTA, **kwargs)
    ledger = BudgetLedger(make_accountant("pld", "gaussian", sigma, 0.05), 0.5, DELTA)
    assert ledger.can_spend(100)
    assert 0.49 < ledger.spend(100) <= 0.5 * (1 + 1e-9)
    assert not ledger.can_spend(1)
    assert check_feasible(noise_multiplier=sigma, epsilon=0.5, delta=DELTA, **kwargs) <= 0.5 + 1e-9


def test_check_feasible_names_the_numbers_and_suggests_calibration():
    with pytest.raises(ValueError, match=r"100 steps at noise_multiplier=0.5.*calibrate_noise"):
        check_feasible(noise_multiplier=0.5, sample_rate=0.1, steps=100, epsilon=1.0, delta=DELTA)


# --- validation --------------------------------------------------------------------------------

GOOD = {"noise_multiplier": 1.0, "sample_rate": 0.01, "steps": 10, "delta": DELTA}


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"noise_multiplier": 0.0}, r"noise_multiplier=0.0 .*> 0"),
        ({"noise_multiplier": -1.0}, r"noise_multiplier=-1.0"),
        ({"noise_multiplier": float("nan")}, r"noise_multiplier=nan"),
        ({"noise_multiplier": "1"}, r"noise_multiplier='1'"),
        ({"sample_rate": 0.0}, r"sample_rate=0.0 .*\(0, 1\]"),
        ({"sample_rate": 1.01}, r"sample_rate=1.01 .*\(0, 1\]"),
        ({"steps": 0}, r"steps=0 .*>= 1"),
        ({"steps": 2.5}, r"steps=2.5 must be an integer"),
        ({"steps": True}, r"steps=True must be an integer"),
        ({"delta": 0.0}, r"delta=0.0 .*\(0, 1\)"),
        ({"delta": 1.0}, r"delta=1.0 .*\(0, 1\)"),
        ({"delta": -1e-5}, r"delta=-1e-05"),
        ({"mechanism": "cauchy"}, r"mechanism='cauchy' is unknown; allowed"),
        ({"accountant": "moments"}, r"accountant='moments' is unknown; allowed"),
        ({"mechanism": "laplace", "accountant": "rdp"}, r"'rdp' cannot account.*'laplace'"),
        ({"mechanism": "gaussian", "accountant": "pure"}, r"'pure' cannot account.*'gaussian'"),
        (
            {"mechanism": "laplace", "accountant": "pure", "delta": -0.1},
            r"delta=-0.1 .*\[0, 1\)",
        ),
    ],
)
def test_compute_epsilon_validation(override, match):
    with pytest.raises(ValueError, match=match):
        compute_epsilon(**(GOOD | override))


@pytest.mark.parametrize(
    ("override", "match"),
    [
        ({"epsilon": 0.0}, r"epsilon=0.0 .*> 0"),
        ({"epsilon": -1.0}, r"epsilon=-1.0"),
        ({"epsilon": float("inf")}, r"epsilon=inf"),
        ({"delta": 0.0}, r"delta=0.0"),
        ({"sample_rate": 0.0}, r"sample_rate=0.0"),
        ({"steps": 0}, r"steps=0"),
        ({"mechanism": "laplace", "accountant": "rdp"}, r"rdp.*cannot account.*laplace"),
        ({"accountant": "pure"}, r"pure.*cannot account.*gaussian"),
    ],
)
def test_calibrate_validation(override, match):
    good = {"epsilon": 1.0, "delta": DELTA, "sample_rate": 0.01, "steps": 10}
    with pytest.raises(ValueError, match=match):
        calibrate_noise_multiplier(**(good | override))


def test_registry_lookup_errors_and_ledger_validation():
    assert set(ACCOUNTANTS) == {"pld", "rdp", "pure", "numeric"}
    assert get_accountant("pld").name == "pld"
    with pytest.raises(
        ValueError, match=r"accountant='x' is unknown; allowed: \['numeric', 'pld', 'pure'"
    ):
        get_accountant("x")
    accountant = make_accountant("pld", "gaussian", 1.0, 0.01)
    with pytest.raises(ValueError, match=r"epsilon_budget=0"):
        BudgetLedger(accountant, 0.0, DELTA)
    with pytest.raises(ValueError, match=r"delta=0.0"):
        BudgetLedger(accountant, 1.0, 0.0)
    with pytest.raises(ValueError, match=r"must be a privzo Accountant"):
        BudgetLedger(object(), 1.0, DELTA)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"num_steps=0"):
        accountant.step(0)
    with pytest.raises(ValueError, match=r"num_steps=0"):
        BudgetLedger(accountant, 1.0, DELTA).spend(0)


# --- timing (slow) -----------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("mechanism", ["gaussian", "laplace"])
@pytest.mark.parametrize("steps", [1000, 10000])
def test_pld_calibration_takes_seconds(mechanism, steps):
    start = time.perf_counter()
    sigma = calibrate_noise_multiplier(
        epsilon=2.0, delta=DELTA, sample_rate=0.01, steps=steps, mechanism=mechanism
    )
    elapsed = time.perf_counter() - start
    assert compute_epsilon(
        noise_multiplier=sigma, sample_rate=0.01, steps=steps, delta=DELTA, mechanism=mechanism
    ) <= 2.0 * (1 + 1e-9)
    assert elapsed < 15.0
