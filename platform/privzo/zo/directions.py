"""Perturbation directions: a pure function of (seed, parameter name, element index).

Two generators, recorded in the trajectory (``DirectionSampler.generator``):

- ``philox`` (counter-based): z[i] of parameter ``name`` at step seed ``s`` is computed from
  Philox-4x32-10 keyed by a hash of (s, name) at counter i // 4 (``privzo.zo.philox``). No
  reseeding, any slice is generated directly at its offsets, and the CUDA kernel and this CPU
  code compute the same words, so a trajectory replays across device types (the normals agree
  to a few fp32 ulps: the transcendental functions of the two devices differ in the last bits).
  The default on CUDA, where every pass over a parameter is one fused Triton kernel that
  computes z in registers (``privzo.zo.kernels``; ``DirectionSampler.fused``).
- ``torch-blocks``: each parameter is cut into blocks of ``BLOCK_SIZE`` elements and block ``b``
  is drawn by the device's torch generator seeded with a hash of (s, name, b). On CPU it is
  faster than Philox in torch integer ops (docs/measurements.md, "The ZO step on CPU"), so it
  stays the CPU default; its values depend on the device type's generator (CPU mt19937 vs CUDA
  Philox), so such a trajectory replays only on the device type it was trained on.

Either way an element's value never depends on how the parameters are grouped, split across
ranks or partitioned: the property trajectory replay and ZeRO-3 rely on.

The seeds are public (they are logged in the trajectory): directions are data-independent, so
publishing them costs no privacy.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import torch

from privzo.zo import kernels
from privzo.zo.philox import STREAM_DIRECTION, element_values, name_key, philox_key, splitmix64

BLOCK_SIZE = 1 << 16
# Bump when the value of any direction element, or what the trajectory records about how they
# were drawn, changes. 2: the generator is recorded ('philox' added beside 'torch-blocks').
DIRECTIONS_VERSION = 2
GENERATORS = ("philox", "torch-blocks")


def resolve_generator(name: str, device: torch.device | str) -> str:
    """``name`` itself, or for 'auto': philox on CUDA (the fused kernels), torch-blocks on CPU
    (there it is the faster one)."""
    if name != "auto":
        return name
    return "philox" if torch.device(device).type == "cuda" else "torch-blocks"


def block_seed(seed: int, name: str, block: int) -> int:
    """The generator seed of one torch-blocks block: a hash of (step seed, name, block index)."""
    return splitmix64(splitmix64(splitmix64(seed) ^ name_key(name)) ^ block)


def step_seed(run_seed: int, step: int) -> int:
    """The public seed of one step's direction, derived from the run's seed."""
    return splitmix64(splitmix64(run_seed) ^ step) & ((1 << 63) - 1)


def direction_seeds(seed: int, count: int) -> list[int]:
    """The public seeds of a step's ``count`` directions (``optimizer.directions_per_step``):
    the step's own seed first, so one direction draws exactly the single-direction step's z,
    then hashes of (seed, k) that the trajectory need not store."""
    return [seed] + [
        splitmix64(splitmix64(seed) ^ splitmix64(k)) & ((1 << 63) - 1) for k in range(1, count)
    ]


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
# The Philox transform of each distribution (privzo.zo.philox.element_values).
_PHILOX_TRANSFORMS = {"gaussian": "normal", "rademacher": "sign", "sphere": "normal"}


class DirectionSampler:
    """Regenerates any slice of a step's direction on demand, so z is never stored whole.

    ``fused``: whether the sweeps use the fused kernels (``privzo.zo.kernels``) instead of
    drawing z block by block. ``None`` means yes for Philox on CUDA; ``True`` elsewhere runs
    them wherever Triton can (on CPU tensors under its interpreter: the tests).
    """

    def __init__(
        self,
        distribution: str,
        device: torch.device | str = "cpu",
        generator: str = "torch-blocks",
        fused: bool | None = None,
    ) -> None:
        if distribution not in _DRAWS:
            raise ValueError(f"direction={distribution!r} is unknown; allowed: {list(DIRECTIONS)}")
        if generator not in GENERATORS:
            raise ValueError(f"generator={generator!r} is unknown; allowed: {list(GENERATORS)}")
        self.distribution = distribution
        self.generator = generator
        self.device = torch.device(device)
        self.fused = resolve_fused(fused, generator, self.device)
        self._draw = _DRAWS[distribution]
        self._generator = torch.Generator(device=self.device)

    @property
    def philox_transform(self) -> str:
        """How a Philox word becomes an element: 'normal' or 'sign'."""
        return _PHILOX_TRANSFORMS[self.distribution]

    def block(
        self,
        seed: int,
        name: str,
        block: int,
        length: int,
        generator: torch.Generator | None = None,
    ) -> torch.Tensor:
        """Block ``block`` of parameter ``name``, whose canonical length is ``length``.

        The length must be the block's full length in the parameter (``BLOCK_SIZE`` except for
        the last block): generators do not promise that a shorter draw is a prefix of a longer
        one, so drawing any other length would change the values. ``generator``: a torch
        generator on the sampler's device to draw torch-blocks with instead of the sampler's
        own (a thread's; the values are the same, each block is seeded afresh).
        """
        assert 0 < length <= BLOCK_SIZE
        if self.generator == "philox":
            start = block * BLOCK_SIZE
            return self.counter_slice(seed, name, start, start + length)
        drawing = self._generator if generator is None else generator
        drawing.manual_seed(block_seed(seed, name, block))
        return self._draw(length, drawing, self.device)

    def slice(self, seed: int, name: str, size: int, start: int, stop: int) -> torch.Tensor:
        """Elements ``[start, stop)`` of the direction of parameter ``name`` (``size`` elements)."""
        if self.generator == "philox":
            return self.counter_slice(seed, name, start, stop)
        pieces = [
            self.block(seed, name, block, block_length)[lo:hi]
            for block, block_length, lo, hi in block_overlaps(size, start, stop)
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def counter_slice(self, seed: int, name: str, start: int, stop: int) -> torch.Tensor:
        """Philox elements ``[start, stop)`` of parameter ``name``'s direction, drawn directly."""
        key = philox_key(seed, name)
        return element_values(
            key, STREAM_DIRECTION, start, stop, self.philox_transform, self.device
        )

    def scale(self, seed: int, named_sizes: list[tuple[str, int]]) -> float:
        """The factor every element is multiplied by: sqrt(d)/||z|| on the sphere, else 1.

        The sphere needs the norm of the whole direction, so it costs one extra generation pass.
        """
        if self.distribution != "sphere":
            return 1.0
        if self.fused:
            return self._fused_scale(seed, named_sizes)
        squares = 0.0
        dimension = 0
        for name, size in named_sizes:
            for start, stop in iter_block_ranges(size):
                block = self.block(seed, name, start // BLOCK_SIZE, stop - start)
                squares += float(block.double().square().sum())
            dimension += size
        return math.sqrt(dimension / squares)

    def _fused_scale(self, seed: int, named_sizes: list[tuple[str, int]]) -> float:
        """The sphere's factor from one launch over every parameter, summed on the device:
        one sync."""
        keyed_sizes = [(philox_key(seed, name), size) for name, size in named_sizes]
        squares = kernels.direction_squares_total(keyed_sizes, self.philox_transform, self.device)
        dimension = sum(size for _name, size in named_sizes)
        return math.sqrt(dimension / float(squares))


def resolve_fused(fused: bool | None, generator: str, device: torch.device) -> bool:
    """Whether sweeps run the fused kernels; Triton is required where they will."""
    if fused is None:
        fused = generator == "philox" and device.type == "cuda"
    if fused and generator != "philox":
        raise ValueError(f"the fused kernels draw Philox directions, not {generator!r}")
    if fused:
        kernels.require_triton()
    return fused


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
