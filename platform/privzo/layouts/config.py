"""The ``parallel`` section of a run config: which layout runs it, on how many workers."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from privzo.section import Section

__all__ = ["LayoutName", "ParallelConfig"]

# The layouts a config may choose; tests/unit/algorithms/test_registry.py ties it to the
# registry's layouts.
LayoutName = Literal["single", "replica", "zero3"]


class ParallelConfig(Section):
    """How a run is laid out: one process, Ray Train replicas, or DeepSpeed ZeRO-3 ranks."""

    strategy: LayoutName = "single"
    workers: int = Field(1, ge=1)
    use_gpu: bool = False
    max_failures: int = Field(0, ge=0, description="Worker failures Ray Train recovers from.")
    gpu_memory_gb: float = Field(
        80.0, gt=0, description="Memory of one GPU (GiB), for the planner's fit check."
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
