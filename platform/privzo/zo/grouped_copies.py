"""A module's perturbed copies in one launch: the virtual perturber's half-precision forwards.

Each forward of a half-precision model asks for θ + c·z of every module's weights in turn; with a
launch table rebuilt for each call and large weights launched apart, a model of hundreds of small
modules is bound by the host. Here every module's table is built once per model and keyed once
per direction, and a module's weights, whatever their sizes, share one launch of
``privzo.zo.kernels``' multi-tensor pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from privzo.zo.kernels import (
    COUNTERS_PER_PROGRAM,
    TRANSFORMS,
    TableRow,
    aligned_pointer,
    aligned_rows,
    check_flat,
    compiled,
    element_address,
    host_table,
    upload_table,
)

__all__ = ["GroupedCopies"]


class _CopyGroup(NamedTuple):
    """One group of ``GroupedCopies``: its rows of the table and what a launch needs."""

    base: torch.Tensor  # the lowest-addressed tensor, whose address the table counts from
    first_row: int
    present: list[int]  # indices (in the group) of the non-empty tensors, one row each
    sizes: list[int]  # element counts of all the group's tensors
    programs: int
    aligned: bool  # every row's source and target start 16 bytes aligned from the bases


class _BuiltGroup(NamedTuple):
    group: _CopyGroup
    host: torch.Tensor  # its rows of the table, keys 0


def _copy_group(tensors: Sequence[torch.Tensor], first_row: int) -> _BuiltGroup:
    """One group's rows (a row per non-empty tensor, the copies laid out in order in one
    buffer) and what its launch needs."""
    present = [index for index, tensor in enumerate(tensors) if tensor.numel()]
    sizes = [tensor.numel() for tensor in tensors]
    if not present:
        empty = torch.zeros(0, len(compiled().TABLE_COLUMNS), dtype=torch.int64)
        return _BuiltGroup(_CopyGroup(tensors[0], first_row, [], sizes, 0, False), empty)
    base = min((tensors[index] for index in present), key=torch.Tensor.data_ptr)
    assert len({(tensors[i].device, tensors[i].dtype) for i in present}) == 1
    rows: list[TableRow] = []
    target = 0
    for index in present:
        check_flat(tensors[index])
        rows.append((element_address(tensors[index], base), target, sizes[index], 0, (0, 0)))
        target += sizes[index]
    host, programs = host_table(rows)
    aligned = aligned_pointer(base) and aligned_rows(rows)
    return _BuiltGroup(_CopyGroup(base, first_row, present, sizes, programs, aligned), host)


class GroupedCopies:
    """``perturbed_copies`` of fixed groups of whole tensors (each module's weights), one launch
    per group whatever its tensors' sizes. Every group's table is built once and uploaded once
    per direction (``set_keys``), so a half-precision forward costs one launch per module and
    no host work beside it: rebuilding tables and launching large tensors apart bounds the step
    by the host on models of hundreds of small modules."""

    def __init__(self, groups: Sequence[Sequence[torch.Tensor]]) -> None:
        columns = compiled().TABLE_COLUMNS
        hosts: list[torch.Tensor] = []
        rows = 0
        self._groups: list[_CopyGroup] = []
        for tensors in groups:
            group = _copy_group(tensors, rows)
            self._groups.append(group.group)
            hosts.append(group.host)
            rows += len(group.group.present)
        self._host = torch.cat(hosts) if hosts else torch.zeros(0, len(columns), dtype=torch.int64)
        self._key_columns = [columns.index("KEY0"), columns.index("KEY1")]
        self._device = next((g.base.device for g in self._groups if g.present), None)
        self._table: torch.Tensor | None = None

    def set_keys(self, keys: Sequence[Sequence[tuple[int, int]]]) -> None:
        """The Philox keys of the next direction, one per tensor of each group (as given)."""
        if self._device is None:
            return
        present = [
            group_keys[index]
            for group, group_keys in zip(self._groups, keys, strict=True)
            for index in group.present
        ]
        host = self._host.clone()
        host[:, self._key_columns] = torch.tensor(present, dtype=torch.int64)
        self._table = upload_table(host, self._device)

    @torch.no_grad()
    def copies(self, group_index: int, coefficient: float, transform: str) -> list[torch.Tensor]:
        """θ + c·z of each of the group's tensors (rounded to nearest), views of one new buffer,
        with the keys last set: ``perturbed_copies``' values bit for bit."""
        group = self._groups[group_index]
        if not group.present:
            return [group.base.new_empty(0) for _size in group.sizes]
        assert self._table is not None, "set_keys before copies"
        buffer = group.base.new_empty(sum(group.sizes))
        kernels = compiled()
        kernels.multi_tensor_pass_kernel[(group.programs,)](
            group.base,
            buffer,
            self._table[group.first_row :],
            len(group.present),
            coefficient,
            PASS=kernels.PASS_COPY,
            TRANSFORM=TRANSFORMS[transform],
            COUNTERS=COUNTERS_PER_PROGRAM,
            ALIGNED=group.aligned and aligned_pointer(buffer),
        )
        return list(buffer.split(group.sizes))
