"""Distributed runs on a real local Ray cluster (gloo on CPU) and real DeepSpeed ZeRO-3.

The refusals that need no Ray are in tests/unit/distributed/test_layout_refusals.py.

One Ray session serves the module: starting Ray and each TorchTrainer are the slow parts.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from conftest import REPO, SMALL_RUN, adapter_against_replay, local_ray
from privzo.config import ConfigError, load_config
from privzo.distributed.launch import CHECKPOINTS_KEPT
from privzo.distributed.worker import checkpoint_name
from privzo.privacy import compute_epsilon
from privzo.privacy.truncation import truncation_delta
from privzo.run import RunHooks, run
from privzo.tracking import read_run
from tiny_families import save_tiny_family

pytestmark = pytest.mark.integration

TINY_MEZO = REPO / "configs" / "runs" / "tiny-mezo.yaml"
TINY_DPZERO = REPO / "configs" / "runs" / "tiny-dpzero.yaml"
PERTURBATION_SCALE = 1e-3  # both twins'
ONE_LOSS_BIT_IN_G = float(np.spacing(np.float32(1.0))) / (2 * PERTURBATION_SCALE)


@pytest.fixture(scope="module")
def ray_session():
    with local_ray() as ray:
        yield ray


def _config(path: Path, *extra: str):
    return load_config(path, [*SMALL_RUN, *extra])


def _layout(strategy: str, workers: int) -> list[str]:
    return [f"parallel.strategy={strategy}", f"parallel.workers={workers}"]


def _run(config, output: Path, cache_dir: Path) -> dict:
    return run(config, output, cache_dir=cache_dir, progress=False)


def _rescoring_hooks() -> RunHooks:
    """A search trial's kind of ``final_scores``: it scores the trained model again (forwards,
    which are collectives under zero3). A closure, so cloudpickle ships it by value."""

    def final_scores(context) -> dict[str, float]:
        batch_size = context.config.optimizer.eval_batch_size
        metrics = context.task.evaluate(context.scoring_model, context.test, batch_size)
        return {"selection_rescored": metrics[context.task.metric]}

    return RunHooks(final_scores=final_scores)


@dataclass(frozen=True)
class LayoutRuns:
    """One MeZO run per layout (single, replica x2, zero3 x2) of one config, with a caller's
    final scores, and replica x2 and zero3 x2 again in the family's half precision: what the
    layout tests read."""

    root: Path
    summaries: dict[str, Any]
    trajectories: dict[str, Any]
    weights: dict[str, dict[str, torch.Tensor]]
    base: str  # the model the runs start from, as replay takes it


# tiny-opt, and a tiny Llama (grouped key/value heads, gated MLP, RMSNorm, rotary positions,
# a SentencePiece-style tokenizer with BOS) for the decoders beside OPT
FAMILIES = ("opt", "llama")
# the half-precision pair of runs (replica x2 and zero3 x2) taken through Ray, for opt; the other
# family / dtype pairs are compared bit for bit without Ray in
# tests/unit/distributed/test_zero3_half.py (the layouts' orchestration is the family's own)
HALF = {"opt": "bfloat16"}


@pytest.fixture(scope="module", params=FAMILIES)
def layout_runs(request, ray_session, tmp_path_factory, cache_dir) -> LayoutRuns:
    layouts = {
        "single": ("single", 1, "float32"),
        "replica": ("replica", 2, "float32"),
        "zero3": ("zero3", 2, "float32"),
    }
    if request.param in HALF:
        half = HALF[request.param]
        layouts.update({"replica-half": ("replica", 2, half), "zero3-half": ("zero3", 2, half)})
    root = tmp_path_factory.mktemp(f"layouts-{request.param}")
    model, base = [], "tiny-opt"
    if request.param != "opt":
        base = str(save_tiny_family(request.param, root / request.param))
        model = [f"model.name_or_path={base}"]
    summaries, trajectories, weights = {}, {}, {}
    for name, (strategy, workers, dtype) in layouts.items():
        backend = "mlflow" if name == "replica" else "none"
        config = _config(
            TINY_MEZO,
            *_layout(strategy, workers),
            *model,
            f"model.dtype={dtype}",
            "save_model=true",
            f"tracking.backend={backend}",
        )
        output = root / "runs" / name
        summaries[name] = run(
            config, output, cache_dir=cache_dir, progress=False, hooks=_rescoring_hooks()
        )
        trajectories[name] = pq.read_table(output / "trajectory.parquet").to_pandas()
        weights[name] = load_file(output / "model" / "model.safetensors")
    return LayoutRuns(root, summaries, trajectories, weights, base)


@pytest.mark.ray
@pytest.mark.slow
def test_mezo_is_the_same_on_every_layout(layout_runs):
    """single, replica x2 and zero3 x2: same trajectory and same final weights (fp32)."""
    summaries, trajectories, weights = (
        layout_runs.summaries,
        layout_runs.trajectories,
        layout_runs.weights,
    )
    reference = trajectories["single"]
    assert list(reference["step"]) == list(range(12))
    for name in ("replica", "zero3"):
        trajectory = trajectories[name]
        assert list(trajectory["seed"]) == list(reference["seed"])
        assert list(trajectory["batch_size"]) == [8] * 12  # the global batch, all-reduced count
        # Each rank pads its half of the batch to its own longest example, so a loss can differ
        # from the single-process one in its last fp32 bit; one bit of a loss near 1 is
        # 2**-23 / (2ε) in g. Measured: at most 1.1e-5 (replica), under this bound.
        np.testing.assert_allclose(
            trajectory["projected_gradient"],
            reference["projected_gradient"],
            rtol=0,
            atol=ONE_LOSS_BIT_IN_G,
        )
        assert summaries[name]["workers"] == 2 and summaries[name]["strategy"] == name
        assert len(summaries[name]["peak_memory_mb_per_worker"]) == 2
        assert all(peak > 0 for peak in summaries[name]["peak_memory_mb_per_worker"])
        for key, tensor in weights["single"].items():
            torch.testing.assert_close(weights[name][key], tensor, rtol=0, atol=1e-6)
    assert np.abs(reference["projected_gradient"]).min() > 0  # every step moved the weights
    assert summaries["replica"]["allreduce_bytes_per_step"] == 16  # MeZO: [sum, count] in fp64
    zero3_held = summaries["zero3"]["parameter_bytes_per_worker"]
    assert sum(zero3_held) == summaries["zero3"]["parameter_bytes_full"]  # no padding, no overlap
    assert max(zero3_held) <= 0.55 * summaries["zero3"]["parameter_bytes_full"]
    assert (
        summaries["replica"]["parameter_bytes_per_worker"]
        == [summaries["replica"]["parameter_bytes_full"]] * 2
    )

    # MLflow got rank 0's window metrics and the driver's artifacts, in one run
    uri = f"sqlite:///{(layout_runs.root / 'runs' / 'mlflow.db').resolve()}"
    record = read_run(uri, summaries["replica"]["tracking_run_id"])
    assert record["status"] == "FINISHED"
    assert [step for step, _ in record["history"]["projected_gradient_abs"]] == [4, 8, 12]
    assert record["params"]["parallel.strategy"] == "replica"
    assert record["tags"]["privzo.trainable_parameters"] == str(
        summaries["replica"]["trainable_parameters"]
    )
    run_files = {"summary.json", "trajectory.parquet", "config.yaml", "privacy.json"}
    assert run_files <= set(record["artifacts"])
    # the replayable model, as a single run logs it (replay gives the weights compared above)
    model_uri = f"runs:/{summaries['replica']['tracking_run_id']}/model"
    assert record["tags"]["privzo.model_uri"] == model_uri
    assert {"model/MLmodel", "model/data/replay/trajectory.parquet"} <= set(record["artifacts"])


@pytest.mark.ray
@pytest.mark.slow
def test_zero3_in_half_precision_is_the_single_device_run(layout_runs, cache_dir):
    """zero3 x2 in bf16 (opt; the other pairs without Ray) against replica x2 in bf16: the same
    forwards on the same halves of each batch, so every step's projected gradient agrees within
    1e-4 relative and the final weights are the same. zero3's perturbed weights and updates are
    the single-device bits (tests/unit/distributed/test_zero3_half.py); what a split batch
    changes is each half's forward: on one device, tiny-opt's g over the same batch whole and as
    the two strided halves differed by up to 3.4e-2 relative in bf16 and 3.1e-3 in fp16
    (2.0e-5 in fp32) over 12 steps, which later steps compound."""
    if "zero3-half" not in layout_runs.trajectories:
        pytest.skip("this family's half precision is checked without Ray (test_zero3_half.py)")
    reference = layout_runs.trajectories["replica-half"]
    trajectory = layout_runs.trajectories["zero3-half"]
    assert list(trajectory["seed"]) == list(reference["seed"])
    expected = reference["projected_gradient"].to_numpy()
    measured = trajectory["projected_gradient"].to_numpy()
    assert np.abs(expected).min() > 0
    relative = np.abs(measured - expected) / np.abs(expected)
    print(f"zero3 vs replica in half precision: max relative difference in g {relative.max():.3g}")
    assert relative.max() <= 1e-4
    summary = layout_runs.summaries["zero3-half"]
    assert summary["strategy"] == "zero3" and summary["workers"] == 2
    saved = layout_runs.weights["zero3-half"]
    for key, tensor in layout_runs.weights["replica-half"].items():
        assert saved[key].dtype == tensor.dtype, key
        torch.testing.assert_close(saved[key], tensor, rtol=0, atol=0)
    # replay onto one device rebuilds the gathered weights zero3 saved, bit for bit
    from privzo.replay import replay

    path = layout_runs.root / "runs" / "zero3-half" / "trajectory.parquet"
    loaded, _model, steps = replay(layout_runs.base, path, cache_dir=cache_dir, progress=False)
    assert steps == 12
    replayed = loaded.model.state_dict()
    for key, tensor in saved.items():
        assert torch.equal(replayed[key], tensor), key


@dataclass(frozen=True)
class PrivateLoraRuns:
    """One private (DPZero) LoRA run of tiny-opt on one process and one of a tiny Qwen2 on two
    replica workers, tracked in MLflow: what the budget and adapter tests read. The budget
    depends on the data, the schedule and (ε, δ), not on the model, so the two runs of one
    config but different families spend the same."""

    root: Path
    single: Any
    replica: Any
    replica_base: str  # the replica run's model, as replay takes it
    tracking_uri: str


@pytest.fixture(scope="module")
def private_lora_runs(ray_session, tmp_path_factory, cache_dir) -> PrivateLoraRuns:
    root = tmp_path_factory.mktemp("private-lora")
    lora = ("model.trainable=lora", "model.peft.lora_rank=2")
    single = _run(_config(TINY_DPZERO, *lora, "tracking.backend=none"), root / "one", cache_dir)
    qwen2 = str(save_tiny_family("qwen2", root / "qwen2"))  # LoRA on its q_proj and v_proj
    replica_config = _config(
        TINY_DPZERO,
        *_layout("replica", 2),
        *lora,
        f"model.name_or_path={qwen2}",
        "tracking.backend=mlflow",
    )
    replica = _run(replica_config, root / "runs" / "two", cache_dir)
    uri = f"sqlite:///{(root / 'runs' / 'mlflow.db').resolve()}"
    return PrivateLoraRuns(root, single, replica, qwen2, uri)


def _summary_epsilon(summary: dict[str, Any], sample_rate: float, steps: int) -> float:
    """ε of a run's own σ and noise at δ = 1e-5 less its truncation δ, as its accountant
    evaluates it."""
    return compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=sample_rate,
        steps=steps,
        delta=1e-5 - summary["truncation_delta"],
        noise_parameters=summary["mechanism_parameters"],  # the discrete noise's grid
    )


@pytest.mark.ray
@pytest.mark.slow
def test_private_run_on_two_workers_accounts_every_workers_truncation(private_lora_runs):
    """Two workers sample the single run's Poisson batch between them, each padding its share
    to a bound of its own: smaller than the single run's, its truncation δ counting both shares,
    and σ calibrated to the same ε at what is left of δ."""
    single, replica = private_lora_runs.single, private_lora_runs.replica
    for key in ("sample_rate", "expected_batch_size", "steps"):
        assert replica[key] == single[key], key
    assert replica["max_batch_size"] < single["max_batch_size"]
    assert replica["truncation_delta"] == truncation_delta(
        64, 8 / 64, replica["max_batch_size"], 12, 2.0, shares=2
    )
    root = private_lora_runs.root
    for summary, output in ((single, root / "one"), (replica, root / "runs" / "two")):
        expected = _summary_epsilon(summary, sample_rate=8 / 64, steps=12)
        assert summary["epsilon"] == pytest.approx(expected, rel=1e-9), output
        assert summary["epsilon"] <= 2.0, output
        privacy = json.loads((output / "privacy.json").read_text())
        assert privacy["steps_accounted"] == 12 and privacy["final"] is True, output
        assert privacy["epsilon_spent"] == pytest.approx(expected, rel=1e-9), output
    trajectory = pq.read_table(root / "runs" / "two" / "trajectory.parquet")
    assert trajectory.column("batch_size").null_count == 12  # withheld, as on one process
    assert replica["peak_memory_mb_per_worker"] is None and replica["peak_memory_mb"] is None
    # the kept checkpoints are named by their step, not by the time of their report
    folders = _ray_run_dir(root / "runs" / "two").iterdir()
    kept = sorted(path.name for path in folders if path.is_dir())
    assert kept == [checkpoint_name(steps) for steps in (4, 8, 12)][-CHECKPOINTS_KEPT:]


@pytest.mark.ray
@pytest.mark.slow
def test_zero3_private_run_survives_empty_local_batches(ray_session, tmp_path, cache_dir):
    """p = 2/64: a rank's 32-example partition is empty in ~36% of steps; the rank must still
    join both forwards' weight gathers, or the job deadlocks. On a tiny Mistral, so a private
    zero3 run of a family beside OPT (the layout runs hold MeZO's) runs through Ray too."""
    mistral = save_tiny_family("mistral", tmp_path / "mistral")
    config = _config(
        TINY_DPZERO,
        *_layout("zero3", 2),
        f"model.name_or_path={mistral}",
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
    expected = _summary_epsilon(summary, sample_rate=2 / 64, steps=24)
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["replica", "zero3"])
def test_final_scores_run_on_the_workers(layout_runs, strategy):
    """The caller's final scores run through the worker's train_and_evaluate: rank 0's value
    lands in the summary (zero3's every rank joins the forwards, or the job deadlocks)."""
    summary = layout_runs.summaries[strategy]
    assert summary["selection_rescored"] == summary["metric_after"]  # the same model and data
    written = json.loads((layout_runs.root / "runs" / strategy / "summary.json").read_text())
    assert written["selection_rescored"] == summary["metric_after"]


@pytest.mark.ray
def test_the_test_rays_workers_are_not_niced(ray_session):
    """conftest sets RAY_worker_niceness=0: at Ray's default 15 a CPU-bound neighbour starves
    the workers (docs/measurements.md, "The test suites")."""

    @ray_session.remote
    def niceness() -> int:
        return os.nice(0)

    assert ray_session.get(niceness.remote(), timeout=600) == 0


@pytest.mark.ray
def test_more_workers_than_cpus_is_refused(ray_session, tmp_path, cache_dir):
    config = _config(TINY_MEZO, *_layout("replica", 3))
    with pytest.raises(ConfigError, match=r"parallel.workers=3 needs 3 CPUs .* has 2"):
        _run(config, tmp_path / "out", cache_dir)
    assert not (tmp_path / "out").exists()


def _train_worker_processes() -> list:
    """Ray Train worker processes of this test's own local cluster (our descendants only)."""
    import psutil

    workers = []
    for process in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if "RayTrainWorker" in " ".join(process.cmdline()):
                workers.append(process)
        except psutil.Error:
            continue
    return workers


def _ray_run_dir(output: Path) -> Path:
    """The run's Ray Train state: one directory, named after the output dir plus a suffix."""
    (found,) = (output / "ray").glob(f"{output.name}-*")
    return found


PAUSE_AT = 15  # steps done when rank 0 pauses: checkpoints for 5, 10 and 15 exist by then
PAUSE_LIMIT_S = 600  # a paused rank 0 that nobody kills fails the run instead of hanging
# How long a tiny distributed run may take to start or finish: margins for a loaded 2-core
# machine (docs/measurements.md, "Test margins"), not timings; a hang still ends.
RUN_LIMIT_S = 1800


def _pause_rank0(pid_file: Path) -> RunHooks:
    """Rank 0's first attempt writes its PID and waits to be killed once ``PAUSE_AT`` steps
    are done and checkpointed; a resumed attempt finds the PID file and goes on.

    While rank 0 waits, rank 1 blocks in the next step's all-reduce, so the run cannot finish
    before the test kills the paused worker, however fast or slow the machine is. (The hook is
    a closure so that cloudpickle ships it by value to the worker.)"""

    def after_window(context, steps_done: int, metrics: dict[str, float]) -> None:
        if steps_done < PAUSE_AT or pid_file.exists():
            return
        written = pid_file.with_suffix(".tmp")
        written.write_text(str(os.getpid()))
        written.rename(pid_file)  # the test never reads a half-written PID
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while time.monotonic() < deadline:
            time.sleep(0.1)
        raise RuntimeError(f"rank 0 paused {PAUSE_LIMIT_S} s and was not killed")

    return RunHooks(after_window=after_window)


def _start_paused_run(config, output: Path, cache_dir: Path, pid_file: Path):
    """Start the run in a thread; return it, its outcome dict and the paused rank-0 process
    (checked to be one of this test's own Ray Train workers)."""
    import psutil

    outcome: dict = {}

    def train() -> None:
        try:
            outcome["summary"] = run(
                config, output, cache_dir=cache_dir, progress=False, hooks=_pause_rank0(pid_file)
            )
        except BaseException as error:  # re-raised in the test thread
            outcome["error"] = error

    thread = threading.Thread(target=train)
    thread.start()
    deadline = time.monotonic() + RUN_LIMIT_S  # a loaded machine starts Ray Train slowly
    while not pid_file.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), f"rank 0 never paused at step {PAUSE_AT}: {outcome}"
    paused = int(pid_file.read_text())
    assert paused in {process.pid for process in _train_worker_processes()}
    assert thread.is_alive()  # the run cannot have finished: its rank 0 is paused
    return thread, outcome, psutil.Process(paused)


