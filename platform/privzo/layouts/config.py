"""The ``parallel`` section of a run config: which layout runs it, on how many workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from privzo.section import Section

__all__ = ["MAX_MEMORY_GB", "LayoutName", "OffloadDevice", "ParallelConfig"]

# The layouts a config may choose; tests/unit/algorithms/test_registry.py ties it to the
# registry's layouts.
LayoutName = Literal["single", "replica", "zero3"]
# Where ZeRO-3 keeps each rank's partitions between forwards (DeepSpeed's offload_param)
OffloadDevice = Literal["none", "cpu", "nvme"]
# The most GiB of one GPU or host the planner takes: a million GiB (about a pebibyte) is far
# beyond any machine, so a larger figure is a typo (an exponent, a unit) and is refused.
MAX_MEMORY_GB = 1_000_000


class ParallelConfig(Section):
    """How a run is laid out: one process, Ray Train replicas, or DeepSpeed ZeRO-3 ranks."""

    strategy: LayoutName = "single"
    workers: int = Field(1, ge=1)
    use_gpu: bool = False
    max_failures: int = Field(0, ge=0, description="Worker failures Ray Train recovers from.")
    gpu_memory_gb: float = Field(
        80.0,
        gt=0,
        le=MAX_MEMORY_GB,
        description="Memory of one GPU (GiB), for the planner's fit check.",
    )
    offload: OffloadDevice = Field(
        "none",
        description="Where zero3 keeps each worker's partitions between forwards: on its "
        "device (none) or in host memory (cpu), through DeepSpeed's offload_param; nvme "
        "(files under parallel.nvme_path) is planned and checked, then refused: the trainer "
        "does not swap NVMe partitions in and out yet.",
    )
    nvme_path: str | None = Field(
        None, description="Folder on a local NVMe drive for offload 'nvme' (on every node)."
    )
    host_memory_gb: float | None = Field(
        None,
        gt=0,
        le=MAX_MEMORY_GB,
        description="Host memory (GiB) of the node the workers share, for the planner's "
        "offload check; null = this machine's.",
    )
    storage_path: str | None = Field(
        None,
        description="Where Ray Train keeps checkpoints (shared storage on a cluster); "
        "null = <output-dir>/ray.",
    )
    env_vars: dict[str, str] = Field(
        default_factory=dict, description="Environment of the Ray workers (runtime_env)."
    )

    @model_validator(mode="after")
    def _one_worker_when_single(self) -> ParallelConfig:
        if self.strategy == "single" and self.workers != 1:
            raise ValueError(
                f"parallel.workers={self.workers} with parallel.strategy='single'; allowed: "
                "workers=1, or strategy 'replica' / 'zero3'"
            )
        return self

    @model_validator(mode="after")
    def _offload_needs_zero3(self) -> ParallelConfig:
        if self.offload != "none" and self.strategy != "zero3":
            raise ValueError(
                f"parallel.offload={self.offload!r} with parallel.strategy={self.strategy!r}: "
                "only ZeRO-3 partitions can be offloaded; allowed: strategy 'zero3' "
                "(workers >= 1), or offload 'none'"
            )
        if self.offload == "nvme" and self.nvme_path is None:
            raise ValueError(
                "parallel.offload='nvme' without parallel.nvme_path; set it to a folder on a "
                "local NVMe drive, or use offload 'cpu'"
            )
        return self
