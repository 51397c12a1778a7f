"""The scoring forward every task runs: inference mode unless a first-order baseline asks for
autograd, no key/value cache, and the vocabulary projection only at the positions scored."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import torch


def no_cache(model: torch.nn.Module) -> dict[str, bool]:
    """``use_cache=False`` for HF models: a scoring forward never decodes further, and the
    key/value cache it would build by default costs memory (about 2·B·L·hidden per layer)."""
    config = getattr(model, "config", None)
    return {"use_cache": False} if getattr(config, "use_cache", None) is not None else {}


_DIFFERENTIABLE = contextvars.ContextVar("privzo_differentiable_scoring", default=False)


@contextlib.contextmanager
def differentiable_scoring() -> Iterator[None]:
    """Score with autograd on inside this block: the first-order baselines back-propagate
    through the task's per-example loss; zeroth-order scoring stays in inference mode."""
    token = _DIFFERENTIABLE.set(True)
    try:
        yield
    finally:
        _DIFFERENTIABLE.reset(token)


def scoring_mode() -> contextlib.AbstractContextManager:
    """Inference mode (no autograd state kept) unless inside ``differentiable_scoring``."""
    return contextlib.nullcontext() if _DIFFERENTIABLE.get() else torch.inference_mode()


def body_and_head(model: torch.nn.Module) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The transformer body (``base_model``) and the module mapping its final hidden states to
    vocabulary logits, if the model exposes both.

    Applying the head only at the scored position skips the [seq × vocab] projection of a full
    forward.
    """
    body = getattr(model, "base_model", None)
    if not isinstance(body, torch.nn.Module) or body is model:
        return None
    for attribute in ("lm_head", "cls"):
        head = getattr(model, attribute, None)
        if isinstance(head, torch.nn.Module):
            return body, head
    return None


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of the model's first parameter: where its inputs go."""
    return next(model.parameters()).device


def logits_at(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    *,
    fp32: bool = True,
) -> torch.Tensor:
    """Vocabulary logits at the positions (rows[i], cols[i]), shape [N, V], from one forward
    pass; the vocabulary projection runs only there when the model exposes its head, which for a
    long passage and a short answer is most of the logits' memory. In fp32 (losses formed from
    them are fp32), or with ``fp32=False`` in the model's dtype, for a caller that keeps only a
    few columns before it casts."""
    split = body_and_head(model)
    with scoring_mode():
        if split is None:
            model_out = model(input_ids=input_ids, attention_mask=attention_mask, **no_cache(model))
            logits = model_out.logits[rows, cols]
        else:
            body, head = split
            hidden = body(input_ids=input_ids, attention_mask=attention_mask, **no_cache(model))[0]
            logits = head(hidden[rows, cols])
        return logits.float() if fp32 else logits
