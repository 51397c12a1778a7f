"""``privzo bench memory``: time per step and peak memory of every algorithm, next to inference.

The DPZero paper's time/memory table, measured on this machine: one tiny causal LM (OPT
architecture, built here with seeded random weights and tiny-opt's word tokenizer) and one batch
shape. Each algorithm runs the real training code (the run pipeline's context and loop) in a
fresh process (forked from a server that only imported the libraries), so its peak resident
memory (VmHWM on CPU) is not inflated by what another case allocated, and each process also
times the inference forward it is compared with. Each process maps every allocation of 128 KiB
or more on its own (``MAPPED_FROM_BYTES``), so freed tensors leave the resident set and a
peak counts the tensors alive at it.
The batch is fixed: sample rate 1 (every example in every step) and a fixed noise multiplier,
so no calibration runs and every step sees the same shape.
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from multiprocessing.context import BaseContext
from pathlib import Path
from typing import Any

from privzo.algorithms.registry import get_algorithm

BENCH_SHAPE = dict(hidden_size=256, num_hidden_layers=4, ffn_dim=1024, num_attention_heads=4)
BATCH_SIZE, WORDS_PER_EXAMPLE = 16, 60
# (label, optimizer.algorithm, model.trainable)
CASES: tuple[tuple[str, str, str], ...] = (
    ("adamw", "adamw", "full"),
    ("dpsgd-full", "dpsgd", "full"),
    ("dpsgd-lora", "dpsgd", "lora"),
    ("dpsgd-bitfit", "dpsgd", "bitfit"),
    ("mezo", "mezo", "full"),
    ("dpzero", "dpzero", "full"),
    ("dpgd-0th", "dpgd-0th", "full"),
)


@dataclass(frozen=True)
class MemoryBench:
    """Every case's time and peak memory per step, on one model and batch shape."""

    model: dict[str, Any]  # BENCH_SHAPE, its architecture and parameter count
    batch_size: int
    sequence_length: int
    dtype: str
    repeats: int
    cases: dict[str, dict[str, Any]]  # by label: what the case's own process measured

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        return {**record, "table": _table(record)}

    def table(self) -> str:
        return _table(asdict(self))


def memory_benchmark(cache_dir: Path, repeats: int = 3, progress: bool = True) -> MemoryBench:
    """Measure every case (each in its own process); returns the numbers and a table."""
    with tempfile.TemporaryDirectory(prefix="privzo-bench-") as work:
        work_dir = Path(work)
        with contextlib.redirect_stdout(sys.stderr):  # save_pretrained announces DeepSpeed
            model_dir, parameters = _write_bench_model(work_dir, cache_dir)
        train = _write_bench_data(work_dir)
        results = {}
        for label, algorithm, view in CASES:
            if progress:
                print(f"measuring {label} ...", flush=True)
            overrides = _case_overrides(model_dir, train, algorithm, view, repeats)
            results[label] = _in_fresh_process(overrides, cache_dir, repeats)
    return MemoryBench(
        model={**BENCH_SHAPE, "architecture": "opt", "parameters": parameters},
        batch_size=BATCH_SIZE,
        sequence_length=next(iter(results.values()))["sequence_length"],
        dtype="float32",
        repeats=repeats,
        cases=results,
    )


def _write_bench_model(work_dir: Path, cache_dir: Path) -> tuple[Path, int]:
    """An OPT-architecture model of BENCH_SHAPE with tiny-opt's tokenizer, saved in HF format."""
    import torch
    from transformers import AutoConfig, AutoTokenizer, OPTForCausalLM

    from privzo.models.config import ModelConfig
    from privzo.models.loading import resolve_source

    source = resolve_source(ModelConfig(name_or_path="tiny-opt"), cache_dir, progress=False)
    config = AutoConfig.from_pretrained(source)
    for key, value in BENCH_SHAPE.items():
        setattr(config, key, value)
    config.word_embed_proj_dim = BENCH_SHAPE["hidden_size"]
    config.max_position_embeddings = 128
    torch.manual_seed(0)
    model = OPTForCausalLM(config)
    model_dir = work_dir / "model"
    model.save_pretrained(model_dir)
    AutoTokenizer.from_pretrained(source).save_pretrained(model_dir)
    return model_dir, sum(p.numel() for p in model.parameters())


