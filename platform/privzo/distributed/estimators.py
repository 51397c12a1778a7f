"""The distributed side of the estimator seam: only ``aggregate`` and ``draw_noise`` change.

Every worker sends [local clipped sum, local count, local noise] in one fp64 all-reduce. Rank 0
draws the noise from its secret generator and the others contribute 0, so the reduced total
carries exactly one draw, as a single-process run does, and every rank receives the same g.
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
    """DPZero / DP-ZO over workers; the noise rides in the same all-reduce as the sum."""

    def __init__(self, group: WorkerGroup, **settings: float | str) -> None:
        super().__init__(**settings)  # type: ignore[arg-type]
        self.group = group
        self._noise: float | None = None

    def aggregate(self, total: float, count: int) -> tuple[float, int]:
        local_noise = super().draw_noise() if self.group.rank == 0 else 0.0
        total, count_sum, self._noise = self.group.all_reduce_sum([total, count, local_noise])
        return total, round(count_sum)

    def draw_noise(self) -> float:
        assert self._noise is not None, "draw_noise follows aggregate within a step"
        noise, self._noise = self._noise, None
        return noise


def distribute_estimator(estimator: GradientEstimator, group: WorkerGroup) -> GradientEstimator:
    """The all-reducing twin of a single-process estimator, with the same settings."""
    if isinstance(estimator, PrivateEstimator):
        return ReplicaPrivateEstimator(
            group,
            mechanism=estimator.mechanism.name,
            clip=estimator.clip,
            noise_multiplier=estimator.noise_multiplier,
            expected_batch_size=estimator.expected_batch_size,
        )
    if isinstance(estimator, MeanEstimator):
        return ReplicaMeanEstimator(group)
    raise TypeError(f"no distributed version of {type(estimator).__name__}")