def _kill(process) -> None:
    process.kill()
    process.wait(timeout=60)  # gone before the test looks at what the run did next


@pytest.mark.ray
@pytest.mark.slow
def test_failed_run_keeps_its_checkpointed_steps(ray_session, tmp_path, cache_dir):
    """No failures allowed: a killed worker fails the run, which keeps the trajectory of its
    latest checkpoint (like a failed single-process run) and writes no summary; the same
    config again resumes from that trajectory where Ray's checkpoints are gone. On a tiny
    Llama; tiny-opt's replica run is killed and resumed as a search trial in
    tests/integration/test_faults.py."""
    llama = save_tiny_family("llama", tmp_path / "llama")
    steps = 2 * PAUSE_AT  # as many steps left to resume as were made before the kill
    config = _config(
        TINY_MEZO,
        *_layout("replica", 2),
        f"model.name_or_path={llama}",
        f"optimizer.steps={steps}",
        "tracking.log_every=5",
        "tracking.backend=none",
        "eval_before=false",
    )
    output = tmp_path / "failed"
    thread, outcome, victim = _start_paused_run(config, output, cache_dir, tmp_path / "rank0.pid")
    _kill(victim)
    thread.join(timeout=RUN_LIMIT_S)
    assert not thread.is_alive(), "the failed run did not end in 600 s"
    assert "summary" not in outcome and "error" in outcome
    # privzo's one line (the CLI prints an OSError so), naming the way on
    assert isinstance(outcome["error"], OSError), repr(outcome["error"])
    assert "the same command resumes" in str(outcome["error"])
    assert not (output / "summary.json").exists()
    kept = pq.read_table(output / "trajectory.parquet").to_pandas()
    # the newest checkpoint Ray registered (read through Result.from_path, as a resumed attempt
    # reads it through get_checkpoint): step PAUSE_AT's, or the window's before it when rank 0
    # died before Ray's controller registered its report (both ranks had reported it)
    assert PAUSE_AT - 5 <= len(kept) < steps and len(kept) % 5 == 0
    assert list(kept["step"]) == list(range(len(kept)))

    # the same config again, with Ray's checkpoints lost meanwhile: the run goes on from the
    # trajectory the failed launch kept, each of its steps kept as it was and booked once
    shutil.rmtree(output / "ray")
    summary = _run(config, output, cache_dir)
    trajectory = pq.read_table(output / "trajectory.parquet").to_pandas()
    assert summary["resumed_steps"] == len(kept) and summary["steps"] == steps
    assert list(trajectory["step"]) == list(range(steps))
    prefix = trajectory.iloc[: len(kept)].reset_index(drop=True)
    for column in ("seed", "projected_gradient", "learning_rate", "direction_scale"):
        assert list(prefix[column]) == list(kept[column]), column
    assert not (output / "resume.json").exists()


