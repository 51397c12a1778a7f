"""Fused direction passes: the Philox directions generated inside the weight sweep itself.

The CPU path (``privzo.zo.sweeps``, ``privzo.zo.perturbation``) draws z in blocks and issues one
small kernel per block from Python: on OPT-13B about 600,000 launches per step. Here a pass
reads θ once and writes it once, in one Triton launch per parameter or, in the multi-tensor
forms (``add_directions_``, ``rounded_updates_``, ``perturbed_copies``,
``direction_squares_total``), per group of same-dtype tensors (each large tensor still in a
launch of its own, ``OWN_LAUNCH_ELEMENTS``; ``privzo.zo.grouped_copies`` makes a module's
perturbed copies in one launch from a table built once), computing z (and the rounding
uniforms) in registers from the same counter-based function as ``privzo.zo.philox``, so the two
paths compute the same values: integer words bit for bit, the normals to a few fp32 ulps (the
devices' log/sin/cos differ in the last bits). Both forms give the same bits.

Triton is imported on first use only (``privzo.zo.triton_kernels``): it ships with torch's CUDA
builds and is an optional test dependency on CPU, where the kernels run under its interpreter.

Over 400 lines because it is one concept, the host side of every fused pass: loading Triton,
the launch, alignment and the multi-tensor tables and groups that each pass's single and
multi-tensor forms share, so both forms address the same counters.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Sequence
from functools import lru_cache
from types import ModuleType
from typing import NamedTuple

import torch

from privzo.zo.philox import LANES

COUNTERS_PER_PROGRAM = 256  # 1024 elements per program: one read and one write of each
TRANSFORMS = {"normal": 0, "sign": 1}
# A segment this large gets a launch of its own: in the grouped launch each program searches the
# table for its segment, which slows large matrices, while hundreds of small tensors each with a
# launch of its own are launch-bound (docs/measurements.md, "The ZO step against inference").
OWN_LAUNCH_ELEMENTS = 1 << 20
# Elements of one vector load where a launch is aligned (``aligned_block``): 16 bytes of half
# precision.
VECTOR_ELEMENTS = 8


def triton_installed() -> bool:
    return importlib.util.find_spec("triton") is not None


def require_triton() -> None:
    """A clear error, before any model is built, where fused passes are asked for and Triton
    is missing (it ships with torch's CUDA builds; ``pip install triton`` otherwise)."""
    if not triton_installed():
        raise ValueError(
            "the fused direction passes need Triton, which is not installed: it ships with "
            "torch's CUDA builds (pip install triton), or set optimizer.generator=torch-blocks"
        )


@lru_cache(maxsize=1)
def compiled() -> ModuleType:
    require_triton()
    return importlib.import_module("privzo.zo.triton_kernels")


def _launch(
    source: torch.Tensor,
    target: torch.Tensor,
    key: tuple[int, int],
    offset: int,
    coefficient: float,
    transform: str,
    mode: int,
) -> None:
    kernels = compiled()
    count = source.numel()
    grid = (program_count(offset, count),)
    aligned = aligned_block(offset, count) and aligned_pointer(source) and aligned_pointer(target)
    kernels.direction_pass_kernel[grid](
        source,
        target,
        count,
        offset,
        offset // LANES,
        key[0],
        key[1],
        coefficient,
        PASS=mode,
        TRANSFORM=TRANSFORMS[transform],
        COUNTERS=COUNTERS_PER_PROGRAM,
        ALIGNED=aligned,
    )


def aligned_block(offset: int, count: int) -> bool:
    """Whether a program's elements start at a multiple of 8 (the parameter offset a multiple of
    a counter's 4 lanes, the programs' blocks multiples of 1024) and the count is one too: with
    16-byte-aligned tensors, the condition for the kernels' vector loads and stores."""
    return offset % LANES == 0 and count % VECTOR_ELEMENTS == 0


def aligned_pointer(tensor: torch.Tensor) -> bool:
    return tensor.data_ptr() % 16 == 0


def check_flat(tensor: torch.Tensor) -> None:
    assert tensor.dim() == 1 and tensor.is_contiguous() and tensor.numel() > 0


@torch.no_grad()
def add_direction_(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> None:
    """θ ← θ + c·z in place (fp32): ``tensor`` holds elements [offset, offset + numel)."""
    check_flat(tensor)
    assert tensor.dtype == torch.float32
    kernels = compiled()
    _launch(tensor, tensor, key, offset, coefficient, transform, kernels.PASS_ADD)


@torch.no_grad()
def perturbed_copy(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> torch.Tensor:
    """θ + c·z computed in fp32 and rounded once (to nearest) to θ's dtype, in a new tensor."""
    check_flat(tensor)
    result = torch.empty_like(tensor)
    _launch(tensor, result, key, offset, coefficient, transform, compiled().PASS_COPY)
    return result


@torch.no_grad()
def rounded_update_(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> None:
    """θ ← stochastic-round(θ + c·z) in place (bf16 / fp16), uniforms from stream 1 of the same
    key: the fused form of ``privzo.zo.perturbation.rounded_update``."""
    check_flat(tensor)
    assert tensor.dtype in (torch.bfloat16, torch.float16)
    _launch(tensor, tensor, key, offset, coefficient, transform, compiled().PASS_UPDATE)


class Segment(NamedTuple):
    """Elements [offset, offset + numel) of one parameter's direction, held flat in ``tensor``."""

    tensor: torch.Tensor
    key: tuple[int, int]
    offset: int


def program_count(offset: int, count: int) -> int:
    """Programs of ``COUNTERS_PER_PROGRAM`` counters covering elements [offset, offset + count)."""
    first = offset // LANES
    last = (offset + count - 1) // LANES + 1
    return math.ceil((last - first) / COUNTERS_PER_PROGRAM)


def element_address(tensor: torch.Tensor, base: torch.Tensor) -> int:
    """Where ``tensor`` starts, in elements from ``base``'s first element (same dtype)."""
    distance = tensor.data_ptr() - base.data_ptr()
    assert distance % tensor.element_size() == 0
    return distance // tensor.element_size()


# (source address, target address, count, offset, key) of a multi-tensor launch's segment
TableRow = tuple[int, int, int, int, tuple[int, int]]


def host_table(rows: Sequence[TableRow]) -> tuple[torch.Tensor, int]:
    """The int64 table of a multi-tensor launch (``triton_kernels.COLUMNS`` wide), on the host,
    and the launch's program count: each row's programs follow the previous row's."""
    columns = compiled().TABLE_COLUMNS
    table = []
    programs = 0
    for source, target, count, offset, key in rows:
        values = {
            "SOURCE": source,
            "TARGET": target,
            "COUNT": count,
            "OFFSET": offset,
            "FIRST_COUNTER": offset // LANES,
            "FIRST_PROGRAM": programs,
            "KEY0": key[0],
            "KEY1": key[1],
        }
        table.append([values[name] for name in columns])
        programs += program_count(offset, count)
    return torch.tensor(table, dtype=torch.int64).reshape(len(rows), len(columns)), programs


def aligned_rows(rows: Sequence[TableRow]) -> bool:
    """Whether every segment starts 16 bytes aligned from its bases (``aligned_block``)."""
    return all(
        source % VECTOR_ELEMENTS == 0
        and target % VECTOR_ELEMENTS == 0
        and aligned_block(offset, count)
        for source, target, count, offset, _key in rows
    )


def upload_table(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A launch table on ``device``: on CUDA pinned and non-blocking, since a plain copy from
    pageable memory would wait for the stream."""
    if device.type != "cuda":
        return host.to(device)
    return host.pin_memory().to(device, non_blocking=True)


def _table(rows: Sequence[TableRow], device: torch.device) -> tuple[torch.Tensor, int]:
    host, programs = host_table(rows)
    return upload_table(host, device), programs


def _groups(segments: Sequence[Segment]) -> list[list[int]]:
    """Indices of the non-empty segments, grouped by (device, dtype), each group in order."""
    groups: dict[tuple[torch.device, torch.dtype], list[int]] = {}
    for index, segment in enumerate(segments):
        tensor = segment.tensor
        assert tensor.dim() == 1 and tensor.is_contiguous()
        if tensor.numel():
            groups.setdefault((tensor.device, tensor.dtype), []).append(index)
    return list(groups.values())


def _launch_group(
    sources: Sequence[Segment],
    targets: Sequence[torch.Tensor],
    coefficient: float,
    transform: str,
    mode: int,
) -> None:
    """A pass over every segment of a group (same dtype, one device): a launch of its own for
    each segment of ``OWN_LAUNCH_ELEMENTS`` or more, one launch for all the others."""
    grouped = []
    for source, target in zip(sources, targets, strict=True):
        if source.tensor.numel() >= OWN_LAUNCH_ELEMENTS:
            _launch(source.tensor, target, source.key, source.offset, coefficient, transform, mode)
        else:
            grouped.append((source, target))
    if grouped:
        _launch_grouped(
            [s for s, _t in grouped], [t for _s, t in grouped], coefficient, transform, mode
        )


def _launch_grouped(
    sources: Sequence[Segment],
    targets: Sequence[torch.Tensor],
    coefficient: float,
    transform: str,
    mode: int,
) -> None:
    """One launch over the segments. Each is addressed by its element offset from the
    lowest-addressed tensor (one for the sources, one for the targets), so the tensors need not
    be contiguous with each other: Triton adds an int64 offset to a pointer alike when compiled
    and when interpreted (on CPU tensors, whose memory the interpreter uses in place)."""
    kernels = compiled()
    source_base = min((source.tensor for source in sources), key=torch.Tensor.data_ptr)
    target_base = min(targets, key=torch.Tensor.data_ptr)
    rows = [
        (
            element_address(source.tensor, source_base),
            element_address(target, target_base),
            source.tensor.numel(),
            source.offset,
            source.key,
        )
        for source, target in zip(sources, targets, strict=True)
    ]
    table, programs = _table(rows, source_base.device)
    aligned = aligned_pointer(source_base) and aligned_pointer(target_base) and aligned_rows(rows)
    kernels.multi_tensor_pass_kernel[(programs,)](
        source_base,
        target_base,
        table,
        len(rows),
        coefficient,
        PASS=mode,
        TRANSFORM=TRANSFORMS[transform],
        COUNTERS=COUNTERS_PER_PROGRAM,
        ALIGNED=aligned,
    )


def _in_place(
    segments: Sequence[Segment],
    coefficient: float,
    transform: str,
    mode: int,
    dtypes: tuple[torch.dtype, ...],
) -> None:
    for group in _groups(segments):
        sources = [segments[index] for index in group]
        assert sources[0].tensor.dtype in dtypes
        targets = [source.tensor for source in sources]
        _launch_group(sources, targets, coefficient, transform, mode)


@torch.no_grad()
def add_directions_(segments: Sequence[Segment], coefficient: float, transform: str) -> None:
    """``add_direction_`` on every segment, the small ones of a (device, dtype) group in one
    launch: with one launch per tensor, a sweep over hundreds of small tensors is launch-bound."""
    _in_place(segments, coefficient, transform, compiled().PASS_ADD, (torch.float32,))


@torch.no_grad()
def add_direction_terms_(
    terms: Sequence[Sequence[Segment]], coefficients: Sequence[float], transform: str
) -> None:
    """θ ← θ + Σ_t c_t·z_t in place (fp32), ``add_directions_(terms[t], c_t)`` for t in order
    bit for bit, but one read and one write of θ per (device, dtype) group, not one per term.
    ``terms[t]`` are the same tensors at the same offsets, keyed for term t; terms with a zero
    coefficient are skipped, as a sweep skips them. Large segments share the group's launch:
    the table search that slows a one-term pass is shared by every term here."""
    kept = [(ts, c) for ts, c in zip(terms, coefficients, strict=True) if c != 0.0]
    if not kept:
        return
    first = kept[0][0]
    for group in _groups(first):
        base = min((first[index].tensor for index in group), key=torch.Tensor.data_ptr)
        assert base.dtype == torch.float32
        rows: list[TableRow] = []
        for index in group:
            segment = first[index]
            address = element_address(segment.tensor, base)
            rows.append((address, address, segment.tensor.numel(), segment.offset, segment.key))
        keys = [[list(each[index].key) for each, _c in kept] for index in group]
        table, programs = _table(rows, base.device)
        compiled().multi_term_add_kernel[(programs,)](
            base,
            table,
            upload_table(torch.tensor(keys, dtype=torch.int64), base.device),
            upload_table(torch.tensor([c for _t, c in kept], dtype=torch.float32), base.device),
            len(rows),
            len(kept),
            TRANSFORM=TRANSFORMS[transform],
            COUNTERS=COUNTERS_PER_PROGRAM,
        )


@torch.no_grad()
def rounded_updates_(segments: Sequence[Segment], coefficient: float, transform: str) -> None:
    """``rounded_update_`` on every segment, grouped as ``add_directions_``."""
    halves = (torch.bfloat16, torch.float16)
    _in_place(segments, coefficient, transform, compiled().PASS_UPDATE, halves)


@torch.no_grad()
def perturbed_copies(
    segments: Sequence[Segment], coefficient: float, transform: str
) -> list[torch.Tensor]:
    """``perturbed_copy`` of every segment, grouped as ``add_directions_`` (a module's small
    weights and biases at once); a group's copies are views of one new buffer."""
    copies = [segment.tensor.new_empty(0) for segment in segments]  # kept where empty
    for group in _groups(segments):
        sources = [segments[index] for index in group]
        sizes = [source.tensor.numel() for source in sources]
        buffer = sources[0].tensor.new_empty(sum(sizes))
        targets = buffer.split(sizes)
        _launch_group(sources, targets, coefficient, transform, compiled().PASS_COPY)
        for index, target in zip(group, targets, strict=True):
            copies[index] = target
    return copies


def direction_squares_total(
    keyed_sizes: Sequence[tuple[tuple[int, int], int]], transform: str, device: torch.device
) -> torch.Tensor:
    """Σ z² over the whole of every (key, size) parameter in one launch, as a 0-dim fp64 tensor
    left on ``device``: the per-program sums are summed in a fixed order, so replay computes the
    same bits (not those of summing ``direction_squares`` per parameter: the order differs)."""
    kernels = compiled()
    rows = [(0, 0, size, 0, key) for key, size in keyed_sizes if size]
    if not rows:
        return torch.zeros((), dtype=torch.float64, device=device)
    table, programs = _table(rows, device)
    partial = torch.empty(programs, dtype=torch.float64, device=device)
    kernels.multi_tensor_squares_kernel[(programs,)](
        partial,
        table,
        len(rows),
        TRANSFORM=TRANSFORMS[transform],
        COUNTERS=COUNTERS_PER_PROGRAM,
    )
    return partial.sum()


def direction_squares(
    key: tuple[int, int], size: int, transform: str, device: torch.device
) -> torch.Tensor:
    """Σ z² over a parameter's ``size`` elements (the sphere's norm) as a 0-dim fp64 tensor on
    ``device``, summed in a fixed order; left on the device so a step syncs once, not once per
    parameter."""
    kernels = compiled()
    counters = (size - 1) // LANES + 1
    programs = math.ceil(counters / COUNTERS_PER_PROGRAM)
    partial = torch.empty(programs, dtype=torch.float64, device=device)
    kernels.direction_squares_kernel[(programs,)](
        partial,
        size,
        0,
        0,
        key[0],
        key[1],
        TRANSFORM=TRANSFORMS[transform],
        COUNTERS=COUNTERS_PER_PROGRAM,
    )
    return partial.sum()
