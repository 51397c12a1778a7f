"""The one collective the algorithm needs: a sum of a few scalars over every worker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
import torch.distributed as dist


@dataclass
class WorkerGroup:
    """This process's place among the workers (the default torch.distributed group), and the
    payload bytes it has all-reduced (what the algorithm communicates)."""

    rank: int
    world_size: int
    reduced_bytes: int = field(default=0, compare=False)

    @classmethod
    def current(cls) -> WorkerGroup:
        if not dist.is_available() or not dist.is_initialized():
            return cls(0, 1)
        return cls(dist.get_rank(), dist.get_world_size())

    def all_reduce_sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sum over workers, in fp64 (exact for counts up to 2**53).

        The result is identical on every rank, so all replicas apply the same step.
        """
        if self.world_size == 1:
            return [float(value) for value in values]
        tensor = torch.tensor(list(values), dtype=torch.float64)
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        self.reduced_bytes += tensor.numel() * tensor.element_size()
        return tensor.tolist()

    def all_gather_float(self, value: float) -> list[float]:
        """``value`` from every rank, in rank order (e.g. each worker's peak memory)."""
        if self.world_size == 1:
            return [float(value)]
        parts = [torch.zeros(1, dtype=torch.float64) for _ in range(self.world_size)]
        dist.all_gather(parts, torch.tensor([value], dtype=torch.float64))
        return [float(part) for part in parts]
