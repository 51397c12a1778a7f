"""What the training, baseline and audit loops use of a task, whichever kind it is.

``PromptClassificationTask`` and ``GenerationTask`` each have their own examples and batches;
a loop only hands them back to the task that made them, so here they are opaque.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch

# Example positions to collate: a list, a range, or a sampler's integer array.
Indices = Sequence[int] | np.ndarray


class ScoringTask(Protocol):
    """A task's encoded examples → batches → per-example losses."""

    def public_example(self) -> Any:
        """An encoded input built from the template alone (no record)."""
        ...

    def collate(self, examples: Any, indices: Indices, length: int | None = None) -> Any:
        """The examples at ``indices`` as one batch on the CPU, right-padded to ``length``
        tokens (None: to the longest of them)."""
        ...

    def per_example_loss(self, model: torch.nn.Module, batch: Any) -> torch.Tensor:
        """fp32 losses, one per example of ``batch``, under ``model``."""
        ...


__all__ = ["Indices", "ScoringTask"]
