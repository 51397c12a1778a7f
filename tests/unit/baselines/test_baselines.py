"""First-order baselines (real Opacus, real MLflow on sqlite) and DPGD-0th on tiny models."""

from __future__ import annotations

import json
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conftest import autograd_per_example
from privzo.algorithms.stepper import StepMeter
from privzo.baselines.dpgd import clip_coefficients, direction_norm
from privzo.baselines.first_order import (
    FirstOrderStepper,
    trainable_parameters,
    zero_nonfinite_grad_samples,
)
from privzo.config import ConfigError, ModelConfig, load_config
from privzo.memory import PeakMemory
from privzo.models.loading import load_model
from privzo.run import build_context, plan_privacy, run
from privzo.tracking import read_run
from privzo.zo.directions import step_seed
from privzo.zo.step import estimate_differences

# Short runs in micro-batches of 3 rows, at a learning rate that moves the tiny model.
BASELINE_RUN = (
    "optimizer.steps=6",
    "optimizer.learning_rate=5e-2",
    "optimizer.physical_batch_size=3",
    "tracking.log_every=4",
)


def _base_weights(cache_dir: Path) -> dict[str, torch.Tensor]:
    return load_model(ModelConfig(name_or_path="tiny-opt"), cache_dir).model.state_dict()


def _changed(trained: dict[str, torch.Tensor], base: dict[str, torch.Tensor]) -> set[str]:
    return {name for name, tensor in trained.items() if not torch.equal(base[name], tensor)}


@pytest.mark.parametrize("view", [pytest.param("full", marks=pytest.mark.slow), "bitfit", "lora"])
def test_dpsgd_run_meets_the_budget_with_the_zeroth_order_sigma(
    tmp_path, tiny_run_config, cache_dir, view
):
    accountant = "pld" if view == "full" else "rdp"  # rdp calibrates in well under a second
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpsgd",
        f"model.trainable={view}",
        f"privacy.accountant={accountant}",
    )
    output = tmp_path / "runs" / f"dpsgd-{view}"
    summary = run(config, output, cache_dir=cache_dir, progress=False)

    assert summary["algorithm"] == "dpsgd" and summary["private"] is True
    assert summary["accountant"] == accountant
    assert summary["steps"] == 6 and summary["mechanism"] == "gaussian"
    assert 0 < summary["epsilon"] <= 3.0 * (1 + 1e-9)
    # the same (ε, δ, q, T) planned for dpzero gives the same σ
    dpzero = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpzero",
        f"privacy.accountant={accountant}",
        "privacy.noise_grid=null",  # the continuous Gaussian, as Opacus' noise
        "task.pad_to=batch",  # as the baseline pads: no truncation takes part of δ
    )
    assert summary["noise_multiplier"] == pytest.approx(plan_privacy(dpzero, 64).noise_multiplier)
    assert json.loads((output / "summary.json").read_text()) == summary.to_dict()
    assert not (output / "trajectory.parquet").exists()  # no trajectory: the weights instead
    assert (output / "model").is_dir()
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert record["status"] == "FINISHED"
    assert record["params"]["optimizer.algorithm"] == "dpsgd"
    assert [step for step, _ in record["history"]["epsilon_spent"]] == [4, 6]
    assert record["metrics"]["final_epsilon"] == pytest.approx(summary["epsilon"])
    assert "train_loss" not in record["history"]  # private diagnostics stay off
    assert {"summary.json", "config.yaml"} <= set(record["artifacts"])


def test_dp_bitfit_changes_only_biases(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpsgd",
        "model.trainable=bitfit",
        "privacy.accountant=rdp",
        "tracking.backend=none",
    )
    run(config, tmp_path / "bitfit", cache_dir=cache_dir, progress=False)
    trained = load_file(tmp_path / "bitfit" / "model" / "model.safetensors")
    changed = _changed(trained, _base_weights(cache_dir))
    biases = {name for name in trained if name.endswith(".bias")}
    assert changed and changed <= biases
    assert len(changed) >= len(biases) // 2  # noise moves (almost) every bias


def test_adamw_full_run_is_nonprivate_and_moves_every_tensor(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=adamw",
        "privacy.sampler=shuffle",
        "tracking.log_every=3",
    )
    output = tmp_path / "runs" / "adamw"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert summary["private"] is False and summary["epsilon"] is None
    assert summary["noise_multiplier"] is None and summary["mechanism"] is None
    trained = load_file(output / "model" / "model.safetensors")
    assert _changed(trained, _base_weights(cache_dir)) == set(trained)
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summary["tracking_run_id"])
    assert [step for step, _ in record["history"]["train_loss"]] == [3, 6]


