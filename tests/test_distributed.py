"""Distributed runs on a real local Ray cluster (gloo on CPU) and real DeepSpeed ZeRO-3.

One Ray session serves the module (starting Ray costs ~10 s, each TorchTrainer ~20 s on 2 CPUs).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from privzo.config import ConfigError, load_config
from privzo.privacy import compute_epsilon
from privzo.run import run
from privzo.tracking import read_run

REPO = Path(__file__).resolve().parents[1]
TINY_MEZO = REPO / "configs" / "runs" / "tiny-mezo.yaml"
TINY_DPZERO = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
# The twins' data and schedule, shrunk to seconds: tiny-opt, 64 training examples.
SMALL = [
    "model.name_or_path=tiny-opt",
    "task.examples_per_class=32",
    "task.test_size=16",
    "optimizer.steps=12",
    "optimizer.batch_size=8",
    "tracking.log_every=4",
]
FAST_REPORT = {"RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1"}


@pytest.fixture(scope="module")
def ray_session():
    ray = pytest.importorskip("ray")
    from privzo.distributed.launch import ray_runtime_env

    previous = os.environ.get("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S")
    os.environ.update(FAST_REPORT)  # the driver side of the report interval (entry point)
    ray.init(num_cpus=2, include_dashboard=False, runtime_env=ray_runtime_env(FAST_REPORT))
    yield ray
    ray.shutdown()
    if previous is None:
        os.environ.pop("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", None)


def _config(path: Path, *extra: str):
    return load_config(path, [*SMALL, *extra])


def _layout(strategy: str, workers: int) -> list[str]:
    return [f"parallel.strategy={strategy}", f"parallel.workers={workers}"]


def _run(config, output: Path, cache_dir: Path) -> dict:
    return run(config, output, cache_dir=cache_dir, progress=False)


@pytest.mark.ray
@pytest.mark.slow
def test_mezo_is_the_same_on_every_layout(ray_session, tmp_path, cache_dir):
    """single, replica x2 and zero3 x2: same trajectory and same final weights (fp32)."""
    layouts = {"single": ("single", 1), "replica": ("replica", 2), "zero3": ("zero3", 2)}
    summaries, trajectories, weights = {}, {}, {}
    for name, (strategy, workers) in layouts.items():
        backend = "mlflow" if name == "replica" else "none"
        config = _config(
            TINY_MEZO, *_layout(strategy, workers), "save_model=true", f"tracking.backend={backend}"
        )
        output = tmp_path / "runs" / name
        summaries[name] = _run(config, output, cache_dir)
        trajectories[name] = pq.read_table(output / "trajectory.parquet").to_pandas()
        weights[name] = load_file(output / "model" / "model.safetensors")

    reference = trajectories["single"]
    assert list(reference["step"]) == list(range(12))
    for name in ("replica", "zero3"):
        trajectory = trajectories[name]
        assert list(trajectory["seed"]) == list(reference["seed"])
        assert list(trajectory["batch_size"]) == [8] * 12  # the global batch, all-reduced count
        np.testing.assert_allclose(
            trajectory["projected_gradient"], reference["projected_gradient"], rtol=1e-5
        )
        assert summaries[name]["workers"] == 2 and summaries[name]["strategy"] == name
        assert len(summaries[name]["peak_memory_mb_per_worker"]) == 2
        assert all(peak > 0 for peak in summaries[name]["peak_memory_mb_per_worker"])
        for key, tensor in weights["single"].items():
            torch.testing.assert_close(weights[name][key], tensor, rtol=0, atol=1e-6)
    assert np.abs(reference["projected_gradient"]).min() > 0  # every step moved the weights

    # MLflow got rank 0's window metrics and the driver's artifacts, in one run
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summaries["replica"]["tracking_run_id"])
    assert record["status"] == "FINISHED"
    assert [step for step, _ in record["history"]["projected_gradient_abs"]] == [4, 8, 12]
    assert record["params"]["parallel.strategy"] == "replica"
    assert record["tags"]["privzo.trainable_parameters"] == str(
        summaries["replica"]["trainable_parameters"]
    )
    assert {"summary.json", "trajectory.parquet", "config.yaml"} <= set(record["artifacts"])


@pytest.mark.ray
@pytest.mark.slow
def test_private_run_on_two_workers_spends_the_single_run_budget(ray_session, tmp_path, cache_dir):
    single = _run(_config(TINY_DPZERO, "tracking.backend=none"), tmp_path / "one", cache_dir)
    replica = _run(
        _config(TINY_DPZERO, *_layout("replica", 2), "tracking.backend=none"),
        tmp_path / "two",
        cache_dir,
    )
    for key in ("noise_multiplier", "sample_rate", "expected_batch_size", "steps"):
        assert replica[key] == single[key], key
    assert replica["epsilon"] == pytest.approx(single["epsilon"], rel=1e-12)
    expected = compute_epsilon(
        noise_multiplier=single["noise_multiplier"],
        sample_rate=8 / 64,
        steps=12,
        delta=1e-5,
    )
    assert replica["epsilon"] == pytest.approx(expected, rel=1e-9) and replica["epsilon"] <= 2.0
    trajectory = pq.read_table(tmp_path / "two" / "trajectory.parquet")
    assert trajectory.column("batch_size").null_count == 12  # withheld, as on one process


@pytest.mark.ray
@pytest.mark.slow
def test_zero3_private_run_survives_empty_local_batches(ray_session, tmp_path, cache_dir):
    """p = 2/64: a rank's 32-example partition is empty in ~36% of steps; the rank must still
    join both forwards' weight gathers, or the job deadlocks."""
    config = _config(
        TINY_DPZERO,
        *_layout("zero3", 2),
        "optimizer.batch_size=2",
        "optimizer.steps=24",
        "tracking.backend=none",
        "tracking.log_every=12",
        "tracking.log_private_diagnostics=true",
        "eval_before=false",
    )
    summary = _run(config, tmp_path / "z3", cache_dir)
    assert summary["steps"] == 24
    assert summary["empty_batches"] > 0  # rank 0's local batch was empty at least once
    expected = compute_epsilon(
        noise_multiplier=summary["noise_multiplier"], sample_rate=2 / 64, steps=24, delta=1e-5
    )
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)


# --- bad input: a clear error before any worker starts (no Ray needed) ---------------------


def test_expected_batch_smaller_than_workers_is_refused(tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("replica", 2), "optimizer.batch_size=1")
    with pytest.raises(ConfigError, match=r"batch_size=1 .* parallel.workers=2"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


def test_zero3_needs_float32_weights(tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("zero3", 2), "model.dtype=bfloat16")
    with pytest.raises(ConfigError, match=r"model.dtype='bfloat16' with parallel.strategy='zero3'"):
        _run(config, tmp_path / "out", cache_dir)


def test_single_strategy_takes_one_worker():
    with pytest.raises(ConfigError, match=r"parallel.workers=2 with parallel.strategy='single'"):
        _config(TINY_MEZO, "parallel.workers=2")


def test_planner_refuses_a_model_that_does_not_fit(tmp_path, cache_dir):
    config = _config(
        TINY_MEZO,
        *_layout("replica", 2),
        "parallel.use_gpu=true",
        "model.device=auto",
        "parallel.gpu_memory_gb=0.01",
    )
    with pytest.raises(ConfigError, match=r"does not fit whole in one 0.01 GiB GPU"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


@pytest.mark.ray
def test_more_workers_than_cpus_is_refused(ray_session, tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("replica", 3))
    with pytest.raises(ConfigError, match=r"parallel.workers=3 needs 3 CPUs .* has 2"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()
