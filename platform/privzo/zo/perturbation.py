"""How the model is evaluated at θ + c·z, and how the step's update lands on θ.

Three ways, chosen by the weights' dtype and whether this process holds them whole:

- ``InPlacePerturber`` (fp32): the three fused sweeps. θ is moved to +εz, then to −εz, and the
  last sweep restores and updates at once, +(ε − ηg)z. In fp32 the round trip leaves only a few
  ulps of rounding, and replay repeats the same operations, so it is bit-identical.
- ``VirtualPerturber`` (bf16 / fp16): in half precision θ + εz − 2εz + εz drifts visibly from θ
  (a bf16 ulp is 2⁻⁸ relative), so θ is never perturbed in place. A forward pre-hook on each
  module that owns trainable weights swaps in θ + c·z (computed in fp32, block by block, rounded
  once) for that module's forward only, and the update is one fp32 sweep rounded once,
  stochastically (``privzo.zo.rounding``), so updates below half an ulp still land in
  expectation. Extra memory: one module's weights at a time.
- ``GatheredPerturber`` (bf16 / fp16, partitioned weights): the virtual perturber where this
  process holds a slice of each weight and the whole weight exists only during its module's
  forward, gathered by hooks registered before this one (ZeRO-3). θ + c·z is computed from the
  gathered weight at offset 0, so the forward sees the single-device bits, and the update lands
  on this process's slice, at its element indices.

All three expose the same calls, used identically by training and by replay.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from privzo.zo import kernels
from privzo.zo.directions import DirectionSampler
from privzo.zo.grouped_copies import GroupedCopies
from privzo.zo.philox import STREAM_ROUNDING, element_values, philox_key
from privzo.zo.rounding import stochastic_round
from privzo.zo.sweeps import (
    ParameterShard,
    iter_direction_pieces,
    segments,
    sweep,
    sweep_terms,
)


class Perturber(ABC):
    """Evaluation point and update of the trainable weights, driven by (seed, coefficient)."""

    mode: str

    def __init__(self, shards: list[ParameterShard], sampler: DirectionSampler) -> None:
        self.shards = shards
        self.sampler = sampler

    @property
    def sizes(self) -> list[tuple[str, int]]:
        return [(shard.name, shard.size) for shard in self.shards]

    @abstractmethod
    def perturb(self, seed: int, coefficient: float) -> None:
        """From now on the model evaluates at θ + coefficient · z(seed)."""

    @abstractmethod
    def update(self, seed: int, coefficient: float) -> None:
        """End the step: θ ← θ + coefficient · z(seed), and evaluate at θ again."""

    def update_all(self, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """End a step of K directions: θ ← θ + Σ_k c_k z_k, and evaluate at θ again. The model
        sits at θ − r·z of the last direction, so its update comes first (fused with that
        restore), then the others in order; training and replay both end a step here."""
        self.update(seeds[-1], coefficients[-1])
        for seed, coefficient in zip(seeds[:-1], coefficients[:-1], strict=True):
            self.update(seed, coefficient)


class InPlacePerturber(Perturber):
    """fp32 weights moved in place; tracks the current offset so every move is one sweep."""

    mode = "inplace"

    def __init__(self, shards: list[ParameterShard], sampler: DirectionSampler) -> None:
        super().__init__(shards, sampler)
        for shard in shards:
            if shard.tensor.dtype != torch.float32:
                raise ValueError(
                    f"parameter {shard.name!r} is {shard.tensor.dtype}: in-place perturbation "
                    "needs float32 (half precision uses the virtual perturber)"
                )
        self._offset = 0.0

    def perturb(self, seed: int, coefficient: float) -> None:
        sweep(self.shards, self.sampler, seed, coefficient - self._offset)
        self._offset = coefficient

    def update(self, seed: int, coefficient: float) -> None:
        sweep(self.shards, self.sampler, seed, coefficient - self._offset)
        self._offset = 0.0

    def update_all(self, seeds: Sequence[int], coefficients: Sequence[float]) -> None:
        """The K updates as the base class orders them, in one pass over θ where fused."""
        if len(seeds) == 1:
            self.update(seeds[0], coefficients[0])
            return
        order = [seeds[-1], *seeds[:-1]]
        terms = [coefficients[-1] - self._offset, *coefficients[:-1]]
        sweep_terms(self.shards, self.sampler, order, terms)
        self._offset = 0.0


class _SwappingPerturber(Perturber):
    """The virtual perturbers' common part: θ stays untouched; a pre-hook on each module owning
    trainable weights swaps in the copies ``_copies(group)`` returns for that module's forward,
    and a forward hook swaps the originals back. The update is one stochastically rounded sweep
    of ``shards``."""

    mode = "virtual"

    def __init__(
        self,
        shards: list[ParameterShard],
        sampler: DirectionSampler,
        owners: list[tuple[nn.Module, dict[str, tuple[nn.Parameter, ParameterShard]]]],
        *,
        swap_back_first: bool = False,
    ) -> None:
        """``swap_back_first``: register the swap-back before the module's other forward hooks."""
        super().__init__(shards, sampler)
        self._seed = 0
        self._coefficient = 0.0
        self._handles = []
        for group, (module, owned) in enumerate(owners):
            self._handles.append(module.register_forward_pre_hook(self._swap_in(owned, group)))
            self._handles.append(
                module.register_forward_hook(_swap_back(owned), prepend=swap_back_first)
            )

    def perturb(self, seed: int, coefficient: float) -> None:
        self._seed, self._coefficient = seed, coefficient

    def update(self, seed: int, coefficient: float) -> None:
        self._coefficient = 0.0
        rounded_updates(self.shards, self.sampler, seed, coefficient)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()

    @abstractmethod
    def _copies(self, group: int) -> list[torch.Tensor]:
        """θ + c·z of the weights of the ``group``-th owning module, in its ``owned`` order."""

    def _swap_in(self, owned: dict[str, tuple[nn.Parameter, ParameterShard]], group: int) -> Any:
        def hook(module: nn.Module, _inputs: Any) -> None:
            if self._coefficient == 0.0:
                return
            copies = self._copies(group)
            for (attribute, (parameter, _shard)), perturbed in zip(
                owned.items(), copies, strict=True
            ):
                module._parameters[attribute] = nn.Parameter(
                    perturbed.view(parameter.data.shape), requires_grad=False
                )

        return hook


