"""The gathered perturber's contract on a model whose weights exist whole only during their
module's forward (filled by a pre-hook registered first, emptied by a later forward hook, as
ZeRO-3 does), held as two contiguous slices: the forwards and the updated slices are the
single-device virtual perturber's, bit for bit. The same with DeepSpeed itself is in
tests/unit/distributed/test_zero3_half.py."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from privzo.zo.directions import DirectionSampler
from privzo.zo.perturbation import GatheredPerturber, VirtualPerturber
from privzo.zo.sweeps import ParameterShard, full_shards

SEED, SCALE, STEP = 7, 1e-2, -2e-2


def _model(dtype: torch.dtype) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)).to(dtype)


def _sliced(model: nn.Module, world: int) -> list[list[ParameterShard]]:
    """Each rank's slices [rank·P, rank·P + P) of every flattened parameter, and hooks that
    assemble the whole weight from them for each module's forward only."""
    ranks: list[list[ParameterShard]] = [[] for _ in range(world)]
    for name, parameter in model.named_parameters():
        flat = parameter.data.reshape(-1).clone()
        part = -(-flat.numel() // world)
        for rank in range(world):
            piece = flat[rank * part : (rank + 1) * part].clone()
            ranks[rank].append(ParameterShard(name, piece, flat.numel(), rank * part))
    shape = {name: parameter.shape for name, parameter in model.named_parameters()}
    names = {id(parameter): name for name, parameter in model.named_parameters()}
    pieces = {name: [r[i] for r in ranks] for i, name in enumerate(shape)}

    def gather(module: nn.Module, _inputs) -> None:
        for parameter in module.parameters(recurse=False):
            name = names[id(parameter)]
            whole = torch.cat([shard.tensor for shard in pieces[name]])
            parameter.data = whole.view(shape[name])

    def release(module: nn.Module, _inputs, _output) -> None:
        for parameter in module.parameters(recurse=False):
            parameter.data = torch.empty(0, dtype=parameter.dtype)

    for module in model:
        module.register_forward_pre_hook(gather)
        module.register_forward_hook(release)
        release(module, None, None)
    return ranks


def _trace(model: nn.Module, perturber, inputs: torch.Tensor) -> list[torch.Tensor]:
    with torch.no_grad():
        perturber.perturb(SEED, SCALE)
        plus = model(inputs)
        perturber.update(SEED, STEP)
        after = model(inputs)
    return [plus, after]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gathered_weights_give_the_single_device_bits(dtype):
    inputs = torch.randn(4, 6, generator=torch.Generator().manual_seed(1)).to(dtype)
    sampler = DirectionSampler("gaussian")
    whole = _model(dtype)
    single = VirtualPerturber(whole, full_shards(list(whole.named_parameters())), sampler)
    expected = _trace(whole, single, inputs)

    sliced = _model(dtype)
    ranks = _sliced(sliced, world=2)
    perturbers = [GatheredPerturber(sliced, shards, sampler) for shards in ranks]
    with torch.no_grad():
        for perturber in perturbers:
            perturber.perturb(SEED, SCALE)
        plus = sliced(inputs)
        # the release saw the gathered weights, not the perturbed copies: nothing left whole
        assert all(parameter.numel() == 0 for parameter in sliced.parameters())
        for perturber in perturbers:  # each rank updates its own slices
            perturber.update(SEED, STEP)
        after = sliced(inputs)
    for got, want in zip([plus, after], expected, strict=True):
        assert torch.equal(got, want)
    assert not torch.equal(expected[0], expected[1])
    for index, (name, parameter) in enumerate(whole.named_parameters()):
        joined = torch.cat([shards[index].tensor for shards in ranks])
        assert torch.equal(joined, parameter.detach().reshape(-1)), name


def test_a_weight_nothing_gathered_is_refused():
    model = _model(torch.bfloat16)
    shards = full_shards(list(model.named_parameters()))
    perturber = GatheredPerturber(model, shards, DirectionSampler("gaussian"))
    for parameter in model.parameters():
        parameter.data = torch.empty(0, dtype=torch.bfloat16)
    perturber.perturb(SEED, SCALE)
    with pytest.raises(RuntimeError, match="gather hook must run before the perturber's"):
        model(torch.zeros(1, 6, dtype=torch.bfloat16))
