"""Rebuild fine-tuned weights from a base model and a trajectory."""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import torch

from privzo.models.config import ModelConfig
from privzo.models.loading import (
    LoadedModel,
    apply_view,
    is_hub_id,
    load_model,
    resolve_device,
    save_weights,
)
from privzo.rundir.trajectory import read_run_trajectory
from privzo.zo.directions import DirectionSampler
from privzo.zo.integrity import check_fingerprint, rounding_rtol, weights_fingerprint
from privzo.zo.perturbation import Perturber, make_perturber
from privzo.zo.sweeps import full_shards
from privzo.zo.trajectory import TrajectoryMeta, replay_steps


@dataclass
class ReplaySetup:
    """The base model with the run's view, ready to step through its trajectory."""

    loaded: LoadedModel
    model: torch.nn.Module  # with its view (the peft wrapper for lora / prefix)
    perturber: Perturber
    table: pa.Table
    meta: TrajectoryMeta


def replay(
    base: str,
    trajectory_path: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> tuple[LoadedModel, torch.nn.Module, int]:
    """The base model with the run's PEFT view and every step of the trajectory applied.

    ``device`` / ``dtype`` default to the training run's. Philox trajectories replay on any
    device type (within the tolerance in docs/performance/index.md, "The step on GPUs");
    ``dtype='float32'`` rebuilds a half-precision run into fp32 weights: the updates it
    intended, without its roundings.
    Returns the loaded base, the model with its view (the peft wrapper for lora / prefix), and
    the number of steps replayed.
    """
    setup = prepare_replay(
        base, trajectory_path, cache_dir=cache_dir, progress=progress, device=device, dtype=dtype
    )
    steps = replay_steps(setup.perturber, setup.table, setup.meta)
    return setup.loaded, setup.model, steps


def prepare_replay(
    base: str,
    trajectory_path: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> ReplaySetup:
    """Load the base with the view and directions the trajectory was trained with (an auditor
    steps through it with ``replay_steps(..., at_perturbed=...)``)."""
    table, meta = read_run_trajectory(trajectory_path)  # with its run's key, where it is beside
    model_config = ModelConfig.model_validate(
        {
            "name_or_path": base,
            "device": device or meta.device_type,
            "dtype": dtype or meta.dtype,
            "trainable": meta.trainable,
            "peft": meta.view_options,
            "revision": replay_revision(base, meta),
        }
    )
    check_replay_target(meta, model_config)
    loaded = load_model(model_config, cache_dir, progress=progress)
    if meta.base_fingerprint is not None:
        actual = weights_fingerprint(loaded.model.named_parameters())
        rtol = rounding_rtol(meta.dtype, model_config.dtype)
        check_fingerprint(meta.base_fingerprint, actual, base, rtol=rtol)
    model, pairs = apply_view(loaded.model, model_config, seed=meta.view_seed)
    directions = DirectionSampler(meta.direction, loaded.device, meta.generator)
    perturber = make_perturber(model, full_shards(pairs), directions)
    return ReplaySetup(loaded, model, perturber, table, meta)


def replay_revision(base: str, meta: TrajectoryMeta) -> str | None:
    """The hub commit the run trained on, where the replay's base is that same hub id: the
    branch may have moved since, and the fingerprint would refuse other weights. A local copy
    of the base is loaded as it is (its fingerprint is checked)."""
    if meta.model_revision is None or base != meta.model or not is_hub_id(base):
        return None
    return meta.model_revision


def check_replay_target(meta: TrajectoryMeta, target: ModelConfig) -> None:
    """Refuse, before loading, a device or dtype the trajectory cannot be replayed into."""
    device_type = resolve_device(target.device).type
    if meta.generator == "torch-blocks" and device_type != meta.device_type:
        raise ValueError(
            f"this trajectory's directions come from the {meta.device_type} torch generator "
            f"(optimizer.generator=torch-blocks), which {device_type} cannot reproduce; replay "
            f"it with --device {meta.device_type} (philox trajectories replay on any device)"
        )
    if meta.perturbation == "inplace" and target.dtype != "float32":
        raise ValueError(
            f"this trajectory trained float32 weights; replaying it into {target.dtype} would "
            "round them: use --dtype float32"
        )


def replay_to_directory(
    base: str,
    trajectory_path: Path,
    output_dir: Path,
    *,
    cache_dir: Path,
    progress: bool = True,
    device: str | None = None,
    dtype: str | None = None,
) -> int:
    """Replay and save the weights and tokenizer in HF format; returns the steps replayed."""
    loaded, model, steps = replay(
        base, trajectory_path, cache_dir=cache_dir, progress=progress, device=device, dtype=dtype
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    save_weights(model, loaded.tokenizer, output_dir)
    return steps


# --- the run's model in MLflow: base reference + trajectory, rebuilt by replay on load ---------

MODEL_LOADER = "privzo.replay"  # MLflow imports this module and calls its ``_load_pyfunc``
MODEL_BASE_FILE = "base.json"
MODEL_TRAJECTORY_FILE = "trajectory.parquet"


def write_model_data(directory: Path, base: str, trajectory_path: Path, cache_dir: Path) -> Path:
    """What a run logs as its MLflow model: the base reference and the trajectory (kilobytes,
    no weights). ``cache_dir`` is where a built-in base is built on load."""
    directory.mkdir(parents=True, exist_ok=True)
    reference = {"base": base, "cache_dir": str(Path(cache_dir).resolve())}
    (directory / MODEL_BASE_FILE).write_text(json.dumps(reference, indent=2) + "\n")
    shutil.copyfile(trajectory_path, directory / MODEL_TRAJECTORY_FILE)
    return directory


class ReplayedModel:
    """A run's fine-tuned model as ``mlflow.pyfunc.load_model`` gives it back: the base with
    every trajectory step replayed (checked against the base's fingerprint).

    ``get_raw_model()`` is the torch model (with its peft view for lora / prefix runs);
    ``predict(texts)`` gives each text's mean next-token loss under it (lower: likelier), a
    task-free score that needs no label words.
    """

    def __init__(self, loaded: LoadedModel, model: torch.nn.Module, steps: int) -> None:
        self.loaded, self.model, self.steps = loaded, model, steps

    @property
    def tokenizer(self) -> Any:
        return self.loaded.tokenizer

    def get_raw_model(self) -> torch.nn.Module:
        return self.model

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> list[float]:
        texts = _texts(model_input)
        losses = []
        with torch.no_grad():
            for text in texts:
                encoded = self.tokenizer(text, return_tensors="pt").to(self.loaded.device)
                output = self.model(**encoded, labels=encoded["input_ids"])
                losses.append(float(output.loss))
        return losses


def _texts(model_input: Any) -> list[str]:
    """Texts from a string, a list of strings, or a DataFrame's ``text`` (or only) column."""
    if isinstance(model_input, str):
        return [model_input]
    columns = getattr(model_input, "columns", None)
    if columns is not None:
        column = "text" if "text" in columns else columns[0]
        return [str(value) for value in model_input[column]]
    return [str(value) for value in model_input]


def _load_pyfunc(data_path: str) -> ReplayedModel:
    """MLflow's pyfunc entry point for a model logged by a run (see ``write_model_data``)."""
    directory = Path(data_path)
    reference = json.loads((directory / MODEL_BASE_FILE).read_text())
    loaded, model, steps = replay(
        reference["base"],
        directory / MODEL_TRAJECTORY_FILE,
        cache_dir=Path(reference["cache_dir"]),
        progress=False,
    )
    model.eval()
    return ReplayedModel(loaded, model, steps)
