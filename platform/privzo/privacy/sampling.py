"""Batch samplers: which example indices go into each step's batch.

The privacy accountants assume Poisson subsampling (every example in independently with
probability p, so batch sizes vary and batches can be empty) and that nobody can tell which
examples were drawn. ``PoissonSampler`` therefore draws from its own ``SecretGenerator`` and takes
no seed. ``ShuffleSampler`` is the seeded, fixed-size sampler for non-private runs only: its
batches are reproducible from a logged seed, so no subsampling amplification may be claimed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import numpy as np

from privzo.privacy.checks import check_count, check_sample_rate
from privzo.privacy.mechanisms import SecretGenerator

__all__ = ["PoissonSampler", "Sampler", "ShuffleSampler"]


class Sampler(ABC):
    """Yields one array of example indices (int64, sorted or shuffled) per step."""

    name: ClassVar[str]
    dataset_size: int
    expected_batch_size: float

    @abstractmethod
    def next_batch(self) -> np.ndarray:
        """The indices of the next step's batch."""


class PoissonSampler(Sampler):
    """Each example joins each batch independently with probability ``sample_rate``.

    This is exactly the sampling the subsampled-mechanism accountants assume. Batches are sorted
    index arrays whose size is Binomial(N, p); divide the noisy sum by ``expected_batch_size``
    (p·N), not by the realised size, which depends on the data membership being hidden.

    With ``max_batch_size`` a larger draw keeps a secret uniformly random subset of that many
    (truncated Poisson sampling; ``privzo.privacy.truncation`` accounts for it).
    """

    name: ClassVar[str] = "poisson"

    def __init__(
        self, dataset_size: int, sample_rate: float, max_batch_size: int | None = None
    ) -> None:
        self.dataset_size = check_count("dataset_size", dataset_size, 1)
        self.sample_rate = check_sample_rate(sample_rate)
        self.expected_batch_size = self.sample_rate * self.dataset_size
        self.max_batch_size = (
            None if max_batch_size is None else check_count("max_batch_size", max_batch_size, 1)
        )
        self._generator = SecretGenerator()

    def next_batch(self) -> np.ndarray:
        if self.sample_rate == 1.0:
            return self._truncated(np.arange(self.dataset_size, dtype=np.int64))
        mask = self._generator.uniform(self.dataset_size) < self.sample_rate
        return self._truncated(np.flatnonzero(mask).astype(np.int64))

    def _truncated(self, batch: np.ndarray) -> np.ndarray:
        """``batch``, or a secret uniformly random ``max_batch_size`` of it (sorted)."""
        if self.max_batch_size is None or len(batch) <= self.max_batch_size:
            return batch
        kept = np.argsort(self._generator.uniform(len(batch)))[: self.max_batch_size]
        return np.sort(batch[kept])

    def __repr__(self) -> str:
        return (
            f"PoissonSampler(dataset_size={self.dataset_size}, sample_rate={self.sample_rate}, "
            f"max_batch_size={self.max_batch_size})"
        )


class ShuffleSampler(Sampler):
    """Seeded fixed-size batches from a fresh permutation each epoch (non-private runs only).

    An epoch yields ``dataset_size // batch_size`` full batches; the leftover examples of a
    permutation are dropped so every batch has exactly ``batch_size`` indices, and the next
    epoch reshuffles. Reproducible from ``seed``, which is why it must not back a DP claim.
    """

    name: ClassVar[str] = "shuffle"

    def __init__(self, dataset_size: int, batch_size: int, seed: int) -> None:
        self.dataset_size = check_count("dataset_size", dataset_size, 1)
        self.batch_size = check_count("batch_size", batch_size, 1, self.dataset_size)
        self.seed = check_count("seed", seed, 0)
        self.expected_batch_size = float(self.batch_size)
        self._rng = np.random.default_rng(self.seed)
        self.epoch = 0
        self._order = self._rng.permutation(self.dataset_size).astype(np.int64)
        self._position = 0

    def next_batch(self) -> np.ndarray:
        if self._position + self.batch_size > self.dataset_size:
            self.epoch += 1
            self._order = self._rng.permutation(self.dataset_size).astype(np.int64)
            self._position = 0
        batch = self._order[self._position : self._position + self.batch_size]
        self._position += self.batch_size
        return batch.copy()

    def __repr__(self) -> str:
        return (
            f"ShuffleSampler(dataset_size={self.dataset_size}, batch_size={self.batch_size}, "
            f"seed={self.seed})"
        )