def test_adamw_lora_trains_the_adapter_only(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=adamw",
        "model.trainable=lora",
        "tracking.backend=none",
    )
    summary = run(config, tmp_path / "lora", cache_dir=cache_dir, progress=False)
    adapter = load_file(tmp_path / "lora" / "model" / "adapter_model.safetensors")
    assert adapter and all("lora_" in name for name in adapter)
    assert any(float(t.abs().sum()) > 0 for n, t in adapter.items() if "lora_B" in n)  # B left 0
    assert summary["trainable_parameters"] == sum(t.numel() for t in adapter.values())


@pytest.mark.parametrize("example_major", [True, False])
def test_opacus_per_example_gradients_equal_autograd_per_example(
    tiny_run_config, cache_dir, monkeypatch, example_major
):
    """Opacus' per-example gradients are each example's own gradient, so clipping bounds what
    every example contributes: with OPT's MLP rows fed example-major (the default), and with
    the per-token rows folded back per example (the fallback for other flattened blocks)."""
    from privzo.baselines import first_order

    if not example_major:
        monkeypatch.setattr(first_order, "example_major_mlp_rows", lambda model: nullcontext())
    config = tiny_run_config(*BASELINE_RUN, "optimizer.algorithm=dpsgd", "tracking.backend=none")
    context = build_context(config, cache_dir, progress=False)
    indices = [0, 5, 9]
    parameters, expected = autograd_per_example(context, indices)

    loop = FirstOrderStepper(context, StepMeter(PeakMemory()))
    loop.start()
    try:
        loop._per_example_loss(indices).mean().backward()
        rows = {parameter.grad_sample.shape[0] for parameter in parameters}
        assert (rows == {3}) == example_major  # else OPT's flattened MLP gave B·L rows
        loop._fold_token_rows(len(indices))
        for parameter, *per_example in zip(parameters, *expected, strict=True):
            for row, gradient in enumerate(per_example):
                torch.testing.assert_close(
                    parameter.grad_sample[row], gradient, atol=1e-5, rtol=1e-4
                )
    finally:
        loop.finish()
    assert all(not parameter.requires_grad for parameter in parameters)
    assert "inner" not in " ".join(name for name, _ in context.model.named_parameters())


def test_dpsgd_empty_poisson_batch_releases_noise_of_scale_sigma_c_over_b(
    tiny_run_config, cache_dir
):
    """An empty logical batch still takes the step: pure noise N(0, σ²C²) per coordinate,
    divided by the expected batch size B, from Opacus' DPOptimizer with privzo's σ."""
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpsgd",
        "optimizer.learning_rate=1.0",
        "privacy.noise_multiplier=2.0",
        "privacy.clip=0.5",
        "privacy.accountant=rdp",
        "tracking.backend=none",
    )
    context = build_context(config, cache_dir, progress=False)
    loop = FirstOrderStepper(context, StepMeter(PeakMemory()))
    parameters = trainable_parameters(context)
    before = torch.cat([p.detach().flatten().clone() for p in parameters])
    loop.start()
    try:
        loop._physical = iter([[]])  # the batch manager's view of an empty Poisson batch
        assert loop.optimizer.secure_mode  # noise robust to floating-point attacks
        losses, empty = loop._private_step()
    finally:
        loop.finish()
    assert losses == [] and empty
    step = torch.cat([p.detach().flatten() for p in parameters]) - before
    expected_std = 1.0 * 2.0 * 0.5 / 8  # learning rate · σ · C / B
    assert float(step.std()) == pytest.approx(expected_std, rel=0.05)  # 28k coordinates
    assert abs(float(step.mean())) < 5 * expected_std / step.numel() ** 0.5


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["optimizer.algorithm=dpsgd", "privacy.sampler=shuffle"], "privacy.sampler"),
        (["optimizer.physical_batch_size=0"], "physical_batch_size"),
    ],
)
def test_bad_baseline_settings_fail_at_load(overrides, field):
    with pytest.raises(ConfigError, match=field):
        load_config(None, overrides)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (["optimizer.algorithm=dpsgd", "model.trainable=prefix"], "model.trainable"),
        (["optimizer.algorithm=adamw", "privacy.noise_multiplier=1.0"], "privacy.noise_multiplier"),
        (["optimizer.algorithm=dpsgd", "privacy.mechanism=laplace"], "privacy.mechanism"),
        (["optimizer.algorithm=adamw", "privacy.mechanism=gaussian"], "privacy.mechanism"),
    ],
)
def test_what_a_baseline_cannot_do_is_refused_by_its_registry_entry(overrides, field):
    from privzo.algorithms.registry import check_capabilities

    with pytest.raises(ConfigError, match=field):
        check_capabilities(load_config(None, overrides))


# --- DPGD-0th ------------------------------------------------------------------------------


