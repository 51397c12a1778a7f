"""The ``model`` section of a run config: which network to fine-tune, its PEFT view and device."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator

from privzo.section import Section

__all__ = ["ModelConfig", "PeftConfig"]


class PeftConfig(Section):
    """Options of the LoRA and prefix views (ignored by full and bitfit)."""

    lora_rank: int = Field(8, ge=1)
    lora_alpha: int = Field(16, ge=1)
    lora_target_modules: list[str] | None = Field(
        None,
        description="Module names to adapt (at least one); null = the architecture's q/v "
        "projections.",
    )
    prefix_tokens: int = Field(5, ge=1)

    @field_validator("lora_target_modules", mode="before")
    @classmethod
    def _names_a_module(cls, value: object) -> object:
        """An empty list would fall back to the defaults silently: it is refused instead."""
        if isinstance(value, list) and not value:
            raise ValueError(
                "an empty list adapts nothing; name at least one module, or omit the key "
                "(null) for the family's defaults"
            )
        return value


class ModelConfig(Section):
    """Which network to fine-tune and where it runs."""

    name_or_path: str = Field(
        "tiny-opt",
        description="HF hub id, local directory, or a built-in tiny model ('tiny-opt', "
        "'tiny-roberta', 'demo-opt-s', 'demo-opt-m', 'demo-opt-l').",
    )
    kind: Literal["auto", "causal", "masked"] = "auto"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    device: str = Field("cpu", description="'cpu', 'auto' or 'cuda' ('cuda:N': GPU N).")
    trainable: Literal["full", "bitfit", "lora", "prefix"] = Field(
        "full", description="The PEFT view: which tensors the run perturbs and updates."
    )
    peft: PeftConfig = Field(default_factory=PeftConfig)
    tokenizer_use_fast: bool = Field(
        True,
        description="Load the fast (Rust) tokenizer; false asks for the slow Python one, as "
        "MeZO's OPT code did (use_fast=False). transformers 5 has fast tokenizers only: there "
        "false is refused when the tokenizer loads.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        description="Hub ids only: the branch, tag or commit to load (from_pretrained's "
        "revision); null = the default branch. The commit loaded is recorded either way.",
    )

    @field_validator("device")
    @classmethod
    def _known_device(cls, device: str) -> str:
        if re.fullmatch(r"cpu|auto|cuda(:\d+)?", device) is None:
            raise ValueError("allowed: 'cpu', 'auto', 'cuda' or 'cuda:N' (GPU number N)")
        return device
