"""The memory planner: exact parameter counts, placement decisions, and the activation formula
checked against a real forward on CPU."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    MistralConfig,
    OPTConfig,
    OPTForCausalLM,
    Qwen2Config,
    Qwen3Config,
)

from privzo.config import load_config
from privzo.forward_memory import estimate_activation_bytes, measure_forward_peak_mb
from privzo.models.architecture import DecoderArch, arch_from_config, count_parameters, hf_config
from privzo.models.shapes import SHAPES
from privzo.planner import (
    HOST_OVERHEAD_BYTES,
    SEQ_LEN,
    forward_shape,
    plan,
    planned_step_bytes,
    resolve_arch,
)

OPT_SIZES = {name: arch for name, arch in SHAPES.items() if name.startswith("opt-")}


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


# Small configs of each Llama-family member: grouped key/value heads, tied and untied heads, a
# head width set apart from hidden // heads (Qwen3's layout).
FAMILY_CONFIGS = {
    "llama": LlamaConfig(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False,
    ),
    "llama-tied": LlamaConfig(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, vocab_size=300, tie_word_embeddings=True,
    ),
    "mistral": MistralConfig(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=False,
    ),
    "qwen2": Qwen2Config(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=300, tie_word_embeddings=True,
    ),
    "qwen3": Qwen3Config(
        hidden_size=48, intermediate_size=80, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, vocab_size=300, tie_word_embeddings=False,
    ),
}  # fmt: skip


@pytest.mark.parametrize("name", FAMILY_CONFIGS)
def test_family_parameter_counts_match_transformers(name: str) -> None:
    config = FAMILY_CONFIGS[name]
    expected = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())
    arch = arch_from_config(config)
    assert count_parameters(arch) == expected
    # and the arch builds back into a config of the same model
    rebuilt = AutoModelForCausalLM.from_config(hf_config(arch))
    assert sum(p.numel() for p in rebuilt.parameters()) == expected


@pytest.mark.parametrize(
    ("shape", "published", "tolerance"),
    [
        # the totals the model cards and hub pages state
        ("llama-3.1-8b", 8.03e9, 0.001),
        ("llama-3.1-70b", 70.6e9, 0.002),
        ("llama-2-7b", 6.74e9, 0.001),
        ("llama-2-13b", 13.0e9, 0.002),
        ("llama-2-70b", 69.0e9, 0.002),
        ("qwen2.5-0.5b", 0.49e9, 0.01),
        ("qwen2.5-7b", 7.62e9, 0.001),
        ("qwen2.5-72b", 72.7e9, 0.001),
        ("mistral-7b", 7.24e9, 0.001),
    ],
)
def test_family_shapes_match_published_totals(
    shape: str, published: float, tolerance: float
) -> None:
    assert abs(count_parameters(SHAPES[shape]) / published - 1) < tolerance


def test_plan_reads_a_hub_id_and_a_local_directory(tmp_path: Path) -> None:
    by_id = plan("meta-llama/Llama-3.1-8B", gpus=1, gpu_memory_gb=80)
    assert by_id.model == "llama-3.1-8b" and by_id.strategy == "replica" and by_id.fits
    assert by_id.parameters == count_parameters(SHAPES["llama-3.1-8b"])
    FAMILY_CONFIGS["qwen2"].save_pretrained(tmp_path)  # config.json only, no weights
    by_directory = plan(str(tmp_path), gpus=1, gpu_memory_gb=80)
    assert by_directory.parameters == count_parameters(arch_from_config(FAMILY_CONFIGS["qwen2"]))


def test_plan_refuses_an_unmodelled_family_naming_the_known_ones(tmp_path: Path) -> None:
    from transformers import GPT2Config

    GPT2Config(n_layer=1, n_embd=32, n_head=2).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match=r"'gpt2' is not a decoder family.*known families: opt"):
        plan(str(tmp_path), gpus=1, gpu_memory_gb=80)


def test_llama_3_1_70b_is_sharded_over_eight_gpus() -> None:
    result = plan("llama-3.1-70b", gpus=8, gpu_memory_gb=80, dtype="bfloat16")
    assert result.strategy == "zero3" and result.fits
    assert not plan("llama-3.1-70b", gpus=1, gpu_memory_gb=80, dtype="bfloat16").fits


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


def test_offload_runs_opt_66b_on_one_gpu_from_host_memory() -> None:
    """Offloaded, a GPU holds no partition: only the gathered layer, activations and overhead
    of the unsharded plan; the host holds the weights, and each forward copies them once."""
    sharded = plan("opt-66b", gpus=1, gpu_memory_gb=80, dtype="float16")
    offloaded = plan(
        "opt-66b", gpus=1, gpu_memory_gb=80, dtype="float16", offload="cpu", host_memory_gb=256
    )
    assert not sharded.fits and offloaded.fits and offloaded.strategy == "zero3"
    assert offloaded.bytes_per_gpu == sharded.bytes_per_gpu - sharded.parameter_bytes
    assert offloaded.host_bytes == offloaded.parameter_bytes + HOST_OVERHEAD_BYTES
    assert offloaded.offload_bytes_per_step == 2 * offloaded.parameter_bytes
    assert offloaded.nvme_bytes == 0 and offloaded.host_fits
    small_host = plan("opt-66b", gpus=1, gpu_memory_gb=80, offload="cpu", host_memory_gb=128)
    assert small_host.host_fits is False and not small_host.fits  # 10% margin: 126 > 115 GiB


def test_nvme_offload_keeps_the_weights_on_the_drive() -> None:
    """Eight GPUs, two directions: each GPU copies its eighth of the weights four times a step;
    the host holds only each worker's swap buffers."""
    offloaded = plan("opt-66b", gpus=8, gpu_memory_gb=80, offload="nvme", forwards_per_step=4)
    assert offloaded.nvme_bytes == offloaded.parameter_bytes
    assert offloaded.offload_bytes_per_step == 4 * offloaded.parameter_bytes // 8
    in_host = plan("opt-66b", gpus=8, gpu_memory_gb=80, offload="cpu")
    assert offloaded.host_bytes < in_host.host_bytes - offloaded.parameter_bytes / 2
    assert offloaded.host_fits is None  # no host memory given: the host is not judged


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"model": "opt-7b", "gpus": 1, "gpu_memory_gb": 80},
            r"known families: opt, llama.*named shapes: tiny, tiny-llama, tiny-qwen2, "
            r"tiny-mistral, opt-125m.*llama-3.1-8b",
        ),
        ({"model": "opt-125m", "gpus": 0, "gpu_memory_gb": 80}, "gpus"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 0}, "gpu_memory_gb"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": float("nan")}, "finite number > 0"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "batch_size": 0}, "batch_size"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "seq_len": 0}, "seq_len must"),
        (
            {"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "host_memory_gb": -1.0},
            "host_memory_gb must be a finite number > 0",
        ),
        ({"model": "", "gpus": 1, "gpu_memory_gb": 80}, "the model name is empty; known"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "dtype": "int3"}, "dtype"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "attention": "x"}, "attention"),
        ({"model": "opt-125m", "gpus": 1, "gpu_memory_gb": 80, "offload": "disk"}, "offload"),
    ],
)
def test_plan_errors(kwargs: dict[str, object], message: str) -> None:
    model = kwargs.pop("model")
    with pytest.raises(ValueError, match=message):
        plan(model, **kwargs)  # type: ignore[arg-type]


