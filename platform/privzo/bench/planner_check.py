"""``privzo bench planner``: the planner's memory per worker against runs of a real-size model.

Each case (algorithm × dtype × layout: single, replica and zero3 with 2 workers, zero3 with its
partitions offloaded to host memory) is a short run of a model directory (e.g. one made by
``privzo models init --shape opt-1.3b``) on CPU, in a process of its own: its peak is then its
own, not what an earlier case left in the process, and a 2-worker case starts its own local Ray.
Cases run one after another, never two at once, since each holds one or two copies of the model.
A case already finished in the output directory with the same config is read, not run again.

Per case it prints each worker's peak memory (privzo's figure: the peak RSS of the worker
process from the start of training) beside ``privzo.planner.cpu_worker_bytes`` for the same
layout, dtype, forward batch and length (``privzo.planner.forward_shape``: DPZero pads each
worker's share to its privacy plan's bound); the step time over two forwards (the evaluation
forwards' time, one forward of a worker's share of the batch each); and for MeZO the largest
relative difference of the projected gradients from the single-process run of the same dtype.
DPZero's batches and noise are drawn from secret randomness, so its runs have no twin to agree
with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from itertools import product
from pathlib import Path

import numpy as np

from privzo.config.loading import build_config
from privzo.config.run import RunConfig
from privzo.planner import cpu_worker_bytes, forward_shape, resolve_arch
from privzo.rundir.files import SUMMARY_FILE, TRAJECTORY_FILE
from privzo.rundir.records import finished
from privzo.zo.trajectory import read_trajectory

_MIB = 2**20
# name → (strategy, workers, offload)
LAYOUTS = {
    "single": ("single", 1, "none"),
    "replica": ("replica", 2, "none"),
    "zero3": ("zero3", 2, "none"),
    "zero3-offload": ("zero3", 2, "cpu"),
}
ALGORITHMS = ("mezo", "dpzero")
DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True)
class Case:
    """One run of the benchmark."""

    algorithm: str
    dtype: str
    layout: str

    @property
    def name(self) -> str:
        return f"{self.algorithm}-{self.dtype}-{self.layout}"

    @property
    def workers(self) -> int:
        return LAYOUTS[self.layout][1]


@dataclass(frozen=True)
class Measured:
    """What a case's run measured, and the planner's figure for it."""

    case: Case
    peaks_mb: list[float]  # each worker's
    planned_mb: float
    step_time_s: float
    forward_time_s: float  # one evaluation forward of a worker's share of the batch
    projected_gradients: list[float]

    @property
    def planned_over_measured(self) -> float:
        return self.planned_mb / max(self.peaks_mb)

    @property
    def step_over_two_forwards(self) -> float:
        return self.step_time_s / (2 * self.forward_time_s)


def cases(algorithms: list[str], dtypes: list[str], layouts: list[str]) -> list[Case]:
    """Every combination, checked against the known names before anything runs."""
    for kind, given, known in (
        ("algorithm", algorithms, ALGORITHMS),
        ("dtype", dtypes, DTYPES),
        ("layout", layouts, tuple(LAYOUTS)),
    ):
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(f"unknown {kind} {', '.join(unknown)}; known: {', '.join(known)}")
    return [Case(*combination) for combination in product(algorithms, dtypes, layouts)]


def case_config(
    case: Case, model: str, *, steps: int, batch_size: int, max_length: int
) -> RunConfig:
    """A short run of ``case`` whose evaluation is one forward of a worker's share of the
    batch, the size each of a step's two forwards has."""
    strategy, workers, offload = LAYOUTS[case.layout]
    share = batch_size // workers
    private = case.algorithm == "dpzero"
    return build_config(
        {
            "model": {"name_or_path": model, "dtype": case.dtype, "device": "cpu"},
            "task": {
                "builtin_dataset": "demo-sentiment",
                "template": "{sentence} It was",
                "label_words": ["terrible", "great"],
                "examples_per_class": 64,
                "test_size": share,
                "max_length": max_length,
            },
            "optimizer": {
                "algorithm": case.algorithm,
                "steps": steps,
                "batch_size": batch_size,
                "eval_batch_size": share,
            },
            "privacy": {"epsilon": 8.0, "clip": 20.0} if private else {"sampler": "shuffle"},
            "parallel": {"strategy": strategy, "workers": workers, "offload": offload},
            # memory and time are what this measures, on the built-in synthetic data set
            "tracking": {"backend": "none", "log_every": steps, "log_private_diagnostics": True},
            "eval_before": False,
            "seed": 0,
        },
        source="privzo bench planner",
    )


def run_case(config: RunConfig, output_dir: Path, cache_dir: Path) -> None:
    """``privzo run`` of ``config`` in a fresh process (a new local Ray for 2 workers), unless
    ``output_dir`` holds its finished run already."""
    if finished(output_dir, config) is not None:
        return
    output_dir.parent.mkdir(parents=True, exist_ok=True)
    config_file = output_dir.with_suffix(".json")  # JSON is YAML, as privzo run reads it
    config_file.write_text(json.dumps(config.model_dump(mode="json"), indent=2))
    package_root = str(Path(__file__).resolve().parents[2])
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [package_root, env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "privzo", "run", str(config_file), "--output-dir"]
    command += [str(output_dir), "--cache-dir", str(cache_dir), "--quiet"]
    if config.parallel.strategy != "single":  # a Ray of its own, not one another user started
        command += ["--address", "local"]
    subprocess.run(command, env=env, check=True, stdout=subprocess.DEVNULL)


