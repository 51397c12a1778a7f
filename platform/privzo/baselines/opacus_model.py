"""How a transformers model trains under Opacus without changing what it computes.

Opacus records per-example gradients through hooks on the layers that own trainable tensors;
these context managers make an OPT model fit those hooks for the length of a first-order run
and restore it on exit (parameter objects never change, so the optimizer's hold on them does
not either): training mode only where Opacus needs it, OPT's positions as a plain embedding,
and the MLP rows example-major.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, TypeGuard

import torch
from torch import nn

if TYPE_CHECKING:
    from transformers.models.opt.modeling_opt import OPTLearnedPositionalEmbedding


@contextlib.contextmanager
def parameter_layers_in_training_mode(model: nn.Module) -> Iterator[None]:
    """Training mode only for modules that own trainable tensors (Opacus captures their
    activations only then); the blocks around them keep dropout off. Restored on exit."""
    changed = [
        module
        for module in model.modules()
        if not module.training
        and any(parameter.requires_grad for parameter in module.parameters(recurse=False))
    ]
    for module in changed:
        module.training = True
    try:
        yield
    finally:
        for module in changed:
            module.training = False


def _is_opt_positions(module: object) -> TypeGuard[OPTLearnedPositionalEmbedding]:
    """Whether ``module`` is OPT's positional embedding (by name: no OPT import needed)."""
    return type(module).__name__ == "OPTLearnedPositionalEmbedding"


class _PositionTable(nn.Module):
    """OPT's learned positions as a plain ``nn.Embedding`` child, which Opacus supports.

    OPT's ``OPTLearnedPositionalEmbedding`` subclasses ``nn.Embedding`` but is called with the
    attention mask and an int, which Opacus' hooks cannot record; this computes the position
    ids the same way and looks them up in the same weight tensor.
    """

    def __init__(self, original: OPTLearnedPositionalEmbedding) -> None:
        super().__init__()
        self.offset = original.offset
        self.table = nn.Embedding(*original.weight.shape)
        self.table.weight = original.weight  # the same Parameter: the optimizer updates it

    def forward(
        self,
        attention_mask: torch.Tensor,
        past_key_values_length: int = 0,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        if position_ids is None:
            position_ids = torch.cumsum(attention_mask, dim=1)
            position_ids = (position_ids * attention_mask - 1).long()
            position_ids = position_ids[:, past_key_values_length:]
        return self.table(position_ids + self.offset)


@contextlib.contextmanager
def opacus_compatible_positions(model: nn.Module) -> Iterator[None]:
    """Swap OPT's positional embeddings for ``_PositionTable`` while Opacus trains."""
    swapped = []
    for parent in list(model.modules()):
        original = getattr(parent, "embed_positions", None)
        if _is_opt_positions(original):
            table = _PositionTable(original)
            table.train(original.training)
            parent.embed_positions = table
            swapped.append((parent, original))
    try:
        yield
    finally:
        for parent, original in swapped:
            parent.embed_positions = original


class _ExampleMajorRows(nn.Module):
    """Gives a layer that OPT calls on flattened [B·L, H] rows a [B, L, H] view of them.

    Opacus then records B per-example gradients of size |θ| instead of B·L per-row ones (for
    an MLP that is L times less memory and time); the output is flattened back, so the block
    computes exactly what it did.
    """

    def __init__(self, inner: nn.Module, shape: list[int]) -> None:
        super().__init__()
        self.inner = inner
        self.shape = shape  # [B, L] of the current forward, set by the layer's pre-hook

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        batch, length = self.shape
        if rows.dim() != 2 or rows.shape[0] != batch * length:
            return self.inner(rows)
        out = self.inner(rows.view(batch, length, rows.shape[-1]))
        return out.reshape(batch * length, out.shape[-1])


@contextlib.contextmanager
def example_major_mlp_rows(model: nn.Module) -> Iterator[None]:
    """Wrap the MLP block layers of OPT decoder layers in ``_ExampleMajorRows`` while Opacus
    trains; restored on exit (parameter objects never change)."""
    swapped, handles = [], []
    for layer in list(model.modules()):
        if type(layer).__name__ != "OPTDecoderLayer":
            continue
        shape = [0, 0]

        def record(_module: nn.Module, args: tuple, kwargs: dict, shape: list[int] = shape) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            shape[:] = hidden.shape[:2]

        handles.append(layer.register_forward_pre_hook(record, with_kwargs=True))
        for attribute in ("final_layer_norm", "fc1", "fc2"):
            original = getattr(layer, attribute)
            setattr(layer, attribute, _ExampleMajorRows(original, shape))
            swapped.append((layer, attribute, original))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()
        for layer, attribute, original in swapped:
            setattr(layer, attribute, original)
