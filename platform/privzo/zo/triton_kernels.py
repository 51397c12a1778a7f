"""The fused sweep kernels in Triton: one read and one write of the weights per pass.

Each program takes ``COUNTERS`` consecutive Philox counters of one parameter (four elements
each), computes the counter words in registers exactly as ``privzo.zo.philox`` does on the CPU
(same key, counter layout, streams and word-to-value transforms), and applies one of three
passes to those elements:

- ``PASS_ADD``: θ ← fma(c, z, θ) in place (fp32 weights).
- ``PASS_COPY``: out ← round-to-nearest(fma(c, z, float(θ))) (the virtual half-precision
  perturbation: a temporary weight for one module's forward).
- ``PASS_UPDATE``: θ ← stochastic-round(fma(c, z, float(θ))) in place, the rounding uniforms
  from stream 1 (``privzo.zo.rounding`` on the same bit patterns).

A fourth kernel sums z² per program (the sphere's norm) into a buffer, so the total is summed in
a fixed order and replay is deterministic. The z's never reach memory. Each kernel has a
multi-tensor form that covers many parameters of one dtype in one launch, each program finding
its parameter in a table, so a sweep over hundreds of tensors is bound by the weights' traffic,
not by launches.

Importing this module imports Triton; ``privzo.zo.kernels`` imports it only when a fused pass
is first asked for, so CPU installs without Triton never touch it. With ``TRITON_INTERPRET=1``
set before that first use, the same kernels run on CPU tensors (how the tests check them
against the CPU implementation).

Over 400 lines because it is one concept: the device twin of ``privzo.zo.philox``, whose
rounds, word transforms and passes must agree with it bit for bit and are read and checked
together (``privzo bench kernels``).
"""

from __future__ import annotations

import triton
import triton.language as tl

PASS_ADD = 0
PASS_COPY = 1
PASS_UPDATE = 2
TRANSFORM_NORMAL = 0
TRANSFORM_SIGN = 1

_M0 = tl.constexpr(0xD2511F53)
_M1 = tl.constexpr(0xCD9E8D57)
_W0 = tl.constexpr(0x9E3779B9)
_W1 = tl.constexpr(0xBB67AE85)
_TWO_PI = tl.constexpr(6.283185307179586)
_TWO_TO_MINUS_24 = tl.constexpr(5.960464477539063e-08)


@triton.jit
def _philox(c0, c1, c2, c3, key0, key1):
    """Philox-4x32-10 of a block of counters (uint32 words); the key is two uint32 scalars."""
    k0 = key0
    k1 = key1
    for _ in tl.static_range(10):
        hi0 = tl.umulhi(c0, _M0)
        lo0 = c0 * _M0
        hi1 = tl.umulhi(c2, _M1)
        lo1 = c2 * _M1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = k0 + _W0
        k1 = k1 + _W1
    return c0, c1, c2, c3


@triton.jit
def _counter_words(counters, stream, key0, key1):
    """The four words of ``counters`` (int64) in ``stream``: lo/hi 32 bits, stream, 0."""
    low = (counters & 0xFFFFFFFF).to(tl.uint32)
    high = (counters >> 32).to(tl.uint32)
    stream_word = tl.zeros_like(low) + stream
    return _philox(low, high, stream_word, tl.zeros_like(low), key0, key1)


@triton.jit
def _box_muller(radius_word, angle_word):
    """Two normals from two words, as ``privzo.zo.philox.normals_from_words``."""
    u1 = ((radius_word >> 9) * 2 + 1).to(tl.float32) * _TWO_TO_MINUS_24
    u2 = (angle_word >> 8).to(tl.float32) * _TWO_TO_MINUS_24
    radius = tl.sqrt_rn(tl.log(u1) * -2.0)
    angle = u2 * _TWO_PI
    return radius * tl.cos(angle), radius * tl.sin(angle)


@triton.jit
def _sign(word):
    return 1.0 - ((word >> 31) * 2).to(tl.float32)


@triton.jit
def _uniform(word):
    return (word >> 8).to(tl.float32) * _TWO_TO_MINUS_24


@triton.jit
def _directions(w0, w1, w2, w3, TRANSFORM: tl.constexpr):
    if TRANSFORM == 0:
        z0, z1 = _box_muller(w0, w1)
        z2, z3 = _box_muller(w2, w3)
    else:
        z0, z1, z2, z3 = _sign(w0), _sign(w1), _sign(w2), _sign(w3)
    return z0, z1, z2, z3