def _write_bench_data(work_dir: Path) -> Path:
    """BATCH_SIZE rows of WORDS_PER_EXAMPLE in-vocabulary words (synthetic, no real data)."""
    from privzo.demo_data import POSITIVE_ADJECTIVES, PUBLIC_SUBJECTS

    words = [*PUBLIC_SUBJECTS, *POSITIVE_ADJECTIVES]
    path = work_dir / "train.jsonl"
    with path.open("w") as handle:
        for index in range(BATCH_SIZE):
            sentence = " ".join(words[(index + k) % len(words)] for k in range(WORDS_PER_EXAMPLE))
            handle.write(json.dumps({"sentence": sentence, "label": index % 2}) + "\n")
    return path


def _case_overrides(
    model_dir: Path, train: Path, algorithm: str, view: str, repeats: int
) -> list[str]:
    overrides = [
        f"model.name_or_path={model_dir}",
        f"model.trainable={view}",
        f"task.train_path={train}",
        f"task.test_path={train}",
        f"optimizer.algorithm={algorithm}",
        f"optimizer.steps={repeats + 2}",
        f"optimizer.batch_size={BATCH_SIZE}",
        "optimizer.learning_rate=1e-6",
        "eval_before=false",
        "tracking.backend=none",
    ]
    entry = get_algorithm(algorithm)
    if entry.family == "first-order":  # the zeroth-order steps score whole batches
        overrides.append(f"optimizer.physical_batch_size={BATCH_SIZE}")
    if entry.private:
        # rdp: its accountant holds a few arrays, where a PLD's (tens of MB, built before the
        # first step) would raise the process's resident peak under the step's own extra memory;
        # rdp accounts only continuous noise, so the scalar noise is the float sampler here (the
        # same memory as the default grid's: one scalar)
        overrides += ["privacy.noise_multiplier=1.0", "privacy.epsilon=1e6"]
        overrides += ["privacy.accountant=rdp"]
        if entry.family == "zeroth-order":
            # padded as the forward it is compared with is; what a public batch shape costs is
            # `privzo bench pad-to`'s to measure
            overrides += ["privacy.noise_grid=null", "task.pad_to=batch"]
    else:
        overrides += ["privacy.sampler=shuffle"]
    return overrides


# imported once by the fork server, so each case's process starts with them instead of
# importing them again (seconds of CPU per case); it starts from the server's clean state
PRELOADED = ["torch", "transformers", "opacus", "privzo.run", "privzo.bench.memory"]


def _in_fresh_process(overrides: list[str], cache_dir: Path, repeats: int) -> dict[str, Any]:
    """``measure_case`` in a new process forked from a server that has only imported the
    libraries (``spawn`` where there is no fork server): no other case's memory is in it."""
    context: BaseContext = multiprocessing.get_context("spawn")
    if "forkserver" in multiprocessing.get_all_start_methods():
        server = multiprocessing.get_context("forkserver")
        server.set_forkserver_preload(PRELOADED)
        context = server
    with ProcessPoolExecutor(max_workers=1, mp_context=context) as pool:
        return pool.submit(measure_case, overrides, str(cache_dir), repeats).result()


def measure_case(overrides: list[str], cache_dir: str, repeats: int) -> dict[str, Any]:
    """In a fresh process: the inference forward (before any training state exists), then
    training steps; median seconds and median peak resident MB of each after one warm-up.

    Library messages printed to stdout while importing (DeepSpeed announces its accelerator)
    go to stderr instead, so the parent's stdout (e.g. ``--json``) stays clean.
    """
    from privzo.memory import map_large_blocks

    with contextlib.redirect_stdout(sys.stderr):
        map_large_blocks(MAPPED_FROM_BYTES)
        return _measure_case(overrides, cache_dir, repeats)