def test_dpgd_run_meets_the_budget_and_noises_every_tensor(tmp_path, tiny_run_config, cache_dir):
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpgd-0th",
        "optimizer.learning_rate=1e-3",
        "privacy.accountant=rdp",
    )
    output = tmp_path / "runs" / "dpgd"
    summary = run(config, output, cache_dir=cache_dir, progress=False)
    assert summary["algorithm"] == "dpgd-0th" and summary["steps"] == 6
    assert 0 < summary["epsilon"] <= 3.0 * (1 + 1e-9)
    dpzero = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpzero",
        "privacy.accountant=rdp",
        "privacy.noise_grid=null",  # the continuous Gaussian, which dpgd-0th's d-dim noise is
        "task.pad_to=batch",  # as the baseline pads: no truncation takes part of δ
    )
    assert summary["noise_multiplier"] == pytest.approx(plan_privacy(dpzero, 64).noise_multiplier)
    assert not (output / "trajectory.parquet").exists()
    trained = load_file(output / "model" / "model.safetensors")
    assert _changed(trained, _base_weights(cache_dir)) == set(trained)  # d-dimensional noise


def test_dpgd_refuses_a_model_above_the_size_cap_before_writing(
    tmp_path, tiny_run_config, cache_dir
):
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpgd-0th",
        "optimizer.dpgd_max_parameters=1000",
        "privacy.accountant=rdp",
    )
    with pytest.raises(ConfigError, match="dpgd_max_parameters=1000"):
        run(config, tmp_path / "too-big", cache_dir=cache_dir, progress=False)
    assert not (tmp_path / "too-big").exists()


def test_dpgd_clipping_bounds_every_per_example_vector(tiny_run_config, cache_dir):
    config = tiny_run_config(*BASELINE_RUN, "optimizer.algorithm=dpgd-0th", "tracking.backend=none")
    context = build_context(config, cache_dir, progress=False)
    perturber, seed = context.perturber, step_seed(config.seed, 0)
    batch = context.task.collate(context.train, list(range(16)))
    differences, _ = estimate_differences(
        perturber,
        seed,
        1e-3,
        1e-3,
        batch,
        16,
        lambda b: context.task.per_example_loss(context.scoring_model, b),
    )
    perturber.update(seed, 0.0)  # back to θ
    norm = direction_norm(context.shards, perturber.sampler, seed)
    whole = torch.cat(
        [perturber.sampler.slice(seed, s.name, s.size, 0, s.size) for s in context.shards]
    )
    assert norm == pytest.approx(float(whole.double().norm()), rel=1e-9)
    clip = float(differences.abs().median()) * norm  # about half the examples get clipped
    coefficients = clip_coefficients(differences, norm, clip)
    vector_norms = coefficients.abs() * norm  # ‖c_i z‖ of each example's contribution
    assert bool((vector_norms <= clip * (1 + 1e-12)).all())
    small = differences.double().abs() * norm <= clip
    assert 0 < int(small.sum()) < 16
    torch.testing.assert_close(coefficients[small], differences.double()[small])
    torch.testing.assert_close(vector_norms[~small], torch.full_like(vector_norms[~small], clip))
    assert bool((torch.sign(coefficients) == torch.sign(differences.double())).all())


# --- privzo bench memory -------------------------------------------------------------------


def test_dpsgd_zeroes_and_counts_a_non_finite_per_example_gradient(tiny_run_config, cache_dir):
    """A finite loss can still back-propagate to a non-finite gradient (an overflow in the
    backward); Opacus' clip factor is then NaN and the noisy sum of the step NaN. The example
    must contribute nothing, be counted, and the step stay finite."""
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpsgd",
        "privacy.noise_multiplier=2.0",
        "privacy.accountant=rdp",
        "tracking.backend=none",
    )
    context = build_context(config, cache_dir, progress=False)
    loop = FirstOrderStepper(context, StepMeter(PeakMemory()))
    parameters = trainable_parameters(context)
    loop.start()
    try:
        loop._per_example_loss([0, 5, 9]).mean().backward()
        loop._fold_token_rows(3)
        parameters[0].grad_sample[1].view(-1)[0] = float("nan")  # example 5's gradient
        parameters[-1].grad_sample[2].view(-1)[0] = float("inf")  # example 9's gradient
        kept = parameters[0].grad_sample[0].clone()
        unusable = zero_nonfinite_grad_samples(parameters, 3)
        assert unusable.tolist() == [False, True, True]
        assert all(float(p.grad_sample[1:].abs().sum()) == 0 for p in parameters)
        assert torch.equal(parameters[0].grad_sample[0], kept)  # a finite example is untouched
        loop.optimizer.step()
        assert all(torch.isfinite(p).all() for p in parameters)
    finally:
        loop.finish()


