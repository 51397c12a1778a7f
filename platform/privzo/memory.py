"""Peak memory of the current process, per measured section.

Why not the obvious tools:

* sampling RSS (``psutil`` in a thread) misses short spikes, e.g. the moment a perturbed copy of
  the weights and the activations coexist; the kernel's high-water mark cannot miss them;
* ``tracemalloc`` only sees allocations made through Python's allocator, not tensor storage;
* GPU memory is managed by PyTorch's caching allocator, whose own counters are exact.

So on CUDA we use the allocator's peak counters, and on Linux CPU the kernel's peak-RSS mark
(``VmHWM``), which can be reset by writing ``5`` to ``/proc/self/clear_refs``. Both are
per-process: in Ray, measure inside each worker and report it with the metrics.

"MB" here means MiB (2**20 bytes), like the figures PyTorch and ``/proc`` tools usually show.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

_CLEAR_REFS = Path("/proc/self/clear_refs")
_MEMINFO = Path("/proc/meminfo")
_CGROUP = Path("/sys/fs/cgroup")
_STATUS = Path("/proc/self/status")
_MIB = 2**20


def _status_kib(field: str) -> int | None:
    """A ``kB`` field (e.g. ``VmHWM``) of ``/proc/self/status``, or None where unavailable."""
    try:
        text = _STATUS.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == field:
            return int(value.split()[0])
    return None


def _lifetime_peak_rss_mb() -> float:
    """Peak RSS since process start from ``getrusage`` (kB on Linux, bytes on macOS)."""
    import resource  # POSIX only, so not imported at module level

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / _MIB if sys.platform == "darwin" else peak / 1024


def current_rss_mb() -> float:
    """Resident set size of this process now, in MiB (0.0 where ``/proc`` is unavailable)."""
    kib = _status_kib("VmRSS")
    return 0.0 if kib is None else kib / 1024


# glibc's mallopt parameter for the size from which malloc maps a block of its own
_M_MMAP_THRESHOLD = -3
# Blocks from this size on get their own mapping, returned to the system when freed.
MMAP_THRESHOLD_BYTES = 2**20


def map_large_blocks(from_bytes: int = MMAP_THRESHOLD_BYTES) -> bool:
    """Give every C-heap block of ``from_bytes`` or more its own mapping, returned to the system
    when freed; False where the C library is not glibc.

    glibc raises its threshold (up to 32 MiB) each time a mapped block is freed, so a model's
    load and a ZeRO-3 rank's gathered layers (16 to 400 MiB, freed and made again every forward)
    land in the heap, where the freed ones stay counted in the process: each ZeRO-3 rank held
    more than the single process it divides. A set threshold stays fixed. Called before a model
    loads by ZeRO-3 runs only: mapping every block of 1 MiB slowed the tiny CPU step by about
    half (docs/measurements.md). ``privzo bench memory``'s cases set 128 KiB, so their peaks
    count live tensors only.
    """
    libc = _glibc()
    return libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, from_bytes) == 1


def _glibc() -> Any:
    """glibc, or None where the C library is another (macOS, musl: their allocators return
    memory themselves)."""
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.malloc_trim, libc.mallopt  # noqa: B018 - both are glibc's
    except (OSError, AttributeError):
        return None
    return libc


def return_freed_memory() -> bool:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``); False where
    the C library is not glibc.

    Loading a checkpoint frees gigabytes of read buffers, and glibc keeps freed blocks below
    other live ones in the process (counted in its RSS) for reuse; a ZeRO-3 rank then held
    more than the single process it divides. Called once the model is loaded.
    """
    import gc

    gc.collect()  # Python's own cycles first, so their tensors' storage is free too
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim(0)
    return True


def _reset_rss_peak() -> bool:
    """Reset the kernel's peak-RSS mark to the current RSS; False if not permitted/supported."""
    try:
        with _CLEAR_REFS.open("w") as handle:
            handle.write("5")
    except OSError:
        return False
    return True


class PeakMemory:
    """Peak memory of this process on ``device`` since the last :meth:`reset`.

    On CPU, if ``/proc/self/clear_refs`` cannot be written (non-Linux, old kernel, restricted
    container), :attr:`resettable` is False and :meth:`peak_mb` is the peak since process start:
    still an upper bound, but not specific to the measured section.
    """

    def __init__(self, device: torch.device | str = "cpu") -> None:
        self.device = torch.device(device)
        self.is_cuda = self.device.type == "cuda"
        self.resettable = True
        self.baseline_mb = 0.0
        self.reset()

    def reset(self) -> None:
        """Start a new measurement window and remember the memory in use at its start."""
        if self.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
            self.baseline_mb = torch.cuda.memory_allocated(self.device) / _MIB
        else:
            self.resettable = _reset_rss_peak()
            self.baseline_mb = current_rss_mb()

    def peak_mb(self) -> float:
        """Highest memory use in the window, in MiB: allocated tensor memory on CUDA, RSS on
        CPU (the whole process: interpreter, libraries and tensors)."""
        if self.is_cuda:
            return torch.cuda.max_memory_allocated(self.device) / _MIB
        kib = _status_kib("VmHWM")
        return _lifetime_peak_rss_mb() if kib is None else kib / 1024

    def peak_increase_mb(self) -> float:
        """Peak minus the memory in use at :meth:`reset`: what the measured section added."""
        return max(0.0, self.peak_mb() - self.baseline_mb)


def available_memory_bytes() -> int | None:
    """Memory a new allocation of this process can get on CPU, in bytes: the kernel's
    ``MemAvailable``, capped by what the process's cgroup (a container's limit) has left;
    None where neither can be read (non-Linux)."""
    limits = []
    try:
        for line in _MEMINFO.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                limits.append(int(line.split()[1]) * 1024)
    except OSError:
        pass
    try:
        maximum = (_CGROUP / "memory.max").read_text().strip()
        current = int((_CGROUP / "memory.current").read_text())
        if maximum != "max":
            limits.append(max(0, int(maximum) - current))
    except (OSError, ValueError):
        pass
    return min(limits) if limits else None
