"""(d) ``privzo run model.device=cuda`` of DPZero in float32, bfloat16 and float16 on a
``privzo models init`` model of the OPT-125m shape, and in bfloat16 on one of the ``tiny-llama``
shape: each run finishes, spends the planned ε, and ``privzo replay --device cpu`` rebuilds its
weights within replay's stated tolerance (``privzo.bench.kernel_check``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from privzo.bench.kernel_check import (
    FLIPPED_DIFFERENCE_ULPS,
    FLIPPED_ROUNDINGS_BOUND,
    flipped_roundings,
)

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
# Each run's model shape and dtype: OPT-125m's in every dtype, and a tiny Llama (grouped
# key/value heads, gated MLP, RMSNorm, rotary positions) in bfloat16, the dtype Llama ships in;
# it is small, so its run and replay finish beside the others'.
RUNS = {
    "float32": ("opt-125m", "float32"),
    "bfloat16": ("opt-125m", "bfloat16"),
    "float16": ("opt-125m", "float16"),
    "llama-bfloat16": ("tiny-llama", "bfloat16"),
}
STEPS = 6
DEVICE = "cuda"
# replay's tolerance for float32 weights trained on another device type (z's last bits)
FLOAT32_RTOL, FLOAT32_ATOL = 1e-5, 1e-6


def _privzo(*arguments: str | Path, threads: int | None = None) -> subprocess.Popen[str]:
    env = dict(os.environ)
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    command = [sys.executable, "-m", "privzo", *map(str, arguments)]
    return subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _wait(processes: dict[str, subprocess.Popen[str]], timeout: float) -> None:
    for name, process in processes.items():
        output, _ = process.communicate(timeout=timeout)
        assert process.returncode == 0, f"{name} failed:\n{output[-4000:]}"


def train_and_replay(root: Path, device: str = DEVICE, runs: dict | None = None) -> Path:
    """Every run of ``runs`` (name: (shape, dtype); default ``RUNS``) at once on ``device``,
    then their replays at once on the CPU; each shape's base model is ``root/base-SHAPE``."""
    runs = RUNS if runs is None else runs
    shapes = {shape for shape, _dtype in runs.values()}
    inits = {
        f"models init {shape}": _privzo(
            "models", "init", "--shape", shape, "--output-dir", root / f"base-{shape}"
        )
        for shape in shapes
    }
    _wait(inits, 300)
    started = {
        name: _privzo(
            "run",
            CONFIG,
            f"model.name_or_path={root / f'base-{shape}'}",
            f"model.device={device}",
            f"model.dtype={dtype}",
            "optimizer.generator=philox",
            "tracking.backend=none",
            f"optimizer.steps={STEPS}",
            "task.test_size=64",
            "save_model=true",
            "--output-dir",
            root / f"run-{name}",
        )
        for name, (shape, dtype) in runs.items()
    }
    _wait(started, 600)
    threads = max(1, (os.cpu_count() or 3) // len(runs))
    replays = {
        name: _privzo(
            "replay",
            "--base",
            root / f"base-{shape}",
            "--trajectory",
            root / f"run-{name}" / "trajectory.parquet",
            "--output-dir",
            root / f"replay-{name}",
            "--device",
            "cpu",
            threads=threads,
        )
        for name, (shape, _dtype) in runs.items()
    }
    _wait(replays, 600)
    return root


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return train_and_replay(tmp_path_factory.mktemp("gpu-runs"))


@pytest.mark.parametrize("name", RUNS)
def test_a_gpu_run_spends_its_epsilon_and_replays_on_cpu(runs: Path, name: str, gpu_record):
    shape, dtype = RUNS[name]
    summary = json.loads((runs / f"run-{name}" / "summary.json").read_text())
    assert summary["device"].startswith(DEVICE) and summary["dtype"] == dtype
    assert summary["steps"] == STEPS
    assert 0.99 * summary["epsilon_target"] <= summary["epsilon"] <= summary["epsilon_target"]
    trained = load_file(runs / f"run-{name}" / "model" / "model.safetensors")
    replayed = load_file(runs / f"replay-{name}" / "model.safetensors")
    base = load_file(runs / f"base-{shape}" / "model.safetensors")
    assert trained.keys() == replayed.keys()
    figures: dict[str, object] = {
        "model": shape,
        "dtype": dtype,
        "steps": STEPS,
        "epsilon": summary["epsilon"],
        "epsilon_target": summary["epsilon_target"],
        "accuracy_before": summary["metric_before"],
        "accuracy_after": summary["metric_after"],
    }
    moved = sum(not torch.equal(trained[n], base[n].to(trained[n].dtype)) for n in trained)
    assert moved > 0  # training changed the weights
    if dtype == "float32":
        worst = max(
            float(
                (
                    (trained[n] - replayed[n]).abs()
                    / (FLOAT32_ATOL + FLOAT32_RTOL * replayed[n].abs())
                ).max()
            )
            for n in trained
        )
        figures["worst_error_over_tolerance"] = worst
        gpu_record("run_replay", **figures)
        assert worst <= 1.0
        return
    flips = {n: flipped_roundings(trained[n], replayed[n]) for n in trained}
    elements = sum(t.numel() for t in trained.values())
    fraction = sum(flips[n][0] * trained[n].numel() for n in trained) / elements
    figures["flipped_fraction"] = fraction
    figures["largest_flipped_fraction_of_a_tensor"] = max(f for f, _ulps in flips.values())
    figures["largest_difference_in_tensor_ulps"] = max(ulps for _f, ulps in flips.values())
    gpu_record("run_replay", **figures)
    assert fraction <= FLIPPED_ROUNDINGS_BOUND
    assert figures["largest_difference_in_tensor_ulps"] <= FLIPPED_DIFFERENCE_ULPS