@triton.jit
def _round_nearest(values, half_dtype: tl.constexpr):
    """fp32 → ``half_dtype``, round to nearest even. bf16 is rounded in integer arithmetic (torch's
    rule, NaN → 0x7FC0): Triton's interpreter gets ties and carries of its own bf16 cast wrong,
    and the kernels must compute the same bits on both."""
    if half_dtype == tl.bfloat16:
        bits = values.to(tl.uint32, bitcast=True)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        rounded = tl.where(values != values, 0x7FC0, rounded)
        return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    else:
        return values.to(half_dtype, fp_downcast_rounding="rtne")


@triton.jit
def _stochastic_round(values, uniforms, half_dtype: tl.constexpr):
    """``privzo.zo.rounding.stochastic_round`` on the same bit patterns."""
    nearest = _round_nearest(values, half_dtype)
    nearest_value = nearest.to(tl.float32)
    residual = values - nearest_value
    bits = nearest.to(tl.int16, bitcast=True).to(tl.int32) & 0xFFFF
    magnitude = bits & 0x7FFF
    negative = (bits & 0x8000) != 0
    upward = residual > 0
    away_from_zero = (upward != negative) | (magnitude == 0)
    new_magnitude = tl.where(away_from_zero, magnitude + 1, magnitude - 1)
    new_negative = tl.where(magnitude == 0, residual <= 0, negative)
    new_bits = new_magnitude | new_negative.to(tl.int32) * 0x8000
    other = (new_bits - (new_bits >= 0x8000).to(tl.int32) * 0x10000).to(tl.int16)
    other = other.to(half_dtype, bitcast=True)
    gap = tl.abs(other.to(tl.float32) - nearest_value)
    finite = tl.abs(nearest_value) < float("inf")
    take_other = (uniforms * gap < tl.abs(residual)) & finite
    return tl.where(take_other, other, nearest)


@triton.jit
def _lanes_in_order(v0, v1, v2, v3):
    """The four lanes of a block of counters as one vector in element order: counter c's lane j
    is element 4c + j, so the block's loads and stores are contiguous (four strided accesses per
    element are what the layout avoids)."""
    return tl.interleave(tl.interleave(v0, v2), tl.interleave(v1, v3))


@triton.jit
def _block_directions(counters, key0, key1, TRANSFORM: tl.constexpr):
    """z at the four elements of each of ``counters`` (int64), in element order."""
    w0, w1, w2, w3 = _counter_words(counters, 0, key0.to(tl.uint32), key1.to(tl.uint32))
    z0, z1, z2, z3 = _directions(w0, w1, w2, w3, TRANSFORM)
    return _lanes_in_order(z0, z1, z2, z3)


