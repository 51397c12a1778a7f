"""What an audit can prove at a run's settings, known before the run (the audit's power).

A zeroth-order step releases one scalar g_t = (Σ_batch d_i + noise) / B, shared by its batch.
An in-canary adds its own d_c / B to g_t on the T·B/N steps that sample it, and the other
sampled examples add theirs, among them about B·n_in/N in-canaries whose derivatives along z_t
are as large as its own when canaries dominate the gradient. A score that sums a canary's
alignment with the released scalars over the steps (every score but ``white-box-match``, and
the black-box loss difference, which is that sum to first order) then separates in- from
out-canaries by at most √(T·B / (N·n_in)) standard deviations: larger canary gradients only
approach the ceiling, and noise only lowers it. The ε lower bound that scores separated that far
can be expected to reach follows from the guesses they would make.

A step with K directions (``optimizer.directions_per_step``) releases K scalars along independent
directions from the same batch: each adds its own d_c / B on the steps that sample c and its own
independent sum of the other examples' alignments, so the K coordinates count as T·K steps and
the ceiling is √(T·K·B / (N·n_in)).

Below the ceiling the canaries' size matters. With ρ the canaries' mean squared directional
derivative over the data's (each less its label's shared part, as the directional score sees
them), the sampled steps add T·|∇l_c|²/N to an in-canary's score, and every step adds the
products of d_c with the batch's other derivatives, of variance |∇l_c|²·B·(N − n_in + n_in·ρ)/N
times the data's |∇l|² over B², so the expected separation is

    √(T·B/N) · √ρ / √(N − n_in + n_in·ρ),

with T·K in place of T for K directions a step.

√(T·B)/N for canaries of the data's size and the ceiling as ρ grows: large-gradient canaries
(``privzo.audit.canaries``) move a score towards the ceiling, never past it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from scipy.optimize import brentq
from scipy.stats import norm

from privzo.privacy.audit import BOUNDS, epsilon_lower_bound

# the score that looks for one step's exact release of a canary's difference: not bound
UNBOUNDED_SCORES = ("white-box-match",)


@dataclass(frozen=True)
class AuditPower:
    """The separation ceiling of the aligning scores and the one-run ε_lb expected at it."""

    separation_ceiling: float  # √(T·K·B / (N·n_in)), in standard deviations of the scores
    epsilon_at_ceiling: float  # the one-run ε_lb of Gaussian scores separated that far
    # ρ as the replay measured it (None without a white-box replay beside reference rows), the
    # separation expected at it and the ε_lb expected there
    gradient_ratio: float | None = None
    expected_separation: float | None = None
    epsilon_expected: float | None = None


def separation_ceiling(
    steps: int, batch_size: float, training_rows: int, canaries_in: int, directions: int = 1
) -> float:
    """√(T·K·B / (N·n_in)), N the rows trained on (the private rows and the in-canaries) and
    K the directions per step."""
    if canaries_in < 1:
        return 0.0
    released = steps * directions
    return math.sqrt(released * batch_size / ((training_rows + canaries_in) * canaries_in))


def expected_separation(
    steps: int, batch_size: float, training_rows: int, canaries_in: int, ratio: float
) -> float:
    """√(T·B/N) · √ρ / √(N − n_in + n_in·ρ) (see the module docstring), N = rows + n_in."""
    if canaries_in < 1 or ratio <= 0:
        return 0.0
    rows = training_rows + canaries_in
    spread = training_rows + canaries_in * ratio
    return math.sqrt(steps * batch_size / rows) * math.sqrt(ratio / spread)


def expected_correct(separation: float, canaries: int, k: int) -> int:
    """Right guesses among the k highest and k lowest of M scores, half of them N(μ, 1) (in)
    and half N(0, 1) (out), at their expected counts (rounded)."""
    half = canaries / 2

    def above(threshold: float) -> float:  # expected scores above the threshold, less k
        return half * (norm.sf(threshold - separation) + norm.sf(threshold)) - k

    threshold = brentq(above, -40.0, separation + 40.0)
    # by symmetry the k lowest hold as many out-canaries as the k highest hold in-canaries
    return 2 * round(half * norm.sf(threshold - separation))


def expected_epsilon(
    separation: float, canaries: int, ks: Sequence[int], *, delta: float, alpha: float
) -> float:
    """The largest one-run ε_lb over ``ks`` (Bonferroni-corrected as the audit does) that
    scores separated by ``separation`` give at their expected counts."""
    level = alpha / (len(ks) * len(BOUNDS))
    best = 0.0
    for k in ks:
        correct = expected_correct(separation, canaries, k)
        if 2 * correct > 2 * k:  # at chance or below nothing is rejected: skip the search
            bound = epsilon_lower_bound(canaries, 2 * k, correct, delta=delta, alpha=level)
            best = max(best, bound)
    return best


def audit_power(
    *,
    steps: int,
    directions: int = 1,
    batch_size: float,
    training_rows: int,
    canaries_in: int,
    canaries: int,
    ks: Sequence[int],
    delta: float,
    alpha: float,
    gradient_ratio: float | None = None,
) -> AuditPower:
    """The run's ceiling and the ε_lb expected there, and, given the canaries' measured
    ``gradient_ratio`` ρ, the separation and ε_lb expected at it (``alpha`` already divided by
    the number of scores, as the audit's tests are)."""
    ceiling = separation_ceiling(steps, batch_size, training_rows, canaries_in, directions)
    at_ceiling = expected_epsilon(ceiling, canaries, ks, delta=delta, alpha=alpha)
    if gradient_ratio is None:
        return AuditPower(ceiling, at_ceiling)
    separation = expected_separation(
        steps * directions, batch_size, training_rows, canaries_in, gradient_ratio
    )
    epsilon = expected_epsilon(separation, canaries, ks, delta=delta, alpha=alpha)
    return AuditPower(ceiling, at_ceiling, gradient_ratio, separation, epsilon)
