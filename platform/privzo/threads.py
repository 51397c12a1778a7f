"""How many threads each process gets: the cores this process may use, shared by the processes
that run at once.

torch sizes its pools from the machine's core count, not from the process's CPU affinity or its
cgroup quota, and every process of a search or study would take all of them: on a shared or
throttled machine the OpenMP threads of several processes then spin against each other. The
entry point reads the affinity and the quota (the library reads no environment) and passes the
numbers here.
"""

from __future__ import annotations

import contextlib
import math


def cgroup_cpu_quota(cpu_max: str) -> float | None:
    """Cores allowed by a cgroup v2 ``cpu.max`` line (``"<quota> <period>"``, or ``"max ..."``
    when unlimited); None when unlimited or unreadable."""
    fields = cpu_max.split()
    if len(fields) != 2 or fields[0] == "max":
        return None
    try:
        quota, period = float(fields[0]), float(fields[1])
    except ValueError:
        return None
    return quota / period if quota > 0 and period > 0 else None


def available_cores(affinity: int, quota: float | None = None) -> int:
    """The cores one process may keep busy: its affinity set, capped by the cgroup quota (a
    quota of 1.5 cores still lets two threads run, throttled, so it rounds up); at least 1."""
    cores = max(1, affinity)
    if quota is not None:
        cores = min(cores, max(1, math.ceil(quota)))
    return cores


def threads_per_process(cores: int, processes: int) -> int:
    """Threads for each of ``processes`` processes running at once on ``cores`` cores: an equal
    share, at least 1 (more processes than cores run one thread each)."""
    if processes < 1:
        raise ValueError(f"processes={processes}: allowed: 1 or more")
    return max(1, max(1, cores) // processes)


def use_threads(threads: int) -> None:
    """Size this process's torch pools: ``threads`` intra-op threads and as many inter-op ones.

    torch fixes the inter-op pool at its first parallel work and refuses to resize it; a process
    reused for a second task (a Ray worker running another trial) keeps the pool it has.
    """
    import torch

    torch.set_num_threads(threads)
    # already started: the intra-op pool set above is the one these models' kernels use
    with contextlib.suppress(RuntimeError):
        torch.set_num_interop_threads(threads)
