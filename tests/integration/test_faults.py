"""Fault injection. A single run SIGKILLed at random steps, again and again,
then let finish: every kill lands wherever the run is (inside a step, while a window's
trajectory and resume point are written, while MLflow is logging); the same command resumes.
A distributed run's worker, then its driver, and a search trial are each SIGKILLed at a random
step boundary, then resumed (the second part of this module).

The runs train tiny decoders of the families beside OPT (Qwen2, Mistral, Llama), and tiny-opt
where a test has a second run for it (the search trial's replica layout): what a fault tests is
the layouts' and the run directory's, and each resumed attempt loads its family's model and
replays the kept steps onto it. tiny-opt's single run is SIGKILLed and resumed in
tests/integration/test_killed_cli_run.py.

Checked at the end of the single run: every step in the trajectory exactly once and in order,
the rows each killed attempt had written kept unchanged (nothing lost, nothing redrawn), ε the
accountant's value for T steps (each step booked once), one MLflow run in the experiment,
FINISHED, whose ε windows are each logged once, every window end's.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest
import torch
from safetensors.torch import load_file

from conftest import RAY_TEST_ENV, REPO, local_ray
from forked_cli import Command, start_cli
from privzo.distributed.launch import CHECKPOINTS_KEPT
from privzo.privacy import compute_epsilon
from privzo.search.tuner import tune_dir
from privzo.tracking import find_runs, read_run
from tiny_families import save_tiny_family

pytestmark = pytest.mark.integration

STEPS = 150
KILLS = 3
WAIT_S = 600  # a margin for a loaded machine, not a timing


def _fault_seed() -> int:
    """The seed of a test's kill points: ``PRIVZO_FAULT_SEED`` to replay a failure (every
    failure message names its seed), else a fresh one."""
    given = os.environ.get("PRIVZO_FAULT_SEED")
    return int(given) if given else random.SystemRandom().randrange(2**32)


def _rows(output: Path) -> list[dict]:
    try:
        return pq.read_table(output / "trajectory.parquet").to_pylist()
    except (OSError, ValueError):  # not written yet
        return []


def _start(
    config: Path, output: Path, cache_dir: Path, model: Path, train: Path, test: Path, logs: Path
) -> Command:
    """``privzo run`` of the run, in a process forked from one that imported privzo's libraries
    once (``forked_cli``): each attempt costs its run, not seconds of imports."""
    argv = [
        *("run", str(config), "--quiet"),
        *("--cache-dir", str(cache_dir), "--output-dir", str(output)),
        f"model.name_or_path={model}",
        f"task.train_path={train}",
        f"task.test_path={test}",
        f"optimizer.steps={STEPS}",
        "optimizer.batch_size=8",
        "task.max_length=16",  # prompts of at most 6 tokens: batches pad to 16, not 128
        "tracking.log_every=5",
        "tracking.experiment=faults",
        "privacy.epsilon=3",
    ]
    return start_cli(argv, config.parent, dict(os.environ), logs)


@pytest.mark.integration
def test_a_run_killed_at_random_steps_loses_nothing_and_books_each_step_once(
    tmp_path, sentiment_files, cache_dir
):
    """On a tiny Qwen2 (byte-level BPE, tied embeddings)."""
    seed = _fault_seed()
    rng = random.Random(seed)  # the kill points; the seed is in every failure message
    print(f"seed {seed}: {KILLS} kills of {STEPS} steps")
    model = save_tiny_family("qwen2", tmp_path / "qwen2")
    config = tmp_path / "run.yaml"
    config.write_text("seed: 0\n")
    output = tmp_path / "runs" / "dp"
    kept: list[list[dict]] = []  # what each killed attempt had written
    low = 1
    for kill in range(KILLS):
        # a step in the kill's quarter of the run, past what the last attempt wrote
        span = STEPS // (KILLS + 1)
        target = max(low, rng.randrange(kill * span + 1, (kill + 1) * span))
        logs = tmp_path / f"attempt-{kill}"
        process = _start(config, output, cache_dir, model, *sentiment_files, logs)
        deadline = time.monotonic() + WAIT_S
        while len(_rows(output)) < target:
            assert process.poll() is None, f"seed {seed}: ended early\n{process.stderr()}"
            assert time.monotonic() < deadline, f"seed {seed}: step {target} not reached"
            time.sleep(0.02)
        time.sleep(rng.uniform(0.0, 0.3))  # land anywhere: in a step, a write, a log
        process.send_signal(signal.SIGKILL)
        code = process.wait(timeout=60)
        assert code == -signal.SIGKILL, f"seed {seed}, kill {kill}: {process.stderr()}"
        kept.append(_rows(output))
        assert len(kept[-1]) >= target and not (output / "summary.json").exists()
        low = len(kept[-1]) + 1

    process = _start(config, output, cache_dir, model, *sentiment_files, tmp_path / "last")
    code = process.wait(timeout=WAIT_S)
    assert code == 0, f"seed {seed}: {process.stderr()}"

    rows = _rows(output)
    assert [row["step"] for row in rows] == list(range(STEPS)), f"seed {seed}"
    for kill, before in enumerate(kept):
        assert rows[: len(before)] == before, f"seed {seed}: attempt {kill}'s rows changed"
    summary = json.loads((output / "summary.json").read_text())
    expected = compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=summary["sample_rate"],
        steps=STEPS,
        delta=summary["delta"] - summary["truncation_delta"],  # the accountant's δ
        noise_parameters=summary["mechanism_parameters"],  # the discrete noise's grid
    )
    assert summary["steps"] == STEPS
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9), f"seed {seed}"
    uri = f"sqlite:///{(tmp_path / 'runs' / 'mlflow.db').resolve()}"
    runs = find_runs(uri, "faults")
    assert [(run.run_id, run.status) for run in runs] == [
        (summary["tracking_run_id"], "FINISHED")
    ], f"seed {seed}"
    record = read_run(uri, summary["tracking_run_id"])
    history = [step for step, _ in record["history"]["epsilon_spent"]]
    assert history == sorted(set(history)) and history[-1] == STEPS, f"seed {seed}: {history}"
    # every window end of every attempt has its ε, also one an attempt was killed right after
    window_ends = {step for step, _ in record["history"]["learning_rate"]}
    assert window_ends <= set(history), f"seed {seed}: {sorted(window_ends - set(history))}"
    assert not (output / "resume.json").exists()


# --- a distributed worker and a search trial, killed at a random step ----------------------
#
# Neither kill races the run: the victim's rank 0 (or the trial) writes its PID and waits at the
# drawn step's boundary until the test has checked that PID is its own and killed the victim.
# The wait is the ``RunHooks.after_window`` hook a distributed run ships to
# rank 0; a trial's hooks are the search's own, so a Ray worker setup hook (the test's, given to
# ``ray.init``) wraps the trial's ``after_window`` with the same wait.

# one window per step (log_every=1): any step can be the one killed at. Twelve steps put a kill
# before or after the first score (every 5 steps) and end off that grid (final score at 12);
# a window costs a checkpoint, so more steps only add time
RAY_STEPS = 12
PAUSE_LIMIT_S = 900  # a paused victim nobody kills fails its run instead of hanging
RUN_LIMIT_S = 2400  # a margin for a loaded 2-core machine (a search's first trial), not a timing
TINY_DPZERO = REPO / "configs" / "runs" / "tiny-dpzero.yaml"


def _pause_at(step: int, pid_file: Path):
    """An ``after_window`` that, the first time ``step`` steps are done, writes this process's
    PID and waits to be killed; a later attempt finds the PID file and goes on. A closure, so
    cloudpickle ships it by value to Ray's workers."""

    def pause(steps_done: int) -> None:
        if steps_done != step or pid_file.exists():
            return
        written = pid_file.with_suffix(".tmp")
        written.write_text(str(os.getpid()))
        written.rename(pid_file)  # the test never reads a half-written PID
        time.sleep(PAUSE_LIMIT_S)
        raise RuntimeError(f"paused {PAUSE_LIMIT_S} s at step {step} and was not killed")

    return pause


