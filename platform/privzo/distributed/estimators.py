"""The distributed side of the estimator seam: only ``aggregate`` and ``draw_noise`` change.

Every worker sends [local clipped sums (one per direction of the step), local count] in one
fp64 all-reduce. Rank 0 draws the noise from its secret generator and adds it to its local sums
before sending, so each reduced total carries exactly one draw, as a single-process run does,
every rank receives the same g, and no rank (nor anything on the wire after rank 0) sees a sum
without its noise. With several directions each example's K-vector is clipped on the rank that
holds it, so the all-reduced sums are those of a single process.
"""

from __future__ import annotations

from privzo.distributed.collectives import WorkerGroup
from privzo.zo.estimators import GradientEstimator, MeanEstimator, PrivateEstimator


class ReplicaMeanEstimator(MeanEstimator):
    """MeZO's mean over the global batch: all-reduce the sum and the count, then divide."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def aggregate(self, totals: list[float], count: int) -> tuple[list[float], int]:
        *reduced, count_sum = self.group.all_reduce_sum([*totals, count])
        return reduced, round(count_sum)


class ReplicaPrivateEstimator(PrivateEstimator):
    """DPZero / DP-ZO over workers; the noise is in rank 0's share of the all-reduced sum."""

    def __init__(self, group: WorkerGroup, **settings: float | str | dict | None) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.group = group

    def aggregate(self, totals: list[float], count: int) -> tuple[list[float], int]:
        if self.group.rank == 0:
            draw = super().draw_noise  # bound here: a comprehension has no zero-argument super
            totals = [total + draw() for total in totals]
        *reduced, count_sum = self.group.all_reduce_sum([*totals, count])
        return reduced, round(count_sum)

    def draw_noise(self) -> float:
        """0: the draw is already in the aggregated sum."""
        return 0.0


def distribute_estimator(estimator: GradientEstimator, group: WorkerGroup) -> GradientEstimator:
    """The all-reducing twin of a single-process estimator, with the same settings."""
    if isinstance(estimator, PrivateEstimator):
        return ReplicaPrivateEstimator(
            group,
            mechanism=estimator.mechanism.name,
            clip=estimator.clip,
            noise_multiplier=estimator.noise_multiplier,
            expected_batch_size=estimator.expected_batch_size,
            noise_parameters=estimator.noise_parameters,  # a parametrised mechanism's (lmo)
        )
    if isinstance(estimator, MeanEstimator):
        return ReplicaMeanEstimator(group)
    raise TypeError(f"no distributed version of {type(estimator).__name__}")
