"""Load a causal or masked LM from a built-in name, a local directory or a hub id."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast, runtime_checkable

import safetensors
import torch
import transformers
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

from privzo.models.builtin import BUILTIN_MODELS, is_builtin, materialize_builtin
from privzo.models.config import ModelConfig
from privzo.models.peft_views import apply_peft_view, view_refusal
from privzo.section import ConfigError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MASKED_TYPES = {"roberta", "bert", "xlm-roberta", "deberta", "deberta-v2", "electra", "distilbert"}


@dataclass
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    kind: str  # "causal" or "masked"
    source: str  # the directory or hub id the weights came from
    device: torch.device
    revision: str | None = None  # the hub commit loaded (None for a local or built-in model)


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"model.device={device!r} but CUDA is not available; use 'cpu'")
    return torch.device(device)


def is_hub_id(name: str) -> bool:
    """Whether ``model.name_or_path`` names a hub model (not a built-in or a local path)."""
    return not is_builtin(name) and not Path(name).expanduser().exists() and not _path_like(name)


def _path_like(name: str) -> bool:
    """A name no hub id has (``org/name`` at most): absolute, relative to ``.`` or ``~``, or
    deeper than one slash, so a missing directory is refused as such, not looked up online."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def pretrained_kwargs(config: ModelConfig) -> dict[str, str]:
    """What every ``from_pretrained`` of the model's source takes besides the source: the
    pinned ``revision`` where one is set."""
    return {"revision": config.revision} if config.revision is not None else {}


def resolve_source(config: ModelConfig, cache_dir: Path, progress: bool = True) -> str:
    """The directory or hub id to load from; builds built-in models into ``cache_dir``."""
    name = config.name_or_path
    if config.revision is not None and not is_hub_id(name):
        raise ConfigError(
            f"model.revision={config.revision!r}: a revision pins a hub id, but "
            f"model.name_or_path={name!r} is a built-in name or a local directory; unset it"
        )
    if is_builtin(name):
        return str(materialize_builtin(name, cache_dir, progress=progress))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise ConfigError(
                f"model.name_or_path={name!r} is a path without a config.json; it must be a "
                "directory saved with save_pretrained"
            )
        return str(path)
    if _path_like(name):
        raise ConfigError(
            f"model.name_or_path={name!r}: no such directory; for a hub id write org/name (like "
            "'facebook/opt-125m'), or give an existing local directory or a built-in name"
        )
    return name


def peek_kind(config: ModelConfig) -> str:
    """'causal' or 'masked' without loading weights (or building a built-in model), so the task
    and its data can be checked first."""
    if config.kind != "auto":
        return config.kind
    name = config.name_or_path
    if is_builtin(name):
        return "masked" if BUILTIN_MODELS[name].arch == "roberta" else "causal"
    source = resolve_source(config, cache_dir=Path("."), progress=False)
    return resolve_kind(config, _load_hf_config(config, source))


def check_model(config: ModelConfig) -> str:
    """The model's kind, its source checked without loading weights: a built-in name, a local
    directory saved with save_pretrained, or a hub id whose config loads (whatever
    ``model.kind`` says: a study checks every cell's model with this before the first trains)."""
    if is_builtin(config.name_or_path):
        return peek_kind(config)
    source = resolve_source(config, cache_dir=Path("."), progress=False)
    hf_config = _load_hf_config(config, source)
    check_weight_files(config, source)
    refusal = view_refusal(config.trainable, hf_config)
    if refusal is not None:
        raise ConfigError(f"model.trainable={config.trainable!r}: {refusal}")
    return resolve_kind(config, hf_config)


def _load_hf_config(config: ModelConfig, source: str) -> PretrainedConfig:
    unreachable = hub_unreachable(source, config.revision) if is_hub_id(source) else None
    if unreachable is not None:
        raise ConfigError(
            f"model.name_or_path={config.name_or_path!r}: the Hugging Face Hub cannot be reached "
            f"({unreachable}) and the model is not in the local Hugging Face cache; allowed: an "
            "existing local directory, a reachable hub id, or a built-in name"
        )
    try:
        return AutoConfig.from_pretrained(source, **pretrained_kwargs(config))
    except OSError as error:  # a hub id that does not exist or cannot be reached
        raise ConfigError(
            f"model.name_or_path={config.name_or_path!r}: cannot load the model ({error}); "
            "allowed: an existing local directory, a reachable hub id, or a built-in name"
        ) from None


