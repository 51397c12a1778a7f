"""Per-example losses of a batch computed in micro-batches (``optimizer.physical_batch_size``),
and the batches of a public shape (``task.pad_to='max_length'``).

Per-example losses are independent of each other, so a batch may be scored in chunks of at
most ``physical_batch_size`` examples and the losses concatenated: the same losses, while the
activations alive at once follow the chunk, not the batch. A chunk is a slice of the collated
batch (not a batch collated anew), so every chunk keeps the batch's padded length and each
example sees the same input it would in one forward.

A batch of a public shape has ``rows`` rows of ``length`` tokens whatever was drawn: the drawn
examples, then copies of the task's public example (built from the template, no record) whose
losses are dropped. Every forward is then [micro_batch, length], so an example's fp32 loss does
not depend on which others share its batch, and a step's time and memory do not depend on the
data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from privzo.section import ConfigError
from privzo.tasks.interface import Indices, ScoringTask

BatchT = TypeVar("BatchT")


@dataclass(frozen=True)
class PublicShape:
    """The shape of every training forward: ``rows`` per batch (a multiple of
    ``micro_batch``) in forwards of ``micro_batch`` rows of ``length`` tokens."""

    rows: int
    micro_batch: int
    length: int


def public_shape(
    rows: int | None, physical_batch_size: int | None, max_length: int | None
) -> PublicShape:
    """The shape of a run's padded batches: ``rows`` from the privacy plan, the micro-batch
    of ``optimizer.physical_batch_size`` (null: the whole batch) and the task's ``max_length``.

    Raises ConfigError when the task has no length to pad to."""
    assert rows is not None, "task.pad_to='max_length' plans a batch bound"
    if max_length is None:
        raise ConfigError(
            "task.pad_to='max_length' needs a length to pad to, and this model states no "
            "position limit; set task.max_length, or task.pad_to='batch'"
        )
    micro_batch = physical_batch_size or rows
    assert rows % micro_batch == 0, "the plan rounds the bound to whole micro-batches"
    return PublicShape(rows, micro_batch, max_length)


def padded_batch(task: ScoringTask, examples: Any, indices: Indices, shape: PublicShape) -> Any:
    """The examples at ``indices`` (at most ``shape.rows``), then public padding rows: a
    batch of ``shape.rows`` × ``shape.length`` whose first ``len(indices)`` rows are real."""
    assert len(indices) <= shape.rows, "the sampler truncates to the plan's bound"
    padding = shape.rows - len(indices)
    public = task.collate(task.public_example(), [0] * padding, shape.length)
    if not len(indices):
        return public
    real = task.collate(examples, indices, shape.length)
    return join_rows(real, public) if padding else real


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


def join_rows(first: BatchT, second: BatchT) -> BatchT:
    """The rows of ``first`` then those of ``second``: two batch dataclasses of one kind whose
    per-example tensors have the same trailing shapes."""
    assert dataclasses.is_dataclass(first) and not isinstance(first, type)
    joined = {
        field.name: torch.cat([getattr(first, field.name), getattr(second, field.name)])
        for field in dataclasses.fields(first)
    }
    return dataclasses.replace(first, **joined)


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
