"""``privzo bench zo-step``: what a zeroth-order step costs next to inference, measured.

On one tiny OPT-style model (fp32, batch 16, sequence 128) in one process, it times and
measures peak memory of: an inference forward (the same scoring forward the step uses), a MeZO
step, a DPZero step, and a reference 4-sweep step (perturb +ε, −2ε, +ε, then a separate update)
to show what fusing the restore into the update saves, and one sweep alone (a step is about two
forwards plus three sweeps; on CPU a sweep is dominated by drawing z from torch's sequential
generator), and the same sweep with the counter-based Philox generator (the CUDA default; on
CPU drawn in torch integer ops, which is why the CPU default stays torch-blocks). Every figure
printed is measured here.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import OPTConfig, OPTForCausalLM

from privzo.memory import PeakMemory
from privzo.tasks.classification import Batch, score_label_logits
from privzo.zo.directions import DirectionSampler, step_seed
from privzo.zo.estimators import GradientEstimator, make_estimator
from privzo.zo.perturbation import InPlacePerturber
from privzo.zo.step import zo_step
from privzo.zo.sweeps import ParameterShard, full_shards, sweep

BENCH_MODEL = dict(
    vocab_size=8192,
    hidden_size=256,
    num_hidden_layers=4,
    ffn_dim=1024,
    num_attention_heads=4,
    max_position_embeddings=256,
    word_embed_proj_dim=256,
)
BATCH_SIZE, SEQUENCE_LENGTH = 16, 128
TARGETS = {
    "step_over_two_forwards": 1.15,
    "step_over_forward_memory": 1.05,
    "dpzero_over_mezo_time": 1.02,
    "dpzero_over_mezo_memory": 1.01,
}


def _bench_model() -> tuple[OPTForCausalLM, Batch, torch.Tensor]:
    torch.manual_seed(0)
    model = OPTForCausalLM(OPTConfig(**BENCH_MODEL)).eval()
    model.requires_grad_(False)
    input_ids = torch.randint(4, BENCH_MODEL["vocab_size"], (BATCH_SIZE, SEQUENCE_LENGTH))
    batch = Batch(
        input_ids=input_ids,
        attention_mask=torch.ones_like(input_ids),
        positions=torch.full((BATCH_SIZE,), SEQUENCE_LENGTH - 1),
        labels=torch.randint(0, 2, (BATCH_SIZE,)),
    )
    return model, batch, torch.tensor([10, 11])


def _measure(
    cases: dict[str, Callable[[], Any]], memory: PeakMemory, repeats: int, progress: bool
) -> dict[str, tuple[float, float]]:
    """(median seconds, median peak MB) per case.

    The cases run round-robin, one warm-up round first, so slow drift of the machine (clock,
    other processes, allocator state) touches every case alike instead of biasing a ratio.
    """
    times: dict[str, list[float]] = {name: [] for name in cases}
    peaks: dict[str, list[float]] = {name: [] for name in cases}
    for round_index in range(repeats + 1):
        if progress:
            print(f"round {round_index}/{repeats} ({'warm-up' if round_index == 0 else 'timed'})")
        for name, action in cases.items():
            memory.reset()
            started = time.perf_counter()
            action()
            elapsed = time.perf_counter() - started
            if round_index > 0:
                times[name].append(elapsed)
                peaks[name].append(memory.peak_mb())
    return {
        name: (statistics.median(times[name]), statistics.median(peaks[name])) for name in cases
    }


def _four_sweep_step(
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    seed: int,
    loss: Callable[[], torch.Tensor],
    estimator: GradientEstimator,
    radius: float,
    learning_rate: float,
) -> None:
    """The naive step: perturb +ε, −2ε, restore +ε, then a separate update sweep."""
    sweep(shards, sampler, seed, radius)
    plus = loss()
    sweep(shards, sampler, seed, -2 * radius)
    minus = loss()
    sweep(shards, sampler, seed, radius)
    estimate = estimator.estimate((plus - minus) / (2 * radius))
    sweep(shards, sampler, seed, -learning_rate * estimate.projected_gradient)


def zo_step_benchmark(repeats: int = 5, progress: bool = True) -> dict[str, Any]:
    model, batch, label_ids = _bench_model()
    shards = full_shards(model.named_parameters())
    sampler = DirectionSampler("gaussian")
    philox = DirectionSampler("gaussian", generator="philox")
    perturber = InPlacePerturber(shards, sampler)
    memory = PeakMemory("cpu")
    estimators = {
        "mezo": make_estimator("mezo"),
        "dpzero": make_estimator(
            "dpzero", clip=1.0, noise_multiplier=1.0, expected_batch_size=BATCH_SIZE
        ),
    }

    def loss(_batch: Batch = batch) -> torch.Tensor:
        logits = score_label_logits(model, _batch, label_ids)
        return torch.nn.functional.cross_entropy(logits, _batch.labels, reduction="none")

    def fused(name: str) -> Callable[[], Any]:
        counter = iter(range(10**9))
        return lambda: zo_step(
            step=0,
            seed=step_seed(0, next(counter)),
            perturber=perturber,
            batch=batch,
            batch_size=BATCH_SIZE,
            loss_fn=loss,
            estimator=estimators[name],
            learning_rate=1e-6,
            perturbation_scale=1e-3,
        )

    def four_sweep(name: str) -> Callable[[], Any]:
        return lambda: _four_sweep_step(
            shards, sampler, 1, loss, estimators[name], radius=1e-3, learning_rate=1e-6
        )

    cases = {
        "forward": loss,
        "one_sweep": lambda: sweep(shards, sampler, 7, 1e-9),
        "one_sweep_philox": lambda: sweep(shards, philox, 7, 1e-9),
        "mezo": fused("mezo"),
        "dpzero": fused("dpzero"),
        "mezo_4sweep": four_sweep("mezo"),
        "dpzero_4sweep": four_sweep("dpzero"),
    }
    measured = _measure(cases, memory, repeats, progress)
    return _report(measured, sum(shard.size for shard in shards), repeats)


def _report(
    measured: dict[str, tuple[float, float]], parameters: int, repeats: int
) -> dict[str, Any]:
    forward_time, forward_memory = measured["forward"]
    ratios: dict[str, float] = {}
    for name in ("mezo", "dpzero", "mezo_4sweep", "dpzero_4sweep"):
        step_time, step_memory = measured[name]
        ratios[f"{name}_step_over_two_forwards"] = step_time / (2 * forward_time)
        ratios[f"{name}_step_over_forward_memory"] = step_memory / forward_memory
    ratios["dpzero_over_mezo_time"] = measured["dpzero"][0] / measured["mezo"][0]
    ratios["dpzero_over_mezo_memory"] = measured["dpzero"][1] / measured["mezo"][1]
    ratios["fused_over_4sweep_time"] = measured["dpzero"][0] / measured["dpzero_4sweep"][0]
    # A step is about 2 forwards + 3 sweeps: this says how much of the step is direction work.
    ratios["sweep_over_forward_time"] = measured["one_sweep"][0] / forward_time
    ratios["philox_sweep_over_sweep_time"] = (
        measured["one_sweep_philox"][0] / measured["one_sweep"][0]
    )
    result = {
        "model": {**BENCH_MODEL, "parameters": parameters},
        "batch_size": BATCH_SIZE,
        "sequence_length": SEQUENCE_LENGTH,
        "dtype": "float32",
        "threads": torch.get_num_threads(),
        "repeats": repeats,
        "seconds": {name: value[0] for name, value in measured.items()},
        "peak_memory_mb": {name: value[1] for name, value in measured.items()},
        "ratios": ratios,
        "targets": TARGETS,
    }
    result["table"] = _table(result)
    return result


def _table(result: dict[str, Any]) -> str:
    ratios, targets = result["ratios"], result["targets"]
    lines = [
        f"ZO step benchmark: OPT-style, {result['model']['parameters'] / 1e6:.2f}M parameters, "
        f"batch {result['batch_size']} x {result['sequence_length']} tokens, fp32, "
        f"{result['threads']} threads, median of {result['repeats']}",
        f"{'case':<16}{'seconds':>10}{'peak MB':>10}{'t/(2 fwd)':>11}{'mem/fwd':>9}",
    ]
    for name, seconds in result["seconds"].items():
        memory = result["peak_memory_mb"][name]
        time_ratio = ratios.get(f"{name}_step_over_two_forwards")
        memory_ratio = ratios.get(f"{name}_step_over_forward_memory")
        shown_time = "-" if time_ratio is None else f"{time_ratio:.3f}"
        shown_memory = "-" if memory_ratio is None else f"{memory_ratio:.3f}"
        lines.append(f"{name:<16}{seconds:>10.4f}{memory:>10.1f}{shown_time:>11}{shown_memory:>9}")
    checks = [
        (
            "dpzero step / 2 forwards",
            ratios["dpzero_step_over_two_forwards"],
            targets["step_over_two_forwards"],
        ),
        (
            "dpzero step / forward memory",
            ratios["dpzero_step_over_forward_memory"],
            targets["step_over_forward_memory"],
        ),
        ("dpzero / mezo time", ratios["dpzero_over_mezo_time"], targets["dpzero_over_mezo_time"]),
        (
            "dpzero / mezo memory",
            ratios["dpzero_over_mezo_memory"],
            targets["dpzero_over_mezo_memory"],
        ),
        ("fused 3-sweep / 4-sweep time", ratios["fused_over_4sweep_time"], None),
        ("one sweep / forward time", ratios["sweep_over_forward_time"], None),
        ("philox sweep / sweep time", ratios["philox_sweep_over_sweep_time"], None),
    ]
    for label, value, target in checks:
        verdict = "" if target is None else (" ok" if value <= target else " ABOVE TARGET")
        bound = "" if target is None else f" (target <= {target})"
        lines.append(f"{label:<30}{value:.3f}{bound}{verdict}")
    return "\n".join(lines)