class VirtualPerturber(_SwappingPerturber):
    """Half-precision weights stay untouched during evaluation (see the module docstring)."""

    def __init__(
        self, model: nn.Module, shards: list[ParameterShard], sampler: DirectionSampler
    ) -> None:
        assert all(shard.offset == 0 and shard.tensor.numel() == shard.size for shard in shards)
        owners = [
            (module, owned) for module in model.modules() if (owned := _match_owned(module, shards))
        ]
        super().__init__(shards, sampler, owners)
        # each module's shards: the fused copies' launch tables are built once, keyed for a seed
        # at its first forward
        self._groups = [[shard for _parameter, shard in owned.values()] for _m, owned in owners]
        self._fused = (
            GroupedCopies([[shard.tensor for shard in group] for group in self._groups])
            if sampler.fused
            else None
        )
        self._keyed_seed: int | None = None

    def _copies(self, group: int) -> list[torch.Tensor]:
        """From the prebuilt tables where fused."""
        if self._fused is None:
            shards = self._groups[group]
            return _perturbed_copies(shards, self.sampler, self._seed, self._coefficient)
        if self._keyed_seed != self._seed:
            self._fused.set_keys(self._keys(self._seed))
            self._keyed_seed = self._seed
        return self._fused.copies(group, self._coefficient, self.sampler.philox_transform)

    def _keys(self, seed: int) -> list[list[tuple[int, int]]]:
        return [[philox_key(seed, shard.name) for shard in group] for group in self._groups]


class GatheredPerturber(_SwappingPerturber):
    """Virtual perturbation of weights gathered just before each module's forward.

    The pre-hook must run after the hook that gathers (hooks run in registration order) and the
    swap-back before the one that releases (``swap_back_first``), so the gathering code never
    sees the temporary copy. ``shards`` are this process's slices (the update's); modules are
    matched to them through ``model``'s parameter names.
    """

    def __init__(
        self,
        model: nn.Module,
        shards: list[ParameterShard],
        sampler: DirectionSampler,
        partition_sampler: DirectionSampler | None = None,
    ) -> None:
        """``partition_sampler``: the update's directions where the slices live on another
        device than the gathered weights (offloaded to host memory), the same generator there."""
        owners = _owners_by_name(model, shards)
        super().__init__(shards, sampler, owners, swap_back_first=True)
        self._owned = [owned for _module, owned in owners]
        self._partition_sampler = partition_sampler or sampler

    def update(self, seed: int, coefficient: float) -> None:
        self._coefficient = 0.0
        rounded_updates(self.shards, self._partition_sampler, seed, coefficient)

    def _copies(self, group: int) -> list[torch.Tensor]:
        """From the gathered weights, whole, at offset 0."""
        owned = self._owned[group].values()
        whole = [_whole_shard(parameter, shard) for parameter, shard in owned]
        return _perturbed_copies(whole, self.sampler, self._seed, self._coefficient)


def _whole_shard(parameter: nn.Parameter, shard: ParameterShard) -> ParameterShard:
    """The gathered weight as a shard at offset 0; anything else means nothing gathered it."""
    if parameter.data.numel() != shard.size:
        raise RuntimeError(
            f"parameter {shard.name!r} holds {parameter.data.numel()} of its {shard.size} "
            "elements in its module's forward: its gather hook must run before the perturber's"
        )
    return ParameterShard(shard.name, parameter.data.view(-1), shard.size, 0)


def _swap_back(owned: dict[str, tuple[nn.Parameter, ParameterShard]]) -> Any:
    def hook(module: nn.Module, _inputs: Any, _output: Any) -> None:
        for attribute, (parameter, _shard) in owned.items():
            module._parameters[attribute] = parameter

    return hook


