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
    VECTOR_ELEMENTS,
    aligned_block,
    aligned_pointer,
    check_flat,
    compiled,
    element_address,
    program_count,
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


class GroupedCopies:
    """``perturbed_copies`` of fixed groups of whole tensors (each module's weights), one launch
    per group whatever its tensors' sizes. Every group's table is built once and uploaded once
    per direction (``set_keys``), so a half-precision forward costs one launch per module and
    no host work beside it: rebuilding tables and launching large tensors apart bounds the step
    by the host on models of hundreds of small modules."""

    def __init__(self, groups: Sequence[Sequence[torch.Tensor]]) -> None:
        columns = compiled().TABLE_COLUMNS
        rows: list[list[int]] = []
        self._groups: list[_CopyGroup] = []
        for tensors in groups:
            present = [index for index, tensor in enumerate(tensors) if tensor.numel()]
            if not present:
                self._groups.append(
                    _CopyGroup(tensors[0], len(rows), [], [0] * len(tensors), 0, False)
                )
                continue
            base = min((tensors[index] for index in present), key=torch.Tensor.data_ptr)
            assert len({(tensors[i].device, tensors[i].dtype) for i in present}) == 1
            first_row, programs, target, aligned = len(rows), 0, 0, aligned_pointer(base)
            for index in present:
                tensor = tensors[index]
                check_flat(tensor)
                values = {name: 0 for name in columns}
                values.update(
                    SOURCE=element_address(tensor, base),
                    TARGET=target,
                    COUNT=tensor.numel(),
                    FIRST_PROGRAM=programs,
                )
                rows.append([values[name] for name in columns])
                aligned = aligned and values["SOURCE"] % VECTOR_ELEMENTS == 0
                aligned = (
                    aligned and target % VECTOR_ELEMENTS == 0 and aligned_block(0, tensor.numel())
                )
                programs += program_count(0, tensor.numel())
                target += tensor.numel()
            sizes = [tensor.numel() for tensor in tensors]
            self._groups.append(_CopyGroup(base, first_row, present, sizes, programs, aligned))
        self._host = torch.tensor(rows, dtype=torch.int64).reshape(len(rows), len(columns))
        self._key_columns = [columns.index("KEY0"), columns.index("KEY1")]
        self._table: torch.Tensor | None = None

    def set_keys(self, keys: Sequence[Sequence[tuple[int, int]]]) -> None:
        """The Philox keys of the next direction, one per tensor of each group (as given)."""
        host = self._host.clone()
        for group, group_keys in zip(self._groups, keys, strict=True):
            for row, index in enumerate(group.present, start=group.first_row):
                host[row, self._key_columns] = torch.tensor(group_keys[index])
        device = next((group.base.device for group in self._groups if group.present), None)
        if device is None:
            return
        if device.type == "cuda":  # pinned and non-blocking: no wait for the stream
            self._table = host.pin_memory().to(device, non_blocking=True)
        else:
            self._table = host.to(device)

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
