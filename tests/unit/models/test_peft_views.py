"""PEFT views: what each view trains, that zeroth-order steps touch only that, and replay."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedModel

from privzo.config import ModelConfig
from privzo.models.builtin import SPECIAL_TOKENS
from privzo.models.loading import LoadedModel, load_model
from privzo.models.peft_views import PEFT_VIEWS, apply_peft_view, unwrap_for_scoring
from privzo.tasks.classification import Batch, score_label_logits
from privzo.zo.directions import DirectionSampler, step_seed
from privzo.zo.estimators import MeanEstimator
from privzo.zo.perturbation import InPlacePerturber
from privzo.zo.step import zo_step
from privzo.zo.sweeps import full_shards
from privzo.zo.trajectory import TrajectoryMeta, TrajectoryRecorder, read_trajectory, replay_steps

peft = pytest.importorskip("peft")

CASES = [
    ("tiny-opt", "full"),
    ("tiny-opt", "bitfit"),
    ("tiny-opt", "lora"),
    ("tiny-opt", "prefix"),
    ("tiny-roberta", "lora"),
    ("tiny-roberta", "prefix"),
]
ADAPTER_CASES = [case for case in CASES if case[1] in ("lora", "prefix")]
SEED = 1234
STEPS = 4
SCALE = 1e-3
LABEL_TOKENS = torch.tensor([10, 11])
# Where LoRA lands by default (query and value projections) in each tiny model.
LORA_LAYERS = {
    "tiny-opt": ("base_model.model.model.decoder.layers.{}.self_attn.{}", ("q_proj", "v_proj")),
    "tiny-roberta": (
        "base_model.model.roberta.encoder.layer.{}.attention.self.{}",
        ("query", "value"),
    ),
}


@pytest.fixture(scope="module")
def load(cache_dir: Path):
    """A fresh, frozen, eval-mode base model on each call (the engine's own loading path)."""

    def _load(name: str) -> LoadedModel:
        return load_model(ModelConfig(name_or_path=name), cache_dir, progress=False)

    return _load


def _batch(loaded: LoadedModel) -> Batch:
    """Four seeded prompts of different lengths, right-padded, scored like a real task."""
    config = loaded.model.config
    generator = torch.Generator().manual_seed(0)
    lengths = [8, 6, 7, 5]
    input_ids = torch.full((4, 8), config.pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((4, 8), dtype=torch.long)
    positions = []
    for row, length in enumerate(lengths):
        input_ids[row, :length] = torch.randint(
            5, config.vocab_size, (length,), generator=generator
        )
        input_ids[row, 0] = config.bos_token_id
        attention_mask[row, :length] = 1
        if loaded.kind == "masked":
            input_ids[row, length - 1] = config.eos_token_id
            input_ids[row, length - 2] = SPECIAL_TOKENS.index("<mask>")
            positions.append(length - 2)
        else:
            positions.append(length - 1)
    labels = torch.tensor([0, 1, 0, 1])
    return Batch(input_ids, attention_mask, torch.tensor(positions), labels)


def _scores(model: nn.Module, batch: Batch) -> torch.Tensor:
    return score_label_logits(unwrap_for_scoring(model), batch, LABEL_TOKENS)


def _loss_fn(model: nn.Module):
    scorer = unwrap_for_scoring(model)

    def per_example(batch: Batch) -> torch.Tensor:
        logits = score_label_logits(scorer, batch, LABEL_TOKENS)
        return F.cross_entropy(logits, batch.labels, reduction="none")

    return per_example


def _perturber(pairs: list[tuple[str, nn.Parameter]]) -> InPlacePerturber:
    return InPlacePerturber(full_shards(pairs), DirectionSampler("gaussian"))


def _train(model: nn.Module, pairs, batch: Batch, recorder: TrajectoryRecorder) -> None:
    perturber, loss_fn = _perturber(pairs), _loss_fn(model)
    for step in range(STEPS):
        record = zo_step(
            step=step,
            seed=step_seed(7, step),
            perturber=perturber,
            batch=batch,
            batch_size=len(batch),
            loss_fn=loss_fn,
            estimator=MeanEstimator(),
            learning_rate=0.05,
            perturbation_scale=SCALE,
        )
        recorder.append(record)


def _recorder(model_name: str, view: str) -> TrajectoryRecorder:
    meta = TrajectoryMeta(
        SCALE, "gaussian", "cpu", view, {}, SEED, model_name, "float32", "inplace"
    )
    return TrajectoryRecorder(meta, release_batch_size=False)


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _base_named(model: nn.Module) -> dict[str, nn.Parameter]:
    """The wrapped model's base weights under their original names (LoRA adds '.base_layer')."""
    underlying = model.get_base_model() if isinstance(model, peft.PeftModel) else model
    named = underlying.named_parameters()
    return {name.replace(".base_layer.", "."): p for name, p in named}


def _expected_names(model_name: str, view: str, base: nn.Module) -> list[str]:
    base_names = [name for name, _ in base.named_parameters()]
    if view == "full":
        return base_names
    if view == "bitfit":
        return [name for name in base_names if name.endswith(".bias")]
    if view == "prefix":
        return ["prompt_encoder.default.embedding.weight"]
    layer, targets = LORA_LAYERS[model_name]
    return [
        f"{layer.format(i, target)}.lora_{matrix}.default.weight"
        for i in range(2)
        for target in targets
        for matrix in "AB"
    ]


@pytest.mark.parametrize(("model_name", "view"), CASES)
def test_view_trains_exactly_the_intended_tensors(load, model_name, view):
    base = load(model_name).model
    expected = _expected_names(model_name, view, load(model_name).model)
    model, pairs = apply_peft_view(base, view, seed=SEED)
    names = [name for name, _ in pairs]
    assert sorted(names) == sorted(expected) and len(names) == len(set(names))
    assert len({p.data_ptr() for _, p in pairs}) == len(pairs)  # tied weights listed once
    assert not any(p.requires_grad for p in model.parameters())
    assert not any(module.training for module in model.modules())  # adapter dropout stays off
    if view == "lora":
        assert all(p.shape in {(8, 32), (32, 8)} for _, p in pairs)
    if view == "prefix":  # prefix_tokens × (2 · layers · hidden): one key and value per layer
        assert pairs[0][1].shape == (5, 2 * 2 * 32)
    if view in ("full", "bitfit"):
        assert model is base and unwrap_for_scoring(model) is base


@pytest.mark.parametrize(("model_name", "view"), CASES)
def test_zo_steps_change_exactly_the_trainable_tensors(load, model_name, view):
    loaded = load(model_name)
    model, pairs = apply_peft_view(loaded.model, view, seed=SEED)
    before = _snapshot(model)
    _train(model, pairs, _batch(loaded), _recorder(model_name, view))
    trainable = {name for name, _ in pairs}
    changed = {name for name, p in model.named_parameters() if not torch.equal(p, before[name])}
    assert changed == trainable
    fresh = dict(load(model_name).model.named_parameters())
    trainable_storage = {p.data_ptr() for _, p in pairs}
    frozen = {n: p for n, p in _base_named(model).items() if p.data_ptr() not in trainable_storage}
    assert view == "full" or frozen
    for name, parameter in frozen.items():
        assert torch.equal(parameter, fresh[name]), name


@pytest.mark.parametrize(("model_name", "view"), CASES)
def test_replay_on_a_fresh_base_reproduces_every_tensor(load, tmp_path, model_name, view):
    loaded = load(model_name)
    model, pairs = apply_peft_view(loaded.model, view, seed=SEED)
    recorder = _recorder(model_name, view)
    _train(model, pairs, _batch(loaded), recorder)
    recorder.write(tmp_path / "trajectory.parquet")
    table, meta = read_trajectory(tmp_path / "trajectory.parquet")

    replayed, replay_pairs = apply_peft_view(load(model_name).model, view, seed=SEED)
    at_init = _snapshot(replayed)
    assert replay_steps(_perturber(replay_pairs), table, meta) == STEPS
    trained = dict(model.named_parameters())
    assert [n for n, _ in replayed.named_parameters()] == list(trained)
    for name, parameter in replayed.named_parameters():
        assert torch.equal(parameter, trained[name]), name
    assert any(not torch.equal(p, at_init[name]) for name, p in replay_pairs)


@pytest.mark.parametrize(("model_name", "view"), ADAPTER_CASES)
def test_adapter_init_is_a_function_of_the_seed_only(load, model_name, view):
    rng_before = torch.get_rng_state()
    _, first = apply_peft_view(load(model_name).model, view, seed=SEED)
    torch.manual_seed(999)  # the global RNG must play no part
    _, same = apply_peft_view(load(model_name).model, view, seed=SEED)
    _, other = apply_peft_view(load(model_name).model, view, seed=SEED + 1)
    for (name, a), (_, b) in zip(first, same, strict=True):
        assert torch.equal(a, b), name
    for (name, a), (_, c) in zip(first, other, strict=True):
        if ".lora_B." in name:  # B starts at zero whatever the seed
            assert not a.any() and not c.any(), name
        else:
            assert not torch.equal(a, c), name
    torch.set_rng_state(rng_before)
    _, again = apply_peft_view(load(model_name).model, view, seed=SEED)
    assert torch.equal(torch.get_rng_state(), rng_before)  # the view drew nothing from it
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(first, again, strict=True))


@pytest.mark.parametrize("model_name", ["tiny-opt", "tiny-roberta"])
def test_lora_scoring_equals_the_base_at_init_and_moves_with_the_adapters(load, model_name):
    loaded = load(model_name)
    batch = _batch(loaded)
    base_scores = _scores(loaded.model, batch)
    model, pairs = apply_peft_view(load(model_name).model, "lora", seed=SEED)
    scorer = unwrap_for_scoring(model)
    assert isinstance(scorer, PreTrainedModel) and scorer is not model
    assert any(".lora_A." in name for name, _ in scorer.base_model.named_parameters())
    assert torch.equal(_scores(model, batch), base_scores)  # B = 0: the adapters add nothing
    _perturber(pairs).perturb(3, 0.05)
    assert not torch.allclose(_scores(model, batch), base_scores, atol=1e-6)


@pytest.mark.parametrize("model_name", ["tiny-opt", "tiny-roberta"])
def test_prefix_scoring_matches_peft_forward_and_moves_with_the_prefix(load, model_name):
    loaded = load(model_name)
    batch = _batch(loaded)
    base_scores = _scores(loaded.model, batch)
    model, pairs = apply_peft_view(load(model_name).model, "prefix", seed=SEED)
    scores = _scores(model, batch)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    peft_scores = logits[torch.arange(len(batch)), batch.positions][:, LABEL_TOKENS]
    torch.testing.assert_close(scores, peft_scores, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(scores, base_scores, atol=1e-4)  # the prefix is attended to
    _perturber(pairs).perturb(3, 0.05)
    assert not torch.allclose(_scores(model, batch), scores, atol=1e-6)


def test_padding_does_not_leak_into_prefix_scores(load):
    """The prefix's attention mask is prepended, so right padding must not change a score."""
    loaded = load("tiny-opt")
    model, _ = apply_peft_view(loaded.model, "prefix", seed=SEED)
    batch = _batch(loaded)
    padded = _scores(model, batch)[3]
    length = int(batch.attention_mask[3].sum())
    alone = Batch(
        batch.input_ids[3:, :length],
        batch.attention_mask[3:, :length],
        batch.positions[3:],
        batch.labels[3:],
    )
    torch.testing.assert_close(_scores(model, alone)[0], padded, rtol=1e-5, atol=1e-6)


def test_unknown_view_and_missing_biases_are_rejected():
    layer = nn.Sequential(nn.Linear(4, 4, bias=False))
    with pytest.raises(ValueError, match="allowed"):
        apply_peft_view(layer, "adapters", seed=0)
    with pytest.raises(ValueError, match="no bias"):
        apply_peft_view(layer, "bitfit", seed=0)
    assert set(PEFT_VIEWS) == {"full", "bitfit", "lora", "prefix"}


def test_prefix_names_an_unverified_model_type():
    config = GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=16, n_positions=16)
    with pytest.raises(ValueError, match="gpt2"):
        apply_peft_view(GPT2LMHeadModel(config), "prefix", seed=0)


def test_an_empty_lora_target_list_is_refused_not_read_as_the_defaults():
    from privzo.config import ConfigError, load_config

    with pytest.raises(ConfigError, match=r"lora_target_modules: an empty list adapts nothing"):
        load_config(None, ["model.trainable=lora", "model.peft.lora_target_modules=[]"])
    config = load_config(None, ["model.peft.lora_target_modules=[q_proj]"])
    assert config.model.peft.lora_target_modules == ["q_proj"]
