"""The noise grid with several directions per step: the rounded K-vector's norm bound, checked
by brute force on small lattices, and the RDP bound of its discrete Gaussian step, checked
against Rényi divergences summed on the lattice (docs/privacy/vector-grid.md)."""

from __future__ import annotations

import json
import math
from decimal import Decimal, getcontext

import dp_accounting
import numpy as np
import pytest
import torch
from scipy.special import logsumexp

from privzo.privacy import calibrate_noise_multiplier, compute_epsilon
from privzo.privacy.accountants import accountant_from_state, make_accountant
from privzo.privacy.accountants.rdp import INTEGER_ORDERS, vector_grid_noise_multiplier
from privzo.privacy.discrete import vector_grid_bound
from privzo.privacy.dp_accounting_adapter import RDP_ORDERS
from privzo.search.privacy import TrialEvent, rdp_curve
from privzo.zo.estimators import column_totals, make_estimator, round_vectors


def gridded(directions: int, sigma: float, grid: int = 16):
    """A private estimator of K = ``directions`` on the grid, clip 1 (so C/γ = grid/σ)."""
    return make_estimator(
        "gaussian",
        clip=1.0,
        noise_multiplier=sigma,
        expected_batch_size=1.0,
        noise_parameters={"grid": grid, "directions": directions},
    )


def lattice_in_ball(directions: int, radius: float, per_unit: int) -> torch.Tensor:
    """Every point of the lattice (1/per_unit)·Z^K within the ball of ``radius`` (grid units)."""
    reach = math.floor(radius * per_unit)
    axis = torch.arange(-reach, reach + 1, dtype=torch.float64) / per_unit
    points = torch.cartesian_prod(*[axis] * directions)
    return points[torch.linalg.vector_norm(points, dim=1) <= radius]


# --- the rounded vector's norm -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("directions", "sigma", "per_unit"),
    # C/γ = 16/σ: 3.54 (just above √2·2.5, where (2.5+, 2.5+) rounds to (3, 3)), 4.8, 2.9
    [(2, 16 / 3.54, 32), (2, 16 / 4.8, 32), (3, 16 / 2.9, 8)],
)
def test_every_clipped_vector_on_a_fine_lattice_rounds_within_the_bound(
    directions, sigma, per_unit
):
    """All points of norm ≤ C/γ (on a lattice 8-32 times finer than the grid) round to
    integer vectors of squared norm ≤ N; some exceed (C/γ)², so C alone would be no bound,
    and the largest comes within 2 units² of N (exactly N in the first case)."""
    estimator = gridded(directions, sigma)
    ratio = 16 / sigma
    diagonal = torch.full((1, directions), ratio / math.sqrt(directions), dtype=torch.float64)
    points = torch.cat([lattice_in_ball(directions, ratio, per_unit), diagonal])
    units = estimator.to_units(estimator.clip_each(points * estimator.unit))
    squares = (units**2).sum(dim=1)
    bound = vector_grid_bound(16, sigma, directions)
    assert torch.equal(units, torch.round(units))  # integers on the grid
    assert float(squares.max()) <= bound
    assert float(squares.max()) > ratio**2  # rounding lengthens: C/γ is not a bound
    assert float(squares.max()) >= bound - 2
    if directions == 2 and per_unit == 32 and sigma == 16 / 3.54:
        assert float(squares.max()) == bound == 18


@pytest.mark.parametrize("directions", [2, 16, 64])
def test_neighbouring_batches_sums_differ_by_a_vector_within_the_bound(directions):
    """Add/remove one record: the integer sums differ by that record's rounded vector, whose
    squared norm stays within N, over batches of clipped and unclipped rows at the default
    grid; the largest difference reaches past (C/γ)²."""
    generator = torch.Generator().manual_seed(directions)
    sigma = 1.37
    estimator = gridded(directions, sigma, grid=1024)
    bound = vector_grid_bound(1024, sigma, directions)
    rows = torch.randn(64, directions, generator=generator, dtype=torch.float64)
    rows[::2] *= 10.0  # half the rows beyond the clip: rounded from norm exactly C
    units = estimator.to_units(estimator.clip_each(rows))
    full = torch.tensor(column_totals(units), dtype=torch.float64)
    largest = 0.0
    for index in range(rows.shape[0]):
        kept = torch.cat([units[:index], units[index + 1 :]])
        difference = full - torch.tensor(column_totals(kept), dtype=torch.float64)
        largest = max(largest, float((difference**2).sum()))
    assert largest <= bound
    assert largest > (1024 / sigma) ** 2


