"""Perturbation directions: a pure function of (seed, parameter name, element index).

Each parameter is cut into fixed blocks of ``BLOCK_SIZE`` elements of its flattened view. Block
``b`` of parameter ``name`` at step seed ``s`` is drawn from a generator seeded with a 64-bit hash
of ``(s, name, b)``. So any element's value depends only on (seed, name, index), never on how the
parameters are grouped, split across ranks or partitioned, and any slice can be regenerated
without materialising the rest: the property trajectory replay and ZeRO-3 rely on.

The seeds are public (they are logged in the trajectory): directions are data-independent, so
publishing them costs no privacy. Values depend on the device type's generator (CPU mt19937 vs
CUDA Philox); replay a trajectory on the device type it was trained on.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Iterator
from functools import lru_cache

import torch

BLOCK_SIZE = 1 << 16
DIRECTIONS_VERSION = 1  # bump when the value of any direction element changes
_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    """A 64-bit finaliser that spreads nearby inputs (steps, blocks) to unrelated seeds."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


@lru_cache(maxsize=65536)
def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one block: a hash of (step seed, parameter name, block index)."""
    return _splitmix64(_splitmix64(_splitmix64(seed) ^ _name_key(name)) ^ block)


def step_seed(run_seed: int, step: int) -> int:
    """The public seed of one step's direction, derived from the run's seed."""
    return _splitmix64(_splitmix64(run_seed) ^ step) & ((1 << 63) - 1)


def _gaussian(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    return torch.randn(n, generator=generator, device=device, dtype=torch.float32)


def _rademacher(n: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    bits = torch.randint(0, 2, (n,), generator=generator, device=device, dtype=torch.int8)
    return bits.to(torch.float32).mul_(2).sub_(1)


# "sphere" draws Gaussian blocks and rescales them by sqrt(d)/||z|| (see ``DirectionSampler``).
_DRAWS: dict[str, Callable[[int, torch.Generator, torch.device], torch.Tensor]] = {
    "gaussian": _gaussian,
    "rademacher": _rademacher,
    "sphere": _gaussian,
}
DIRECTIONS = tuple(_DRAWS)


class DirectionSampler:
    """Regenerates any slice of a step's direction on demand, so z is never stored whole."""

    def __init__(self, distribution: str, device: torch.device | str = "cpu") -> None:
        if distribution not in _DRAWS:
            raise ValueError(f"direction={distribution!r} is unknown; allowed: {list(DIRECTIONS)}")
        self.distribution = distribution
        self.device = torch.device(device)
        self._draw = _DRAWS[distribution]
        self._generator = torch.Generator(device=self.device)

    def block(self, seed: int, name: str, block: int, length: int) -> torch.Tensor:
        """Block ``block`` of parameter ``name``, whose canonical length is ``length``.

        The length must be the block's full length in the parameter (``BLOCK_SIZE`` except for
        the last block): generators do not promise that a shorter draw is a prefix of a longer
        one, so drawing any other length would change the values.
        """
        assert 0 < length <= BLOCK_SIZE
        self._generator.manual_seed(block_seed(seed, name, block))
        return self._draw(length, self._generator, self.device)

    def slice(self, seed: int, name: str, size: int, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of the direction of parameter ``name`` (``size`` elements)."""
        pieces = [
            self.block(seed, name, block, block_length)[lo:hi]
            for block, block_length, lo, hi in block_overlaps(size, start, stop)
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def scale(self, seed: int, named_sizes: list[tuple[str, int]]) -> float:
        """The factor every element is multiplied by: sqrt(d)/||z|| on the sphere, else 1.

        The sphere needs the norm of the whole direction, so it costs one extra generation pass.
        """
        if self.distribution != "sphere":
            return 1.0
        squares = 0.0
        dimension = 0
        for name, size in named_sizes:
            for start, stop in iter_block_ranges(size):
                block = self.block(seed, name, start // BLOCK_SIZE, stop - start)
                squares += float(block.double().square().sum())
            dimension += size
        return math.sqrt(dimension / squares)


def iter_block_ranges(size: int) -> Iterator[tuple[int, int]]:
    """The [start, stop) ranges of the blocks of a flattened parameter with ``size`` elements."""
    for start in range(0, size, BLOCK_SIZE):
        yield start, min(start + BLOCK_SIZE, size)


def block_overlaps(size: int, start: int, stop: int) -> Iterator[tuple[int, int, int, int]]:
    """(block, its canonical length, lo, hi) for every block overlapping [start, stop) of a
    parameter with ``size`` elements; ``[lo, hi)`` is the overlap within the block."""
    assert 0 <= start < stop <= size
    first, last = start // BLOCK_SIZE, (stop - 1) // BLOCK_SIZE
    for block in range(first, last + 1):
        block_start = block * BLOCK_SIZE
        length = min(BLOCK_SIZE, size - block_start)
        lo = max(start, block_start) - block_start
        hi = min(stop, block_start + length) - block_start
        yield block, length, lo, hi
