"""Per-example losses of a batch computed in micro-batches (``optimizer.physical_batch_size``).

Per-example losses are independent of each other, so a batch may be scored in chunks of at
most ``physical_batch_size`` examples and the losses concatenated: the same losses, while the
activations alive at once follow the chunk, not the batch. A chunk is a slice of the collated
batch (not a batch collated anew), so every chunk keeps the batch's padded length and each
example sees the same input it would in one forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import torch

BatchT = TypeVar("BatchT")


def batch_rows(batch: BatchT, start: int, stop: int) -> BatchT:
    """The examples ``start:stop`` of a batch dataclass whose fields are tensors (or other
    values) with one row per example along their first dimension."""
    assert dataclasses.is_dataclass(batch) and not isinstance(batch, type)
    sliced: dict[str, Any] = {}
    for field in dataclasses.fields(batch):
        value = getattr(batch, field.name)
        assert isinstance(value, torch.Tensor), f"{field.name} is not a per-example tensor"
        sliced[field.name] = value[start:stop]
    return dataclasses.replace(batch, **sliced)


def losses_in_micro_batches(
    loss_fn: Callable[[BatchT], torch.Tensor],
    batch: BatchT,
    physical_batch_size: int | None,
) -> torch.Tensor:
    """``loss_fn(batch)``, computed in chunks of at most ``physical_batch_size`` examples
    (None: the whole batch in one call) and concatenated in order."""
    size = len(batch)  # type: ignore[arg-type]
    if physical_batch_size is None or size <= physical_batch_size:
        return loss_fn(batch)
    if physical_batch_size < 1:
        raise ValueError(f"physical_batch_size={physical_batch_size}: allowed: 1 or more")
    chunks = [
        loss_fn(batch_rows(batch, start, min(start + physical_batch_size, size)))
        for start in range(0, size, physical_batch_size)
    ]
    return torch.cat(chunks)
