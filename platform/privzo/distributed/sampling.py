"""Each worker's share of the step's batch.

- Poisson (private runs): the dataset is partitioned by index (worker r owns r, r+W, r+2W, ...)
  and each worker Poisson-samples its own partition at rate p from its own secret generator.
  Every example is still in independently with probability p, so the union is exactly a Poisson
  sample of the whole dataset at rate p: the accountant's assumption holds unchanged.
- Shuffle (non-private MeZO): every worker draws the same global batch from the seeded
  ShuffleSampler and keeps its strided slice, so the global batch is the single-process one.
"""

from __future__ import annotations

import numpy as np

from privzo.distributed.collectives import WorkerGroup
from privzo.privacy.sampling import PoissonSampler, Sampler, ShuffleSampler


class PartitionedPoissonSampler(Sampler):
    name = "poisson"

    def __init__(
        self,
        dataset_size: int,
        sample_rate: float,
        group: WorkerGroup,
        max_batch_size: int | None = None,
    ) -> None:
        """``max_batch_size``: the privacy plan's bound of one worker's share, whose
        truncation δ counts every share of every step (``privzo.privacy.truncation``)."""
        self.partition = np.arange(group.rank, dataset_size, group.world_size, dtype=np.int64)
        self._local = PoissonSampler(len(self.partition), sample_rate, max_batch_size)
        self.dataset_size = dataset_size
        self.expected_batch_size = sample_rate * dataset_size  # of the global batch

    def next_batch(self) -> np.ndarray:
        return self.partition[self._local.next_batch()]


class StridedShuffleSampler(Sampler):
    name = "shuffle"

    def __init__(self, dataset_size: int, batch_size: int, seed: int, group: WorkerGroup) -> None:
        self._global = ShuffleSampler(dataset_size, batch_size, seed)
        self.group = group
        self.dataset_size = dataset_size
        self.expected_batch_size = float(batch_size)

    def next_batch(self) -> np.ndarray:
        return self._global.next_batch()[self.group.rank :: self.group.world_size]


def worker_sampler(
    kind: str,
    dataset_size: int,
    batch_size: int,
    sample_rate: float,
    seed: int,
    group: WorkerGroup,
    max_batch_size: int | None = None,
) -> Sampler:
    """This worker's sampler for ``privacy.sampler`` = ``kind``."""
    if kind == "poisson":
        return PartitionedPoissonSampler(dataset_size, sample_rate, group, max_batch_size)
    return StridedShuffleSampler(dataset_size, batch_size, seed, group)