@triton.jit
def _pass_block(
    source_ptr,
    target_ptr,
    block,
    count,
    offset,
    first_counter,
    key0,
    key1,
    coefficient,
    PASS: tl.constexpr,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """The pass over counters [first_counter + block, + COUNTERS) of elements [offset, offset +
    count) of a parameter, held locally at [0, count): element e is lane e % 4 of counter e // 4.
    Shared by the per-parameter and the multi-tensor kernels, so both compute the same bits.
    ``ALIGNED`` (the host checked it) says the block's first element is 16 bytes aligned, so a
    block wholly inside the tensor is read and written with unmasked vector accesses."""
    counters = first_counter + block + tl.arange(0, COUNTERS).to(tl.int64)
    start = (first_counter + block) * 4 - offset
    if ALIGNED:
        start = tl.multiple_of(start, 8)
    z = _block_directions(counters, key0, key1, TRANSFORM)
    uniforms = z  # unused unless PASS_UPDATE
    if PASS == 2:
        r0, r1, r2, r3 = _counter_words(counters, 1, key0.to(tl.uint32), key1.to(tl.uint32))
        uniforms = _lanes_in_order(_uniform(r0), _uniform(r1), _uniform(r2), _uniform(r3))
    local = start + tl.arange(0, 4 * COUNTERS).to(tl.int64)
    if (start >= 0) & (start + 4 * COUNTERS <= count):
        _apply(source_ptr, target_ptr, local, local >= 0, z, uniforms, coefficient, PASS, False)
    else:
        inside = (local >= 0) & (local < count)
        _apply(source_ptr, target_ptr, local, inside, z, uniforms, coefficient, PASS, True)


@triton.jit
def _apply(
    source_ptr,
    target_ptr,
    local,
    inside,
    z,
    uniforms,
    coefficient,
    PASS: tl.constexpr,
    MASKED: tl.constexpr,
):
    """Load θ at ``local``, apply the pass, store; masked by ``inside`` at a tensor's edges."""
    if MASKED:
        theta = tl.load(source_ptr + local, mask=inside, other=0.0)
    else:
        theta = tl.load(source_ptr + local)
    moved = tl.fma(z, coefficient, theta.to(tl.float32))
    if PASS == 0:
        result = moved
    elif PASS == 1:
        result = _round_nearest(moved, target_ptr.dtype.element_ty)
    else:
        result = _stochastic_round(moved, uniforms, target_ptr.dtype.element_ty)
    if MASKED:
        tl.store(target_ptr + local, result, mask=inside)
    else:
        tl.store(target_ptr + local, result)


@triton.jit(do_not_specialize=["count", "offset", "first_counter", "key0", "key1", "coefficient"])
def direction_pass_kernel(
    source_ptr,
    target_ptr,
    count,
    offset,
    first_counter,
    key0,
    key1,
    coefficient,
    PASS: tl.constexpr,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """One pass over elements [offset, offset + count) of one parameter."""
    block = tl.program_id(0).to(tl.int64) * COUNTERS
    _pass_block(
        source_ptr,
        target_ptr,
        block,
        count,
        offset,
        first_counter,
        key0,
        key1,
        coefficient,
        PASS,
        TRANSFORM,
        COUNTERS,
        ALIGNED,
    )


# Columns of a multi-tensor launch's segment table (int64, one row per segment): where the
# segment's elements are, in elements from the source / target base pointer; its element count
# and offset in the whole parameter; its first counter; its first program; its Philox key.
SOURCE = tl.constexpr(0)
TARGET = tl.constexpr(1)
COUNT = tl.constexpr(2)
OFFSET = tl.constexpr(3)
FIRST_COUNTER = tl.constexpr(4)
FIRST_PROGRAM = tl.constexpr(5)
KEY0 = tl.constexpr(6)
KEY1 = tl.constexpr(7)
COLUMNS = tl.constexpr(8)
TABLE_COLUMNS = (
    "SOURCE",
    "TARGET",
    "COUNT",
    "OFFSET",
    "FIRST_COUNTER",
    "FIRST_PROGRAM",
    "KEY0",
    "KEY1",
)  # the columns above, in order (the host builds rows by name)


@triton.jit
def _find_row(table_ptr, segments, program):
    """The index of the row whose programs include ``program``: a binary search of the
    first-program column (increasing), a few scalar loads from a table that stays in cache,
    rather than a program → row table, which for a large model would hold millions of entries
    to build and copy."""
    low = program * 0
    high = low + segments
    while high - low > 1:
        middle = (low + high) // 2
        start = tl.load(table_ptr + middle * COLUMNS + FIRST_PROGRAM)
        low = tl.where(start <= program, middle, low)
        high = tl.where(start <= program, high, middle)
    return low


@triton.jit
def _find_segment(table_ptr, segments, program):
    """The row (a pointer to its columns) whose programs include ``program``."""
    return table_ptr + _find_row(table_ptr, segments, program) * COLUMNS


@triton.jit(do_not_specialize=["segments", "coefficient"])
def multi_tensor_pass_kernel(
    source_base,
    target_base,
    table_ptr,
    segments,
    coefficient,
    PASS: tl.constexpr,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
    ALIGNED: tl.constexpr,
):
    """One pass over every segment of a table (same dtype, one device) in one launch: each
    program finds its segment's row and runs the per-parameter kernel's block on it."""
    program = tl.program_id(0).to(tl.int64)
    row = _find_segment(table_ptr, segments, program)
    block = (program - tl.load(row + FIRST_PROGRAM)) * COUNTERS
    source = tl.load(row + SOURCE)
    target = tl.load(row + TARGET)
    if ALIGNED:  # every segment starts 16 bytes aligned
        source = tl.multiple_of(source, 8)
        target = tl.multiple_of(target, 8)
    _pass_block(
        source_base + source,
        target_base + target,
        block,
        tl.load(row + COUNT),
        tl.load(row + OFFSET),
        tl.load(row + FIRST_COUNTER),
        tl.load(row + KEY0),
        tl.load(row + KEY1),
        coefficient,
        PASS,
        TRANSFORM,
        COUNTERS,
        ALIGNED,
    )


@triton.jit(do_not_specialize=["segments", "terms"])
def multi_term_add_kernel(
    base,
    table_ptr,
    keys_ptr,
    coefficients_ptr,
    segments,
    terms,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
):
    """θ ← fma(c_T, z_T, … fma(c_1, z_1, θ)) in place (fp32) over every segment of a table: the
    ``terms`` passes of ``PASS_ADD`` in one read and one write of θ, each z regenerated in
    registers. The accumulator is fp32 between terms as θ is between passes, so the result is
    the passes' bit for bit. ``keys_ptr`` holds each segment's keys (int64 [segments, terms,
    2]), ``coefficients_ptr`` the terms' coefficients (fp32 [terms]); the table's key columns
    are unused."""
    program = tl.program_id(0).to(tl.int64)
    index = _find_row(table_ptr, segments, program)
    row = table_ptr + index * COLUMNS
    count = tl.load(row + COUNT)
    first = tl.load(row + FIRST_COUNTER) + (program - tl.load(row + FIRST_PROGRAM)) * COUNTERS
    counters = first + tl.arange(0, COUNTERS).to(tl.int64)
    local = first * 4 - tl.load(row + OFFSET) + tl.arange(0, 4 * COUNTERS).to(tl.int64)
    inside = (local >= 0) & (local < count)
    pointers = base + tl.load(row + SOURCE) + local
    theta = tl.load(pointers, mask=inside, other=0.0)
    keys = keys_ptr + index * terms * 2
    for term in range(terms):
        z = _block_directions(
            counters, tl.load(keys + 2 * term), tl.load(keys + 2 * term + 1), TRANSFORM
        )
        theta = tl.fma(z, tl.load(coefficients_ptr + term), theta)
    tl.store(pointers, theta, mask=inside)


@triton.jit
def _lane_square(z, local, count):
    inside = (local >= 0) & (local < count)
    wide = z.to(tl.float64)
    return tl.sum(tl.where(inside, wide * wide, 0.0), axis=0)


@triton.jit
def _squares_block(block, count, offset, first_counter, key0, key1, TRANSFORM, COUNTERS):
    counters = first_counter + block + tl.arange(0, COUNTERS).to(tl.int64)
    w0, w1, w2, w3 = _counter_words(counters, 0, key0.to(tl.uint32), key1.to(tl.uint32))
    z0, z1, z2, z3 = _directions(w0, w1, w2, w3, TRANSFORM)
    local = counters * 4 - offset
    total = _lane_square(z0, local, count) + _lane_square(z1, local + 1, count)
    total += _lane_square(z2, local + 2, count) + _lane_square(z3, local + 3, count)
    return total


@triton.jit(do_not_specialize=["count", "offset", "first_counter", "key0", "key1"])
def direction_squares_kernel(
    partial_ptr,
    count,
    offset,
    first_counter,
    key0,
    key1,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
):
    """Σ z² over this program's elements of [offset, offset + count), in fp64."""
    program = tl.program_id(0)
    block = program.to(tl.int64) * COUNTERS
    total = _squares_block(block, count, offset, first_counter, key0, key1, TRANSFORM, COUNTERS)
    tl.store(partial_ptr + program, total)


@triton.jit(do_not_specialize=["segments"])
def multi_tensor_squares_kernel(
    partial_ptr,
    table_ptr,
    segments,
    TRANSFORM: tl.constexpr,
    COUNTERS: tl.constexpr,
):
    """Σ z² over this program's elements of its segment (a table as for the passes; the
    address columns unused), in fp64: one launch for every parameter of the sphere."""
    program = tl.program_id(0).to(tl.int64)
    row = _find_segment(table_ptr, segments, program)
    total = _squares_block(
        (program - tl.load(row + FIRST_PROGRAM)) * COUNTERS,
        tl.load(row + COUNT),
        tl.load(row + OFFSET),
        tl.load(row + FIRST_COUNTER),
        tl.load(row + KEY0),
        tl.load(row + KEY1),
        TRANSFORM,
        COUNTERS,
    )
    tl.store(partial_ptr + program, total)
