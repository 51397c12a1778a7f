"""Peak-memory measurement: real allocations on CPU, allocator counters (faked) on CUDA."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import privzo.memory as memory
from privzo.memory import PeakMemory, current_rss_mb

SIZE_MB = 200
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="needs /proc/self/status"
)


def _allocate(mb: int) -> torch.Tensor:
    """Touched (not just reserved) float32 storage of ``mb`` MiB, so it counts in RSS."""
    return torch.ones(mb * 2**20 // 4, dtype=torch.float32)


def _resettable_cpu_meter() -> PeakMemory:
    meter = PeakMemory(torch.device("cpu"))
    if not meter.resettable:
        pytest.skip("/proc/self/clear_refs is not writable here")
    return meter


@linux_only
def test_cpu_peak_follows_allocation_and_resets() -> None:
    meter = _resettable_cpu_meter()
    before = meter.peak_mb()
    block = _allocate(SIZE_MB)
    peak = meter.peak_mb()
    assert peak - before == pytest.approx(SIZE_MB, rel=0.1)
    assert meter.peak_increase_mb() == pytest.approx(SIZE_MB, rel=0.1)

    del block
    gc.collect()
    meter.reset()
    assert meter.peak_mb() < peak - 0.75 * SIZE_MB
    assert meter.peak_increase_mb() < 0.1 * SIZE_MB


@linux_only
def test_cpu_peak_sees_a_spike_already_freed() -> None:
    """The point of the high-water mark: a transient allocation is counted after it is gone."""
    meter = _resettable_cpu_meter()
    _allocate(SIZE_MB).sum()  # allocated, used and freed before we look
    gc.collect()
    assert meter.peak_increase_mb() == pytest.approx(SIZE_MB, rel=0.1)
    assert current_rss_mb() < meter.peak_mb() - 0.75 * SIZE_MB


@linux_only
def test_current_rss_counts_live_tensors() -> None:
    before = current_rss_mb()
    block = _allocate(SIZE_MB)
    assert current_rss_mb() - before == pytest.approx(SIZE_MB, rel=0.1)
    del block


@linux_only
def test_falls_back_to_lifetime_peak_without_clear_refs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(memory, "_CLEAR_REFS", tmp_path / "no-such-dir" / "clear_refs")
    meter = PeakMemory("cpu")
    assert meter.resettable is False
    assert meter.peak_mb() >= current_rss_mb() > 0


def test_cuda_uses_allocator_counters(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[str, torch.device]] = []

    def record(name: str, value: int):
        def fake(device: torch.device) -> int:
            calls.append((name, device))
            return value

        return fake

    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", record("reset", 0))
    monkeypatch.setattr(torch.cuda, "memory_allocated", record("allocated", 100 * 2**20))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", record("peak", 350 * 2**20))
    meter = PeakMemory("cuda:1")
    assert meter.peak_mb() == 350.0
    assert meter.peak_increase_mb() == 250.0
    device = torch.device("cuda:1")
    assert calls == [("reset", device), ("allocated", device), ("peak", device), ("peak", device)]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_peak_on_real_device() -> None:
    device = torch.device("cuda")
    meter = PeakMemory(device)
    block = torch.ones(SIZE_MB * 2**20 // 4, device=device)
    del block
    assert meter.peak_increase_mb() == pytest.approx(SIZE_MB, rel=0.1)
    meter.reset()
    assert meter.peak_increase_mb() < 0.1 * SIZE_MB


# Frees 256 MiB of 4 MiB blocks below a live one, in a fresh process (glibc's thresholds are
# process-wide, and build_context fixes them in the test process); prints the RSS with the
# blocks held, once freed, and after return_freed_memory.
_HEAP_SCRIPT = """
import gc, sys, torch
from privzo.memory import current_rss_mb, map_large_blocks, return_freed_memory
if sys.argv[1] == "mapped":
    assert map_large_blocks()
first = torch.ones(2**20)  # 4 MiB: freeing it raises glibc's own mmap threshold above that
del first
held = [torch.ones(2**20) for _ in range(64)]
pinned = torch.ones(2**18)  # a live block above them keeps the heap from shrinking
before = current_rss_mb()
del held
gc.collect()
freed = current_rss_mb()
assert return_freed_memory()
print(before, freed, current_rss_mb(), float(pinned.sum()))
"""


def _heap_after_frees(mode: str) -> tuple[float, float, float]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("MALLOC_")}
    result = subprocess.run(
        [sys.executable, "-c", _HEAP_SCRIPT, mode],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    before, freed, trimmed, pinned = map(float, result.stdout.split())
    assert pinned == 2**18
    return before, freed, trimmed


@linux_only
def test_freed_heap_blocks_below_a_live_one_go_back_to_the_system():
    """What a checkpoint load leaves with glibc's own thresholds: blocks freed below a live
    allocation stay in the process (in its RSS) until ``return_freed_memory``."""
    before, freed, trimmed = _heap_after_frees("default")
    assert freed > before - 64, (before, freed)
    assert trimmed < before - 128, (before, trimmed)


@linux_only
def test_mapped_large_blocks_go_back_to_the_system_when_freed():
    """After ``map_large_blocks`` a freed block of 1 MiB or more leaves the process at once,
    though an earlier free would have raised glibc's own threshold above it."""
    before, freed, _ = _heap_after_frees("mapped")
    assert freed < before - 192, (before, freed)
