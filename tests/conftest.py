"""Shared fixtures: a tiny labelled dataset on disk and a model cache for the session."""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from privzo.config import RunConfig, load_config
from privzo.privacy import keep_epsilons_in
from privzo.tracking import keep_blank_stores_in

# The fused Triton kernels (privzo.zo.kernels) run on CPU tensors under Triton's interpreter,
# which Triton reads when a kernel is defined: privzo imports Triton only on first use, so
# setting it here, before any test runs, is early enough.
os.environ.setdefault("TRITON_INTERPRET", "1")

# Ray starts its worker processes at nice 15 (RAY_worker_niceness) so its own services stay
# responsive; next to any CPU-bound process at nice 0 they then get about 3 % of a core (weights
# 36 against 1024), and a distributed test slows many-fold next to one busy process per core
# (docs/measurements.md, "The test suites"). Every Ray a test starts (here, in a CLI subprocess,
# or `ray start`) inherits this environment, so its workers compete as equals.
os.environ.setdefault("RAY_worker_niceness", "0")

# A new Ray prestarts idle Python workers for jobs without a runtime environment; the tests' Rays
# run only privzo's jobs, which ship privzo in theirs, so those workers start (importing Ray)
# and are never used: two spare processes per Ray the tests start.
os.environ.setdefault("RAY_prestart_worker_first_driver", "false")

# OpenMP threads that wait by spinning (libgomp's default) starve each other when the suite's
# processes share a few cores: beside other work the million-weight rounding tests ran 15 times
# slower with spinning threads than with sleeping ones (docs/measurements.md, "OpenMP threads
# waiting passively"). The commands set this for themselves; the tests' own processes and the
# Rays they start take it from here, before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

# The checkout's root, for tests that read its configs/, README.md or platform/ (tests sit at
# different depths under tests/, so none computes it from its own __file__).
REPO = Path(__file__).resolve().parents[1]