def test_plan_names_a_file_or_a_directory_without_config_json(tmp_path: Path) -> None:
    (tmp_path / "weights.bin").write_bytes(b"")
    with pytest.raises(ValueError, match=r"weights\.bin' is a file; give a local model dir"):
        plan(str(tmp_path / "weights.bin"), gpus=1, gpu_memory_gb=80)
    with pytest.raises(ValueError, match=r"is a directory without a config\.json"):
        plan(str(tmp_path), gpus=1, gpu_memory_gb=80)


cpu_linux = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/self/clear_refs").exists(),
    reason="needs a resettable peak-RSS mark (/proc/self/clear_refs)",
)


@cpu_linux
@pytest.mark.parametrize(("hidden", "layers"), [(64, 2), (256, 4)])
def test_estimate_within_20_percent_of_measured_forward(hidden: int, layers: int) -> None:
    arch = DecoderArch(
        layers=layers, hidden=hidden, ffn=4 * hidden, heads=4, vocab=8192, max_positions=128
    )
    measured, estimated = measure_forward_peak_mb(arch, batch_size=16, seq_len=128)
    print(f"hidden {hidden} layers {layers}: measured {measured:.1f} MiB, est {estimated:.1f}")
    assert measured > 0
    assert abs(estimated - measured) <= 0.2 * measured


