"""DeepSpeed ZeRO stage 3, used forward-only: no optimizer state, no gradients.

The model loads partitioned through transformers' DeepSpeed integration (an ``HfDeepSpeedConfig``
kept alive while ``from_pretrained`` runs makes it build under ``deepspeed.zero.Init``), so no
rank ever holds the whole model. Each parameter's local partition is ``param.ds_tensor``: a flat,
contiguous slice ``[rank·P, rank·P + P)`` of the flattened parameter, P = ceil(numel / world),
with the last rank's slice padded past ``numel``. In float32 every rank perturbs its partition in
place with the directions of exactly those element indices, so z stays a pure function of (seed,
name, element index) and the padding is never touched. In bf16 / fp16 the weights are never
perturbed in place (``privzo.zo.perturbation.GatheredPerturber``): each module's forward sees
θ + c·z computed from its gathered weights, exactly the single-device values, and the
stochastically rounded update lands on each partition at its element indices. Forward passes
gather each layer's weights from the partitions just before use (a collective: every rank must
run the same forwards). With ``parallel.offload: cpu`` the partitions live in host memory
(DeepSpeed's ``offload_param``), and the sweeps and updates run there (``partition_sampler``).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from privzo.config.run import RunConfig
from privzo.distributed.collectives import WorkerGroup
from privzo.layouts.config import ParallelConfig
from privzo.layouts.context import RunContext, build_context
from privzo.models.architecture import DecoderArch
from privzo.models.loading import LoadedModel, SavesPretrained, load_model
from privzo.models.shapes import random_model
from privzo.zo.directions import DirectionSampler
from privzo.zo.perturbation import Perturber, make_perturber
from privzo.zo.sweeps import ParameterShard


def deepspeed_config(parallel: ParallelConfig) -> dict[str, Any]:
    """Stage 3 for inference. No parameter stays resident after a forward (persistence
    thresholds 0): a persistent parameter would keep a full copy in ``param.data`` that an
    edit of ``ds_tensor`` does not reach. ``memory_efficient_linear`` off: it replaces
    ``torch.nn.functional.linear`` process-wide by a matmul and a separate bias add, which saves
    backward memory only and rounds half-precision outputs differently from one device.
    ``parallel.offload`` adds DeepSpeed's ``offload_param``: the partitions (``ds_tensor``)
    then live in host memory or NVMe files, and each forward copies a layer's to the device."""
    zero: dict[str, Any] = {
        "stage": 3,
        "stage3_param_persistence_threshold": 0,
        "stage3_model_persistence_threshold": 0,
        "memory_efficient_linear": False,
    }
    if parallel.offload != "none":
        zero["offload_param"] = offload_param(parallel)
    return {"train_micro_batch_size_per_gpu": 1, "zero_optimization": zero}


def offload_param(parallel: ParallelConfig) -> dict[str, Any]:
    """DeepSpeed's ``offload_param`` section for ``parallel.offload`` (cpu or nvme). Pinned
    host memory only with GPUs: it speeds the copies to the device and needs a CUDA runtime."""
    section: dict[str, Any] = {"device": parallel.offload, "pin_memory": parallel.use_gpu}
    if parallel.offload == "nvme":
        section["nvme_path"] = str(Path(parallel.nvme_path or "").expanduser().resolve())
    return section


# DeepSpeed's section that makes ``zero.Init`` partition the weights in the model's dtype
PRECISION_SECTIONS = {"bfloat16": "bf16", "float16": "fp16"}


def init_config(dtype: str, parallel: ParallelConfig) -> dict[str, Any]:
    """``deepspeed_config`` for loading under ``zero.Init``: half precision enabled where the
    model's dtype is, or the partitions would be created in float32. The engine is given
    ``deepspeed_config`` alone: forward-only, it needs no mixed-precision setup (which DeepSpeed
    refuses for fp16 where the accelerator does not report it, e.g. CPUs, that compute it)."""
    section = PRECISION_SECTIONS.get(dtype)
    return {**deepspeed_config(parallel), **({section: {"enabled": True}} if section else {})}


def partition_shards(
    named_parameters: list[tuple[str, torch.nn.Parameter]], group: WorkerGroup
) -> list[ParameterShard]:
    """This rank's real (unpadded) elements of every partitioned parameter."""
    shards = []
    for name, parameter in named_parameters:
        # attributes ZeRO-3 attaches to every partitioned parameter, unknown to torch's stubs
        local = parameter.ds_tensor.view(-1)  # type: ignore[attr-defined]
        numel = parameter.ds_numel  # type: ignore[attr-defined]
        offset = group.rank * local.numel()
        length = max(0, min(local.numel(), numel - offset))
        shards.append(ParameterShard(name, local[:length], numel, offset if length else numel))
    return shards


