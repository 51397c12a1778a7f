"""PEFT views: which tensors a zeroth-order run perturbs and updates.

A view turns a loaded base model into ``(model, pairs)``: the model to evaluate (possibly wrapped
by the ``peft`` library) and the ordered ``(name, parameter)`` pairs the run trains. The pairs
feed ``full_shards`` and a perturber exactly like the ``full`` / ``bitfit`` pairs of
``privzo.models.loading``, and the names are the ones direction blocks are seeded with.

Replay rebuilds the fine-tuned weights from the base model, the view and its ``seed``: adapters
are initialised from generators seeded by ``(seed, parameter name)`` on the CPU, so the start
point is the same on every machine and the global RNG is never consumed. Every parameter is
left with ``requires_grad=False``: updates are in-place sweeps, there is no autograd.

peft keeps adapters in fp32 even on a half-precision base (its ``autocast_adapter_dtype``
default), so ``lora`` and ``prefix`` runs use the in-place fp32 perturber whatever the base dtype.

Scoring: privzo's scorer runs ``model.base_model(...)`` and applies ``model.lm_head`` at one
position. On a peft wrapper ``.base_model`` is peft's tuner (for LoRA the ``LoraModel``, whose
forward returns vocabulary logits), so pass ``unwrap_for_scoring(model)`` to the scorer instead.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

if TYPE_CHECKING:
    from peft import PeftModel

NamedParameters = list[tuple[str, nn.Parameter]]

# Per-architecture LoRA targets (the attention query and value projections, as in the LoRA and
# MeZO papers); other architectures fall back to peft's own table.
LORA_DEFAULT_TARGETS: dict[str, list[str]] = {
    "opt": ["q_proj", "v_proj"],
    "roberta": ["query", "value"],
    "llama": ["q_proj", "v_proj"],
    "mistral": ["q_proj", "v_proj"],
    "qwen2": ["q_proj", "v_proj"],
    "qwen3": ["q_proj", "v_proj"],
}
# Prefix tuning feeds the prefix as past key/values, whose handling (attention mask, position
# ids) is architecture-specific; these are the types checked to score correctly.
PREFIX_MODEL_TYPES: tuple[str, ...] = ("opt", "roberta")
_ADAPTER_INIT_SALT = "privzo-adapter-init"


@dataclass(frozen=True)
class ViewOptions:
    """The knobs of every view; views ignore the ones that do not concern them."""

    seed: int
    lora_rank: int = 8
    lora_alpha: int = 16
    lora_dropout: float = 0.0
    lora_target_modules: tuple[str, ...] | None = None
    prefix_tokens: int = 5


def view_refusal(view: str, hf_config: Any) -> str | None:
    """Why ``view`` cannot train a model of this ``transformers`` config, or None; read from
    the config alone, so a run is refused before any weights load."""
    model_type = getattr(hf_config, "model_type", None)
    if view == "prefix" and model_type not in PREFIX_MODEL_TYPES:
        return (
            f"PEFT view 'prefix' is not supported for model type {model_type!r}: prefix tuning "
            f"is verified only for {list(PREFIX_MODEL_TYPES)}; allowed: full, lora"
        )
    if view == "bitfit" and _bias_free(hf_config):
        return (
            f"PEFT view 'bitfit' trains bias terms, and model type {model_type!r} has none (no "
            "attention or MLP biases in this config); allowed: full, lora"
        )
    return None


def _bias_free(hf_config: Any) -> bool:
    """Llama, Mistral and Qwen3 decoders have no bias unless their config asks for one (Qwen2's
    query/key/value projections always have them)."""
    if getattr(hf_config, "model_type", None) not in ("llama", "mistral", "qwen3"):
        return False
    return not (
        getattr(hf_config, "attention_bias", False) or getattr(hf_config, "mlp_bias", False)
    )


ViewBuilder = Callable[[nn.Module, ViewOptions], tuple[nn.Module, NamedParameters]]


def apply_peft_view(
    model: nn.Module,
    view: str,
    *,
    seed: int,
    lora_rank: int = 8,
    lora_alpha: int = 16,
    lora_dropout: float = 0.0,
    lora_target_modules: list[str] | None = None,
    prefix_tokens: int = 5,
) -> tuple[nn.Module, NamedParameters]:
    """The model to evaluate and the ordered (name, parameter) pairs that ``view`` trains.

    ``lora`` injects adapters into ``model`` in place and returns peft's wrapper around it;
    ``prefix`` wraps ``model`` without touching it. The returned model keeps ``model``'s
    train/eval mode (new adapter modules included), so dropout stays off in eval mode, which a
    zeroth-order difference of two forwards needs.
    """
    if view not in PEFT_VIEWS:
        raise ValueError(f"PEFT view {view!r} is unknown; allowed: {sorted(PEFT_VIEWS)}")
    options = ViewOptions(
        seed=seed,
        lora_rank=lora_rank,
        lora_alpha=lora_alpha,
        lora_dropout=lora_dropout,
        lora_target_modules=tuple(lora_target_modules) if lora_target_modules else None,
        prefix_tokens=prefix_tokens,
    )
    training = model.training
    wrapped, pairs = PEFT_VIEWS[view](model, options)
    wrapped.train(training)
    wrapped.requires_grad_(False)
    return wrapped, pairs


def full_view(model: nn.Module, options: ViewOptions) -> tuple[nn.Module, NamedParameters]:
    """Every parameter; ``named_parameters`` lists a tied tensor (embedding / LM head) once."""
    return model, list(model.named_parameters())


def bitfit_view(model: nn.Module, options: ViewOptions) -> tuple[nn.Module, NamedParameters]:
    """Bias terms only (BitFit): every parameter whose name ends in ``.bias``."""
    biases = [(name, p) for name, p in model.named_parameters() if name.endswith(".bias")]
    if not biases:
        raise ValueError(f"PEFT view 'bitfit': {type(model).__name__} has no bias parameters")
    return model, biases


def lora_view(model: nn.Module, options: ViewOptions) -> tuple[nn.Module, NamedParameters]:
    """peft's LoRA on the target modules; trains the A and B matrices only.

    B starts at zero, so ``B·A = 0`` and the wrapped model's output equals the base model's at
    initialisation; A is uniform in ±1/√fan_in (the distribution peft's default draws from).
    """
    peft = _import_peft("lora")
    if options.lora_rank < 1:
        raise ValueError(f"lora_rank={options.lora_rank} must be at least 1")
    config = peft.LoraConfig(
        r=options.lora_rank,
        lora_alpha=options.lora_alpha,
        lora_dropout=options.lora_dropout,
        target_modules=list(options.lora_target_modules or _lora_targets(model)),
        bias="none",
    )
    wrapped = _wrap_without_global_rng(peft, model, config)
    pairs = _adapter_pairs(wrapped)
    unexpected = [name for name, _ in pairs if not _is_lora_matrix(name)]
    if unexpected or not pairs:
        raise ValueError(f"LoRA view: expected only LoRA A/B matrices trainable, got {unexpected}")
    for name, parameter in pairs:
        _seeded_init(parameter, name, options.seed, _lora_init(name))
    return wrapped, pairs


def prefix_view(model: nn.Module, options: ViewOptions) -> tuple[nn.Module, NamedParameters]:
    """peft's prefix tuning: ``prefix_tokens`` learned key/value vectors in every layer.

    Trains the prefix encoder's embedding (no reparametrisation MLP), initialised N(0, 1) like
    peft's default. The prefix occupies position ids, so the longest prompt the model can
    score shrinks by ``prefix_tokens``.
    """
    peft = _import_peft("prefix")
    model_type = _model_type(model)
    if model_type not in PREFIX_MODEL_TYPES:
        raise ValueError(
            f"PEFT view 'prefix' is not supported for model type {model_type!r}: prefix tuning "
            f"is verified only for {list(PREFIX_MODEL_TYPES)}"
        )
    if options.prefix_tokens < 1:
        raise ValueError(f"prefix_tokens={options.prefix_tokens} must be at least 1")
    config = peft.PrefixTuningConfig(
        task_type=_prefix_task_type(peft, model),
        num_virtual_tokens=options.prefix_tokens,
        prefix_projection=False,
    )
    wrapped = _wrap_without_global_rng(peft, model, config)
    pairs = _adapter_pairs(wrapped)
    for name, parameter in pairs:
        _seeded_init(parameter, name, options.seed, _normal_init)
    return wrapped, pairs


PEFT_VIEWS: dict[str, ViewBuilder] = {
    "full": full_view,
    "bitfit": bitfit_view,
    "lora": lora_view,
    "prefix": prefix_view,
}


def unwrap_for_scoring(model: nn.Module) -> nn.Module:
    """The module to hand privzo's scorer (``base_model(...)`` + ``lm_head``) for ``model``.

    - Not a peft model: ``model`` itself.
    - LoRA (and other adapter methods): the underlying Hugging Face model; peft replaced its
      target layers in place, so its own ``base_model`` and ``lm_head`` already run the adapters.
    - Prefix tuning: the underlying model ignores the prefix (peft injects it as past key/values
      in the wrapper's forward), so a ``PrefixScoringView`` supplies it instead.
    """
    peft_model_class = _peft_model_class()
    if peft_model_class is None or not isinstance(model, peft_model_class):
        return model
    if model.active_peft_config.is_prompt_learning:
        return PrefixScoringView(model)
    return model.get_base_model()


class PrefixScoringView(nn.Module):
    """A prefix-tuned model with the interface the scorer uses.

    ``base_model(input_ids, attention_mask)`` runs the transformer body with the prefix as past
    key/values (and the attention mask extended over it), as peft's own forward does, and the
    vocabulary head is the underlying model's, so only the scored position is projected.
    """

    def __init__(self, peft_model: PeftModel) -> None:
        super().__init__()
        underlying = peft_model.get_base_model()
        body = underlying.base_model
        assert isinstance(body, nn.Module), "a Hugging Face model's base_model is its body"
        self.peft_model = peft_model
        self.body = _PrefixBody(peft_model, body)
        for attribute in ("lm_head", "cls"):
            head = getattr(underlying, attribute, None)
            if isinstance(head, nn.Module):
                self.add_module(attribute, head)

    @property
    def base_model(self) -> nn.Module:
        return self.body

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.peft_model(*args, **kwargs)


class _PrefixBody(nn.Module):
    """The transformer body called with the current prefix prepended as past key/values."""

    def __init__(self, peft_model: PeftModel, body: nn.Module) -> None:
        super().__init__()
        self.peft_model = peft_model
        self.body = body

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> Any:
        batch_size = input_ids.shape[0]
        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        tokens = self.peft_model.active_peft_config.num_virtual_tokens
        prefix_mask = attention_mask.new_ones((batch_size, tokens))
        return self.body(
            input_ids=input_ids,
            attention_mask=torch.cat([prefix_mask, attention_mask], dim=1),
            past_key_values=self.peft_model.get_prompt(batch_size),
            **kwargs,
        )


def _import_peft(view: str) -> Any:
    try:
        import peft
    except ImportError as error:
        raise ImportError(
            f"PEFT view {view!r} needs the 'peft' package, a dependency of privzo that this "
            "environment lacks: reinstall privzo (pip install -e . in a checkout)"
        ) from error
    return peft


def _peft_model_class() -> type[PeftModel] | None:
    try:
        from peft import PeftModel
    except ImportError:
        return None
    return PeftModel


def _model_type(model: nn.Module) -> str:
    config = getattr(model, "config", None)
    return str(getattr(config, "model_type", type(model).__name__))


def _lora_targets(model: nn.Module) -> list[str]:
    """The default LoRA target modules of ``model``'s architecture."""
    from peft.utils import TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING as peft_defaults

    model_type = _model_type(model)
    targets = LORA_DEFAULT_TARGETS.get(model_type) or peft_defaults.get(model_type)
    if not targets:
        raise ValueError(
            f"PEFT view 'lora': no default target modules for model type {model_type!r}; "
            "pass lora_target_modules"
        )
    return list(targets)


def _prefix_task_type(peft: Any, model: nn.Module) -> Any:
    """peft's wrapper class: causal LM where the model generates, else feature extraction.

    peft has no masked-LM task type; its feature-extraction wrapper passes the prefix to any
    model whose forward accepts past key/values, which RoBERTa's masked LM does.
    """
    can_generate = getattr(model, "can_generate", None)
    if callable(can_generate) and can_generate():
        return peft.TaskType.CAUSAL_LM
    return peft.TaskType.FEATURE_EXTRACTION


def _wrap_without_global_rng(peft: Any, model: nn.Module, config: Any) -> nn.Module:
    """``get_peft_model`` with the global RNGs forked: peft's own initialisation draws from
    them, and is overwritten by the seeded initialisation anyway."""
    cuda_devices = sorted(
        {p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"}
    )
    with torch.random.fork_rng(devices=cuda_devices):
        return peft.get_peft_model(model, config)


def _adapter_pairs(wrapped: nn.Module) -> NamedParameters:
    """The parameters peft marked trainable, in ``named_parameters`` order."""
    return [(name, p) for name, p in wrapped.named_parameters() if p.requires_grad]


def _is_lora_matrix(name: str) -> bool:
    return ".lora_A." in name or ".lora_B." in name


InitFunction = Callable[[torch.Size, torch.Generator], torch.Tensor]


def _lora_init(name: str) -> InitFunction:
    return _zeros_init if ".lora_B." in name else _uniform_fan_in_init


def _zeros_init(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    return torch.zeros(shape)


def _uniform_fan_in_init(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    bound = 1.0 / shape[-1] ** 0.5
    return torch.rand(shape, generator=generator).mul_(2 * bound).sub_(bound)


def _normal_init(shape: torch.Size, generator: torch.Generator) -> torch.Tensor:
    return torch.randn(shape, generator=generator)


def _init_seed(seed: int, name: str) -> int:
    """A 63-bit generator seed per (view seed, parameter name): adding or dropping one adapter
    leaves the initialisation of the others unchanged."""
    key = f"{_ADAPTER_INIT_SALT}/{seed}/{name}".encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") >> 1


@torch.no_grad()
def _seeded_init(parameter: nn.Parameter, name: str, seed: int, init: InitFunction) -> None:
    """Draw in fp32 on the CPU, then copy to the parameter's device and dtype, so the start
    point does not depend on the device's generator or on the global RNG state."""
    generator = torch.Generator(device="cpu").manual_seed(_init_seed(seed, name))
    parameter.copy_(init(parameter.shape, generator))