@cpu_linux
@pytest.mark.parametrize(
    ("family", "kv_heads", "tied", "attention"),
    [("llama", 2, False, "eager"), ("qwen2", 2, True, "sdpa"), ("mistral", 1, False, "sdpa")],
)
def test_family_estimate_within_10_percent_of_measured_forward(
    family: str, kv_heads: int, tied: bool, attention: str
) -> None:
    """One shape per family (grouped key/value heads, a gated MLP 2.75x wide, tied or untied
    head), each measured in its own process."""
    arch = DecoderArch(
        family=family, layers=4, hidden=256, ffn=704, heads=4, kv_heads=kv_heads, vocab=8192,
        max_positions=128, tie_embeddings=tied,
    )  # fmt: skip
    measured, estimated = measure_forward_peak_mb(
        arch, batch_size=16, seq_len=128, attention=attention
    )
    print(f"{family} {attention}: measured {measured:.1f} MiB, est {estimated:.1f}")
    assert measured > 0
    assert abs(estimated - measured) <= 0.1 * measured


def test_a_cpu_zero3_worker_holds_its_partition_and_the_gathered_embedding():
    """On CPU a process is its own device: a zero3 worker of 2 holds half the weights plus the
    largest unit gathered (OPT's token embedding) twice over (gloo's staging copy), the same
    activations and process overhead as the single process."""
    from privzo.planner import cpu_worker_bytes, largest_parameter, resolve_arch

    _, arch = resolve_arch("opt-1.3b")
    shape = {"dtype": "bfloat16", "batch_size": 4, "seq_len": 32}
    single = cpu_worker_bytes(arch, strategy="single", workers=1, **shape)
    zero3 = cpu_worker_bytes(arch, strategy="zero3", workers=2, **shape)
    weights = count_parameters(arch) * 2
    assert single - zero3 == weights - (-(-weights // 2) + 2 * largest_parameter(arch) * 2)
    assert zero3 < single
    with pytest.raises(ValueError, match="unknown strategy 'zero2'"):
        cpu_worker_bytes(arch, strategy="zero2", workers=2, **shape)


def test_planned_step_memory_is_one_forward_of_a_micro_batch_within_the_positions() -> None:
    """A step's planned memory is one forward's activations: a micro-batch
    (``optimizer.physical_batch_size``) of prompts of ``task.max_length`` tokens (the planner's
    default length without it), cut at the model's positions."""
    micro = ["optimizer.batch_size=32", "optimizer.physical_batch_size=8"]
    config = load_config(overrides=micro)
    _, arch = resolve_arch("tiny")
    short = replace(arch, max_positions=SEQ_LEN // 4)
    dtype = config.model.dtype
    assert forward_shape(config, None, arch) == (8, SEQ_LEN)
    whole = estimate_activation_bytes(arch, 8, SEQ_LEN, dtype)
    assert planned_step_bytes(config, arch, None) == whole
    cut = estimate_activation_bytes(short, 8, SEQ_LEN // 4, dtype)
    assert planned_step_bytes(config, short, None) == cut
    capped = load_config(overrides=[*micro, "task.max_length=16"])
    assert planned_step_bytes(capped, arch, None) == estimate_activation_bytes(arch, 8, 16, dtype)


def test_a_padded_private_forward_has_the_privacy_plans_rows_on_every_worker() -> None:
    """A padded batch (``task.pad_to='max_length'``, DPZero's default) has the privacy plan's
    bound of rows on every worker, whatever its share; a micro-batch still caps one forward."""
    workers = ["parallel.strategy=replica", "parallel.workers=2", "optimizer.batch_size=8"]
    config = load_config(overrides=[*workers, "task.max_length=32"])
    _, arch = resolve_arch("opt-1.3b")
    assert forward_shape(config, None, arch) == (4, 32)
    assert forward_shape(config, 31, arch) == (31, 32)
    micro = load_config(
        overrides=[*workers, "task.max_length=32", "optimizer.physical_batch_size=8"]
    )
    assert forward_shape(micro, 32, arch) == (8, 32)
    padded = planned_step_bytes(config, arch, padded_rows=31)
    assert padded == estimate_activation_bytes(arch, 31, 32, config.model.dtype)
    assert padded > planned_step_bytes(config, arch, None)


def test_a_padded_run_without_a_max_length_plans_the_models_positions() -> None:
    """Without ``task.max_length`` a padded batch is filled to the model's positions (the
    task's length then), so the planner plans that many tokens, not its default; an unpadded
    batch keeps the default."""
    _, arch = resolve_arch("opt-1.3b")
    padded = load_config(overrides=["task.pad_to=max_length"])
    assert padded.task.max_length is None and arch.max_positions == 2048
    assert forward_shape(padded, 8, arch) == (8, 2048)
    unpadded = load_config(overrides=["task.pad_to=batch"])
    assert forward_shape(unpadded, None, arch)[1] == SEQ_LEN
