"""`ray job submit` end to end: a local head node on 127.0.0.1, a tiny replica job, its output.
The job trains a tiny Qwen2 (tiny-opt's replica MeZO runs in tests/integration/test_distributed.py).

The head runs in its own temp dir with token authentication disabled (no token written to the
home directory); only the processes of that head are stopped afterwards (`ray stop` would stop
every Ray process on the machine).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from conftest import REPO, stop_ray_under
from tiny_families import save_tiny_family

pytestmark = pytest.mark.integration

RAY = shutil.which("ray") or str(Path(sys.executable).with_name("ray"))


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture
def head_node():
    temp_dir = Path(tempfile.mkdtemp(prefix="rz", dir="/tmp"))  # Ray's socket paths are short
    dashboard_port = _free_port()
    # every port of our own, so another Ray on the machine (default agent port 52365, ...)
    # cannot keep our job agent from starting ("No available agent to submit job")
    ports = {
        name: _free_port()
        for name in (
            "port", "dashboard-agent-listen-port", "dashboard-agent-grpc-port",
            "metrics-export-port", "runtime-env-agent-port", "node-manager-port",
            "object-manager-port", "ray-client-server-port",
        )
    }  # fmt: skip
    # the head's workers inherit its environment: Ray Train's worker group may take 10 minutes
    # to start on a loaded machine, not Ray's 60 s
    env = {
        **os.environ,
        "RAY_AUTH_MODE": "disabled",
        "RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S": "1200",
    }
    env.pop("RAY_ADDRESS", None)
    command = [
        RAY, "start", "--head", "--node-ip-address=127.0.0.1", "--num-cpus=2",
        "--include-dashboard=true", "--dashboard-host=127.0.0.1",
        f"--dashboard-port={dashboard_port}", "--disable-usage-stats", f"--temp-dir={temp_dir}",
        *(f"--{name}={port}" for name, port in ports.items()),
    ]  # fmt: skip
    try:
        subprocess.run(command, env=env, check=True, capture_output=True, timeout=600)
        yield f"http://127.0.0.1:{dashboard_port}", env
    finally:
        stop_ray_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.mark.integration
@pytest.mark.ray
@pytest.mark.slow
def test_ray_job_submit_runs_a_replica_job(head_node, tmp_path, cache_dir):
    address, env = head_node
    output = tmp_path / "job-output"
    qwen2 = save_tiny_family("qwen2", tmp_path / "qwen2")
    # "/runs": the top-level run folder only ("runs" alone would also drop configs/runs)
    runtime_env = {"excludes": ["/.git", "/runs", "/mlruns", "*.db", "__pycache__"]}
    started = time.monotonic()
    command = [
        RAY, "job", "submit", f"--address={address}", f"--working-dir={REPO}",
        f"--runtime-env-json={json.dumps(runtime_env)}", "--",
        "python", "jobs/run.py", "--config", "configs/runs/tiny-mezo.yaml",
        "--output-dir", str(output), "--cache-dir", str(cache_dir),
        f"model.name_or_path={qwen2}", "task.examples_per_class=16", "task.test_size=8",
        "optimizer.steps=6", "optimizer.batch_size=4", "tracking.log_every=3",
        "tracking.backend=none", "parallel.strategy=replica", "parallel.workers=2",
    ]  # fmt: skip
    for _attempt in range(30):  # the head's job agent comes up a few seconds after `ray start`
        job = subprocess.run(
            command, env={**env, "PYTHONPATH": ""}, capture_output=True, text=True, timeout=1800
        )
        if "No available agent" not in job.stderr + job.stdout:
            break
        time.sleep(2)
    elapsed = time.monotonic() - started
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout
    line = next(line for line in job.stdout.splitlines() if '"privzo_summary"' in line)
    summary = json.loads(line[line.index("{") :])["privzo_summary"]
    assert summary["strategy"] == "replica" and summary["workers"] == 2
    assert summary["steps"] == 6
    assert json.loads((output / "summary.json").read_text()) == summary
    # the workers print privzo's lines, not Ray Train's per-window INFO lines or load bars
    for chatter in ("Reporting training result", "Checkpoint successfully created", "Loading"):
        assert chatter not in job.stdout + job.stderr, chatter
    print(f"ray job submit took {elapsed:.1f} s")