@pytest.fixture
def ray_with():
    """``ray_with(**runtime_env)`` starts a 2-CPU local Ray for one test (stopped after it):
    conftest's ``local_ray`` with ``runtime_env``'s extras."""
    with contextlib.ExitStack() as stack:
        yield lambda **runtime_env: stack.enter_context(local_ray(**runtime_env))


def _descendants(marker: str) -> dict[int, object]:
    """This test's own processes whose command line holds ``marker`` (Ray's workers are
    children of the raylet this test started)."""
    import psutil

    found = {}
    for process in psutil.Process(os.getpid()).children(recursive=True):
        try:
            if marker in " ".join(process.cmdline()):
                found[process.pid] = process
        except psutil.Error:
            continue
    return found


def _in_thread(function, *args, **kwargs):
    """Run ``function`` in a thread; returns the thread and a dict that gets its result (or the
    error it raised, re-raised by the test)."""
    import threading

    outcome: dict = {}

    def target() -> None:
        try:
            outcome["result"] = function(*args, **kwargs)
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def _wait_for(pid_file: Path, thread, outcome: dict, seed: int) -> int:
    deadline = time.monotonic() + RUN_LIMIT_S
    while not pid_file.exists() and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), f"seed {seed}: the victim never paused: {outcome}"
    assert thread.is_alive(), f"seed {seed}: the run ended although its victim is paused"
    return int(pid_file.read_text())