def _owners_by_name(
    model: nn.Module, shards: list[ParameterShard]
) -> list[tuple[nn.Module, dict[str, tuple[nn.Parameter, ParameterShard]]]]:
    """Each module owning trainable parameters, with them and their shards: matched by the
    parameter object named as the shard is, so a tied weight is found in every module using it."""
    by_name = dict(model.named_parameters())
    by_identity = {id(by_name[shard.name]): shard for shard in shards}
    owners = []
    for module in model.modules():
        owned = {
            attribute: (parameter, by_identity[id(parameter)])
            for attribute, parameter in module.named_parameters(recurse=False)
            if id(parameter) in by_identity
        }
        if owned:
            owners.append((module, owned))
    return owners


def _match_owned(
    module: nn.Module, shards: list[ParameterShard]
) -> dict[str, tuple[nn.Parameter, ParameterShard]]:
    """The module's own parameters that are trainable, each with its shard (by storage)."""
    by_pointer = {shard.tensor.data_ptr(): shard for shard in shards}
    owned = {}
    for attribute, parameter in module.named_parameters(recurse=False):
        shard = by_pointer.get(parameter.data_ptr())
        if shard is not None and shard.tensor.numel() == parameter.numel():
            owned[attribute] = (parameter, shard)
    return owned


def _perturbed_copies(
    shards: list[ParameterShard], sampler: DirectionSampler, seed: int, coefficient: float
) -> list[torch.Tensor]:
    """``_perturbed_copy`` of each of a module's shards; fused, grouped as the kernels do."""
    if sampler.fused:
        return kernels.perturbed_copies(
            segments(shards, seed), coefficient, sampler.philox_transform
        )
    return [_perturbed_copy(shard, sampler, seed, coefficient) for shard in shards]


@torch.no_grad()
def _perturbed_copy(
    shard: ParameterShard, sampler: DirectionSampler, seed: int, coefficient: float
) -> torch.Tensor:
    """θ + c·z computed in fp32 (in one fused kernel, or piece by piece) and rounded once to
    θ's dtype."""
    if sampler.fused:
        key = philox_key(seed, shard.name)
        return kernels.perturbed_copy(
            shard.tensor, key, shard.offset, coefficient, sampler.philox_transform
        )
    result = torch.empty_like(shard.tensor)
    for local, direction in iter_direction_pieces(shard, sampler, seed):
        result[local] = shard.tensor[local].float().add_(direction, alpha=coefficient)
    return result


@torch.no_grad()
def rounded_update(
    shard: ParameterShard, sampler: DirectionSampler, seed: int, coefficient: float
) -> None:
    """θ ← round(θ + c·z), the arithmetic in fp32 and one stochastic rounding per step.

    The rounding uniforms are Philox stream 1 keyed by (seed, name) at the elements' indices
    (whatever the direction generator), so replay repeats every decision.
    """
    if coefficient == 0.0:
        return
    key = philox_key(seed, shard.name)
    if sampler.fused:
        kernels.rounded_update_(
            shard.tensor, key, shard.offset, coefficient, sampler.philox_transform
        )
        return
    for local, direction in iter_direction_pieces(shard, sampler, seed):
        view = shard.tensor[local]
        start = shard.offset + local.start
        uniforms = element_values(
            key, STREAM_ROUNDING, start, start + view.numel(), "uniform", view.device
        )
        updated = view.float().add_(direction, alpha=coefficient)
        view.copy_(stochastic_round(updated, uniforms, view.dtype))


def rounded_updates(
    shards: list[ParameterShard], sampler: DirectionSampler, seed: int, coefficient: float
) -> None:
    """``rounded_update`` on every shard; fused, the small ones in one launch."""
    if coefficient == 0.0:
        return
    if sampler.fused:
        kernels.rounded_updates_(segments(shards, seed), coefficient, sampler.philox_transform)
        return
    for shard in shards:
        rounded_update(shard, sampler, seed, coefficient)


def make_perturber(
    model: nn.Module,
    shards: list[ParameterShard],
    sampler: DirectionSampler,
    gathered: bool = False,
    partition_sampler: DirectionSampler | None = None,
) -> Perturber:
    """In-place sweeps for fp32 weights (whole or sliced), virtual perturbation for half
    precision; ``gathered``: the shards are slices whose whole weights are gathered for each
    module's forward (``GatheredPerturber``). ``partition_sampler``: the directions on the
    shards' own device where it is not ``sampler``'s (slices offloaded to host memory), so
    sweeps and updates run where the slices live."""
    dtypes = {shard.tensor.dtype for shard in shards}
    if dtypes == {torch.float32}:
        return InPlacePerturber(shards, partition_sampler or sampler)
    if len(dtypes) == 1 and dtypes <= {torch.bfloat16, torch.float16}:
        if gathered:
            return GatheredPerturber(model, shards, sampler, partition_sampler)
        return VirtualPerturber(model, shards, sampler)
    raise ValueError(f"trainable weights mix dtypes {sorted(map(str, dtypes))}; use one dtype")
