"""The distributed side of the estimator seam: only ``aggregate`` and ``draw_noise`` change.

Every worker sends [local clipped sum, local count] in one fp64 all-reduce. Rank 0 draws the
noise from its secret generator and adds it to its local sum before sending, so the reduced
total carries exactly one draw, as a single-process run does, every rank receives the same g,
and no rank (nor anything on the wire after rank 0) sees the sum without its noise.
"""

from __future__ import annotations

from privzo.distributed.collectives import WorkerGroup
from privzo.zo.estimators import GradientEstimator, MeanEstimator, PrivateEstimator


class ReplicaMeanEstimator(MeanEstimator):
    """MeZO's mean over the global batch: all-reduce the sum and the count, then divide."""

    def __init__(self, group: WorkerGroup) -> None:
        self.group = group

    def aggregate(self, total: float, count: int) -> tuple[float, int]:
        total, count_sum = self.group.all_reduce_sum([total, count])
        return total, round(count_sum)


class ReplicaPrivateEstimator(PrivateEstimator):
    """DPZero / DP-ZO over workers; the noise is in rank 0's share of the all-reduced sum."""

    def __init__(self, group: WorkerGroup, **settings: float | str | dict | None) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.group = group

    def aggregate(self, total: float, count: int) -> tuple[float, int]:
        if self.group.rank == 0:
            total += super().draw_noise()
        total, count_sum = self.group.all_reduce_sum([total, count])
        return total, round(count_sum)

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