def _kill(process, seed: int) -> None:
    import psutil

    process.kill()
    process.wait(timeout=120)
    assert not psutil.pid_exists(process.pid) or process.status() == psutil.STATUS_ZOMBIE, (
        f"seed {seed}: the victim {process.pid} survived SIGKILL"
    )


def _join(thread, outcome: dict, seed: int):
    thread.join(timeout=RUN_LIMIT_S)
    assert not thread.is_alive(), f"seed {seed}: the run did not end in {RUN_LIMIT_S} s"
    if "error" in outcome:
        raise AssertionError(f"seed {seed}: the run failed") from outcome["error"]
    return outcome["result"]


def _check_released_once(uri: str, run_id: str, rows: list[dict], seed: int) -> None:
    """Every window's metrics logged at most once, and the released |g| of each logged step
    (one step a window) is the final trajectory's: no step was drawn twice. (The tracker
    buffers metrics, so a killed attempt's unsent windows are missing, never released.)"""
    history = read_run(uri, run_id)["history"]
    for key, points in history.items():
        steps = [step for step, _ in points]
        assert len(steps) == len(set(steps)), f"seed {seed}: {key} logged twice at a step"
    logged = dict(history["projected_gradient_abs"])
    assert set(logged) <= set(range(1, len(rows) + 1)) and len(rows) in logged, f"seed {seed}"
    for row in rows:
        released = logged.get(row["step"] + 1, abs(row["projected_gradient"]))
        assert released == pytest.approx(abs(row["projected_gradient"]), rel=1e-12), (
            f"seed {seed}: step {row['step']} released {released}, recorded "
            f"{row['projected_gradient']}"
        )


def _check_accounted_once(output: Path, summary: dict, steps: int, seed: int) -> None:
    """privacy.json books every step once, and ε is the accountant's for the run's recorded
    parameters (computed here, not taken from the run)."""
    expected = compute_epsilon(
        noise_multiplier=summary["noise_multiplier"],
        sample_rate=summary["sample_rate"],
        steps=steps,
        delta=summary["delta"] - summary["truncation_delta"],  # the accountant's δ
        noise_parameters=summary["mechanism_parameters"],
    )
    privacy = json.loads((output / "privacy.json").read_text())
    assert privacy["steps_accounted"] == steps and privacy["final"] is True, f"seed {seed}"
    assert privacy["epsilon_spent"] == pytest.approx(expected, rel=1e-9), f"seed {seed}"
    assert summary["epsilon"] == pytest.approx(expected, rel=1e-9), f"seed {seed}"