def planned_worker_bytes(case: Case, config: RunConfig, padded_rows: int | None) -> int:
    """The planner's figure for one worker of ``case``: its layout and dtype, and one forward
    as the run makes it (``forward_shape``: a private run pads each worker's share to its
    privacy plan's bound, ``padded_rows``: for the benchmark's batch of 8, DPZero's 31 rows on one
    process and 22 on each of 2 workers)."""
    strategy, workers, _ = LAYOUTS[case.layout]
    arch = resolve_arch(config.model.name_or_path)[1]
    forward_batch, seq_len = forward_shape(config, padded_rows, arch)
    return cpu_worker_bytes(
        arch,
        strategy=strategy,
        workers=workers,
        dtype=case.dtype,
        batch_size=forward_batch,
        seq_len=seq_len,
    )


def measured(case: Case, output_dir: Path, config: RunConfig) -> Measured:
    """A finished case's figures, with the planner's for its layout, dtype, share and length."""
    summary = json.loads((output_dir / SUMMARY_FILE).read_text())
    peaks = summary.get("peak_memory_mb_per_worker") or [summary["peak_memory_mb"]]
    table, _ = read_trajectory(output_dir / TRAJECTORY_FILE)
    planned = planned_worker_bytes(case, config, summary.get("max_batch_size"))
    return Measured(
        case,
        peaks_mb=[float(peak) for peak in peaks],
        planned_mb=planned / _MIB,
        step_time_s=summary["mean_step_time_s"],
        forward_time_s=summary["eval_time_s"],
        projected_gradients=table.column("projected_gradient").to_pylist(),
    )


def agreement(result: Measured, reference: Measured | None) -> float | None:
    """Largest relative difference of the projected gradients from ``reference`` (the single
    process's run of the same algorithm and dtype); None for DPZero or without a reference."""
    if reference is None or result.case.algorithm != "mezo":
        return None
    expected = np.asarray(reference.projected_gradients)
    difference = np.abs(np.asarray(result.projected_gradients) - expected)
    return float((difference / np.abs(expected)).max())


def table(results: list[Measured], title: str) -> str:
    """The benchmark's table, one line per case."""
    singles = {(r.case.algorithm, r.case.dtype): r for r in results if r.case.layout == "single"}
    lines = [
        title,
        f"{'case':<30} {'peak per worker (MiB)':>22} {'planner':>8} {'plan/peak':>9} "
        f"{'step/2 fwd':>10} {'g vs single':>11}",
    ]
    for result in results:
        reference = singles.get((result.case.algorithm, result.case.dtype))
        difference = agreement(result, reference)
        shown = "ref" if result is reference else "—" if difference is None else f"{difference:.1e}"
        peaks = ", ".join(f"{peak:,.0f}" for peak in result.peaks_mb)
        lines.append(
            f"{result.case.name:<30} {peaks:>22} {result.planned_mb:>8,.0f} "
            f"{result.planned_over_measured:>9.2f} {result.step_over_two_forwards:>10.2f} "
            f"{shown:>11}"
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class PlannerBench:
    """Every selected case's measured peaks beside the planner's figure, and the table."""

    model: str
    steps: int
    batch_size: int
    max_length: int
    results: list[Measured]
    title: str

    def to_json(self) -> dict[str, object]:
        return {
            "model": self.model,
            "steps": self.steps,
            "batch_size": self.batch_size,
            "max_length": self.max_length,
            "cases": [
                {
                    "case": r.case.name,
                    "peak_memory_mb_per_worker": r.peaks_mb,
                    "planned_mb_per_worker": r.planned_mb,
                    "planned_over_measured": r.planned_over_measured,
                    "step_over_two_forwards": r.step_over_two_forwards,
                }
                for r in self.results
            ],
            "table": self.table(),
        }

    def table(self) -> str:
        return table(self.results, self.title)


def planner_benchmark(
    model: str,
    output_dir: Path,
    cache_dir: Path,
    *,
    selected: list[Case],
    steps: int = 2,
    batch_size: int = 8,
    max_length: int = 32,
) -> PlannerBench:
    """Run (or read) every selected case, one at a time, and tabulate them."""
    results = []
    for case in selected:
        config = case_config(case, model, steps=steps, batch_size=batch_size, max_length=max_length)
        case_dir = Path(output_dir).resolve() / case.name
        run_case(config, case_dir, cache_dir)
        results.append(measured(case, case_dir, config))
    title = (
        f"Planner vs measured, CPU: {model}, {steps} steps, batch {batch_size} "
        f"× ≤{max_length} tokens"
    )
    return PlannerBench(model, steps, batch_size, max_length, results, title)
