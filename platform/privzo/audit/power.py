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


def separation_ceiling(
    steps: int, batch_size: float, training_rows: int, canaries_in: int, directions: int = 1
) -> float:
    """√(T·K·B / (N·n_in)), N the rows trained on (the private rows and the in-canaries) and
    K the directions per step."""
    if canaries_in < 1:
        return 0.0
    released = steps * directions
    return math.sqrt(released * batch_size / ((training_rows + canaries_in) * canaries_in))


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
) -> AuditPower:
    """The run's ceiling and the ε_lb expected there (``alpha`` already divided by the
    number of scores, as the audit's tests are)."""
    ceiling = separation_ceiling(steps, batch_size, training_rows, canaries_in, directions)
    return AuditPower(ceiling, expected_epsilon(ceiling, canaries, ks, delta=delta, alpha=alpha))
