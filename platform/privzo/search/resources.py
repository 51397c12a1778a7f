"""What one search trial takes from the Ray cluster, checked before any trial starts.

A ``single`` trial is one Tune function holding ``resources.cpus_per_trial`` CPUs and
``resources.gpus_per_trial`` GPUs. A distributed trial (``parallel.strategy`` replica or zero3)
is a driver that builds a Ray Train ``TorchTrainer`` and waits on its ``fit()``, plus
``parallel.workers`` Train workers of one CPU (and one GPU with ``parallel.use_gpu``) each. The
driver reserves memory but no CPU: were it to hold one, a trial of 2 workers could never start on
2 CPUs (Ray Train waits for its workers' bundles while the driver sits on a CPU they need).
Concurrent distributed trials' workers must all fit at once for the same reason: Tune does not
see the workers' bundles, so a trial whose workers cannot be placed would wait forever.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privzo.config.run import RunConfig
from privzo.search.config import SearchConfig
from privzo.section import ConfigError

# The driver of a distributed trial: a Python process with torch and Ray loaded that validates
# the run and waits on the trainer; reserved as memory so that it holds no CPU a worker needs.
DRIVER_MEMORY_BYTES = 2**30


@dataclass(frozen=True)
class TrialResources:
    """One trial's Ray resources: its Tune function's, and its Train workers' (if any)."""

    driver: dict[str, float]  # Ray resource names (CPU, GPU, memory) for tune.with_resources
    workers: int  # Ray Train workers (0: the trial trains in its Tune function)
    per_worker: dict[str, float]

    @property
    def distributed(self) -> bool:
        return self.workers > 0

    def tune_spec(self) -> dict[str, float]:
        """``tune.with_resources``'s spec for the trial function."""
        spec = {"cpu": self.driver.get("CPU", 0.0), "gpu": self.driver.get("GPU", 0.0)}
        if "memory" in self.driver:
            spec["memory"] = self.driver["memory"]
        return spec

    def total(self) -> dict[str, float]:
        """Everything one trial holds while it trains."""
        total = dict(self.driver)
        for name, amount in self.per_worker.items():
            total[name] = total.get(name, 0.0) + amount * self.workers
        return total


def trial_resources(search: SearchConfig, base: RunConfig) -> TrialResources:
    """The resources of every trial (the layout is the base run's: ``parallel`` is not
    searchable, so all trials share it)."""
    parallel = base.parallel
    if parallel.strategy == "single":
        driver = {"CPU": float(search.resources.cpus_per_trial)}
        if search.resources.gpus_per_trial:
            driver["GPU"] = float(search.resources.gpus_per_trial)
        return TrialResources(driver, 0, {})
    if search.resources.gpus_per_trial:
        raise ConfigError(
            f"resources.gpus_per_trial={search.resources.gpus_per_trial:g} with "
            f"parallel.strategy={parallel.strategy!r}: a distributed trial's GPUs are its "
            "workers' (parallel.use_gpu: one per worker) and its driver needs none; set "
            "resources.gpus_per_trial=0"
        )
    per_worker = {"CPU": 1.0, **({"GPU": 1.0} if parallel.use_gpu else {})}
    return TrialResources({"memory": float(DRIVER_MEMORY_BYTES)}, parallel.workers, per_worker)


def check_trial_resources(
    search: SearchConfig, base: RunConfig, available: dict[str, float]
) -> TrialResources:
    """Refuse a search whose trials the cluster (``available``: Ray's resource totals) cannot
    run: one trial must fit, and with distributed trials every concurrent trial must."""
    needed = trial_resources(search, base)
    if not needed.distributed:
        _check_single(search, available)
        return needed
    _check_distributed(search, base, needed, available)
    return needed


def _check_single(search: SearchConfig, available: dict[str, float]) -> None:
    resources = search.resources
    for name, key, wanted in (
        ("cpus_per_trial", "CPU", resources.cpus_per_trial),
        ("gpus_per_trial", "GPU", resources.gpus_per_trial),
    ):
        have = available.get(key, 0.0)
        if wanted > have:
            raise ConfigError(
                f"resources.{name}={wanted:g}: the Ray cluster has {have:g} {key}s in all; "
                f"allowed: up to {have:g}"
            )


def _check_distributed(
    search: SearchConfig, base: RunConfig, needed: TrialResources, available: dict[str, float]
) -> None:
    parallel, concurrency = base.parallel, search.resources.concurrency
    layout = f"parallel.strategy={parallel.strategy!r} with parallel.workers={parallel.workers}"
    for key, amount in needed.per_worker.items():
        have = available.get(key, 0.0)
        per_trial = amount * needed.workers
        if per_trial > have:
            raise ConfigError(
                f"{layout}: each trial runs {needed.workers} Ray Train workers of {amount:g} "
                f"{key} each ({per_trial:g} {key}s) but the Ray cluster has {have:g}; allowed: "
                f"parallel.workers <= {int(have // amount)}"
            )
        if per_trial * concurrency > have:
            raise ConfigError(
                f"resources.concurrency={concurrency} trials at once, {layout}: their workers "
                f"need {per_trial * concurrency:g} {key}s but the Ray cluster has {have:g} "
                "(trials whose workers cannot all be placed would wait forever); allowed: "
                f"resources.concurrency <= {int(have // per_trial)}"
            )
    memory = needed.driver["memory"] * concurrency
    have = available.get("memory", math.inf)  # unknown before a local Ray starts
    if memory > have:
        raise ConfigError(
            f"resources.concurrency={concurrency}: each distributed trial's driver reserves "
            f"{DRIVER_MEMORY_BYTES / 2**30:g} GiB of Ray memory and the cluster has "
            f"{have / 2**30:.2f} GiB; allowed: resources.concurrency <= "
            f"{int(have // needed.driver['memory'])}"
        )
