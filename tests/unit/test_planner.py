"""The memory planner: exact parameter counts, placement decisions, and the activation formula
checked against a real forward on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from transformers import OPTConfig, OPTForCausalLM

from privzo.planner import (
    OPT_SIZES,
    OPTArch,
    arch_from_config,
    count_parameters,
    measure_forward_peak_mb,
    plan,
)


def _small_config(**overrides: object) -> OPTConfig:
    sizes = {
        "hidden_size": 48,
        "num_hidden_layers": 2,
        "ffn_dim": 96,
        "num_attention_heads": 4,
        "vocab_size": 300,
        "max_position_embeddings": 64,
    }
    return OPTConfig(**{**sizes, **overrides})


@pytest.mark.parametrize(
    "overrides",
    [
        {"word_embed_proj_dim": 48},
        # OPT-350m's layout: narrower embeddings, project in/out, no final layer norm.
        {"word_embed_proj_dim": 16, "do_layer_norm_before": False},
    ],
)
def test_count_parameters_matches_transformers(overrides: dict[str, object]) -> None:
    config = _small_config(**overrides)
    expected = sum(p.numel() for p in OPTForCausalLM(config).parameters())
    assert count_parameters(arch_from_config(config)) == expected


def test_published_sizes() -> None:
    # Exact: 125,239,296 and 1,315,758,080 (the familiar "125M" and "1.3B").
    assert count_parameters(OPT_SIZES["opt-125m"]) == 125_239_296
    assert count_parameters(OPT_SIZES["opt-1.3b"]) == 1_315_758_080
    assert abs(count_parameters(OPT_SIZES["opt-125m"]) / 125e6 - 1) < 0.01
    # 1.2% above the rounded name "1.3B": the exact count is checked above instead.
    assert abs(count_parameters(OPT_SIZES["opt-1.3b"]) / 1.3e9 - 1) < 0.015
    assert abs(count_parameters(OPT_SIZES["opt-66b"]) / 66e9 - 1) < 0.01


def test_opt_66b_needs_sharding_across_eight_gpus() -> None:
    result = plan("opt-66b", gpus=8, gpu_memory_gb=80, dtype="float16")
    assert result.strategy == "zero3"
    assert result.fits
    assert result.bytes_per_gpu < result.parameter_bytes / 2
    assert set(result.to_json()) >= {"model", "parameters", "strategy", "gpus", "bytes_per_gpu"}


def test_opt_66b_does_not_fit_one_gpu() -> None:
    result = plan("facebook/opt-66b", gpus=1, gpu_memory_gb=80)
    assert not result.fits
    assert result.to_json()["fits"] is False


def test_opt_1_3b_is_replicated() -> None:
    result = plan("opt-1.3b", gpus=8, gpu_memory_gb=80)
    assert result.strategy == "replica"
    assert result.fits
    assert result.to_json()["model"] == "opt-1.3b"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": "opt-7b", "gpus": 1, "gpu_memory_gb": 80}, "known: opt-125m"),
        ({"model": "opt-125m", "gpus": 0, "gpu_memory_gb": 80}, "gpus"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 0}, "gpu_memory_gb"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "dtype": "int3"}, "dtype"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "attention": "x"}, "attention"),
    ],
)
def test_plan_errors(kwargs: dict[str, object], message: str) -> None:
    model = kwargs.pop("model")
    with pytest.raises(ValueError, match=message):
        plan(model, **kwargs)  # type: ignore[arg-type]


cpu_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/clear_refs").exists(),
    reason="needs a resettable peak-RSS mark (/proc/self/clear_refs)",
)


@cpu_linux
@pytest.mark.parametrize(("hidden", "layers"), [(64, 2), (256, 4)])
def test_estimate_within_20_percent_of_measured_forward(hidden: int, layers: int) -> None:
    arch = OPTArch(
        layers=layers, hidden=hidden, ffn=4 * hidden, heads=4, vocab=8192, max_positions=128
    )
    measured, estimated = measure_forward_peak_mb(arch, batch_size=16, seq_len=128)
    print(f"hidden {hidden} layers {layers}: measured {measured:.1f} MiB, est {estimated:.1f}")
    assert measured > 0
    assert abs(estimated - measured) <= 0.2 * measured
