"""``privzo tune`` after ``ray start --head``: the search joins the running local Ray (with its
CPU count), found through the address file ``ray start`` writes, and passes Ray no CPU count."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import stop_ray_under
from privzo.cli.arguments import ray_target
from privzo.distributed.cluster import address_file_under
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
        target = ray_target(None)  # what `privzo tune` finds: the address file under RAY_TMPDIR
        assert target.address_file == address_file_under(temp_dir)
        used = start_ray(target, num_cpus=2)  # and the cores of a machine of 2
        assert ray.cluster_resources()["CPU"] == 1.0  # the running cluster's, not ours
        assert used.choice.joins and used.choice.source == "ray start --head"
        assert used.line().startswith("ray: joined the running cluster at ")
        assert used.line().endswith("(1 CPU)")
    finally:
        ray.shutdown()
        stop_ray_under(temp_dir)
        shutil.rmtree(temp_dir, ignore_errors=True)