def _check_trajectory(rows: list[dict], released: list[dict], steps: int, seed: int) -> None:
    """Steps 0..T-1 once each, in order, and what the killed attempt released kept as it was."""
    assert [row["step"] for row in rows] == list(range(steps)), f"seed {seed}"
    kept = [{k: row[k] for k in ("step", "seed", "projected_gradient")} for row in rows]
    before = [{k: row[k] for k in ("step", "seed", "projected_gradient")} for row in released]
    assert kept[: len(before)] == before, f"seed {seed}: a released step was drawn again"


def _released_checkpoint(storage: Path, step: int) -> list[dict]:
    """The trajectory rank 0 attached to its report for ``step`` (written before the report
    returned, so before the window's metrics went out)."""
    from privzo.distributed.checkpoint import read_checkpoint

    for state in storage.glob("*/checkpoint_*/state.json"):
        table, _meta, run_state = read_checkpoint(state.parent)
        if run_state.steps_done == step:
            return table.to_pylist()
    raise AssertionError(f"no checkpoint for step {step} in {storage}")


def _check_replays_to_the_saved_model(output: Path, base: str, cache_dir: Path, seed: int) -> None:
    """The restarted ranks rebuilt θ by replaying the kept steps: the saved weights are the
    whole trajectory's, replayed from the base model ``base``."""
    from privzo.replay import replay

    loaded, _model, replayed_steps = replay(
        base, output / "trajectory.parquet", cache_dir=cache_dir, progress=False
    )
    assert replayed_steps == RAY_STEPS, f"seed {seed}"
    replayed = loaded.model.state_dict()
    for name, tensor in load_file(output / "model" / "model.safetensors").items():
        assert torch.equal(replayed[name], tensor), f"seed {seed}: {name}"


# The CLI itself (``privzo.cli.main``, argv as given), with rank 0 of the run pausing at each of
# the given steps until the test has killed a victim: the same ``after_window`` wait as above,
# installed by wrapping ``privzo.run.run`` (which the CLI imports when it runs). Defined in
# ``__main__``, so cloudpickle ships the wait by value to the Ray Train workers.
PAUSING_CLI = """
import os, sys, time
from pathlib import Path

import privzo.run as pipeline

pid_dir, steps = Path(os.environ["FAULT_PID_DIR"]), os.environ["FAULT_STEPS"].split(",")
limit, real = float(os.environ["FAULT_PAUSE_LIMIT_S"]), pipeline.run


def pause(_context, done, _metrics):
    pid_file = pid_dir / f"rank0-{done}.pid"
    if str(done) not in steps or pid_file.exists():
        return
    written = pid_file.with_suffix(".tmp")
    written.write_text(str(os.getpid()))
    written.rename(pid_file)
    time.sleep(limit)
    raise RuntimeError(f"paused {limit} s at step {done} and was not killed")


def paused_run(*args, **kwargs):
    return real(*args, hooks=pipeline.RunHooks(after_window=pause), **kwargs)


pipeline.run = paused_run
from privzo.cli import main

sys.exit(main(sys.argv[1:]))
"""


def _gone(pid: int, limit_s: float) -> bool:
    import psutil

    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.2)
    return False