def test_a_rounding_beyond_the_bound_falls_back_toward_zero():
    """A row whose nearest rounding exceeds N (float error in the clipping could make one) is
    rounded toward zero, and zeroed if even that exceeds it."""
    scaled = torch.tensor([[2.6, 2.6], [2.4, 2.4], [3.9, 3.9]], dtype=torch.float64)
    units = round_vectors(scaled, 10)
    assert units.tolist() == [[2.0, 2.0], [2.0, 2.0], [0.0, 0.0]]
    assert round_vectors(scaled, 18).tolist() == [[3.0, 3.0], [2.0, 2.0], [3.0, 3.0]]


@pytest.mark.parametrize("directions", [2, 3, 16, 1024])
@pytest.mark.parametrize("sigma", [0.05, 1.2636, 9.9, 1e4])
def test_the_bound_is_the_largest_integer_below_the_squared_radius(directions, sigma):
    """N ≤ (K/σ + √J/2)² < N + 1, checked at 60 digits on the float σ's exact value."""
    getcontext().prec = 60
    radius = Decimal(1024) / Decimal(sigma) + Decimal(directions).sqrt() / 2
    bound = vector_grid_bound(1024, sigma, directions)
    assert bound <= radius * radius < bound + 1


def test_the_bound_refuses_a_single_direction():
    with pytest.raises(ValueError, match="directions"):
        vector_grid_bound(1024, 1.0, 1)


def test_the_estimator_refuses_a_step_of_another_width_than_accounted():
    estimator = gridded(4, 1.0)
    with pytest.raises(AssertionError):
        estimator.estimate(torch.zeros(5, 3, dtype=torch.float32))


def test_the_released_k_vector_lies_on_the_grid():
    estimator = gridded(4, 1.3, grid=1024)
    differences = torch.randn(7, 4, generator=torch.Generator().manual_seed(0)) * 3
    estimate = estimator.estimate(differences)
    assert len(estimate.projected_gradients) == 4
    for value in estimate.projected_gradients:  # g = γ·(S + k)/B with B = 1
        units = value / estimator.unit
        assert units == pytest.approx(round(units), abs=1e-6)


# --- the discrete Gaussian on Z^K: Rényi divergences on the lattice ---------------------------


def lattice_divergences(scale: int, shift: tuple[int, ...], rate: float, alpha: float):
    """D_α of one Poisson-subsampled step on Z^K, summed over a box reaching 12s beyond where
    the terms peak (up to ⌈α⌉u): (remove: D_α(mixture‖P₀), add: D_α(P₀‖mixture)),
    P₀ = N_Z(0, s²)^K and P_u its shift by u."""
    reach, most = 12 * scale, math.ceil(alpha)
    axes = [np.arange(-reach + min(0, most * c), reach + max(0, most * c) + 1) for c in shift]
    grid = np.stack(np.meshgrid(*axes, indexing="ij"), axis=-1).reshape(-1, len(shift))
    log_p0 = -(grid.astype(np.float64) ** 2).sum(axis=1) / (2 * scale**2)
    log_pu = -((grid - np.asarray(shift)) ** 2).sum(axis=1) / (2 * scale**2)
    log_norm = logsumexp(log_p0)  # the same for P_u: an integer shift of the lattice
    log_p0, log_pu = log_p0 - log_norm, log_pu - log_norm
    log_mix = np.logaddexp(math.log1p(-rate) + log_p0, math.log(rate) + log_pu)
    remove = logsumexp(alpha * log_mix + (1 - alpha) * log_p0) / (alpha - 1)
    add = logsumexp(alpha * log_p0 + (1 - alpha) * log_mix) / (alpha - 1)
    return float(remove), float(add)


