"""``privzo tune`` after ``ray start --head``: the search joins the running local Ray (with its
CPU count) instead of failing on Ray's "num_cpus must not be provided"."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from privzo.search.runner import start_ray


@pytest.mark.ray
def test_a_search_joins_the_local_ray_already_running():
    ray = pytest.importorskip("ray")
    command = shutil.which("ray")
    assert command is not None, "ray's command-line tool comes with ray[default]"
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    head = [command, "start", "--head", "--num-cpus=1", "--include-dashboard=false"]
    subprocess.run([*head, "--disable-usage-stats"], env=env, check=True, timeout=600)
    try:
        start_ray(None, num_cpus=2)  # what `privzo tune` passes on a machine of 2 cores
        assert ray.cluster_resources()["CPU"] == 1.0  # the running cluster's, not ours
    finally:
        ray.shutdown()
        subprocess.run([command, "stop", "--force"], env=env, timeout=300)
