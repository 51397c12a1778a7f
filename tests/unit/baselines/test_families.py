"""Every algorithm and PEFT view on tiny Llama, Qwen2 and Mistral models (2 layers, grouped
key/value heads, RMSNorm, gated MLPs, rotary positions), and what a family cannot do refused
before its weights load."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import torch
from safetensors.torch import load_file

from conftest import autograd_per_example
from privzo.algorithms.registry import get_algorithm
from privzo.algorithms.stepper import StepMeter
from privzo.baselines.first_order import FirstOrderStepper
from privzo.config import ConfigError, ModelConfig, load_config
from privzo.memory import PeakMemory
from privzo.models.loading import check_model
from privzo.run import build_context, run
from tiny_families import save_tiny_family

FAMILIES = ("llama", "qwen2", "mistral")


@pytest.fixture(scope="module")
def family_dirs(tmp_path_factory) -> dict[str, Path]:
    """A saved model and tokenizer per family: Qwen2 with a byte-level BPE, the others with a
    SentencePiece-style one, as their checkpoints ship."""
    root = tmp_path_factory.mktemp("families")
    paths = {family: save_tiny_family(family, root / family) for family in FAMILIES}
    return paths


def _config(model_dir: Path, sentiment_files, *overrides: str):
    train, test = sentiment_files
    return load_config(
        None,
        [
            f"model.name_or_path={model_dir}",
            f"task.train_path={train}",
            f"task.test_path={test}",
            "task.test_size=8",
            "optimizer.steps=2",
            "optimizer.batch_size=4",
            "optimizer.learning_rate=1e-2",
            "privacy.accountant=rdp",
            "privacy.noise_grid=null",
            "tracking.backend=none",
            "eval_before=false",
            *overrides,
        ],
    )


CASES = [
    (family, algorithm, view)
    for family in FAMILIES
    for algorithm, view in [
        ("dpsgd", "full"),
        ("dpsgd", "lora"),
        ("dpzero", "full"),
        ("mezo", "full"),
    ]
] + [
    ("qwen2", "dpsgd", "bitfit"),  # the one family here with biases (query/key/value)
    # the other algorithms, each on one family
    ("llama", "dpzo-laplace", "full"),
    ("qwen2", "adamw", "full"),
    ("mistral", "dpgd-0th", "full"),
]


@pytest.mark.parametrize(("family", "algorithm", "view"), CASES)
def test_two_steps_of_each_algorithm_move_the_trained_tensors(
    tmp_path, family_dirs, sentiment_files, cache_dir, family, algorithm, view
):
    sampler = ["privacy.sampler=shuffle"] if algorithm == "mezo" else []
    if algorithm == "dpzo-laplace":  # Laplace noise: an accountant that bounds it
        sampler.append("privacy.accountant=pure")
    config = _config(
        family_dirs[family],
        sentiment_files,
        f"optimizer.algorithm={algorithm}",
        f"model.trainable={view}",
        *sampler,
    )
    output = tmp_path / "run"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert summary["steps"] == 2 and 0.0 <= summary["accuracy_after"] <= 1.0
    assert (summary["epsilon"] is not None) == get_algorithm(algorithm).private
    if get_algorithm(algorithm).writes_trajectory:  # the trajectory replays the run
        trajectory = pd.read_parquet(output / "trajectory.parquet")
        assert len(trajectory) == 2 and trajectory["projected_gradient"].abs().sum() > 0
        return
    weights = (
        output / "model" / ("adapter_model.safetensors" if view == "lora" else "model.safetensors")
    )
    trained = load_file(weights)
    if view == "lora":
        assert any(
            name.endswith("lora_B.weight") and t.abs().sum() > 0 for name, t in trained.items()
        )
        return
    base = load_file(family_dirs[family] / "model.safetensors")
    changed = {name for name, tensor in trained.items() if not torch.equal(base[name], tensor)}
    if view == "bitfit":
        assert changed and all(name.endswith(".bias") for name in changed)
    else:  # RMSNorm weights and the gated MLP's three projections train too
        assert any("norm" in name for name in changed) and any("gate_proj" in n for n in changed)


@pytest.mark.parametrize("family", FAMILIES)
def test_opacus_per_example_gradients_equal_autograd_per_example(
    family_dirs, sentiment_files, cache_dir, family
):
    """Opacus' per-example gradients of every Llama-family tensor (RMSNorm weights through
    Opacus' functorch fallback, the rotary attention and gated MLP's linears through its
    hooks) are each example's own gradient, so clipping bounds what every example adds."""
    config = _config(family_dirs[family], sentiment_files, "optimizer.algorithm=dpsgd")
    context = build_context(config, cache_dir, progress=False)
    indices = [0, 5, 9]
    parameters, expected = autograd_per_example(context, indices)
    stepper = FirstOrderStepper(context, StepMeter(PeakMemory()))
    stepper.start()
    try:
        stepper._per_example_loss(indices).mean().backward()
        stepper._fold_token_rows(len(indices))
        for parameter, *per_example in zip(parameters, *expected, strict=True):
            assert parameter.grad_sample.shape[0] == len(indices)
            for row, gradient in enumerate(per_example):
                torch.testing.assert_close(
                    parameter.grad_sample[row], gradient, atol=1e-5, rtol=1e-4
                )
    finally:
        stepper.finish()


@pytest.mark.parametrize(
    ("family", "view", "message"),
    [
        ("llama", "bitfit", "model type 'llama' has none"),
        ("mistral", "bitfit", "model type 'mistral' has none"),
        ("llama", "prefix", r"verified only for \['opt', 'roberta'\]"),
        ("qwen2", "prefix", r"verified only for \['opt', 'roberta'\]"),
    ],
)
def test_a_view_a_family_cannot_take_is_refused_before_weights_load(
    tmp_path, family_dirs, sentiment_files, cache_dir, family, view, message
):
    with pytest.raises(ConfigError, match=message):
        check_model(ModelConfig(name_or_path=str(family_dirs[family]), trainable=view))
    config = _config(family_dirs[family], sentiment_files, f"model.trainable={view}")
    with pytest.raises(ConfigError, match=message):
        run(config, tmp_path / "run", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "run").exists()