@pytest.mark.ray
@pytest.mark.slow
def test_rank_0_logs_the_lora_adapter_as_a_transformers_model(private_lora_runs, cache_dir):
    """A LoRA run of a tiny Qwen2 on 2 replica workers (zero3 refuses adapters): rank 0 logs
    the adapter in MLflow's transformers flavor, with the family's byte-level tokenizer; loaded
    back, it computes what the trajectory replays to. (The reporting process logs it through
    the same function in every layout: tiny-opt's single-process adapters are logged and
    loaded back in tests/unit/tracking/test_mlflow_model.py.)"""
    uri, summary = private_lora_runs.tracking_uri, private_lora_runs.replica
    record = read_run(uri, summary["tracking_run_id"])
    adapter_uri = record["tags"]["privzo.adapter_uri"]
    assert "adapter/peft/adapter_model.safetensors" in record["artifacts"]

    trajectory = private_lora_runs.root / "runs" / "two" / "trajectory.parquet"
    parts, loaded, expected, steps = adapter_against_replay(
        uri, adapter_uri, trajectory, cache_dir, base=private_lora_runs.replica_base
    )
    assert steps == 12
    torch.testing.assert_close(loaded, expected, rtol=0, atol=1e-6)
    trained_b = [p for name, p in parts["model"].named_parameters() if "lora_B" in name]
    assert trained_b and all(p.abs().max() > 0 for p in trained_b)  # B starts at 0: steps moved it
