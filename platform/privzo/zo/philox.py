"""Philox-4x32-10, the counter-based generator of the directions, in vectorised torch integer ops.

Philox (Salmon, Moraes, Dror, Shaw, "Parallel random numbers: as easy as 1, 2, 3", SC 2011) maps
a 128-bit counter and a 64-bit key to 128 random bits through ten rounds of multiply-xor. The
output is a pure function of (key, counter): element i of any stream is computed directly from i,
so a slice of a parameter (a ZeRO-3 partition, a shard, a replay) is generated at its offsets
without drawing what comes before it, and the CUDA kernel (``privzo.zo.kernels``) computes the
same words as this CPU implementation.

Layout, shared by this module and the kernel: the key is a hash of (step seed, parameter name);
element i of stream ``s`` is lane ``i % 4`` of the counter (i // 4 low 32 bits, i // 4 high 32
bits, s, 0). Stream 0 is the direction z, stream 1 the uniforms of stochastic rounding.

Values live in int64 tensors holding unsigned 32-bit words (torch has no full uint32 arithmetic).
"""

from __future__ import annotations

import hashlib
import math
from functools import lru_cache

import torch

# Constants of Philox-4x32 from the Random123 paper (multipliers and Weyl key increments).
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
ROUNDS = 10
LANES = 4  # 32-bit words per counter: four elements per Philox call
MASK32 = 0xFFFFFFFF
_MASK64 = (1 << 64) - 1
STREAM_DIRECTION = 0
STREAM_ROUNDING = 1
# Counters per vectorised batch (a sweep's Philox piece, ``privzo.zo.sweeps.PHILOX_PIECE``): each
# op splits across the intra-op threads, and its int64 temporaries stay near 4 MiB each.
CHUNK_COUNTERS = 1 << 19
TWO_PI = 2.0 * math.pi


def splitmix64(value: int) -> int:
    """A 64-bit finaliser that spreads nearby inputs (steps, names) to unrelated keys."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


@lru_cache(maxsize=65536)
def name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


def philox_key(seed: int, name: str) -> tuple[int, int]:
    """The 64-bit Philox key of parameter ``name`` at step seed ``seed``, as two 32-bit words."""
    key = splitmix64(splitmix64(seed) ^ name_key(name))
    return key & MASK32, key >> 32


def _mulhilo(value: torch.Tensor, multiplier: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32 bits of value · multiplier (both < 2³²).

    The product needs 64 unsigned bits; int64 multiplication wraps modulo 2⁶⁴ on torch's CPU
    and CUDA kernels, so the bit pattern is the unsigned product's (the known-answer test with
    all-ones inputs checks it on the running machine).
    """
    product = value * multiplier
    return (product >> 32) & MASK32, product & MASK32


def philox4x32(
    counter: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], key: tuple[int, int]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32-10 of a batch of 128-bit counters (four int64 tensors of 32-bit words)."""
    c0, c1, c2, c3 = counter
    k0, k1 = key
    for _round in range(ROUNDS):
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0, k1 = (k0 + PHILOX_W0) & MASK32, (k1 + PHILOX_W1) & MASK32
    return c0, c1, c2, c3


def counter_words(
    key: tuple[int, int], stream: int, first: int, count: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The four output words of counters ``first .. first + count - 1`` of ``stream``."""
    index = torch.arange(first, first + count, device=device, dtype=torch.int64)
    high = index >> 32
    counter = (index & MASK32, high, torch.full_like(index, stream), torch.zeros_like(index))
    return philox4x32(counter, key)


def normals_from_words(
    words: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Box–Muller, lanes (0, 1) and (2, 3) of each counter: [count, 4] standard normals, fp32.

    u1 = (2·(w >> 9) + 1)·2⁻²⁴ is an odd multiple of 2⁻²⁴, so it is exact in fp32 and never 0
    (log stays finite); u2 = (w >> 8)·2⁻²⁴ in [0, 1).
    """
    lanes = []
    for radius_word, angle_word in ((words[0], words[1]), (words[2], words[3])):
        u1 = ((radius_word >> 9) * 2 + 1).to(torch.float32) * 2.0**-24
        u2 = (angle_word >> 8).to(torch.float32) * 2.0**-24
        radius = torch.sqrt(torch.log(u1) * -2.0)
        angle = u2 * TWO_PI
        lanes += [radius * torch.cos(angle), radius * torch.sin(angle)]
    return torch.stack(lanes, dim=1)


def signs_from_words(
    words: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """±1 from the top bit of each word: [count, 4] fp32."""
    return torch.stack([1.0 - ((word >> 31) * 2).to(torch.float32) for word in words], dim=1)


def uniforms_from_words(
    words: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> torch.Tensor:
    """Uniforms on the 2⁻²⁴ grid of [0, 1) from the top 24 bits of each word: [count, 4] fp32."""
    return torch.stack([(word >> 8).to(torch.float32) * 2.0**-24 for word in words], dim=1)


def element_values(
    key: tuple[int, int],
    stream: int,
    start: int,
    stop: int,
    transform: str,
    device: torch.device,
) -> torch.Tensor:
    """Elements ``[start, stop)`` of one stream as fp32 ``transform`` values, chunk by chunk.

    ``transform`` is 'normal', 'sign' or 'uniform'. Whole counters are generated and cut, so
    the values never depend on where a slice starts.
    """
    assert 0 <= start < stop
    convert = _TRANSFORMS[transform]
    first, last = start // LANES, (stop - 1) // LANES + 1
    pieces = []
    for chunk in range(first, last, CHUNK_COUNTERS):
        count = min(CHUNK_COUNTERS, last - chunk)
        pieces.append(convert(counter_words(key, stream, chunk, count, device)).view(-1))
    values = pieces[0] if len(pieces) == 1 else torch.cat(pieces)
    offset = start - first * LANES
    return values[offset : offset + stop - start]


_TRANSFORMS = {
    "normal": normals_from_words,
    "sign": signs_from_words,
    "uniform": uniforms_from_words,
}
