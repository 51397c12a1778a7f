"""ZeRO-3 in bf16 / fp16, and with its partitions offloaded, without Ray: two spawned gloo ranks
load tiny models partitioned by the real DeepSpeed, and their forwards at θ + c·z and their
updated weights are compared with the single device's, bit for bit (the same batch on every rank,
so only the perturbation and the update can differ). The offloaded cases go through DeepSpeed's
``offload_param`` to host memory (``parallel.offload: cpu``), one of them on a world of one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from conftest import REPO, SMALL_RUN
from privzo.config import load_config
from privzo.layouts.context import WholeModel, direction_sampler
from privzo.models.loading import apply_view
from privzo.zo.perturbation import GatheredPerturber, InPlacePerturber, VirtualPerturber
from tiny_families import save_tiny_family

SEED, SCALE, STEP = 11, 1e-2, -3e-2  # large enough to move most bf16 / fp16 weights
TOKENS = torch.tensor([[5, 9, 12, 7, 3], [8, 2, 14, 6, 4]])
# (family, dtype, offload, workers): every family / dtype pair but the one the integration runs
# take through Ray (tests/integration/test_distributed.py: opt in bf16), and offload to host
# memory in float32 (in-place sweeps of the host's partitions) and in bf16 on one worker
CASES = [
    ("opt", "float16", "none", 2),
    ("llama", "bfloat16", "none", 2),
    ("llama", "float16", "none", 2),
    ("opt", "float32", "cpu", 2),
    ("opt", "bfloat16", "cpu", 1),
]
MODELS = {"opt": "tiny-opt"}  # llama: saved by the fixture


def _config(model: str, dtype: str, offload: str | None = None, workers: int = 1):
    """The run's config; with ``offload`` (none included) the zero3 layout's."""
    path = REPO / "configs" / "runs" / "tiny-mezo.yaml"
    layout = []
    if offload is not None:
        layout = ["parallel.strategy=zero3", f"parallel.offload={offload}"]
        layout.append(f"parallel.workers={workers}")
    overrides = [*SMALL_RUN, f"model.name_or_path={model}", f"model.dtype={dtype}", *layout]
    return load_config(path, overrides)


def _trace(model: torch.nn.Module, perturber) -> dict[str, torch.Tensor]:
    """Logits at θ + c·z, at θ, and at θ after one update (no_grad, as training runs)."""
    with torch.no_grad():
        perturber.perturb(SEED, SCALE)
        plus = model(input_ids=TOKENS).logits
        perturber.perturb(SEED, 0.0)
        base = model(input_ids=TOKENS).logits
        perturber.update(SEED, STEP)
        after = model(input_ids=TOKENS).logits
    return {"plus": plus, "base": base, "after": after}


def _join(rank: int, world: int, store: str) -> None:
    # what Ray Train sets in each worker; DeepSpeed's zero.Init reads LOCAL_RANK
    sizes = {"WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), **sizes)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def _load_and_trace(rank: int, cache_dir: str, case: tuple) -> tuple | None:
    from privzo.distributed.zero3 import PartitionedModel, gathered_state_dict

    config = _config(*case)
    loader = PartitionedModel()
    loaded = loader.load(config, Path(cache_dir), progress=False)
    model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
    perturber = loader.perturber(model, loader.shards(pairs), direction_sampler(config))
    trace = _trace(model, perturber)
    weights = gathered_state_dict(model, keep=rank == 0)
    assert loader.alive is not None
    offloaded = loader.alive[1].zero_offload_param()  # what the engine was configured with
    shard_dtypes = {shard.tensor.dtype for shard in perturber.shards}
    if rank != 0:
        return None
    device = None if offloaded is None else str(offloaded.device)
    return (type(perturber).__name__, shard_dtypes, device, trace, weights)


def _rank(rank: int, store: str, cache_dir: str, cases: list, results: dict) -> None:
    _join(rank, 2, store)
    for key, case in cases:
        if case[3] == 2:
            results[key] = _load_and_trace(rank, cache_dir, case)
    dist.destroy_process_group()
    if rank == 0:  # then a world of one, in the same process
        _join(0, 1, store + "-one")
        for key, case in cases:
            if case[3] == 1:
                results[key] = _load_and_trace(0, cache_dir, case)
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory, cache_dir):
    llama = save_tiny_family("llama", tmp_path_factory.mktemp("llama") / "model")
    cases = [(case, (MODELS.get(case[0], str(llama)), *case[1:])) for case in CASES]
    WholeModel().load(_config("tiny-opt", "float32"), cache_dir, progress=False)  # built once
    store = tmp_path_factory.mktemp("gloo") / "store"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(str(store), str(cache_dir), cases, results), nprocs=2, join=True)
        return dict(results), dict(cases)


@pytest.mark.slow  # two spawned processes that import DeepSpeed and load five models each
@pytest.mark.parametrize(("family", "dtype", "offload", "workers"), CASES)
def test_zero3_matches_the_single_device_bits(
    partitioned, cache_dir, family, dtype, offload, workers
):
    results, cases = partitioned
    kind, shard_dtypes, offloaded_to, trace, weights = results[(family, dtype, offload, workers)]
    half = dtype != "float32"
    assert kind == (GatheredPerturber if half else InPlacePerturber).__name__
    assert shard_dtypes == {getattr(torch, dtype)}  # partitioned in the model's dtype
    assert offloaded_to == (None if offload == "none" else offload)

    model_name, *_ = cases[(family, dtype, offload, workers)]
    config = _config(model_name, dtype)
    loaded = WholeModel().load(config, cache_dir, progress=False)
    model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
    perturber = WholeModel().perturber(model, WholeModel().shards(pairs), direction_sampler(config))
    assert isinstance(perturber, VirtualPerturber if half else InPlacePerturber)
    expected = _trace(model, perturber)

    assert not torch.equal(expected["plus"], expected["base"])  # the perturbation is seen
    assert not torch.equal(expected["after"], expected["base"])  # the update moved weights
    for name in ("plus", "base", "after"):
        assert torch.equal(trace[name], expected[name]), name
    state = dict(model.named_parameters())
    assert set(weights) == set(state)
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor.detach()), name
