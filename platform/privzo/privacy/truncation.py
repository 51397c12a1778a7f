"""The public bound a padded Poisson batch is filled to, and what truncating above it costs.

With ``task.pad_to='max_length'`` every batch is filled with masked public rows to a fixed
number of rows, so a Poisson draw larger than that bound is truncated to a secret uniformly
random subset of it (truncated Poisson sampling, as in Chua et al. 2024, "Scalable DP-SGD:
Shuffling vs. Poisson Subsampling"). The accountants bound the untruncated mechanism M; the run
is M', which equals M (same randomness) unless some step's draw exceeds the bound (event E).
For any outputs S and add/remove neighbours D, D':
P[M'(D) ∈ S] ≤ P[M(D) ∈ S] + P[E_D] ≤ e^ε·P[M(D') ∈ S] + δ + P[E_D]
≤ e^ε·P[M'(D') ∈ S] + δ + P[E_D] + e^ε·P[E_D'], and by a union bound over the T steps
P[E] ≤ T·P[Binomial(N + 1, q) > bound] for either neighbour. So M' is (ε, δ + δ_trunc)-DP with
δ_trunc = (1 + e^ε)·T·P[Binomial(N + 1, q) > bound]; the plan calibrates σ at δ − δ_trunc, so
the stated δ covers both.

With W workers each Poisson-sampling its own partition of the records (``parallel.workers``) and
padding its share to its own bound, E is any share of any step exceeding it: by a union bound
over the W shares, each drawn from at most ⌈(N + 1)/W⌉ records, P[E] ≤ T·W·P[Binomial(⌈(N + 1)/W⌉,
q) > bound]. The same argument then holds with that P[E]; W = 1 is the formula above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scipy.stats import binom

__all__ = [
    "DEFAULT_SHARE",
    "MAX_SHARE",
    "BatchBound",
    "ceil_div",
    "default_bound",
    "delta_of_exceeding",
    "exceed_probability",
    "round_up",
    "share_size",
    "truncation_delta",
]

DEFAULT_SHARE = 0.01
"""The default bound is the smallest whose truncation takes at most this share of δ: a few
standard deviations above the expected batch size, for at most 1 % more noise."""

MAX_SHARE = 0.5
"""A bound whose truncation would take more than this share of δ is refused: the mechanism's
own δ would be left too small to calibrate σ usefully."""

NON_PRIVATE_EXCEED = 0.01
"""A non-private run's default bound: at most this chance that any batch of the run is
truncated (nothing to account, but its batches should still be Poisson draws)."""


@dataclass(frozen=True)
class BatchBound:
    """The rows every padded batch has, the chance that any of the run's draws exceeds them
    (T·P[exceed]) and the δ that truncation takes (0 if it never happens)."""

    rows: int
    truncation_delta: float
    run_exceed_probability: float = 0.0


def delta_of_exceeding(exceed: float, epsilon: float) -> float:
    """(1 + e^ε)·P[E], capped at 1: the δ a mechanism that is ε-DP otherwise gains from
    behaving differently on an event E of probability at most ``exceed`` (module docstring)."""
    if exceed == 0.0:
        return 0.0
    if epsilon > 700:
        return 1.0
    return min(1.0, (1.0 + math.exp(epsilon)) * exceed)


def ceil_div(count: int, parts: int) -> int:
    """⌈count / parts⌉: the most one of ``parts`` even shares of ``count`` holds."""
    return -(-count // parts)


def round_up(count: int, multiple: int) -> int:
    """The smallest multiple of ``multiple`` that is at least ``count``."""
    return ceil_div(count, multiple) * multiple


def share_size(dataset_size: int, shares: int) -> int:
    """The most records one of ``shares`` partitions of the larger neighbour (N + 1) holds."""
    return ceil_div(dataset_size + 1, shares)


def exceed_probability(dataset_size: int, sample_rate: float, bound: int, shares: int = 1) -> float:
    """P[one step's Poisson draw, split in ``shares`` partitions, has more than ``bound`` in
    one of them], for the larger of the two add/remove neighbours (N + 1 records), by a union
    bound over the shares (module docstring). Positive (at least the smallest float) whenever
    it is not exactly 0, so an underflow never reads as a certainty."""
    records = share_size(dataset_size, shares)
    if bound >= records or sample_rate == 0.0:
        return 0.0
    tail = shares * float(binom.sf(bound, records, sample_rate))
    return min(1.0, max(tail, math.ulp(0.0)))


def truncation_delta(
    dataset_size: int, sample_rate: float, bound: int, steps: int, epsilon: float, shares: int = 1
) -> float:
    """δ_trunc = (1 + e^ε)·T·P[exceed] (capped at 1): what truncating each of ``shares``
    partitions' draws above ``bound`` adds to the δ of a T-step run that is ε-DP otherwise
    (module docstring)."""
    exceed = steps * exceed_probability(dataset_size, sample_rate, bound, shares)
    return delta_of_exceeding(exceed, epsilon)


def default_bound(
    dataset_size: int,
    sample_rate: float,
    steps: int,
    exceed_budget: float,
    multiple: int,
    shares: int = 1,
) -> int:
    """The smallest multiple of ``multiple`` whose chance that any share of any of ``steps``
    draws exceeds it, T·P[exceed], is at most ``exceed_budget`` (a whole share, rounded up, when
    the budget is 0)."""
    low, high = 1, share_size(dataset_size, shares)  # no share exceeds all of its records
    if exceed_budget <= 0.0:
        low = high
    while low < high:
        middle = (low + high) // 2
        if steps * exceed_probability(dataset_size, sample_rate, middle, shares) <= exceed_budget:
            high = middle
        else:
            low = middle + 1
    return round_up(low, multiple)
