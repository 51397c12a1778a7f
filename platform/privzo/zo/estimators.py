"""From per-example loss differences to the one scalar a step releases.

The private estimator is the only place private data turns into released numbers (one per
direction of the step), in the named stages of Opacus' pre-step: sanitize → clip → aggregate →
noise → scale. Distribution overrides only ``aggregate`` (an all-reduce of the sums and a count)
and ``draw_noise`` (drawn once, shared), so the algorithm never asks which rank it is on.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from privzo.privacy.discrete import vector_grid_bound
from privzo.privacy.mechanisms import get_mechanism, grid_sensitivity, units_as_float

# On a grid the released total is clamp(S + k, ±RELEASE_LIMIT) grid units: a function of the
# exact integer S + k even when LMO's k is too large for a float to hold exactly. The noise is
# drawn clamped to ±DRAW_LIMIT and added in float64, and the batch's |S| must stay below
# SUM_LIMIT: then |S + k| < RELEASE_LIMIT leaves every partial sum (here, and in a distributed
# all-reduce) an integer below 2⁵³, so exact, and |S + k| ≥ RELEASE_LIMIT leaves the float sum
# beyond RELEASE_LIMIT with the same sign. 2⁵² units are ≥ 2³² noise scales: nothing is lost.
RELEASE_LIMIT = 2**52
DRAW_LIMIT = 2**53
SUM_LIMIT = 2**50

if TYPE_CHECKING:
    from privzo.config.run import RunConfig
    from privzo.privacy.plan import PrivacyPlan


@dataclass(frozen=True)
class DirectionalEstimate:
    """The released projected gradients (one per direction of the step) and counts that
    describe how they were formed."""

    projected_gradients: tuple[float, ...]
    batch_size: int
    nonfinite: int

    @property
    def projected_gradient(self) -> float:
        """The first direction's g: the step's only one with ``directions_per_step=1``."""
        return self.projected_gradients[0]


class GradientEstimator(ABC):
    """Turns per-example differences d_i = (l_i(θ+εz) − l_i(θ−εz)) / 2ε into g.

    ``differences`` is a vector [B] for a step with one direction, or a matrix [B, K] with a
    column per direction (DP-AggZO); the estimate holds one g per column.
    """

    private: bool = False

    @abstractmethod
    def estimate(self, differences: torch.Tensor) -> DirectionalEstimate: ...

    @staticmethod
    def sanitize(differences: torch.Tensor) -> tuple[torch.Tensor, int]:
        """Zero non-finite differences (an overflowed loss) so they never reach the weights."""
        assert differences.dtype in (torch.float32, torch.float64), "differences must be fp32+"
        assert differences.dim() in (1, 2), "differences are [examples] or [examples, directions]"
        finite = torch.isfinite(differences)
        nonfinite = int((~finite).sum())
        return torch.where(finite, differences, torch.zeros_like(differences)), nonfinite

    def aggregate(self, totals: list[float], count: int) -> tuple[list[float], int]:
        """Sum over every process's examples; one process here (the distribution seam)."""
        return totals, count


def column_totals(values: torch.Tensor) -> list[float]:
    """The fp64 sum of each direction's column ([B] is one column, summed as a whole)."""
    if values.dim() == 1:
        return [float(values.double().sum())]
    return values.double().sum(dim=0).tolist()


class MeanEstimator(GradientEstimator):
    """MeZO: the plain batch mean of each direction, no clipping or noise (not private)."""

    def estimate(self, differences: torch.Tensor) -> DirectionalEstimate:
        values, nonfinite = self.sanitize(differences)
        # sum and count first, then divide: a split batch gives the single-process mean
        totals, count = self.aggregate(column_totals(values), values.shape[0])
        means = tuple(total / count if count else 0.0 for total in totals)
        return DirectionalEstimate(means, count, nonfinite)