def hub_unreachable(repo_id: str, revision: str | None) -> str | None:
    """Why the hub cannot be asked about ``repo_id`` (a connection error), or None when the
    model's config is cached or the hub answers (whatever it says: transformers then loads or
    names the problem). One request without retries: transformers would retry an unreachable
    hub with backoff for about 20 s before failing."""
    from huggingface_hub import model_info, try_to_load_from_cache
    from huggingface_hub.errors import HfHubHTTPError

    if try_to_load_from_cache(repo_id, "config.json", revision=revision) is not None:
        return None
    try:
        model_info(repo_id, revision=revision, timeout=10)
    except HfHubHTTPError:  # an answer: not found, gated, unauthorised
        return None
    except Exception as error:  # no answer: DNS, refused, timed out, offline mode
        return f"{type(error).__name__}: {error}"
    return None


def resolve_kind(config: ModelConfig, hf_config: PretrainedConfig) -> str:
    if config.kind != "auto":
        return config.kind
    return "masked" if hf_config.model_type in _MASKED_TYPES else "causal"


def load_model(config: ModelConfig, cache_dir: Path, progress: bool = True) -> LoadedModel:
    """Load weights and tokenizer; every parameter is frozen (updates are in-place sweeps)."""
    device = resolve_device(config.device)
    source = resolve_source(config, cache_dir, progress)
    hf_config = _load_hf_config(config, source)
    kind = resolve_kind(config, hf_config)
    check_weight_files(config, source)
    try:
        auto_class = AutoModelForMaskedLM if kind == "masked" else AutoModelForCausalLM
        pinned = pretrained_kwargs(config)
        tokenizer = load_tokenizer(config, source)  # before the weights: its refusal is cheap
        # with output_loading_info, from_pretrained returns (model, its loading report)
        model, loading = cast(
            "tuple[PreTrainedModel, dict[str, Any]]",
            auto_class.from_pretrained(
                source, dtype=DTYPES[config.dtype], output_loading_info=True, **pinned
            ),
        )
    except OSError as error:  # a hub id that does not exist or cannot be reached
        raise ConfigError(
            f"model.name_or_path={config.name_or_path!r}: cannot load the model ({error}); "
            "allowed: an existing local directory, a reachable hub id, or a built-in name"
        ) from None
    except safetensors.SafetensorError as error:  # a hub download's file, damaged in its cache
        raise _damaged_weights(config, source, error) from None
    check_weights_fit(config, hf_config, model, loading)
    # typeshed's functools.wraps (on transformers' PreTrainedModel.to) does not bind self
    model.to(device).eval()  # type: ignore[arg-type]
    model.requires_grad_(False)
    return LoadedModel(model, tokenizer, kind, source, device, loaded_commit(config, hf_config))


def check_weight_files(config: ModelConfig, source: str) -> None:
    """Refuse a local directory whose safetensors files are damaged or cut short (a copy that
    stopped midway): only their headers are read, which name every tensor's byte range, so a
    file shorter than those ranges is found without loading any weights."""
    directory = Path(source)
    if not directory.is_dir():
        return
    for path in sorted(directory.glob("*.safetensors")):
        try:
            with safetensors.safe_open(str(path), framework="pt"):
                pass
        except safetensors.SafetensorError as error:
            raise _damaged_weights(config, str(path), error) from None


def _damaged_weights(config: ModelConfig, path: str, error: Exception) -> ConfigError:
    return ConfigError(
        f"model.name_or_path={config.name_or_path!r}: the weight file {path!r} is damaged or "
        f"cut short ({error}); copy it again, or save the model again with save_pretrained"
    )


def check_weights_fit(
    config: ModelConfig,
    hf_config: PretrainedConfig,
    model: PreTrainedModel,
    loading: dict[str, Any],
) -> None:
    """Refuse weights that mostly do not fit the architecture config.json names (a gpt2
    config.json over OPT weights): transformers would initialise them at random and train that."""
    missing = len(loading.get("missing_keys") or ())
    expected = len(model.state_dict())
    if 2 * missing <= expected:  # a few new tensors (a task head) are expected
        return
    unexpected = len(loading.get("unexpected_keys") or ())
    raise ConfigError(
        f"model.name_or_path={config.name_or_path!r}: {missing} of the {expected} tensors of "
        f"the {hf_config.model_type!r} architecture its config.json names are not in its "
        f"weight files ({unexpected} tensors there fit none of its names), so they would be "
        "randomly initialised: the config.json does not describe these weights; allowed: a "
        "directory written by save_pretrained, its config.json unchanged"
    )