def ctrl_c_reaches_it() -> None:
    """``preexec_fn`` for a child a test stops with SIGINT (Ctrl+C): a shell without job control
    starts background commands (``pytest ... &``, ``nohup``) with SIGINT ignored, children
    inherit that, and Python then installs no KeyboardInterrupt handler, so the signal would be
    lost (the Ctrl+C test would hang until its timeout in a backgrounded suite)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


# Ray Train for tests: reports every 0.1 s instead of 2 s; a worker group may take 20 minutes to
# start, not Ray's 60 s: a margin for two workers importing torch on a loaded 2-core machine
# (docs/measurements.md, "Test margins"), not a timing.
RAY_TEST_ENV = {
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.1",
    "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "1200",
}


@contextlib.contextmanager
def local_ray(**runtime_env: Any) -> Iterator[Any]:
    """A 2-CPU local Ray with this privzo shipped to its workers (privzo's job runtime env),
    ``RAY_TEST_ENV`` set on both sides (the driver's environment and the workers'), and
    ``runtime_env``'s extras (e.g. a worker setup hook); shut down, environment restored."""
    ray = pytest.importorskip("ray")
    from privzo.distributed.launch import ray_runtime_env

    previous = {name: os.environ.get(name) for name in RAY_TEST_ENV}
    os.environ.update(RAY_TEST_ENV)
    try:
        env = {**ray_runtime_env(RAY_TEST_ENV), **runtime_env}
        ray.init(num_cpus=2, include_dashboard=False, runtime_env=env)
        yield ray
    finally:
        ray.shutdown()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def stop_ray_under(temp_dir: Path) -> None:
    """Stop the Ray whose files live under ``temp_dir`` (``ray start --temp-dir`` or
    ``RAY_TMPDIR``): its processes, which name that directory on their command lines, and their
    children (the workers). ``ray stop`` would stop every Ray on the machine."""
    import psutil

    ours = []
    for process in psutil.process_iter(["cmdline"]):
        if str(temp_dir) in " ".join(process.info["cmdline"] or []):
            ours.append(process)
    family = {p.pid: p for p in ours}
    for process in ours:
        try:
            family.update({child.pid: child for child in process.children(recursive=True)})
        except psutil.Error:
            continue
    for process in family.values():
        try:
            process.kill()
        except psutil.Error:
            continue
    psutil.wait_procs(list(family.values()), timeout=20)


def autograd_per_example(context, indices: list[int]):
    """(the context's trainable parameters, each example's own autograd gradient of them) for
    the rows ``indices`` of its training split: what Opacus' per-example gradients must equal."""
    import torch

    from privzo.baselines.first_order import trainable_parameters
    from privzo.tasks.scoring import differentiable_scoring

    parameters = trainable_parameters(context)
    batch = context.task.collate(context.train, indices)
    for parameter in parameters:
        parameter.requires_grad_(True)
    with differentiable_scoring():
        losses = context.task.per_example_loss(context.scoring_model, batch)
    expected = [torch.autograd.grad(loss, parameters, retain_graph=True) for loss in losses]
    for parameter in parameters:
        parameter.requires_grad_(False)
    return parameters, expected


# LMO's parameters in the privacy tests: a mixture with weight on every part
LMO_PARAMETERS = {
    "weights": [0.4, 0.3, 0.3],
    "gamma_shape": 3.0,
    "gamma_scale": 0.5,
    "exponential_rate": 1.0,
    "uniform_low": 0.5,
    "uniform_high": 1.5,
}


def adapter_against_replay(
    tracking_uri: str, adapter_uri: str, trajectory: Path, cache_dir: Path, base: str = "tiny-opt"
):
    """Load a run's logged adapter (MLflow's transformers flavor) and replay its trajectory on
    ``base`` (the run's model); returns (the loaded components, their logits, the replay's
    logits, steps replayed) on two short texts, for the caller to compare."""
    import mlflow
    import mlflow.transformers
    import torch

    from privzo.replay import replay

    mlflow.set_tracking_uri(tracking_uri)
    try:
        parts = mlflow.transformers.load_model(adapter_uri, return_type="components")
    finally:
        mlflow.set_tracking_uri(None)
    _base, replayed, steps = replay(base, trajectory, cache_dir=cache_dir, progress=False)
    tokens = parts["tokenizer"](["a nice film", "a bad film"], return_tensors="pt", padding=True)
    with torch.no_grad():
        loaded = parts["model"].eval()(**tokens).logits
        expected = replayed.eval()(**tokens).logits
    return parts, loaded, expected, steps


POSITIVE = ["good", "fine", "nice", "happy", "bright"]
NEGATIVE = ["bad", "poor", "sad", "dull", "awful"]


def write_sentiment_jsonl(path: Path, count: int, seed: int) -> Path:
    """Rows like {"sentence": "a nice film", "label": 1}, balanced, deterministic by seed."""
    rng = random.Random(seed)
    with path.open("w") as handle:
        for index in range(count):
            label = index % 2
            word = rng.choice(POSITIVE if label else NEGATIVE)
            handle.write(json.dumps({"sentence": f"a {word} film", "label": label}) + "\n")
    return path


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    """The built-in models' cache, one per test run: pytest-xdist's workers share it (each model
    is built once per run, the others wait on its build lock)."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = tmp_path_factory.getbasetemp().parent / "privzo-cache"
        shared.mkdir(exist_ok=True)
        return shared
    return tmp_path_factory.mktemp("privzo-cache")


@pytest.fixture(scope="session", autouse=True)
def epsilons_kept(cache_dir) -> Path:
    """ε evaluations kept in the session's cache, as ``privzo run`` keeps them in its own: a
    test's calibration that another test already made is read, not evaluated again. New MLflow
    stores are copied from the cache's blank one, as ``privzo run``'s are."""
    keep_epsilons_in(cache_dir)
    keep_blank_stores_in(cache_dir)
    return cache_dir


@pytest.fixture
def sentiment_files(tmp_path) -> tuple[Path, Path]:
    return (
        write_sentiment_jsonl(tmp_path / "train.jsonl", 64, seed=1),
        write_sentiment_jsonl(tmp_path / "test.jsonl", 20, seed=2),
    )


# The distributed twins' data and schedule, shrunk to seconds: tiny-opt, 64 training examples.
SMALL_RUN = [
    "model.name_or_path=tiny-opt",
    "task.examples_per_class=32",
    "task.test_size=16",
    "optimizer.steps=12",
    "optimizer.batch_size=8",
    "tracking.log_every=4",
]

# The tiny run the run-level tests share: 12 DPZero steps of tiny-opt on ``sentiment_files``,
# 8 rows a batch, learning rate 1e-3, ε = 3, metrics every 5 steps.
TINY_RUN = (
    "task.max_length=16",  # prompts of at most 6 tokens: private batches pad to 16, not 128
    "optimizer.steps=12",
    "optimizer.batch_size=8",
    "optimizer.learning_rate=1e-3",
    "tracking.log_every=5",
    "privacy.epsilon=3",
)


@pytest.fixture
def tiny_run_config(sentiment_files):
    """``tiny_run_config(*overrides)``: the tiny run's config, ``key=value`` overrides applied
    after ``TINY_RUN`` (so a later value of the same key wins)."""
    train, test = sentiment_files

    def build(*overrides: str) -> RunConfig:
        paths = [f"task.train_path={train}", f"task.test_path={test}"]
        return load_config(None, ["model.name_or_path=tiny-opt", *paths, *TINY_RUN, *overrides])

    return build


@pytest.fixture
def make_search(tmp_path, sentiment_files):
    """Writes a tiny private search (base run + 2 × 2 grid over clip and steps); keyword
    arguments replace top-level keys of the search config."""

    def write(**search) -> Path:
        train, test = sentiment_files
        base = {
            "model": {"name_or_path": "tiny-opt"},
            # prompts of at most 6 tokens: private batches pad to 16, not the model's 128
            "task": {
                "train_path": str(train),
                "test_path": str(test),
                "validation_size": 16,
                "max_length": 16,
            },
            "optimizer": {"algorithm": "dpzero", "steps": 10, "batch_size": 8},
            "privacy": {"epsilon": 2.0, "delta": 1e-5},
            "tracking": {"experiment": "search-test", "log_every": 5},
        }
        (tmp_path / "base.yaml").write_text(yaml.safe_dump(base))
        data = {
            "base": "base.yaml",
            "space": {"privacy.clip": [0.5, 1.0], "optimizer.steps": [10, 30]},
            "algorithm": "grid",
            **search,
        }
        path = tmp_path / "search.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return write