def continuous_rdp(ratio: float, rate: float, alpha: float) -> float:
    """dp_accounting's RDP of the Poisson-subsampled Gaussian at noise ratio ``ratio``."""
    accountant = dp_accounting.rdp.RdpAccountant([alpha])
    accountant.compose(
        dp_accounting.PoissonSampledDpEvent(rate, dp_accounting.GaussianDpEvent(ratio))
    )
    return float(accountant.rdp[0])


@pytest.mark.parametrize(
    ("scale", "shift", "rate"),
    [(2, (1, 2), 0.1), (2, (1, 2), 0.6), (3, (2, 2), 0.1), (2, (3, 0), 0.6), (2, (1, 1, 1), 0.3)],
)
def test_the_lattice_step_at_integer_orders_is_the_continuous_one_at_the_shifts_norm(
    scale, shift, rate
):
    """Remove direction: equal to the continuous closed form at s/‖u‖ (the bound is attained);
    add direction: at most it, with room. At a fractional order the closed form at ⌈α⌉
    bounds both, while the continuous value at the order itself does not always."""
    ratio = scale / math.sqrt(sum(c * c for c in shift))
    for alpha in (2, 3, 5, 8):
        remove, add = lattice_divergences(scale, shift, rate, alpha)
        bound = continuous_rdp(ratio, rate, alpha)
        assert remove == pytest.approx(bound, rel=1e-9)
        assert add <= bound * (1 + 1e-9)
    for alpha in (1.5, 2.5, 4.3):
        remove, add = lattice_divergences(scale, shift, rate, alpha)
        assert max(remove, add) <= continuous_rdp(ratio, rate, math.ceil(alpha)) * (1 + 1e-9)


def test_the_add_direction_can_exceed_the_remove_one_without_a_reflection():
    """The add ≤ remove step of the proof needs the map x ↦ u − x swapping P₀ and P_u: for an
    asymmetric pair (P₁ not P₀ reflected) the add direction is the larger, so the check in
    the lattice test above can fail."""
    p0, p1, rate, alpha = np.array([0.3, 0.53, 0.17]), np.array([0.03, 0.58, 0.39]), 0.5, 3.0
    mixture = (1 - rate) * p0 + rate * p1
    remove = math.log(np.sum(mixture**alpha * p0 ** (1 - alpha))) / (alpha - 1)
    add = math.log(np.sum(p0**alpha * mixture ** (1 - alpha))) / (alpha - 1)
    assert add > remove


def test_every_rounded_shift_on_a_small_grid_is_covered_by_the_accounted_ratio():
    """End to end on a small grid (K = 16, C/γ = 2.9, two directions): the largest rounded
    vectors u a clipped record can give have lattice steps (at s = 16) whose divergences at
    integer orders stay within the continuous closed form at the accounted ratio K/√N."""
    sigma, directions = 16 / 2.9, 2
    estimator = gridded(directions, sigma)
    points = lattice_in_ball(directions, 2.9, 8)
    units = estimator.to_units(estimator.clip_each(points * estimator.unit))
    shifts = {tuple(int(abs(c)) for c in row) for row in units.tolist()}
    ratio = vector_grid_noise_multiplier(16, sigma, directions)
    for shift in sorted(shifts, key=lambda s: -sum(c * c for c in s))[:3]:  # the largest
        for alpha in (2, 4):
            remove, add = lattice_divergences(16, shift, 0.3, alpha)
            assert max(remove, add) <= continuous_rdp(ratio, 0.3, alpha) * (1 + 1e-9)


# --- the accountants -------------------------------------------------------------------------

VECTOR = {"grid": 1024, "directions": 8}
COMMON = dict(sample_rate=0.016, steps=1000, delta=1e-5)


def test_the_rdp_bound_of_the_vector_grid_is_at_least_the_continuous_one_and_close():
    """√N > K/σ and integer orders only: ε is above the continuous Gaussian's at the same σ
    (what one direction costs), by little; a wider vector (larger N) costs more."""
    continuous = compute_epsilon(noise_multiplier=1.3, accountant="rdp", **COMMON)
    vector = compute_epsilon(
        noise_multiplier=1.3, accountant="rdp", noise_parameters=VECTOR, **COMMON
    )
    wider = compute_epsilon(
        noise_multiplier=1.3,
        accountant="rdp",
        noise_parameters={"grid": 1024, "directions": 1024},
        **COMMON,
    )
    assert continuous < vector < wider < 1.05 * continuous


