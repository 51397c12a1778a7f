"""Parameter sweeps: θ += c·z over every trainable shard, regenerating z as they go.

A zeroth-order step makes three sweeps (+εz, −2εz, then restore and update fused as
+(ε − ηg)z) instead of the four of a naive implementation: one fewer pass of direction
generation and one fewer read-modify-write of every weight. Replay performs exactly the same
sweeps with the same coefficients, which is what makes it bit-identical.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from privzo.zo import kernels
from privzo.zo.directions import BLOCK_SIZE, DirectionSampler, block_overlaps
from privzo.zo.philox import philox_key


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


@torch.no_grad()
def sweep(
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    seed: int,
    coefficient: float,
) -> None:
    """θ += coefficient · z(seed) on every shard: fused, the small shards of a dtype in one
    launch, or (unfused) one direction block at a time."""
    if coefficient == 0.0:
        return
    if sampler.fused:
        kernels.add_directions_(segments(shards, seed), coefficient, sampler.philox_transform)
        return
    for shard in shards:
        for local, direction in iter_direction_blocks(shard, sampler, seed):
            shard.tensor[local].add_(direction, alpha=coefficient)


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
