"""Rebuild fine-tuned weights from a base model and a trajectory."""

from __future__ import annotations

from pathlib import Path

import torch

from privzo.config import ModelConfig
from privzo.models.loading import LoadedModel, apply_view, load_model, save_weights
from privzo.zo.directions import DirectionSampler
from privzo.zo.perturbation import make_perturber
from privzo.zo.sweeps import full_shards
from privzo.zo.trajectory import read_trajectory, replay_steps


def replay(
    base: str, trajectory_path: Path, *, cache_dir: Path, progress: bool = True
) -> tuple[LoadedModel, torch.nn.Module, int]:
    """The base model with the run's PEFT view and every step of the trajectory applied.

    Returns the loaded base, the model with its view (the peft wrapper for lora / prefix), and
    the number of steps replayed.
    """
    table, meta = read_trajectory(trajectory_path)
    model_config = ModelConfig.model_validate(
        {
            "name_or_path": base,
            "device": meta.device_type,
            "dtype": meta.dtype,
            "trainable": meta.trainable,
            "peft": meta.view_options,
        }
    )
    loaded = load_model(model_config, cache_dir, progress=progress)
    model, pairs = apply_view(loaded.model, model_config, seed=meta.view_seed)
    directions = DirectionSampler(meta.direction, loaded.device, meta.generator)
    perturber = make_perturber(model, full_shards(pairs), directions)
    steps = replay_steps(perturber, table, meta)
    return loaded, model, steps


def replay_to_directory(
    base: str, trajectory_path: Path, output_dir: Path, *, cache_dir: Path, progress: bool = True
) -> int:
    """Replay and save the weights and tokenizer in HF format; returns the steps replayed."""
    loaded, model, steps = replay(base, trajectory_path, cache_dir=cache_dir, progress=progress)
    output_dir.mkdir(parents=True, exist_ok=True)
    save_weights(model, loaded.tokenizer, output_dir)
    return steps
