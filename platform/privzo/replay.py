"""Rebuild fine-tuned weights from a base model and a trajectory."""

from __future__ import annotations

from pathlib import Path

from privzo.config import ModelConfig
from privzo.models.loading import LoadedModel, load_model, trainable_parameters
from privzo.zo.directions import DirectionSampler
from privzo.zo.perturbation import make_perturber
from privzo.zo.sweeps import full_shards
from privzo.zo.trajectory import read_trajectory, replay_steps


def replay(
    base: str, trajectory_path: Path, *, cache_dir: Path, progress: bool = True
) -> tuple[LoadedModel, int]:
    """The base model with every step of the trajectory applied, and the number of steps."""
    table, meta = read_trajectory(trajectory_path)
    model_config = ModelConfig(
        name_or_path=base, device=meta.device_type, trainable=meta.trainable, dtype=meta.dtype
    )
    loaded = load_model(model_config, cache_dir, progress=progress)
    shards = full_shards(trainable_parameters(loaded.model, meta.trainable))
    perturber = make_perturber(
        loaded.model, shards, DirectionSampler(meta.direction, loaded.device)
    )
    steps = replay_steps(perturber, table, meta)
    return loaded, steps


def replay_to_directory(
    base: str, trajectory_path: Path, output_dir: Path, *, cache_dir: Path, progress: bool = True
) -> int:
    """Replay and save the weights and tokenizer in HF format; returns the steps replayed."""
    loaded, steps = replay(base, trajectory_path, cache_dir=cache_dir, progress=progress)
    output_dir.mkdir(parents=True, exist_ok=True)
    loaded.model.save_pretrained(output_dir)
    loaded.tokenizer.save_pretrained(output_dir)
    return steps