def loaded_commit(config: ModelConfig, hf_config: PretrainedConfig) -> str | None:
    """The hub commit the weights came from (transformers keeps it as the config's
    ``_commit_hash``); None for a built-in or local model, which has no hub commit."""
    if not is_hub_id(config.name_or_path):
        return None
    return getattr(hf_config, "_commit_hash", None) or config.revision


def load_tokenizer(config: ModelConfig, source: str) -> PreTrainedTokenizerBase:
    """The model's tokenizer, fast or slow as ``model.tokenizer_use_fast`` asks.

    A slow tokenizer that cannot be had is refused rather than replaced by the fast one: the
    setting exists for token-for-token parity with code that used the slow one (MeZO's OPT
    runs), and transformers 5 ignores ``use_fast`` and loads the fast tokenizer silently.
    """
    pinned = pretrained_kwargs(config)
    if config.tokenizer_use_fast:
        return AutoTokenizer.from_pretrained(source, use_fast=True, **pinned)
    try:
        tokenizer = AutoTokenizer.from_pretrained(source, use_fast=False, **pinned)
    except ValueError as error:  # transformers 4: a directory with no slow tokenizer files
        reason = str(error)
    else:
        if not tokenizer.is_fast:
            return tokenizer
        reason = f"transformers {transformers.__version__} loaded {type(tokenizer).__name__}"
    raise ConfigError(
        f"model.tokenizer_use_fast=false: {config.name_or_path!r} has no slow tokenizer here "
        f"({reason}; transformers 5 and later have fast tokenizers only); allowed: "
        "model.tokenizer_use_fast=true, or transformers<5 with the model's slow tokenizer files"
    )


# Position tables that reserve the first padding_idx + 1 rows (RoBERTa style).
_OFFSET_POSITIONS = {"roberta", "xlm-roberta", "camembert"}


def position_limit(hf_config: PretrainedConfig, config: ModelConfig) -> int | None:
    """The most input tokens the model's position table takes (None if it has no limit field).

    A prefix view's virtual tokens take positions too, so they come off the limit.
    """
    limit = getattr(hf_config, "max_position_embeddings", None) or getattr(
        hf_config, "n_positions", None
    )
    if limit is None:
        return None
    if hf_config.model_type in _OFFSET_POSITIONS:
        limit -= (hf_config.pad_token_id or 0) + 1
    if config.trainable == "prefix":
        limit -= config.peft.prefix_tokens
    return limit


def apply_view(
    model: PreTrainedModel, config: ModelConfig, seed: int
) -> tuple[torch.nn.Module, list[tuple[str, torch.nn.Parameter]]]:
    """The model to run (possibly peft-wrapped) and the (name, parameter) pairs it trains.

    ``seed`` (public) fixes the adapters' initialisation, so replay rebuilds the same start.
    """
    try:
        return apply_peft_view(
            model,
            config.trainable,
            seed=seed,
            lora_rank=config.peft.lora_rank,
            lora_alpha=config.peft.lora_alpha,
            lora_target_modules=config.peft.lora_target_modules,
            prefix_tokens=config.peft.prefix_tokens,
        )
    except ValueError as error:
        raise ConfigError(f"model.trainable={config.trainable!r}: {error}") from None


def model_parameters(model: torch.nn.Module) -> int:
    """Parameter count of the model (tied weights counted once; a ZeRO-3 partitioned parameter
    by its full size, ``ds_numel``, not its empty local placeholder)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


@runtime_checkable
class SavesPretrained(Protocol):
    """A Hugging Face or peft model: what every PEFT view runs, saved in its own format."""

    def save_pretrained(self, save_directory: str | Path, **kwargs: Any) -> Any: ...


def save_weights(model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """HF format: the whole model for full / bitfit, the adapter (peft format) for lora / prefix."""
    assert isinstance(model, SavesPretrained), "a view runs a Hugging Face or peft model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
