"""ZeRO-3 in bf16 / fp16 without Ray: two spawned gloo ranks load tiny models partitioned by the
real DeepSpeed, and their forwards at θ + c·z and their updated weights are compared with the
single-device virtual perturber's, bit for bit (the same batch on every rank, so only the
perturbation and the update can differ)."""

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
from privzo.zo.perturbation import GatheredPerturber, VirtualPerturber
from tiny_families import save_tiny_family

SEED, SCALE, STEP = 11, 1e-2, -3e-2  # large enough to move most bf16 / fp16 weights
TOKENS = torch.tensor([[5, 9, 12, 7, 3], [8, 2, 14, 6, 4]])
# every family / dtype pair but the one the integration runs take through Ray
# (tests/integration/test_distributed.py: opt in bf16)
CASES = [("opt", "float16"), ("llama", "bfloat16"), ("llama", "float16")]
MODELS = {"opt": "tiny-opt"}  # llama: saved by the fixture


def _config(model: str, dtype: str):
    path = REPO / "configs" / "runs" / "tiny-mezo.yaml"
    return load_config(path, [*SMALL_RUN, f"model.name_or_path={model}", f"model.dtype={dtype}"])


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


def _rank(rank: int, store: str, cache_dir: str, cases: list, results: dict) -> None:
    from privzo.distributed.zero3 import PartitionedModel, gathered_state_dict

    # what Ray Train sets in each worker; DeepSpeed's zero.Init reads LOCAL_RANK
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    for key, (model_name, dtype) in cases:
        config = _config(model_name, dtype)
        loader = PartitionedModel()
        loaded = loader.load(config, Path(cache_dir), progress=False)
        model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
        perturber = loader.perturber(model, loader.shards(pairs), direction_sampler(config))
        trace = _trace(model, perturber)
        weights = gathered_state_dict(model, keep=rank == 0)
        shard_dtypes = {shard.tensor.dtype for shard in perturber.shards}
        if rank == 0:
            results[key] = (type(perturber).__name__, shard_dtypes, trace, weights)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def partitioned(tmp_path_factory, cache_dir):
    llama = save_tiny_family("llama", tmp_path_factory.mktemp("llama") / "model")
    cases = [(case, (MODELS.get(case[0], str(llama)), case[1])) for case in CASES]
    WholeModel().load(_config("tiny-opt", "float32"), cache_dir, progress=False)  # built once
    store = tmp_path_factory.mktemp("gloo") / "store"
    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_rank, args=(str(store), str(cache_dir), cases, results), nprocs=2, join=True)
        return dict(results), dict(cases)


@pytest.mark.slow  # two spawned processes that import DeepSpeed and load two models each
@pytest.mark.parametrize(("family", "dtype"), CASES)
def test_zero3_half_matches_the_single_device_bits(partitioned, cache_dir, family, dtype):
    results, cases = partitioned
    kind, shard_dtypes, trace, weights = results[(family, dtype)]
    assert kind == GatheredPerturber.__name__
    assert shard_dtypes == {getattr(torch, dtype)}  # partitioned in the model's dtype

    config = _config(*cases[(family, dtype)])
    loaded = WholeModel().load(config, cache_dir, progress=False)
    model, pairs = apply_view(loaded.model, config.model, seed=config.seed)
    perturber = WholeModel().perturber(model, WholeModel().shards(pairs), direction_sampler(config))
    assert isinstance(perturber, VirtualPerturber)
    expected = _trace(model, perturber)

    assert not torch.equal(expected["plus"], expected["base"])  # the perturbation is seen
    assert not torch.equal(expected["after"], expected["base"])  # the update moved weights
    for name in ("plus", "base", "after"):
        assert torch.equal(trace[name], expected[name]), name
    state = dict(model.named_parameters())
    assert set(weights) == set(state)
    for name, tensor in state.items():
        assert torch.equal(weights[name], tensor.detach()), name
