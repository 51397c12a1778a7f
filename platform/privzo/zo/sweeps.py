"""Parameter sweeps: θ += c·z over every trainable shard, regenerating z as they go.

A zeroth-order step makes three sweeps (+εz, −2εz, then restore and update fused as
+(ε − ηg)z) instead of the four of a naive implementation: one fewer pass of direction
generation and one fewer read-modify-write of every weight. Replay performs exactly the same
sweeps with the same coefficients, which is what makes it bit-identical.

On CPU the torch-blocks sweep is mostly drawing z (mt19937, one thread per draw), so with
several intra-op threads the blocks are split among as many threads, each drawing with its own
generator and adding its blocks in pieces of at most ``ADD_PIECE`` elements (an add that short
runs in its own thread, no parallel region). Every element still gets the same z and the same
one fp32 add, so θ comes out with the same bits (``tests/unit/zo/test_sweeps.py``).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import torch
from torch import nn

from privzo.zo import kernels
from privzo.zo.directions import BLOCK_SIZE, DirectionSampler, block_overlaps
from privzo.zo.philox import CHUNK_COUNTERS, LANES, philox_key


@dataclass(frozen=True)
class ParameterShard:
    """The part of one named parameter that this process owns and perturbs.

    ``tensor`` is a flat view of the local elements, which sit at ``[offset, offset + numel)`` of
    the full flattened parameter of ``size`` elements (offset 0 and the whole tensor on a single
    device; a ZeRO-3 rank holds one slice).
    """

    name: str
    tensor: torch.Tensor
    size: int
    offset: int = 0


def full_shards(named_parameters: Iterable[tuple[str, nn.Parameter]]) -> list[ParameterShard]:
    """Shards covering whole parameters, for a model held entirely by this process."""
    shards = []
    for name, parameter in named_parameters:
        if not parameter.is_contiguous():
            raise ValueError(f"parameter {name!r} is not contiguous; sweeps need a flat view")
        shards.append(ParameterShard(name, parameter.data.view(-1), parameter.numel()))
    return shards


# torch's grain size: an elementwise op on this many elements or fewer runs in the calling thread
ADD_PIECE = 32768


@torch.no_grad()
def sweep(
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    seed: int,
    coefficient: float,
) -> None:
    """θ += coefficient · z(seed) on every shard: fused, the small shards of a dtype in one
    launch, or (unfused) one piece of the direction at a time (``iter_direction_pieces``),
    CPU torch-blocks split among the intra-op threads (see the module docstring)."""
    if coefficient == 0.0:
        return
    if sampler.fused:
        kernels.add_directions_(segments(shards, seed), coefficient, sampler.philox_transform)
        return
    threads = sweep_threads(sampler)
    if threads > 1:
        _threaded_sweep(shards, sampler, seed, coefficient, threads)
        return
    for shard in shards:
        for local, direction in iter_direction_pieces(shard, sampler, seed):
            shard.tensor[local].add_(direction, alpha=coefficient)


def sweep_threads(sampler: DirectionSampler) -> int:
    """Threads an unfused sweep draws its blocks with: torch's intra-op threads for CPU
    torch-blocks (its draws are one thread each), else one."""
    if sampler.device.type != "cpu" or sampler.generator != "torch-blocks":
        return 1
    return torch.get_num_threads()


_POOLS: dict[tuple[int, int], ThreadPoolExecutor] = {}
_LOCAL = threading.local()  # each sweep thread's own generator


def _pool(threads: int) -> ThreadPoolExecutor:
    """One pool per process and size (a forked child makes its own: threads do not fork)."""
    key = (os.getpid(), threads)
    if key not in _POOLS:
        _POOLS[key] = ThreadPoolExecutor(threads, thread_name_prefix="privzo-sweep")
    return _POOLS[key]


def _threaded_sweep(
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    seed: int,
    coefficient: float,
    threads: int,
) -> None:
    """The blocks dealt round-robin to ``threads`` threads, each drawing and adding its own."""
    blocks = [
        (shard, block, length, lo, hi)
        for shard in shards
        if shard.tensor.numel()
        for block, length, lo, hi in block_overlaps(
            shard.size, shard.offset, shard.offset + shard.tensor.numel()
        )
    ]

    def add_share(share: int) -> None:
        with torch.no_grad():
            generator = _thread_generator()
            for shard, block, length, lo, hi in blocks[share::threads]:
                direction = sampler.block(seed, shard.name, block, length, generator)[lo:hi]
                at = block * BLOCK_SIZE + lo - shard.offset
                for start in range(0, hi - lo, ADD_PIECE):
                    stop = min(start + ADD_PIECE, hi - lo)
                    piece = shard.tensor[at + start : at + stop]
                    piece.add_(direction[start:stop], alpha=coefficient)

    for done in [_pool(threads).submit(add_share, share) for share in range(threads)]:
        done.result()


def _thread_generator() -> torch.Generator:
    generator = getattr(_LOCAL, "generator", None)
    if generator is None:
        generator = _LOCAL.generator = torch.Generator()
    return generator


@torch.no_grad()
def sweep_terms(
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    seeds: list[int],
    coefficients: list[float],
) -> None:
    """``sweep(seeds[t], coefficients[t])`` for each t in order, with the same bits: fused, one
    pass over θ for all the terms (each z regenerated in the kernel), else one sweep each."""
    if sampler.fused:
        terms = [segments(shards, seed) for seed in seeds]
        kernels.add_direction_terms_(terms, coefficients, sampler.philox_transform)
        return
    for seed, coefficient in zip(seeds, coefficients, strict=True):
        sweep(shards, sampler, seed, coefficient)


def segments(shards: list[ParameterShard], seed: int) -> list[kernels.Segment]:
    """The shards as the fused kernels' segments: each with its parameter's key for ``seed``."""
    return [
        kernels.Segment(shard.tensor, philox_key(seed, shard.name), shard.offset)
        for shard in shards
    ]


def iter_direction_blocks(
    shard: ParameterShard, sampler: DirectionSampler, seed: int
) -> Iterator[tuple[slice, torch.Tensor]]:
    """(slice of ``shard.tensor``, z on those elements) for every direction block it overlaps.

    Blocks are drawn whole at their canonical length and cut, so a shard that starts or ends
    inside a block still sees exactly the values the whole parameter would.
    """
    start, stop = shard.offset, shard.offset + shard.tensor.numel()
    if start == stop:
        return
    for block, length, lo, hi in block_overlaps(shard.size, start, stop):
        direction = sampler.block(seed, shard.name, block, length)
        at = block * BLOCK_SIZE + lo - start  # where the overlap starts in the local tensor
        yield slice(at, at + hi - lo), direction[lo:hi]


# Elements of one Philox piece, one batch of counters: each elementwise op on it (and on its
# counters' int64 words) splits across torch's intra-op threads, which blocks of 65,536 are too
# short to do.
PHILOX_PIECE = CHUNK_COUNTERS * LANES


def iter_direction_pieces(
    shard: ParameterShard, sampler: DirectionSampler, seed: int, piece: int = PHILOX_PIECE
) -> Iterator[tuple[slice, torch.Tensor]]:
    """(slice of ``shard.tensor``, z on those elements) covering the shard, for a pass that
    treats every element alone (an add, a copy, a rounding): Philox's counters are drawn in
    pieces of ``piece`` elements, whose values do not depend on where a piece starts; other
    generators go block by block (``iter_direction_blocks``)."""
    if sampler.generator != "philox":
        yield from iter_direction_blocks(shard, sampler, seed)
        return
    count = shard.tensor.numel()
    for start in range(0, count, piece):
        stop = min(start + piece, count)
        offset = shard.offset + start
        direction = sampler.counter_slice(seed, shard.name, offset, offset + stop - start)
        yield slice(start, stop), direction
