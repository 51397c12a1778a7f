"""Threads per process from the cores available to it and the processes running at once."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from privzo.threads import available_cores, cgroup_cpu_quota, threads_per_process


@pytest.mark.parametrize(
    ("cpu_max", "cores"),
    [
        ("max 100000", None),
        ("150000 100000", 1.5),
        ("50000 100000", 0.5),
        ("", None),
        ("x y", None),
    ],
)
def test_cgroup_quota_is_quota_over_period_or_none_when_unlimited(cpu_max, cores):
    assert cgroup_cpu_quota(cpu_max) == cores


@pytest.mark.parametrize(
    ("affinity", "quota", "cores"),
    [
        (8, None, 8),  # no quota: the affinity set
        (8, 2.0, 2),  # a container limited to 2 cores on an 8-core host
        (8, 1.5, 2),  # a fractional quota still runs two threads (throttled)
        (8, 0.5, 1),  # less than a core: one
        (2, 4.0, 2),  # a quota above the affinity set does not add cores
        (0, None, 1),
    ],
)
def test_available_cores_is_affinity_capped_by_quota(affinity, quota, cores):
    assert available_cores(affinity, quota) == cores


@pytest.mark.parametrize(
    ("cores", "processes", "threads"),
    [(2, 1, 2), (2, 2, 1), (2, 3, 1), (8, 3, 2), (16, 4, 4), (1, 1, 1)],
)
def test_concurrent_processes_share_the_cores_without_oversubscribing(cores, processes, threads):
    assert threads_per_process(cores, processes) == threads
    assert threads * processes <= max(cores, processes)


def test_zero_processes_is_refused():
    with pytest.raises(ValueError, match="processes=0"):
        threads_per_process(2, 0)


def test_use_threads_sizes_both_torch_pools_in_a_fresh_process():
    code = (
        "import torch; from privzo.threads import use_threads; use_threads(1); "
        "print(torch.get_num_threads(), torch.get_num_interop_threads())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["1", "1"]


def test_cli_reads_the_affinity_of_its_process():
    """Pinned to one core (as taskset or a cpuset would), the CLI sizes everything to one."""
    code = (
        "import os; os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]}); "
        "from privzo.cli.process import process_cores; print(process_cores())"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


@pytest.mark.parametrize(("given", "used"), [(None, "PASSIVE"), ("ACTIVE", "ACTIVE")])
def test_cli_makes_openmp_threads_wait_passively_unless_the_user_chose(given, used):
    """Set before torch loads its OpenMP runtime (which reads it once); the user's choice wins."""
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    if given:
        env["OMP_WAIT_POLICY"] = given
    code = (
        "import os, sys; from privzo.cli import main; "
        "main(['plan', '--model', 'opt-125m', '--gpus', '1', '--gpu-memory-gb', '80']); "
        "print(os.environ['OMP_WAIT_POLICY'], 'torch' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.split()[-2:] == [used, "True"]  # the command loaded torch after it