class PartitionedModel:
    """``build_context``'s model loader (``privzo.layouts.context.ModelLoader``) for ZeRO-3:
    the model loads partitioned, and this rank trains its partitions. It keeps the DeepSpeed
    objects that must stay alive while the model is used (the HfDeepSpeedConfig and the engine
    holding the gather hooks)."""

    def __init__(self) -> None:
        self.alive: tuple[Any, Any] | None = None

    def load(self, config: RunConfig, cache_dir: Path, progress: bool) -> LoadedModel:
        import deepspeed
        from transformers.integrations import HfDeepSpeedConfig

        deepspeed.init_distributed(dist_backend="gloo" if not config.parallel.use_gpu else "nccl")
        # while alive, from_pretrained partitions (in the model's dtype)
        hf_deepspeed = HfDeepSpeedConfig(init_config(config.model.dtype, config.parallel))
        loaded = load_model(config.model, cache_dir, progress=False)
        # registers the gather / release hooks, before the perturber registers its own
        engine, *_ = deepspeed.initialize(
            model=loaded.model, config=deepspeed_config(config.parallel)
        )
        self.alive = (hf_deepspeed, engine)
        return loaded

    def shards(self, pairs: list[tuple[str, torch.nn.Parameter]]) -> list[ParameterShard]:
        return partition_shards(pairs, WorkerGroup.current())

    def fingerprint(self, loaded: LoadedModel) -> None:
        return None  # a rank holds partitions, not the weights a fingerprint reads

    def perturber(
        self, model: torch.nn.Module, shards: list[ParameterShard], sampler: DirectionSampler
    ) -> Perturber:
        host = partition_sampler(sampler, shards)
        return make_perturber(model, shards, sampler, gathered=True, partition_sampler=host)


@contextlib.contextmanager
def world_of_one(use_gpu: bool) -> Iterator[None]:
    """This process as rank 0 of a world of one (``torch.distributed`` and what DeepSpeed reads
    from the environment) while the block runs, where no launcher started it: ZeRO-3 needs a
    process group even alone. A group already joined is used as it is; one made here is left,
    and the environment restored, after the block."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    ranks = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    before = {name: os.environ.get(name) for name in ranks}
    os.environ.update(ranks)
    try:
        with tempfile.TemporaryDirectory(prefix="privzo-world-") as folder:
            store = f"file://{Path(folder) / 'store'}"
            dist.init_process_group(
                "nccl" if use_gpu else "gloo", init_method=store, rank=0, world_size=1
            )
            try:
                yield
            finally:
                dist.destroy_process_group()
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def partitioned_random_model(
    arch: DecoderArch, dtype: str, parallel: ParallelConfig, **config_extra: Any
) -> tuple[torch.nn.Module, Any]:
    """A random model of ``arch`` built partitioned (under ``zero.Init``, each partition where
    ``parallel.offload`` puts it, so no device ever holds the whole model) and wrapped by the
    engine whose hooks gather each layer for its forward; also returns what must stay alive
    while the model is used. The process group must be joined first; ``config_extra`` goes to
    the model's config (``privzo.models.shapes.random_model``)."""
    import deepspeed
    from transformers.integrations import HfDeepSpeedConfig

    hf_deepspeed = HfDeepSpeedConfig(init_config(dtype, parallel))  # from_config partitions
    device = "cuda" if parallel.use_gpu else "cpu"
    model = random_model(arch, dtype, device=device, **config_extra)
    engine, *_ = deepspeed.initialize(model=model, config=deepspeed_config(parallel))
    return model, (hf_deepspeed, engine)


def partition_sampler(sampler: DirectionSampler, shards: list[ParameterShard]) -> DirectionSampler:
    """The directions for work on the partitions: ``sampler`` where they live on its device,
    else the same generator on theirs (offloaded to host memory while the forwards run on a
    GPU). Philox gives the same words on both (``privzo.zo.directions``)."""
    devices = {shard.tensor.device for shard in shards}
    if all(device.type == sampler.device.type for device in devices):
        return sampler
    (device,) = devices
    return DirectionSampler(sampler.distribution, device, sampler.generator)


def build_zero3_context(config: RunConfig, cache_dir: Path) -> tuple[RunContext, Any]:
    """``build_context`` with the model loaded partitioned; also returns what must outlive
    training (the loader holding the DeepSpeed objects)."""
    loader = PartitionedModel()
    return build_context(config, cache_dir, progress=False, loader=loader), loader


def gathered_state_dict(model: torch.nn.Module, keep: bool) -> dict[str, torch.Tensor]:
    """Full copies of every parameter, kept (on CPU) only where ``keep``; a collective, so every
    rank calls it, but only the saving rank ever holds the whole model."""
    import deepspeed

    state = {}
    for name, parameter in model.named_parameters():
        with deepspeed.zero.GatheredParameters([parameter], modifier_rank=None):
            if keep:
                state[name] = parameter.data.detach().to("cpu", copy=True)
    return state


def save_gathered(context: RunContext, rank: int, path: Path) -> None:
    """Gather every parameter (one at a time) and save the whole model from rank 0."""
    model = context.model
    assert isinstance(model, SavesPretrained), "a view runs a Hugging Face or peft model"
    state = gathered_state_dict(model, keep=rank == 0)
    if rank == 0:
        model.save_pretrained(path, state_dict=state)
        context.loaded.tokenizer.save_pretrained(path)
