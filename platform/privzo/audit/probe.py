"""What the public base model says of candidate canaries, before the run: the label it finds
least likely for each, and the size of each one's loss gradient under that label.

E_z d_c² = |∇l_c|² for Gaussian directions z, so the gradient's squared norm is the size of the
canary's directional derivatives, the quantity the large-gradient canaries are chosen by. Only
the base model and the canaries' own text enter: nothing of the private data or of the run.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from privzo.tasks.classification import PromptClassificationTask
from privzo.tasks.data import Row
from privzo.tasks.scoring import differentiable_scoring


@dataclass
class BaseModelProbe:
    """Per-row questions to the base model, with the task that encodes and scores the rows."""

    model: torch.nn.Module
    task: PromptClassificationTask
    batch_size: int = 250

    def disfavoured_labels(self, rows: list[Row]) -> np.ndarray:
        """The label whose word the base model scores lowest after each row's prompt."""
        encoded = self.task.encode(rows)
        found = []
        with torch.inference_mode():
            for start in range(0, len(rows), self.batch_size):
                indices = range(start, min(start + self.batch_size, len(rows)))
                logits = self.task.label_logits(self.model, self.task.collate(encoded, indices))
                found.append(logits.argmin(dim=-1).cpu().numpy())
        return np.concatenate(found).astype(np.int64)

    def gradient_sizes(self, rows: list[Row]) -> np.ndarray:
        """|∇l|² of each row's loss (under its own label) over all the floating-point weights
        (a full-model perturbation's; the loaded model is frozen, so they are unfrozen here)."""
        encoded = self.task.encode(rows)
        weights = [p for p in self.model.parameters() if p.is_floating_point()]
        for weight in weights:
            weight.requires_grad_(True)
        sizes = np.empty(len(rows), dtype=np.float64)
        for index in range(len(rows)):
            with differentiable_scoring():
                loss = self.task.per_example_loss(self.model, self.task.collate(encoded, [index]))
            gradients = torch.autograd.grad(loss.sum(), weights, allow_unused=True)
            sizes[index] = sum(float((g.float() ** 2).sum()) for g in gradients if g is not None)
        return sizes
