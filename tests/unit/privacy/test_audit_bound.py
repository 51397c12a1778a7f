"""The one-run audit's ε lower bound (privzo.privacy.audit) against closed forms, an independent
evaluation of the theorem's formula, its monotonicity and its limits."""

from __future__ import annotations

import math

import pytest

from privzo.privacy.audit import (
    EPSILON_TOLERANCE,
    audit_guesses,
    count_correct,
    epsilon_lower_bound,
    p_value,
)


def pure_dp_bound_all_correct(guesses: int, alpha: float) -> float:
    """δ = 0 and every guess right: P[Binomial(r, q) ≥ r] = q^r = α, so ε = log(q / (1 − q))."""
    q = alpha ** (1 / guesses)
    return math.log(q / (1 - q))


def theorem_p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """The theorem's right-hand side with exact integer binomials (no scipy)."""
    q = math.exp(epsilon) / (1 + math.exp(epsilon))

    def pmf(j: int) -> float:
        return math.comb(r, j) * q**j * (1 - q) ** (r - j)

    tail = sum(pmf(j) for j in range(v, r + 1))
    weight = max((sum(pmf(j) for j in range(v - i, v)) / i for i in range(1, v + 1)), default=0)
    return min(1.0, tail + 2 * m * delta * weight)


@pytest.mark.parametrize("guesses", [10, 100, 1000])
def test_pure_dp_all_correct_matches_the_closed_form(guesses):
    bound = epsilon_lower_bound(1000, guesses, guesses, delta=0.0, alpha=0.05)
    assert bound == pytest.approx(pure_dp_bound_all_correct(guesses, 0.05), abs=2e-6)


def test_worked_values():
    # m = r = v = 1000 at 95 %: 5.809 for pure DP (closed form); the δ = 1e-5 term lowers it
    assert epsilon_lower_bound(1000, 1000, 1000, delta=0, alpha=0.05) == pytest.approx(5.809, 1e-3)
    with_delta = epsilon_lower_bound(1000, 1000, 1000, delta=1e-5, alpha=0.05)
    assert 5.7 < with_delta < 5.809
    # 100 of 100 right: 3.493 (pure), a little less with δ
    assert epsilon_lower_bound(1000, 100, 100, delta=0, alpha=0.05) == pytest.approx(3.493, 1e-3)


@pytest.mark.parametrize(
    ("m", "r", "v", "epsilon", "delta"),
    [
        (100, 40, 30, 0.5, 1e-3),
        (1000, 200, 150, 1.0, 1e-5),
        (50, 50, 45, 2.0, 0.01),
        (20, 8, 0, 1, 0.1),
    ],
)
def test_p_value_is_the_theorems_formula(m, r, v, epsilon, delta):
    assert p_value(m, r, v, epsilon, delta) == pytest.approx(
        theorem_p_value(m, r, v, epsilon, delta), rel=1e-9, abs=1e-15
    )


@pytest.mark.parametrize(("r", "v", "delta"), [(200, 150, 1e-5), (100, 90, 1e-3), (1000, 700, 0)])
def test_the_bound_sits_where_the_p_value_crosses_alpha(r, v, delta):
    bound = epsilon_lower_bound(1000, r, v, delta=delta, alpha=0.05)
    assert bound > 0
    assert p_value(1000, r, v, bound, delta) <= 0.05
    assert p_value(1000, r, v, bound + 2 * EPSILON_TOLERANCE, delta) > 0.05


def test_monotone_in_correct_guesses_delta_and_alpha():
    by_correct = [
        epsilon_lower_bound(1000, 200, v, delta=1e-5, alpha=0.05) for v in range(100, 201, 10)
    ]
    assert by_correct == sorted(by_correct)
    by_delta = [
        epsilon_lower_bound(1000, 200, 180, delta=d, alpha=0.05) for d in (0, 1e-6, 1e-4, 1e-3)
    ]
    assert by_delta == sorted(by_delta, reverse=True)
    by_alpha = [epsilon_lower_bound(1000, 200, 180, delta=1e-5, alpha=a) for a in (0.01, 0.05, 0.2)]
    assert by_alpha == sorted(by_alpha)


def test_no_evidence_gives_zero():
    assert epsilon_lower_bound(1000, 100, 50, delta=1e-5, alpha=0.05) == 0.0  # chance accuracy
    assert epsilon_lower_bound(1000, 100, 0, delta=0, alpha=0.05) == 0.0
    assert epsilon_lower_bound(1000, 0, 0, delta=1e-5, alpha=0.05) == 0.0  # no guesses


def test_more_right_guesses_never_beat_the_all_correct_cap():
    cap = pure_dp_bound_all_correct(1000, 0.05)
    assert epsilon_lower_bound(1000, 1000, 999, delta=0, alpha=0.05) < cap


@pytest.mark.parametrize(
    ("args", "message"),
    [((10, 5, 6), "correct ≤ guesses"), ((10, 11, 3), "guesses ≤ canaries"), ((10, 4, -1), "0 ≤")],
)
def test_bad_counts_are_refused(args, message):
    with pytest.raises(ValueError, match=message):
        epsilon_lower_bound(*args, delta=1e-5, alpha=0.05)


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5])
def test_alpha_outside_zero_one_is_refused(alpha):
    with pytest.raises(ValueError, match="alpha"):
        epsilon_lower_bound(10, 4, 4, delta=1e-5, alpha=alpha)


def test_guesses_take_the_highest_and_lowest_scores():
    scores = [0.1, 0.9, 0.5, 0.8, 0.2, 0.3]
    included = [False, True, False, False, True, False]
    # top 2: 0.9 (in, right), 0.8 (out, wrong); bottom 2: 0.1 (out, right), 0.2 (in, wrong)
    assert count_correct(scores, included, 2) == (1, 1)
    with pytest.raises(ValueError, match="k=4"):
        count_correct(scores, included, 4)


def test_the_sweep_pays_for_its_multiple_tests():
    scores = list(range(1000))
    included = [index >= 500 for index in range(1000)]  # perfectly separated
    (single,) = audit_guesses(scores, included, [100], delta=1e-5, alpha=0.05)
    assert single.correct == 200
    assert single.epsilon_lower_bound == pytest.approx(
        epsilon_lower_bound(1000, 200, 200, delta=1e-5, alpha=0.05 / 2)  # two bounds
    )
    swept = audit_guesses(scores, included, [10, 100, 500], delta=1e-5, alpha=0.05)
    assert swept[1].epsilon_lower_bound == pytest.approx(
        epsilon_lower_bound(1000, 200, 200, delta=1e-5, alpha=0.05 / 6)
    )
    assert swept[1].epsilon_lower_bound < single.epsilon_lower_bound
