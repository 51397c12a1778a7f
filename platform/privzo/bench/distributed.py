"""``privzo bench distributed``: what scale-out costs and saves, measured on this machine.

Three short DPZero runs: one in this process (single: two forwards on the whole batch), and on
Ray (CPU, gloo) replica with 2 workers (two forwards on each worker's share of the batch plus one
all-reduce) and zero3 with 2 ranks, for the payload the algorithm all-reduces per step and each
rank's trainable-parameter bytes (about half of one full copy). The single process is the
reference the scale-out is weighed against: what the run costs without it. With a tiny model on a
few shared CPU cores, communication and scheduling dominate the step; the numbers are measured on
the machine that runs them, not a GPU projection.
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from privzo.config.loading import build_config
from privzo.config.run import RunConfig
from privzo.run import run

LAYOUTS = (("single", 1), ("replica", 2), ("zero3", 2))


def bench_config(
    model: str, strategy: str, workers: int, steps: int, env_vars: dict[str, str]
) -> RunConfig:
    return build_config(
        {
            "model": {"name_or_path": model, "dtype": "float32", "device": "cpu"},
            "task": {
                "builtin_dataset": "demo-sentiment",
                "template": "{sentence} It was",
                "label_words": ["terrible", "great"],
                "examples_per_class": 128,
                "test_size": 16,
            },
            "optimizer": {"algorithm": "dpzero", "steps": steps, "batch_size": 32},
            "privacy": {"epsilon": 8.0, "clip": 20.0},
            "parallel": {"strategy": strategy, "workers": workers, "env_vars": env_vars},
            # timing and memory are what this measures, on the built-in synthetic data set
            "tracking": {"backend": "none", "log_every": steps, "log_private_diagnostics": True},
            "eval_before": False,
        },
        source="privzo bench distributed",
    )


@dataclass(frozen=True)
class DistributedBench:
    """The single process's and the 2-worker replica's step time, the replica's all-reduced
    bytes, and what each zero3 rank holds of the parameters."""

    model: str
    steps: int
    expected_batch_size: float
    step_time_s: dict[str, float]  # "single" and "replica_2"
    replica_2_speedup_over_single: float
    allreduce_bytes_per_step: float
    peak_memory_mb_per_worker: dict[str, list[float]]  # by layout: "single_1" and so on
    zero3_parameter_bytes_per_rank: list[int]
    zero3_parameter_bytes_full: int
    zero3_fraction_per_rank: list[float]

    def to_json(self) -> dict[str, Any]:
        record = asdict(self)
        return {**record, "table": _table(record)}

    def table(self) -> str:
        return _table(asdict(self))


def distributed_benchmark(
    cache_dir: Path,
    *,
    model: str = "demo-opt-s",
    steps: int = 30,
    env_vars: dict[str, str] | None = None,
    progress: bool = False,
) -> DistributedBench:
    """Run the three layouts and collect their measured figures."""
    summaries = {}
    with tempfile.TemporaryDirectory(prefix="privzo-bench-") as root:
        for strategy, workers in LAYOUTS:
            ray_env = (env_vars or {}) if strategy != "single" else {}
            config = bench_config(model, strategy, workers, steps, ray_env)
            output = Path(root) / f"{strategy}-{workers}"
            summaries[f"{strategy}_{workers}"] = run(
                config, output, cache_dir=cache_dir, progress=progress
            )
    one, two, zero3 = (summaries[f"{s}_{w}"] for s, w in LAYOUTS)
    peaks = {"single_1": [one["peak_memory_mb"]]}
    for name in ("replica_2", "zero3_2"):
        peaks[name] = summaries[name]["peak_memory_mb_per_worker"]
    full = zero3["parameter_bytes_full"]
    return DistributedBench(
        model=model,
        steps=steps,
        expected_batch_size=one["expected_batch_size"],
        step_time_s={"single": one["mean_step_time_s"], "replica_2": two["mean_step_time_s"]},
        replica_2_speedup_over_single=one["mean_step_time_s"] / two["mean_step_time_s"],
        allreduce_bytes_per_step=two["allreduce_bytes_per_step"],
        peak_memory_mb_per_worker=peaks,
        zero3_parameter_bytes_per_rank=zero3["parameter_bytes_per_worker"],
        zero3_parameter_bytes_full=full,
        zero3_fraction_per_rank=[held / full for held in zero3["parameter_bytes_per_worker"]],
    )


def _table(result: dict[str, Any]) -> str:
    times = result["step_time_s"]
    fractions = ", ".join(f"{f:.3f}" for f in result["zero3_fraction_per_rank"])
    per_rank = ", ".join(f"{b / 2**20:.3f}" for b in result["zero3_parameter_bytes_per_rank"])
    return "\n".join(
        [
            f"Distributed benchmark: {result['model']}, DPZero, {result['steps']} steps, "
            f"expected batch {result['expected_batch_size']:g}, CPU / gloo",
            f"single process step time        {times['single']:.4f} s",
            f"replica step time, 2 workers    {times['replica_2']:.4f} s"
            f"  (speedup {result['replica_2_speedup_over_single']:.2f}x)",
            f"all-reduced per step            {result['allreduce_bytes_per_step']:.0f} bytes",
            f"zero3 parameters per rank (MiB) {per_rank} of "
            f"{result['zero3_parameter_bytes_full'] / 2**20:.3f}  (fractions {fractions})",
        ]
    )