def _secure_draw(size: int, std: float, seed: int) -> torch.Tensor:
    """The secure-mode noise recomputed from its definition: per block of 2¹⁸ elements, four
    fp32 draws N(0, std²) in order, summed and halved."""
    generator = torch.Generator().manual_seed(seed)
    blocks = []
    for start in range(0, size, 2**18):
        count = min(2**18, size - start)
        draws = [torch.empty(count).normal_(0.0, std, generator=generator) for _ in range(4)]
        blocks.append((((draws[0] + draws[1]) + draws[2]) + draws[3]) * 0.5)
    return torch.cat(blocks)


def test_secure_gaussian_noise_has_the_variance_of_one_draw_and_stays_fp32():
    """Half the sum of four N(0, s²) draws is N(0, s²): 2.1M values (3 blocks and a part)
    give the variance to ±0.3 % (5 standard errors) and a Gaussian's fourth moment."""
    from privzo.privacy.mechanisms import secret_torch_generator, secure_gaussian_

    std, size = 1.7, 8 * 2**18 + 12345
    noise = secure_gaussian_(torch.empty(size), std, secret_torch_generator())
    assert noise.dtype == torch.float32
    values = noise.double()
    variance = float(values.var())
    assert variance == pytest.approx(std**2, rel=5 * (2 / size) ** 0.5)
    assert abs(float(values.mean())) < 5 * std / size**0.5
    kurtosis = float((values**4).mean()) / float((values**2).mean()) ** 2
    assert kurtosis == pytest.approx(3.0, abs=0.03)
    with pytest.raises(AssertionError):
        secure_gaussian_(torch.empty(8, dtype=torch.bfloat16), std, secret_torch_generator())


def test_dpgd_adds_its_noise_in_fp32_to_half_precision_weights(tiny_run_config, cache_dir):
    """θ_bf16 ← round(θ + c·ξ) computed in fp32, never θ + c·round_bf16(ξ), with ξ the
    secure-mode sum of four draws (a single draw would not match the recomputation)."""
    from privzo.baselines.dpgd import DpgdStepper

    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpgd-0th",
        "privacy.accountant=rdp",
        "model.dtype=bfloat16",
        "tracking.backend=none",
    )
    context = build_context(config, cache_dir, progress=False)
    loop = DpgdStepper(context, StepMeter(PeakMemory()))
    loop.start()
    loop._generator = torch.Generator().manual_seed(7)  # a known draw, to recompute it here
    before = [shard.tensor.detach().clone() for shard in context.shards]
    loop._add_noise(-0.3)
    assert loop._noise.dtype == torch.float32  # the vector added is fp32
    noise = _secure_draw(sum(t.numel() for t in before), loop.noise_std, 7)
    offset = 0
    for shard, old in zip(context.shards, before, strict=True):
        part = noise[offset : offset + old.numel()].view_as(old)
        expected = (old.float() - 0.3 * part).to(torch.bfloat16)
        assert shard.tensor.dtype == torch.bfloat16 and torch.equal(shard.tensor, expected)
        offset += old.numel()
    loop.finish()


def test_dpsgd_draws_and_adds_its_noise_in_fp32_for_a_half_precision_model(
    tiny_run_config, cache_dir
):
    """A bf16 model's noisy gradient is round_bf16(S + ξ) with the secure-mode ξ summed in
    fp32 (Opacus alone sums ξ's four draws into bf16 and adds bf16 noise to a bf16 sum)."""
    config = tiny_run_config(
        *BASELINE_RUN,
        "optimizer.algorithm=dpsgd",
        "model.trainable=bitfit",
        "model.dtype=bfloat16",
        "privacy.noise_multiplier=2.0",
        "privacy.clip=0.5",
        "privacy.accountant=rdp",
        "tracking.backend=none",
    )
    context = build_context(config, cache_dir, progress=False)
    loop = FirstOrderStepper(context, StepMeter(PeakMemory()))
    parameters = trainable_parameters(context)
    loop.start()
    try:
        optimizer = loop.optimizer
        assert optimizer.secure_mode
        sums = [torch.rand_like(p, dtype=torch.float32).to(torch.bfloat16) for p in parameters]
        for parameter, clipped_sum in zip(parameters, sums, strict=True):
            parameter.summed_grad = clipped_sum.clone()
        optimizer.generator = torch.Generator().manual_seed(11)  # a known draw, recomputed here
        optimizer.add_noise()
        replay = torch.Generator().manual_seed(11)
        std = 2.0 * 0.5
        for parameter, clipped_sum in zip(parameters, sums, strict=True):
            torch.normal(0.0, std, size=(1, 1), generator=replay)  # Opacus' discarded draw
            noise = sum(
                torch.normal(0.0, std, size=parameter.shape, generator=replay) for _ in range(4)
            )
            expected = (clipped_sum.float() + noise / 2).to(torch.bfloat16)
            assert parameter.grad.dtype == torch.bfloat16
            assert torch.equal(parameter.grad, expected)
    finally:
        loop.finish()