# Every allocation of this size or more gets a mapping of its own in a case's process
# (``privzo.memory.map_large_blocks``), so the resident peak follows live tensors: by default glibc
# raises its threshold each time a large mapping is freed (up to 32 MiB), after which large tensors
# come from the heap, whose freed memory stays resident, and a step's new buffer (DPGD-0th's
# 12.4 MiB noise vector) could reuse memory the forward's freed activations left behind and raise
# the peak by a fraction of its size (6.4 and 7.6 MiB were read, 13.0 MiB in another run). Other
# C libraries keep their default.
MAPPED_FROM_BYTES = 128 * 1024


def _measure_case(overrides: list[str], cache_dir: str, repeats: int) -> dict[str, Any]:
    import opacus  # noqa: F401  # every process holds the same libraries before measuring

    from privzo.config.loading import load_config
    from privzo.memory import PeakMemory
    from privzo.run import build_context, make_loop
    from privzo.tasks.interface import ScoringTask
    from privzo.tracking import NoopTracker

    config = load_config(None, overrides)
    context = build_context(config, Path(cache_dir), progress=False)
    memory = PeakMemory(context.loaded.device)
    task: ScoringTask = context.task
    batch = task.collate(context.train, list(range(len(context.train))))

    def forward() -> Any:
        return task.per_example_loss(context.scoring_model, batch)

    # inference first, before any training state (optimizer moments, noise buffers) exists
    forward_s, forward_mb = _timed(forward, memory, repeats)
    tracker = NoopTracker(uri=None, experiment="bench", output_root=Path("."), run_name="bench")
    loop = make_loop(context, tracker, memory)
    loop.stepper.start()  # its training state (optimizer, hooks, noise buffer) is measured
    steps = iter(range(repeats + 1))
    step_s, step_mb = _timed(lambda: loop.step(next(steps)), memory, repeats)
    loop.stepper.finish()
    return {
        "trainable_parameters": sum(shard.size for shard in context.shards),
        "sequence_length": int(batch.input_ids.shape[1]),
        "forward_seconds": forward_s,
        "forward_peak_mb": forward_mb,
        "step_seconds": step_s,
        "step_peak_mb": step_mb,
        "step_extra_mb": step_mb - forward_mb,
        "time_over_forward": step_s / forward_s,
        "memory_over_forward": step_mb / forward_mb,
    }


def _timed(action: Any, memory: Any, repeats: int) -> tuple[float, float]:
    """Median seconds and median peak MB of ``repeats`` calls after one warm-up call."""
    samples = []
    for round_index in range(repeats + 1):
        memory.reset()
        started = time.perf_counter()
        action()
        elapsed = time.perf_counter() - started
        if round_index:
            samples.append((elapsed, memory.peak_mb()))
    return _medians(samples)


def _medians(samples: list[tuple[float, float]]) -> tuple[float, float]:
    return (
        statistics.median(seconds for seconds, _ in samples),
        statistics.median(peak for _, peak in samples),
    )


def _table(result: dict[str, Any]) -> str:
    model = result["model"]
    lines = [
        f"Time and memory per step vs an inference forward: OPT-style, "
        f"{model['parameters'] / 1e6:.2f}M parameters, batch {result['batch_size']} x "
        f"{result['sequence_length']} tokens, fp32, median of {result['repeats']}; each row in "
        "its own process; peak = resident set (VmHWM, includes the libraries), extra = step "
        "peak minus inference peak (optimizer state, per-example gradients, noise, activations)",
        f"{'algorithm':<14}{'trainable':>11}{'step s':>9}{'fwd s':>9}{'t/fwd':>8}"
        f"{'step MB':>9}{'fwd MB':>9}{'extra MB':>10}{'mem/fwd':>9}",
    ]
    for label, case in result["cases"].items():
        lines.append(
            f"{label:<14}{case['trainable_parameters']:>11}{case['step_seconds']:>9.4f}"
            f"{case['forward_seconds']:>9.4f}{case['time_over_forward']:>8.2f}"
            f"{case['step_peak_mb']:>9.1f}{case['forward_peak_mb']:>9.1f}"
            f"{case['step_extra_mb']:>10.1f}"
            f"{case['memory_over_forward']:>9.3f}"
        )
    return "\n".join(lines)
