"""The multi-tensor launches against the per-parameter kernels, under Triton's interpreter.

One launch covers every shard of a (device, dtype) group, each found from a table of element
addresses relative to a base tensor; it must give the per-parameter kernels' values bit for bit
whatever the shards' sizes, partitions and places in memory, and launch once per group.
"""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need triton (the test extra)")

from privzo.zo import kernels, triton_kernels
from privzo.zo.directions import DirectionSampler
from privzo.zo.grouped_copies import GroupedCopies
from privzo.zo.kernels import Segment
from privzo.zo.perturbation import Perturber, make_perturber
from privzo.zo.philox import philox_key
from privzo.zo.sweeps import ParameterShard, full_shards, sweep, sweep_terms

SIZES = [1, 3, 4, 5, 1023, 1024, 1025, 5003]
SEED = 20261123


class _Counting:
    """A kernel whose launches (``kernel[grid](...)``) are counted."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.launches = 0

    def __getitem__(self, grid):
        self.launches += 1
        return self.kernel[grid]


@pytest.fixture
def launches(monkeypatch) -> dict[str, _Counting]:
    names = [
        "direction_pass_kernel",
        "multi_tensor_pass_kernel",
        "direction_squares_kernel",
        "multi_tensor_squares_kernel",
        "multi_term_add_kernel",
    ]
    counters = {name: _Counting(getattr(triton_kernels, name)) for name in names}
    for name, counter in counters.items():
        monkeypatch.setattr(triton_kernels, name, counter)
    return counters


def _shards(dtype: torch.dtype) -> tuple[list[ParameterShard], torch.Tensor]:
    """Shards of every size in ``SIZES``: separate allocations, and views into one buffer in
    an order unlike their addresses with gaps between them; the largest is a partition starting
    inside a counter (elements [7, 5010) of a parameter of 5017). Also the buffer, whose gaps
    must stay untouched."""
    generator = torch.Generator().manual_seed(0)
    buffer = torch.randn(4000, generator=generator).to(dtype)
    views = {1023: buffer[2500:3523], 1024: buffer[5:1029], 5: buffer[1100:1105]}
    shards = []
    for index, size in enumerate(SIZES):
        separate = torch.randn(size, generator=generator).to(dtype)
        tensor = views.get(size, separate)
        if size == 5003:
            shards.append(ParameterShard(f"layer.{index}", tensor, 5017, 7))
        else:
            shards.append(ParameterShard(f"layer.{index}", tensor, size))
    return shards, buffer


def _segments(shards: list[ParameterShard]) -> list[Segment]:
    return [Segment(s.tensor, philox_key(SEED, s.name), s.offset) for s in shards]


def _gaps(buffer: torch.Tensor) -> torch.Tensor:
    keep = torch.ones(buffer.numel(), dtype=torch.bool)
    for start, stop in [(2500, 3523), (5, 1029), (1100, 1105)]:
        keep[start:stop] = False
    return buffer[keep].clone()


@pytest.mark.parametrize("transform", ["normal", "sign"])
def test_the_fp32_sweep_is_the_per_parameter_kernels_bit_for_bit(transform, launches):
    shards, buffer = _shards(torch.float32)
    gaps = _gaps(buffer)
    expected = [shard.tensor.clone() for shard in shards]
    for tensor, segment in zip(expected, _segments(shards), strict=True):
        kernels.add_direction_(tensor, segment.key, segment.offset, -0.37, transform)
    launches["direction_pass_kernel"].launches = 0
    sampler = DirectionSampler("gaussian", generator="philox", fused=True)
    if transform == "sign":
        sampler = DirectionSampler("rademacher", generator="philox", fused=True)
    sweep(shards, sampler, SEED, -0.37)
    for shard, tensor in zip(shards, expected, strict=True):
        assert torch.equal(shard.tensor, tensor), shard.name
    assert torch.equal(_gaps(buffer), gaps)
    assert launches["multi_tensor_pass_kernel"].launches == 1
    assert launches["direction_pass_kernel"].launches == 0


def test_several_terms_in_one_pass_are_the_passes_bit_for_bit(launches):
    """θ + Σ_t c_t z_t in one fp32 pass (K directions' update) gives each pass's bits in turn,
    skips a zero coefficient as a sweep does, and launches once for the group."""
    sampler = DirectionSampler("gaussian", generator="philox", fused=True)
    seeds, coefficients = [SEED, 7, 2**62 + 3], [-0.37, 0.0, 2.5]
    shards, buffer = _shards(torch.float32)
    gaps = _gaps(buffer)
    expected = [shard.tensor.clone() for shard in shards]
    pairs = zip(shards, expected, strict=True)
    others = [ParameterShard(s.name, t, s.size, s.offset) for s, t in pairs]
    for seed, coefficient in zip(seeds, coefficients, strict=True):
        sweep(others, sampler, seed, coefficient)
    passes = launches["multi_tensor_pass_kernel"].launches
    sweep_terms(shards, sampler, seeds, coefficients)
    for shard, tensor in zip(shards, expected, strict=True):
        assert torch.equal(shard.tensor, tensor), shard.name
    assert not torch.equal(shards[-1].tensor, _shards(torch.float32)[0][-1].tensor)
    assert torch.equal(_gaps(buffer), gaps)
    assert launches["multi_term_add_kernel"].launches == 1
    assert launches["multi_tensor_pass_kernel"].launches == passes  # no pass per term


def test_a_step_of_several_directions_ends_in_one_pass(launches):
    """The in-place perturber's update of K directions (fused with the last restore) is the
    base class's K updates bit for bit, in one launch instead of K."""
    sampler = DirectionSampler("gaussian", generator="philox", fused=True)
    seeds, coefficients = [11, 12, 13], [0.02, -0.5, 0.125]
    results = []
    for one_pass in (True, False):
        generator = torch.Generator().manual_seed(1)
        shards = [  # a partition starting inside a counter, and a small tensor
            ParameterShard("a", torch.randn(1030, generator=generator), 1041, 7),
            ParameterShard("b", torch.randn(5, generator=generator), 5),
        ]
        perturber = make_perturber(torch.nn.Module(), shards, sampler)
        perturber.perturb(13, 1e-3)
        perturber.perturb(13, -1e-3)
        if one_pass:
            perturber.update_all(seeds, coefficients)
            assert launches["multi_term_add_kernel"].launches == 1
        else:
            Perturber.update_all(perturber, seeds, coefficients)
        perturber.perturb(14, 0.5)  # back at θ: a move after the step starts from offset 0
        results.append([shard.tensor.clone() for shard in shards])
    for fused, passes in zip(*results, strict=True):
        assert torch.equal(fused, passes)


@pytest.mark.parametrize(
    ("dtype", "transform"), [(torch.bfloat16, "normal"), (torch.float16, "sign")]
)
def test_half_precision_passes_are_the_per_parameter_kernels_bit_for_bit(
    dtype, transform, launches
):
    shards, buffer = _shards(dtype)
    gaps = _gaps(buffer)
    segments = _segments(shards)
    # a fraction of an ulp of the weights: the rounding decides each element by its uniform
    coefficient = 0.6 * torch.finfo(dtype).eps
    copies = kernels.perturbed_copies(segments, coefficient, transform)
    for copy, segment in zip(copies, segments, strict=True):
        expected = kernels.perturbed_copy(
            segment.tensor, segment.key, segment.offset, coefficient, transform
        )
        assert torch.equal(copy, expected)
    expected = [shard.tensor.clone() for shard in shards]
    for tensor, segment in zip(expected, segments, strict=True):
        kernels.rounded_update_(tensor, segment.key, segment.offset, coefficient, transform)
    before = [shard.tensor.clone() for shard in shards]
    kernels.rounded_updates_(segments, coefficient, transform)
    for shard, tensor in zip(shards, expected, strict=True):
        assert torch.equal(shard.tensor, tensor), shard.name
    changed = sum(int((s.tensor != b).sum()) for s, b in zip(shards, before, strict=True))
    assert 0.05 < changed / sum(SIZES) < 0.95  # the rounding decided both ways
    assert torch.equal(_gaps(buffer), gaps)
    assert launches["multi_tensor_pass_kernel"].launches == 2  # the copies, the update


def test_one_launch_per_dtype_and_none_for_empty_shards(launches):
    """A ZeRO-3 rank may hold nothing of a parameter: its empty shard is skipped."""
    parts = [torch.ones(5, dtype=torch.bfloat16), torch.ones(9, dtype=torch.float16)]
    parts += [torch.ones(3, dtype=torch.bfloat16), torch.ones(0, dtype=torch.float16)]
    segments = [Segment(part, (index, 1), 0) for index, part in enumerate(parts)]
    copies = kernels.perturbed_copies(segments, 0.5, "sign")
    assert launches["multi_tensor_pass_kernel"].launches == 2
    assert [copy.dtype for copy in copies] == [part.dtype for part in parts]
    assert [copy.numel() for copy in copies] == [5, 9, 3, 0]
    for copy, segment in zip(copies[:3], segments[:3], strict=True):
        expected = kernels.perturbed_copy(segment.tensor, segment.key, 0, 0.5, "sign")
        assert torch.equal(copy, expected)


def test_the_sphere_needs_one_launch_and_keeps_its_scale(launches):
    sampler = DirectionSampler("sphere", generator="philox", fused=True)
    sizes = [(f"layer.{index}", size) for index, size in enumerate(SIZES)]
    scale = sampler.scale(SEED, sizes)
    assert launches["multi_tensor_squares_kernel"].launches == 1
    assert launches["direction_squares_kernel"].launches == 0
    assert sampler.scale(SEED, sizes) == scale  # a fixed order: the same bits again
    per_parameter = sum(
        float(kernels.direction_squares(philox_key(SEED, name), size, "normal", sampler.device))
        for name, size in sizes
    )
    assert scale == pytest.approx(math.sqrt(sum(SIZES) / per_parameter), rel=1e-12)


def test_a_virtual_step_launches_once_per_module_and_once_for_the_update(launches):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    model = model.to(torch.bfloat16).requires_grad_(False)
    sampler = DirectionSampler("gaussian", generator="philox", fused=True)
    perturber = make_perturber(model, full_shards(model.named_parameters()), sampler)
    perturber.perturb(3, 1e-2)
    model(torch.ones(2, 8, dtype=torch.bfloat16))
    assert launches["multi_tensor_pass_kernel"].launches == 2  # weight and bias together
    perturber.update(3, 1e-2)
    assert launches["multi_tensor_pass_kernel"].launches == 3
    assert launches["direction_pass_kernel"].launches == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_shards_get_launches_of_their_own_with_the_same_bits(dtype, launches, monkeypatch):
    """Shards of ``OWN_LAUNCH_ELEMENTS`` or more skip the table search (measured slower on large
    matrices); the values stay those of the per-parameter kernels."""
    monkeypatch.setattr(kernels, "OWN_LAUNCH_ELEMENTS", 1024)
    shards, _buffer = _shards(dtype)
    segments = _segments(shards)
    expected = [shard.tensor.clone() for shard in shards]
    for tensor, segment in zip(expected, segments, strict=True):
        if dtype == torch.float32:
            kernels.add_direction_(tensor, segment.key, segment.offset, 0.01, "normal")
        else:
            kernels.rounded_update_(tensor, segment.key, segment.offset, 0.01, "normal")
    launches["direction_pass_kernel"].launches = 0
    if dtype == torch.float32:
        kernels.add_directions_(segments, 0.01, "normal")
    else:
        kernels.rounded_updates_(segments, 0.01, "normal")
    for shard, tensor in zip(shards, expected, strict=True):
        assert torch.equal(shard.tensor, tensor), shard.name
    large = sum(size >= 1024 for size in SIZES)
    assert launches["direction_pass_kernel"].launches == large
    assert launches["multi_tensor_pass_kernel"].launches == 1
    copies = kernels.perturbed_copies(segments, 0.01, "normal")
    for copy, segment in zip(copies, segments, strict=True):
        want = kernels.perturbed_copy(segment.tensor, segment.key, segment.offset, 0.01, "normal")
        assert torch.equal(copy, want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_grouped_copies_are_the_per_parameter_copies_bit_for_bit(dtype, launches):
    """The virtual perturber's prebuilt tables: one launch per group, large tensors included,
    an empty tensor kept empty, and each copy the per-parameter kernel's."""
    whole = [shard for shard in _shards(dtype)[0] if shard.offset == 0]
    groups = [whole[:3], [whole[3].tensor.new_empty(0), *(s.tensor for s in whole[3:])]]
    groups[0] = [shard.tensor for shard in groups[0]]
    names = [[s.name for s in whole[:3]], ["empty", *(s.name for s in whole[3:])]]
    copies = GroupedCopies(groups)
    for seed in (SEED, SEED + 1):
        copies.set_keys([[philox_key(seed, name) for name in group] for group in names])
        for index, (tensors, group_names) in enumerate(zip(groups, names, strict=True)):
            got = copies.copies(index, -0.01, "normal")
            assert [t.numel() for t in got] == [t.numel() for t in tensors]
            for copy, tensor, name in zip(got, tensors, group_names, strict=True):
                if tensor.numel():
                    key = philox_key(seed, name)
                    want = kernels.perturbed_copy(tensor, key, 0, -0.01, "normal")
                    assert torch.equal(copy, want), (seed, name)
    assert launches["multi_tensor_pass_kernel"].launches == 2 * len(groups)
