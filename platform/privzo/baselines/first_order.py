"""First-order baselines: ``dpsgd`` (Opacus) and ``adamw`` (non-private), on any PEFT view.

``dpsgd`` is DP-SGD on the view's trainable tensors: full (DP-SGD), lora (DP-LoRA) or bitfit
(DP-BiTFiT). Privacy matches the zeroth-order runs exactly: privzo's own Poisson sampler
(secret generator) draws each logical batch, privzo's accountant calibrates σ for
(ε, δ, q = B/N, T) and books each window, and Opacus' ``DPOptimizer`` clips every per-example
gradient to ``privacy.clip`` (C), adds N(0, σ²C²) to the sum with a secret generator and
divides by the expected batch size B. So one step is the Poisson-subsampled Gaussian mechanism
with sensitivity C under add/remove adjacency, the event the zeroth-order accountants compose:
a ``dpsgd`` and a ``dpzero`` run at the same (ε, δ, q, T) get the same σ.

Logical batches larger than ``optimizer.physical_batch_size`` (null: 16) are split by Opacus'
``BatchMemoryManager`` (the optimizer steps only at the end of the logical batch).

The loss is the task's per-example loss (the one the zeroth-order runs difference), scored with
autograd on. Dropout stays off as in the zeroth-order runs, so both optimise the same function:
only the layers that own trainable tensors are put in training mode, which is what Opacus needs
to capture their activations (Linear, Embedding and LayerNorm carry no dropout).

Opacus on each decoder family: OPT needs two adaptations while Opacus trains (its learned
positions as a plain embedding, its MLP rows fed example-major), both keyed on OPT's module
types. The Llama family (Llama, Mistral, Qwen2, Qwen3) needs none: its linears (the gated MLP's
three, the attention's with grouped key/value heads) see [B, L, H] rows, rotary positions have
no parameters, and its RMSNorm weights get per-example gradients from Opacus' functorch
fallback for modules it has no hook for (``tests/unit/baselines/test_families.py`` checks each
against autograd per example).
"""

from __future__ import annotations

import contextlib
import math
import warnings
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from privzo.algorithms.stepper import StepMeter, StepOutcome, Stepper
from privzo.baselines.opacus_model import (
    example_major_mlp_rows,
    opacus_compatible_positions,
    parameter_layers_in_training_mode,
)
from privzo.privacy.mechanisms import secret_torch_generator
from privzo.privacy.plan import make_sampler
from privzo.privacy.sampling import Sampler
from privzo.tasks.interface import ScoringTask
from privzo.tasks.scoring import differentiable_scoring
from privzo.zo.schedules import make_schedule

if TYPE_CHECKING:
    from privzo.layouts.context import RunContext


def trainable_parameters(context: RunContext) -> list[torch.nn.Parameter]:
    """The view's trainable ``nn.Parameter`` objects (the shards hold flat views of them)."""
    pointers = {shard.tensor.data_ptr() for shard in context.shards}
    found, seen = [], set()
    for parameter in context.model.parameters():
        pointer = parameter.data_ptr()
        if pointer in pointers and pointer not in seen:
            found.append(parameter)
            seen.add(pointer)
    assert len(found) == len(pointers), "every trainable shard is a parameter of the model"
    return found