@pytest.mark.parametrize("accountant", ["pld", "numeric", "pure"])
def test_accountants_that_bound_no_gridded_vector_refuse_it(accountant):
    with pytest.raises(ValueError, match=r"directions|discrete|cannot account") as refused:
        make_accountant(accountant, "gaussian", 1.3, 0.02, noise_parameters=VECTOR)
    if accountant == "pld":
        assert "rounded vector of 8 directions" in str(refused.value)
        assert "['rdp']" in str(refused.value)


def test_directions_without_a_grid_or_below_two_are_refused():
    with pytest.raises(ValueError, match="without a grid"):
        make_accountant("rdp", "gaussian", 1.3, 0.02, noise_parameters={"directions": 4})
    with pytest.raises(ValueError, match="directions=1"):
        make_accountant(
            "rdp", "gaussian", 1.3, 0.02, noise_parameters={"grid": 1024, "directions": 1}
        )


def test_calibration_for_the_vector_grid_meets_the_target():
    common = dict(accountant="rdp", noise_parameters=VECTOR, **COMMON)
    sigma = calibrate_noise_multiplier(epsilon=2.0, **common)
    assert compute_epsilon(noise_multiplier=sigma, **common) <= 2.0
    assert compute_epsilon(noise_multiplier=sigma * 0.99, **common) > 2.0
    continuous = calibrate_noise_multiplier(epsilon=2.0, accountant="rdp", **COMMON)
    assert continuous < sigma < 1.02 * continuous


def test_a_vector_grid_accountant_state_keeps_its_directions():
    accountant = make_accountant("rdp", "gaussian", 1.3, 0.02, noise_parameters=VECTOR)
    accountant.step(5)
    state = json.loads(json.dumps(accountant.state_dict()))
    assert state["noise_parameters"] == VECTOR
    assert accountant_from_state(state).epsilon(1e-5) == accountant.epsilon(1e-5)
    other = make_accountant(
        "rdp", "gaussian", 1.3, 0.02, noise_parameters={"grid": 1024, "directions": 4}
    )
    with pytest.raises(ValueError, match="noise_parameters"):
        other.load_state_dict(state)


def test_a_search_trial_of_the_vector_grid_takes_the_closed_form_at_the_rounded_up_order():
    trial = TrialEvent(steps=10, sample_rate=0.02, noise_multiplier=1.3, noise_grid=1024)
    vector = TrialEvent(
        steps=10, sample_rate=0.02, noise_multiplier=1.3, noise_grid=1024, directions=8
    )
    ratio = vector_grid_noise_multiplier(1024, 1.3, 8)
    step = dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(ratio))
    expected = 10 * rdp_curve(step, np.ceil(RDP_ORDERS))
    assert np.array_equal(vector.curve(), expected)
    assert np.all(vector.curve() >= trial.curve() * (1 - 1e-12))


def test_the_accountants_orders_are_the_default_orders_rounded_up():
    """The rdp accountant's orders for a gridded vector: each default order's ⌈α⌉, none lost."""
    assert sorted({math.ceil(order) for order in RDP_ORDERS}) == list(INTEGER_ORDERS)


def test_the_privacy_command_calibrates_a_gridded_vector_with_rdp_and_names_it_for_pld(capsys):
    from privzo.cli import main

    common = ["--delta", "1e-5", "--sample-rate", "0.016", "--steps", "1000", "--json"]
    vector = ["--noise-grid", "1024", "--directions", "8"]
    assert (
        main(["privacy", "calibrate", "--epsilon", "2", *common, *vector, "--accountant", "rdp"])
        == 0
    )
    record = json.loads(capsys.readouterr().out)
    assert record["directions"] == 8
    assert record["noise_multiplier"] == calibrate_noise_multiplier(
        epsilon=2.0, accountant="rdp", noise_parameters=VECTOR, **COMMON
    )
    assert main(["privacy", "epsilon", "--noise-multiplier", "1", *common, *vector]) == 2
    assert "['rdp']" in capsys.readouterr().err
