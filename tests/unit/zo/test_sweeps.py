"""The CPU sweeps split among threads or drawn in long pieces: the same θ, bit for bit, as one
thread's block-by-block sweep."""

from __future__ import annotations

import pytest
import torch

from privzo.zo.directions import BLOCK_SIZE, DirectionSampler
from privzo.zo.perturbation import rounded_update
from privzo.zo.philox import LANES, STREAM_ROUNDING, element_values, philox_key
from privzo.zo.rounding import stochastic_round
from privzo.zo.sweeps import (
    ParameterShard,
    iter_direction_blocks,
    iter_direction_pieces,
    sweep,
    sweep_threads,
)

# sizes around the block length (several blocks, a short last one) and a shard that starts and
# ends inside blocks, as a ZeRO-3 rank's slice does
SIZES = {"a.weight": 2 * BLOCK_SIZE + 12345, "b.bias": 7, "c.weight": BLOCK_SIZE - 3}
SLICE = ("d.weight", 3 * BLOCK_SIZE + 1, BLOCK_SIZE // 2 + 5, 2 * BLOCK_SIZE + 999)


def _shards(seed: int) -> list[ParameterShard]:
    generator = torch.Generator().manual_seed(seed)
    shards = [
        ParameterShard(name, torch.randn(size, generator=generator), size)
        for name, size in SIZES.items()
    ]
    name, size, start, stop = SLICE
    shards.append(ParameterShard(name, torch.randn(stop - start, generator=generator), size, start))
    return shards


@pytest.fixture
def threads():
    """Sets torch's intra-op threads for the test and puts them back."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("direction", ["gaussian", "rademacher"])
def test_a_sweep_split_among_threads_moves_every_element_as_one_thread_does(threads, direction):
    sampler = DirectionSampler(direction)
    moved = {}
    for count in (1, 2, 3):
        threads(count)
        assert sweep_threads(sampler) == count
        shards = _shards(0)
        for seed, coefficient in [(11, 1e-3), (12, -2e-3), (11, 0.123456789)]:
            sweep(shards, sampler, seed, coefficient)
        moved[count] = [shard.tensor for shard in shards]
    for count in (2, 3):
        assert all(torch.equal(a, b) for a, b in zip(moved[1], moved[count], strict=True))
    # and each element moved by exactly its own z: the sampler's slice of every shard
    start = _shards(0)
    for before, after, shard in zip(start, moved[2], start, strict=True):
        end = shard.offset + shard.tensor.numel()
        z11 = sampler.slice(11, shard.name, shard.size, shard.offset, end)
        z12 = sampler.slice(12, shard.name, shard.size, shard.offset, end)
        expected = before.tensor.clone().add_(z11, alpha=1e-3).add_(z12, alpha=-2e-3)
        assert torch.equal(after, expected.add_(z11, alpha=0.123456789))


def test_a_sweep_on_one_thread_or_off_cpu_blocks_is_not_split(threads):
    threads(2)
    assert sweep_threads(DirectionSampler("gaussian", generator="philox")) == 1
    threads(1)
    assert sweep_threads(DirectionSampler("gaussian")) == 1


@pytest.mark.parametrize("name", ["a.weight", "d.weight"])
def test_philox_pieces_hold_the_blocks_values_wherever_a_piece_starts(name):
    """A Philox pass draws its direction in long pieces (for the intra-op threads): every
    element still gets the value its block gives it, the shard's offset included."""
    sampler = DirectionSampler("gaussian", generator="philox")
    shard = next(shard for shard in _shards(0) if shard.name == name)
    blocks = torch.cat([z for _local, z in iter_direction_blocks(shard, sampler, 5)])
    for piece in (LANES * 1000 + 3, BLOCK_SIZE + 1):
        parts = list(iter_direction_pieces(shard, sampler, 5, piece))
        assert len(parts) > 1
        assert [local.start for local, _z in parts] == list(range(0, shard.tensor.numel(), piece))
        assert torch.equal(torch.cat([z for _local, z in parts]), blocks)


def test_a_philox_rounded_update_in_pieces_rounds_every_element_as_its_block_does():
    """The half-precision update drawn in pieces: the same bits as drawn block by block (its
    uniforms at each element's own index)."""
    sampler = DirectionSampler("gaussian", generator="philox")
    name, size, start, stop = SLICE
    weights = torch.randn(stop - start, generator=torch.Generator().manual_seed(3)).bfloat16()
    shard = ParameterShard(name, weights.clone(), size, start)
    rounded_update(shard, sampler, 9, 1e-2)
    expected = weights.clone()
    for local, z in iter_direction_blocks(shard, sampler, 9):
        begin = start + local.start
        uniforms = element_values(
            philox_key(9, name), STREAM_ROUNDING, begin, begin + z.numel(), "uniform", z.device
        )
        updated = expected[local].float().add_(z, alpha=1e-2)
        expected[local] = stochastic_round(updated, uniforms, torch.bfloat16)
    assert torch.equal(shard.tensor, expected)
    assert not torch.equal(shard.tensor, weights)