class FirstOrderStepper(Stepper):
    """Back-propagation steps on the view's trainable tensors (private with Opacus or not)."""

    def __init__(self, context: RunContext, meter: StepMeter) -> None:
        super().__init__(context, meter)
        config, plan = context.config, context.plan
        self.sampler = make_sampler(config, plan, len(context.train))
        self.schedule = make_schedule(
            config.optimizer.lr_schedule, config.optimizer.learning_rate, config.optimizer.steps
        )
        self.private = plan.private
        self.physical_batch_size = context.config.optimizer.first_order_physical_batch_size
        self.parameters = trainable_parameters(context)
        self._cleanup = contextlib.ExitStack()
        self.optimizer: Any = None
        self._physical: Iterator[list[int]] | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        config = self.context.config
        for parameter in self.parameters:
            parameter.requires_grad_(True)
        self._cleanup.callback(self._freeze)
        update_rule = _update_rule(config)
        self.optimizer = update_rule(
            self.parameters,
            lr=config.optimizer.learning_rate,
            weight_decay=config.optimizer.first_order.weight_decay,
        )
        if self.private:
            self._start_private()

    def _start_private(self) -> None:
        from opacus import GradSampleModule
        from opacus.optimizers import DPOptimizer
        from opacus.utils.batch_memory_manager import BatchMemoryManager

        config, plan = self.context.config, self.context.plan
        model = self.context.model
        self._cleanup.enter_context(opacus_compatible_positions(model))
        self._cleanup.enter_context(example_major_mlp_rows(model))
        grad_samples = GradSampleModule(model, loss_reduction="mean")
        self._cleanup.callback(grad_samples.remove_hooks)
        self._cleanup.enter_context(parameter_layers_in_training_mode(model))
        self.optimizer = fp32_noise_optimizer(DPOptimizer)(
            self.optimizer,
            noise_multiplier=plan.noise_multiplier,
            max_grad_norm=config.privacy.clip,
            expected_batch_size=int(plan.expected_batch_size),
            loss_reduction="mean",
            generator=secret_torch_generator(self.context.loaded.device),
            # each coordinate's noise is a sum of 4 draws (/2), which defeats the floating-
            # point attacks on a single Gaussian draw (Opacus' secure mode, arXiv 2107.10138)
            secure_mode=True,
        )
        loader: torch.utils.data.DataLoader[int] = torch.utils.data.DataLoader(
            # torch's stub asks for a Dataset; a list is a map-style dataset (__getitem__, __len__)
            list(range(len(self.context.train))),  # type: ignore[arg-type]
            batch_sampler=LogicalBatches(self.sampler, config.optimizer.steps),
            collate_fn=list,
        )
        manager = BatchMemoryManager(
            data_loader=loader,
            max_physical_batch_size=self.physical_batch_size,
            optimizer=self.optimizer,
        )
        self._physical = iter(self._cleanup.enter_context(manager))

    def finish(self) -> None:
        self._cleanup.close()

    def _freeze(self) -> None:
        for parameter in self.parameters:
            parameter.requires_grad_(False)
            parameter.grad = None
            for attribute in ("grad_sample", "summed_grad"):
                if hasattr(parameter, attribute):
                    delattr(parameter, attribute)

    # --- steps -----------------------------------------------------------------------------

    def step(self, step: int) -> StepOutcome:
        with self.meter.measure():
            return self._step(step)

    def _step(self, step: int) -> StepOutcome:
        learning_rate = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate
        if self.private:
            losses, empty = self._private_step()
        else:
            losses, empty = self._plain_step()
        mean_loss = float(np.mean(losses)) if losses else math.nan
        return StepOutcome(learning_rate, mean_loss, empty)

    def _plain_step(self) -> tuple[list[float], bool]:
        """Mean loss over the realised batch, accumulated over physical batches."""
        indices = self.sampler.next_batch()
        losses: list[float] = []
        if len(indices):
            chunks = math.ceil(len(indices) / self.physical_batch_size)
            for chunk in np.array_split(indices, chunks):
                per_example = self._per_example_loss(chunk.tolist())
                (per_example.sum() / len(indices)).backward()
                losses.extend(per_example.detach().tolist())
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return losses, not len(indices)

    def _private_step(self) -> tuple[list[float], bool]:
        """One logical Poisson batch: physical batches until Opacus takes the step."""
        assert self._physical is not None
        losses: list[float] = []
        empty = True
        while True:
            indices = next(self._physical)
            if indices:
                empty = False
                per_example, finite = self._finite_losses(indices)
                with warnings.catch_warnings():
                    # Opacus' full backward hooks on layers whose inputs need no gradient (the
                    # first layers, frozen embeddings) fire on outputs; that is what they need.
                    warnings.filterwarnings("ignore", "Full backward hook is firing")
                    per_example.mean().backward()
                self._fold_token_rows(len(indices))
                unusable = zero_nonfinite_grad_samples(self.parameters, len(indices))
                self.nonfinite += int((unusable & finite).sum())  # a bad loss counted already
                losses.extend(per_example.detach().tolist())
            else:  # an empty Poisson batch: the step releases noise only
                self._empty_grad_samples()
            self.optimizer.step()
            skipped = self.optimizer._is_last_step_skipped  # Opacus: mid logical batch
            self.optimizer.zero_grad(set_to_none=True)
            if not skipped:
                return losses, empty

    def _per_example_loss(self, indices: list[int]) -> torch.Tensor:
        return self._finite_losses(indices)[0]

    def _finite_losses(self, indices: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-example losses with non-finite ones counted and replaced by 0, and the mask of
        the finite ones."""
        context = self.context
        task: ScoringTask = context.task
        batch = task.collate(context.train, indices)
        with differentiable_scoring():
            losses = task.per_example_loss(context.scoring_model, batch).float()
        finite = torch.isfinite(losses)
        self.nonfinite += int((~finite).sum())
        return torch.where(finite, losses, torch.zeros_like(losses)), finite

    def _fold_token_rows(self, batch_size: int) -> None:
        """Per-example gradients of layers that saw [B·L, H] rows (a flattened block that
        ``example_major_mlp_rows`` does not cover): Opacus records one "sample" per token row,
        ordered example-major, so the L rows of example b sum to its gradient. With
        loss_reduction="mean" Opacus also rescaled those rows by B·L instead of B, which the
        factor B / (B·L) undoes. Exact; a no-op when every layer saw B rows."""
        for parameter in self.parameters:
            grad_sample = parameter.grad_sample  # type: ignore[attr-defined]  # Opacus' hooks set it
            rows = grad_sample.shape[0]
            if rows != batch_size:
                assert rows % batch_size == 0, f"{rows} gradient rows for {batch_size} examples"
                folded = grad_sample.reshape(batch_size, rows // batch_size, *grad_sample.shape[1:])
                parameter.grad_sample = folded.sum(dim=1) * (batch_size / rows)  # type: ignore[attr-defined]

    def _empty_grad_samples(self) -> None:
        """Zero per-example gradients of a batch of none, so Opacus noises a zero sum."""
        for parameter in self.parameters:
            parameter.grad_sample = parameter.new_zeros((0, *parameter.shape))  # type: ignore[attr-defined]


def zero_nonfinite_grad_samples(parameters: list[nn.Parameter], batch_size: int) -> torch.Tensor:
    """Zero, in every tensor, the per-example gradients of examples that have a non-finite
    entry in any; returns the mask [B] of those examples.

    Opacus' clip factor C / ‖g_i‖ is NaN for such an example, and one NaN poisons the noisy
    sum of the whole step; a zeroed example contributes nothing, as a non-finite loss
    difference does on the zeroth-order path (the sensitivity bound C still holds).
    """
    found = (getattr(p, "grad_sample", None) for p in parameters)
    samples = [sample for sample in found if sample is not None]
    if not samples:
        return torch.zeros(batch_size, dtype=torch.bool)
    finite = torch.stack([torch.isfinite(s.flatten(1)).all(dim=1) for s in samples]).all(dim=0)
    if not finite.all():
        for sample in samples:
            sample[~finite] = 0
    return ~finite


class LogicalBatches(torch.utils.data.Sampler):
    """``steps`` batches from a privzo sampler (Poisson, secret generator) for a DataLoader."""

    def __init__(self, sampler: Sampler, steps: int) -> None:
        self.sampler = sampler
        self.steps = steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield self.sampler.next_batch().tolist()

    def __len__(self) -> int:
        return self.steps


def fp32_noise_optimizer(dp_optimizer: type) -> type:
    """Opacus' DPOptimizer with its noise drawn and added in fp32 whatever the weights' dtype.

    Opacus draws the noise like the summed per-example gradients: for a bf16 model its secure
    sum of four draws accumulates in bf16 and is added to a bf16 sum, so the noise itself is
    rounded to bf16 (8 bits of mantissa) before it hides anything. Here the noise is drawn and
    summed in fp32 by Opacus' secure-mode recipe (one draw thrown away, then four draws per
    coordinate, summed and halved: arXiv 2107.10138), added to the clipped sum in fp32, and
    only the noisy gradient is rounded, once, to the weights' dtype.
    """

    class Fp32NoiseDPOptimizer(dp_optimizer):
        def add_noise(self) -> None:
            std = self.noise_multiplier * self.max_grad_norm
            for parameter in self.params:
                clipped = parameter.summed_grad.float()
                noise = secure_gaussian_noise(std, clipped, self.generator)
                parameter.grad = (clipped + noise).to(parameter.dtype).view_as(parameter)

    return Fp32NoiseDPOptimizer


def secure_gaussian_noise(
    std: float, reference: torch.Tensor, generator: torch.Generator | None
) -> torch.Tensor:
    """fp32 N(0, std²) noise shaped like ``reference``, as a halved sum of four draws (after one
    discarded draw), which Opacus' secure mode uses against floating-point attacks on a draw."""
    device = reference.device
    # discarded, as in Opacus
    torch.normal(0.0, std, size=(1, 1), device=device, generator=generator)
    total = torch.zeros(reference.shape, dtype=torch.float32, device=device)
    for _ in range(4):
        total += torch.normal(0.0, std, size=reference.shape, device=device, generator=generator)
    return total / 2


def _update_rule(config: Any) -> type[torch.optim.SGD] | type[torch.optim.AdamW]:
    first_order = config.optimizer.first_order
    name = first_order.update_rule or ("sgd" if config.optimizer.algorithm == "dpsgd" else "adamw")
    return {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[name]
