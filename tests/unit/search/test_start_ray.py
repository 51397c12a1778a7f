"""``privzo tune`` after ``ray start --head``: the search joins the running local Ray (with its
CPU count) instead of failing on Ray's "num_cpus must not be provided"."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import stop_ray_under
from privzo.search.runner import start_ray


@pytest.mark.ray
def test_a_search_joins_the_local_ray_already_running(monkeypatch):
    ray = pytest.importorskip("ray")
    command = shutil.which("ray")
    assert command is not None, "ray's command-line tool comes with ray[default]"
    # Ray finds a running local cluster through $RAY_TMPDIR/ray/ray_current_cluster: a fresh
    # RAY_TMPDIR keeps this head apart from any other Ray on the machine (tests beside this
    # one), and a short path keeps Ray's socket paths under the kernel's limit.
    temp_dir = Path(tempfile.mkdtemp(prefix="ray", dir="/tmp"))
    monkeypatch.setenv("RAY_TMPDIR", str(temp_dir))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    head = [command, "start", "--head", "--num-cpus=1", "--include-dashboard=false"]
    try:
        subprocess.run([*head, "--disable-usage-stats"], env=env, check=True, timeout=600)
        start_ray(None, num_cpus=2)  # what `privzo tune` passes on a machine of 2 cores
        assert ray.cluster_resources()["CPU"] == 1.0  # the running cluster's, not ours
    finally:
        ray.shutdown()
        stop_ray_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