def _paused_rank0(pid_file: Path, driver: subprocess.Popen, log: Path, seed: int) -> int:
    """The PID of rank 0, once it waits at the step ``pid_file`` names; the driver alive."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while not pid_file.exists() and driver.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert pid_file.exists(), f"seed {seed}: rank 0 never paused\n{log.read_text()[-3000:]}"
    assert driver.poll() is None, f"seed {seed}: the driver ended while rank 0 paused"
    return int(pid_file.read_text())


@dataclass(frozen=True)
class KilledTwice:
    """A replica run whose worker, then whose driver, was SIGKILLed, finished by the same command:
    what the kills left and what the run ended with."""

    seed: int
    worker_step: int
    driver_step: int
    released_first: list[dict]  # the trajectory committed at the worker's kill
    released: list[dict]  # ... at the driver's kill
    resume_point: dict
    ray_run: Path
    output: Path
    base: str  # the model the run starts from, as replay takes it
    uri: str
    summary: dict
    rows: list[dict]


@pytest.fixture(scope="module")
def killed_twice(tmp_path_factory, cache_dir) -> KilledTwice:
    """``privzo run`` of a two-worker replica DPZero run with one restart allowed. While rank 0
    waits at a drawn step, one worker (rank 0 or 1, drawn) is SIGKILLed: the run restarts its
    workers, which rebuild θ by replaying the kept steps. While the new rank 0 waits at a later
    drawn step, the driver is SIGKILLed (nothing of it runs after the kill). Then the same command
    again. One run serves the worker's and the driver's tests (a second would start Ray, a worker
    group and the model again for the same 12 steps). It trains a tiny Mistral; tiny-opt's
    replica run is a trial killed and resumed below."""
    from privzo.distributed.resume import committed

    seed = _fault_seed()
    rng = random.Random(seed)
    worker_step = rng.randrange(2, RAY_STEPS - 3)
    driver_step, rank = rng.randrange(worker_step + 1, RAY_STEPS - 2), rng.randrange(2)
    print(f"seed {seed}: kill rank {rank} at step {worker_step}, the driver at {driver_step}")
    root = tmp_path_factory.mktemp("killed-twice")
    output, pids = root / "runs" / "replica", root / "pids"
    pids.mkdir()
    base = str(save_tiny_family("mistral", root / "mistral"))
    command = [
        *(sys.executable, "-c", PAUSING_CLI, "run", str(TINY_DPZERO), "--quiet"),
        *("--cache-dir", str(cache_dir), "--output-dir", str(output)),
        *(f"model.name_or_path={base}", "task.examples_per_class=32", "task.test_size=16"),
        *(f"optimizer.steps={RAY_STEPS}", "optimizer.batch_size=8", "tracking.log_every=1"),
        *("parallel.strategy=replica", "parallel.workers=2", "parallel.max_failures=1"),
        *("tracking.experiment=driver", "save_model=true"),
    ]
    environment = {
        **os.environ,
        **RAY_TEST_ENV,
        "PYTHONUNBUFFERED": "1",
        "FAULT_PID_DIR": str(pids),
        "FAULT_STEPS": f"{worker_step},{driver_step}",
        "FAULT_PAUSE_LIMIT_S": str(PAUSE_LIMIT_S),
    }
    log = root / "killed.log"
    with log.open("w") as sink:
        driver = subprocess.Popen(command, env=environment, stdout=sink, stderr=sink)
        try:
            rank0 = _paused_rank0(pids / f"rank0-{worker_step}.pid", driver, log, seed)
            workers = _descendants("RayTrainWorker")
            assert len(workers) == 2 and rank0 in workers, f"seed {seed}: {rank0} of {workers}"
            released_first = _released_checkpoint(output / "ray", worker_step)
            assert len(released_first) == worker_step
            (victim,) = [pid for pid in workers if (pid == rank0) == (rank == 0)]
            _kill(workers[victim], seed)
            # the restarted workers replay the kept steps and go on to the driver's step
            rank0 = _paused_rank0(pids / f"rank0-{driver_step}.pid", driver, log, seed)
        finally:
            driver.kill()  # SIGKILL: no handler of the driver runs (no salvage, no MLflow status)
            driver.wait(timeout=120)
    # Ray's controller and workers share the fate of the driver that owns them
    assert _gone(rank0, 300), f"seed {seed}: rank 0 ({rank0}) outlived its driver"
    (ray_run,) = (output / "ray").iterdir()
    newest = committed(str(ray_run))
    assert newest.steps == driver_step, f"seed {seed}: committed {newest.steps}"
    released = _released_checkpoint(output / "ray", driver_step)
    point = json.loads((output / "resume.json").read_text())
    assert point["ray_run"] == ray_run.name and not (output / "trajectory.parquet").exists()

    with log.open("w") as sink:  # the same command again
        done = subprocess.run(
            command, env=environment, stdout=sink, stderr=sink, timeout=RUN_LIMIT_S
        )
    assert done.returncode == 0, f"seed {seed}\n{log.read_text()[-4000:]}"
    return KilledTwice(
        seed=seed,
        worker_step=worker_step,
        driver_step=driver_step,
        released_first=released_first,
        released=released,
        resume_point=point,
        ray_run=ray_run,
        output=output,
        base=base,
        uri=f"sqlite:///{(root / 'runs' / 'mlflow.db').resolve()}",
        summary=json.loads((output / "summary.json").read_text()),
        rows=pq.read_table(output / "trajectory.parquet").to_pylist(),
    )


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_a_distributed_worker_killed_at_a_random_step_loses_nothing(killed_twice, cache_dir):
    """The worker's kill: the restarted workers rebuilt θ by replaying the kept steps (the saved
    model is the whole trajectory's), the steps committed before the kill kept as they were, and
    every step drawn, booked and released once over the attempts."""
    run, seed = killed_twice, killed_twice.seed
    _check_trajectory(run.rows, run.released_first, RAY_STEPS, seed)
    _check_accounted_once(run.output, run.summary, RAY_STEPS, seed)
    _check_released_once(run.uri, run.summary["tracking_run_id"], run.rows, seed)
    assert (
        read_run(run.uri, run.summary["tracking_run_id"])["metrics"]["final_epsilon"]
        == (run.summary["epsilon"])
    )
    _check_replays_to_the_saved_model(run.output, run.base, cache_dir, seed)


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
def test_a_distributed_run_whose_driver_is_killed_resumes_with_the_same_command(killed_twice):
    """The driver's kill: the same command went on from the newest checkpoint the killed launch
    committed, in the same MLflow run and the same Ray Train run, which keeps only its newest
    checkpoints."""
    run, seed = killed_twice, killed_twice.seed
    summary, point = run.summary, run.resume_point
    assert summary["steps"] == RAY_STEPS and summary["resumed_steps"] == run.driver_step, seed
    _check_trajectory(run.rows, run.released, RAY_STEPS, seed)
    runs = find_runs(run.uri, "driver")
    assert [(r.run_id, r.status) for r in runs] == [(point["tracking_run_id"], "FINISHED")]
    assert summary["tracking_run_id"] == point["tracking_run_id"]
    # one Ray Train run for both launches, holding only its newest checkpoints
    assert [path.name for path in (run.output / "ray").iterdir()] == [run.ray_run.name]
    states = sorted(run.ray_run.glob("checkpoint_*/state.json"))
    kept = [json.loads(path.read_text())["steps_done"] for path in states]
    assert sorted(kept) == list(range(RAY_STEPS - CHECKPOINTS_KEPT + 1, RAY_STEPS + 1))
    checkpoints = [path for path in run.ray_run.glob("checkpoint_*") if path.is_dir()]
    assert len(checkpoints) == CHECKPOINTS_KEPT
    assert not (run.output / "resume.json").exists()


def _pausing_trials(step: int, pid_file: Path):
    """A Ray worker setup hook: a trial's run gets the trial's own ``after_window`` (its Tune
    report) followed by the wait at ``step``. A closure, shipped by value like the wait."""
    pause = _pause_at(step, pid_file)

    def setup() -> None:
        import dataclasses

        import privzo.search.trial as trial

        original = trial.run

        def paused_run(config, output_dir, **kwargs):
            reports = kwargs["hooks"].after_window

            def after_window(context, done: int, metrics: dict) -> None:
                reports(context, done, metrics)  # the window's Tune report goes out first
                pause(done)

            kwargs["hooks"] = dataclasses.replace(kwargs["hooks"], after_window=after_window)
            return original(config, output_dir, **kwargs)

        trial.run = paused_run

    return setup


def _wait_for_reports(output: Path, steps: list[int], seed: int) -> None:
    """Until Tune has recorded the score reports of ``steps`` (the run waits meanwhile)."""
    deadline = time.monotonic() + RUN_LIMIT_S
    while [report["step"] for report in _tune_reports(output)] != steps:
        assert time.monotonic() < deadline, f"seed {seed}: Tune never recorded {steps}"
        time.sleep(0.1)


def _tune_reports(output: Path) -> list[dict]:
    """What Tune recorded of the trials' reports (every attempt's, from its result files)."""
    reports = []
    for path in sorted(tune_dir(output, private=True).rglob("result.json")):
        reports += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return reports


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.integration
@pytest.mark.parametrize(("strategy", "family"), [("single", "llama"), ("replica", "opt")])
def test_a_search_trial_killed_at_a_random_step_loses_nothing(
    ray_with, tmp_path, make_search, cache_dir, strategy, family
):
    """A one-trial private search with ASHA scores every 5 steps: the trial's process (a
    single run, or the driver of a two-worker replica run) SIGKILLed while the run waits at a
    drawn step (after that window's report); the trial ends in error, and the same search run
    again resumes the trial from its last window (a distributed one from the newest checkpoint
    its Ray Train run committed). The single trial trains a tiny Llama, the replica one
    tiny-opt."""
    from privzo.dirlock import LOCK_FILE, read_holder
    from privzo.search import load_search_config, run_search
    from privzo.search.privacy import TrialEvent, composition_epsilon, rdp_curve
    from privzo.tracking import find_runs

    seed = _fault_seed()
    step = random.Random(seed).randrange(2, RAY_STEPS - 2)
    print(f"seed {seed}: kill the {strategy} trial at step {step} of {RAY_STEPS}")
    every = 5
    layout = {} if strategy == "single" else {"parallel.strategy": strategy, "parallel.workers": 2}
    model = (
        {}
        if family == "opt"
        else {"model.name_or_path": str(save_tiny_family(family, tmp_path / family))}
    )
    search = load_search_config(
        make_search(
            space={"privacy.clip": [0.5], "optimizer.steps": [RAY_STEPS]},
            overrides={"tracking.log_every": 1, **layout, **model},
            scheduler={"type": "asha", "evaluate_every": every},
        )
    )
    output, pid_file = tmp_path / "search", tmp_path / "trial.pid"
    ray_with(worker_process_setup_hook=_pausing_trials(step, pid_file))
    options = {"cache_dir": cache_dir, "progress": False, "echo": lambda _line: None}
    thread, outcome = _in_thread(run_search, search, output, **options)
    paused = _wait_for(pid_file, thread, outcome, seed)
    (trial_dir,) = (output / "trials").iterdir()
    holder = read_holder(trial_dir / LOCK_FILE)  # the PID the trial's run recorded itself
    assert holder is not None, f"seed {seed}: no lock holder"
    # a single trial's run pauses in the trial's process; a distributed one on its rank 0
    assert (holder.pid == paused) == (strategy == "single"), f"seed {seed}: {holder} {paused}"
    ours = _descendants("")  # this test's own processes (its Ray's workers among them)
    assert {holder.pid, paused} <= set(ours), f"seed {seed}: {holder.pid} is not this test's"
    scores = list(range(every, step + 1, every))
    if strategy != "single":  # rank 0's scores go through Ray's queue to the trial
        _wait_for_reports(output, scores, seed)
    _kill(ours[holder.pid], seed)  # the kill happened before anything is asserted of the resume
    first = _join(thread, outcome, seed)
    # Tune records the trial as errored, but its saved experiment state (which the search's
    # statuses come from) is a snapshot that can still read RUNNING, reported as pending: it
    # did for a single trial killed at step 4 in a full marked run, seed 2752134727, as for
    # replica trials, which wait for their reports. Unfinished either way, and run again by
    # the resumed search; which one is Tune's snapshot timing, not privzo's to assert.
    statuses = [row["status"] for row in first["trials"]]
    assert len(statuses) == 1 and statuses[0] in {"error", "pending"}, f"seed {seed}: {first}"
    if strategy == "single":
        released = pq.read_table(trial_dir / "trajectory.parquet").to_pylist()
    else:  # Ray's workers share the fate of the trial that owns them
        assert _gone(paused, 300), f"seed {seed}: rank 0 ({paused}) outlived its trial"
        released = _released_checkpoint(trial_dir / "ray", step)
    assert len(released) == step, f"seed {seed}"
    killed_run = json.loads((trial_dir / "resume.json").read_text())["tracking_run_id"]
    killed_reports = [report["step"] for report in _tune_reports(output)]
    assert killed_reports == scores, f"seed {seed}"

    # The same search again, in a new Ray session as the same command gets: the killed trial's
    # Ray Train placement group outlives it in this one (Ray Train's cleaner polls the State
    # API, which a local Ray without a dashboard does not serve), holding the workers' CPUs
    import ray

    ray.shutdown()
    ray_with(worker_process_setup_hook=_pausing_trials(step, pid_file))
    summary = run_search(search, output, **options)  # it resumes
    assert summary["interrupted"] is False and summary["trials_finished"] == 1, f"seed {seed}"
    assert summary["restarts"] == 0, f"seed {seed}: the trial resumed, it did not start over"
    trial = json.loads((trial_dir / "summary.json").read_text())
    assert trial["steps"] == RAY_STEPS and trial["resumed_steps"] == step, f"seed {seed}"
    rows = pq.read_table(trial_dir / "trajectory.parquet").to_pylist()
    _check_trajectory(rows, released, RAY_STEPS, seed)
    _check_accounted_once(trial_dir, trial, RAY_STEPS, seed)

    # MLflow: the killed attempt's run is the trial's one run, reopened and FINISHED
    uri = f"sqlite:///{(output / 'mlflow.db').resolve()}"
    runs = find_runs(uri, "search-test")
    statuses = {run.run_id: run.status for run in runs}
    parent = json.loads((output / "search_state.json").read_text())["parent_run_id"]
    assert statuses == {parent: "FINISHED", killed_run: "FINISHED"}, f"seed {seed}"
    assert trial["tracking_run_id"] == killed_run
    _check_released_once(uri, killed_run, rows, seed)
    # the trial's layout in the search's table; a distributed one's in its summary and run too
    workers = 1 if strategy == "single" else 2
    (row,) = pd.read_parquet(output / "trials.parquet").itertuples()
    assert (row.strategy, row.workers, row.status) == (strategy, workers, "finished")
    if strategy != "single":
        assert (trial["strategy"], trial["workers"]) == (strategy, workers), f"seed {seed}"
        tags = read_run(uri, killed_run)["tags"]
        assert (tags["privzo.strategy"], tags["privzo.workers"]) == (strategy, str(workers))

    # Tune: each score step reported once over both attempts, all counted by the records (the
    # new Tune session starts the trial's result file anew: the killed attempt's reports are
    # the ones read before the resume)
    scored = killed_reports + [report["step"] for report in _tune_reports(output)]
    assert sorted(scored) == sorted(set(scored)), f"seed {seed}: a score released twice"
    assert set(scored) == {*range(every, RAY_STEPS, every), RAY_STEPS}, f"seed {seed}"
    assert trial["selection_releases"] == len(scored), f"seed {seed}: releases not all counted"
    event = TrialEvent(
        steps=RAY_STEPS,
        sample_rate=trial["sample_rate"],
        noise_multiplier=trial["noise_multiplier"],
        score_releases=len(scored),
        score_noise_multiplier=search.selection.score_noise_multiplier,
        noise_grid=trial["mechanism_parameters"]["grid"],
    )
    bound = composition_epsilon(rdp_curve(event.dp_event()), 1, trial["delta"])
    assert summary["end_to_end_epsilon"] == pytest.approx(bound, rel=1e-9), f"seed {seed}"