class PrivateEstimator(GradientEstimator):
    """DPZero / DP-ZO: clip each d_i to [−C, C], sum, add noise of scale σC, ÷ expected batch.

    Dividing by the expected (not the realised) batch size keeps the sensitivity of the released
    sum at C under add/remove adjacency, which is what the Poisson accountants assume.

    With K directions per step (DP-AggZO) each example's K differences are clipped together to
    L2 norm C and every coordinate of the sum gets its own Gaussian draw of scale σC: the
    released K-vector is a Gaussian mechanism of L2 sensitivity C, whose privacy loss is that
    of the one-direction step (``docs/privacy``). Only the Gaussian allows K > 1
    (``privzo.algorithms.registry`` refuses the rest before anything loads).

    With a gridded mechanism (``noise_parameters={"grid": K}``) the sum is formed in integer
    units of γ = σC/K: each clipped d_i is rounded to the grid and clamped to ±Δ, Δ = ⌈K/σ⌉
    (``grid_sensitivity``, the sensitivity the accountant uses), the integer noise k is added,
    and only then is the integer total scaled by γ/B. The released g is a function of an integer
    that is exactly discrete-Gaussian (or discrete-Laplace) noised, so no float rounding carries
    the un-noised sum. With K directions on the grid (``noise_parameters`` holding
    ``"directions": K``) each clipped K-vector is rounded coordinate by coordinate to the
    nearest grid point, which keeps its squared norm within N = ``vector_grid_bound`` grid
    units² (the accountants' sensitivity is √N), and each coordinate of the sum gets its own
    discrete Gaussian draw.
    """

    private = True

    def __init__(
        self,
        mechanism: str,
        clip: float,
        noise_multiplier: float,
        expected_batch_size: float,
        noise_parameters: dict | None = None,
    ) -> None:
        if clip <= 0 or noise_multiplier <= 0 or expected_batch_size <= 0:
            raise ValueError("clip, noise_multiplier and expected_batch_size must be positive")
        self.mechanism = get_mechanism(mechanism, **(noise_parameters or {}))
        self.noise_parameters = noise_parameters  # kept so a distributed twin draws the same noise
        self.clip = clip
        self.noise_multiplier = noise_multiplier
        self.expected_batch_size = expected_batch_size
        grid = self.mechanism.grid
        self.unit = 1.0 if grid is None else noise_multiplier * clip / grid  # γ
        self.sensitivity_units = None if grid is None else grid_sensitivity(grid, noise_multiplier)
        # the K the accountant was given: a gridded step of any other K is refused
        self.directions = int((noise_parameters or {}).get("directions", 1))
        self.vector_bound = (  # N: the squared norm of a rounded K-vector, in grid units²
            None
            if grid is None or self.directions == 1
            else vector_grid_bound(grid, noise_multiplier, self.directions)
        )

    def estimate(self, differences: torch.Tensor) -> DirectionalEstimate:
        values, nonfinite = self.sanitize(differences)
        columns = values.shape[1] if values.dim() == 2 else 1
        if columns > 1:
            assert self.mechanism.name == "gaussian", "several directions need the Gaussian"
        if self.sensitivity_units is not None:
            assert columns == self.directions, (columns, self.directions)  # what was accounted
        units = self.to_units(self.clip_each(values))
        totals, count = self.aggregate(column_totals(units), units.shape[0])
        noisy_totals = [total + self.draw_noise() for total in totals]
        if self.sensitivity_units is not None:
            # Δ ≤ 2²⁰/0.05 < 2²⁵ units (and √N < 2²⁵ + 16): a batch would need about 2²⁵
            # examples to reach the limit
            vector = self.vector_bound
            most = self.sensitivity_units if vector is None else math.isqrt(vector) + 1
            assert count * most < SUM_LIMIT, (count, most)
            noisy_totals = [min(max(t, -RELEASE_LIMIT), RELEASE_LIMIT) for t in noisy_totals]
        gradients = tuple(t * self.unit / self.expected_batch_size for t in noisy_totals)
        return DirectionalEstimate(gradients, count, nonfinite)

    def clip_each(self, values: torch.Tensor) -> torch.Tensor:
        """Each example's difference to [−C, C], or its K differences to L2 norm C (in fp64)."""
        if values.dim() == 1:
            return values.clamp(-self.clip, self.clip)
        rows = values.double()
        norms = torch.linalg.vector_norm(rows, dim=1, keepdim=True)
        return rows * (self.clip / norms).clamp(max=1.0)  # a zero row: inf → 1, stays 0

    def to_units(self, clipped: torch.Tensor) -> torch.Tensor:
        """fp64 values in units of the grid: integers within ±Δ (exact sums up to 2⁵³), or the
        clipped values themselves without a grid; K-vectors as ``round_vectors`` makes them."""
        if self.sensitivity_units is None:
            return clipped.double()
        if self.vector_bound is not None:
            return round_vectors(clipped.double() / self.unit, self.vector_bound)
        bound = self.sensitivity_units
        return torch.round(clipped.double() / self.unit).clamp(-bound, bound)

    def draw_noise(self) -> float:
        """One draw in the units of ``to_units`` (the integer k on a grid, else a float of scale
        σC) from the mechanism's secret generator (the distribution seam); one per direction."""
        if self.mechanism.grid is not None:
            units = self.mechanism.sample_units()
            return units_as_float(min(max(units, -DRAW_LIMIT), DRAW_LIMIT))  # exact: ≤ 2⁵³
        return self.mechanism.sample(self.noise_multiplier * self.clip)


def round_vectors(scaled: torch.Tensor, bound: int) -> torch.Tensor:
    """Each row of ``scaled`` (fp64 [B, K], L2 norm ≤ C/γ) rounded to the nearest integers,
    with squared norm at most ``bound`` by construction: a row whose rounding exceeds it (only
    float error in the clipping can make one) is rounded toward zero instead, which never
    lengthens it, and is zeroed if even that exceeds the bound. Squared norms are summed in
    int64, exactly."""
    nearest = torch.round(scaled)
    toward_zero = torch.trunc(scaled)

    def within(rows: torch.Tensor) -> torch.Tensor:
        return (rows.to(torch.int64) ** 2).sum(dim=1, keepdim=True) <= bound

    fallback = torch.where(within(toward_zero), toward_zero, torch.zeros_like(toward_zero))
    return torch.where(within(nearest), nearest, fallback)


def make_estimator(
    mechanism: str | None = None,
    *,
    clip: float | None = None,
    noise_multiplier: float | None = None,
    expected_batch_size: float | None = None,
    noise_parameters: dict | None = None,
) -> GradientEstimator:
    """MeZO's mean (no ``mechanism``: not private), or the private estimator that adds
    ``mechanism``'s noise (a name of ``privzo.privacy.mechanisms``) to the clipped sum."""
    if mechanism is None:
        return MeanEstimator()
    if clip is None or noise_multiplier is None or expected_batch_size is None:
        raise ValueError("a private estimator needs clip, noise_multiplier and expected_batch_size")
    return PrivateEstimator(
        mechanism, clip, noise_multiplier, expected_batch_size, noise_parameters
    )


def estimator_for(config: RunConfig, plan: PrivacyPlan) -> GradientEstimator:
    """The single-process estimator a run's config and privacy plan call for (a distributed
    layout wraps it with ``privzo.distributed.estimators.distribute_estimator``)."""
    return make_estimator(
        plan.mechanism if plan.private else None,
        clip=config.privacy.clip,
        noise_multiplier=plan.noise_multiplier,
        expected_batch_size=plan.expected_batch_size,
        noise_parameters=plan.noise_parameters,
    )
