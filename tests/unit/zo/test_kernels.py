"""The fused Triton kernels against the CPU implementation of the same function.

They run here on CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``, set in
conftest). Integer words (signs, rounding uniforms) and the half-precision roundings must agree
bit for bit; the normals go through log/sin/cos, whose last bits differ between numpy (the
interpreter), torch's CPU kernels and the GPU, so they agree to a few fp32 ulps.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("triton", reason="the kernel tests need triton (the test extra)")

from privzo.zo import kernels
from privzo.zo.directions import DirectionSampler, step_seed
from privzo.zo.estimators import MeanEstimator
from privzo.zo.perturbation import make_perturber
from privzo.zo.philox import (
    STREAM_DIRECTION,
    STREAM_ROUNDING,
    element_values,
    philox_key,
)
from privzo.zo.rounding import stochastic_round
from privzo.zo.step import zo_step
from privzo.zo.sweeps import ParameterShard, full_shards, sweep

CPU = torch.device("cpu")
KEY = philox_key(20261123, "decoder.layers.0.fc1.weight")
SIZE, OFFSET = 5003, 7  # not a multiple of 4 and an offset inside a counter
NORMAL_RTOL = 1e-6  # a few fp32 ulps (2⁻²³ ≈ 1.2e-7)


def _cpu_values(transform: str, stream: int = STREAM_DIRECTION) -> torch.Tensor:
    return element_values(KEY, stream, OFFSET, OFFSET + SIZE, transform, CPU)


def _kernel_direction(transform: str, offset: int = OFFSET, size: int = SIZE) -> torch.Tensor:
    """z itself, through the add pass on zeros (fma(z, 1, 0) = z exactly)."""
    zeros = torch.zeros(size)
    kernels.add_direction_(zeros, KEY, offset, 1.0, transform)
    return zeros


def test_sign_directions_are_the_cpu_words_bit_for_bit():
    assert torch.equal(_kernel_direction("sign"), _cpu_values("sign"))


def test_normal_directions_agree_with_the_cpu_to_a_few_ulps():
    kernel, cpu = _kernel_direction("normal"), _cpu_values("normal")
    torch.testing.assert_close(kernel, cpu, rtol=NORMAL_RTOL, atol=1e-7)
    assert abs(float(kernel.std()) - 1.0) < 0.05  # a standard normal, not a near miss of one


def test_a_partition_generates_exactly_its_slice_of_the_whole_parameter():
    whole = _kernel_direction("normal", offset=0, size=OFFSET + SIZE + 9)
    for start, stop in [
        (0, 5),
        (OFFSET, OFFSET + SIZE),
        (1021, 1030),
        (OFFSET + SIZE, whole.numel()),
    ]:
        part = _kernel_direction("normal", offset=start, size=stop - start)
        assert torch.equal(part, whole[start:stop]), (start, stop)


def test_the_add_pass_is_one_fused_multiply_add():
    theta = torch.randn(SIZE)
    moved = theta.clone()
    kernels.add_direction_(moved, KEY, OFFSET, -0.37, "sign")
    expected = torch.addcmul(theta, _cpu_values("sign"), torch.tensor(-0.37))
    assert torch.equal(moved, expected)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_passes_round_like_the_cpu_path(dtype):
    torch.manual_seed(1)
    theta = (torch.randn(SIZE) * 0.02).to(dtype)
    # a fraction of an ulp of the weights: the rounding decides each element by its uniform
    coefficient = 0.6 * 0.02 * torch.finfo(dtype).eps
    z = _cpu_values("sign")  # exact words, so any difference would be the rounding's
    intended = theta.float() + coefficient * z
    assert torch.equal(
        kernels.perturbed_copy(theta, KEY, OFFSET, coefficient, "sign"), intended.to(dtype)
    )
    updated = theta.clone()
    kernels.rounded_update_(updated, KEY, OFFSET, coefficient, "sign")
    uniforms = _cpu_values("uniform", STREAM_ROUNDING)
    assert torch.equal(updated, stochastic_round(intended, uniforms, dtype))
    changed = (updated != theta).float().mean()
    assert 0.05 < changed < 0.95  # the rounding decided both ways


def test_bf16_rounding_to_nearest_handles_ties_and_carries():
    """θ ± 2⁻⁸ on bf16 weights near 1 and 2 lands exactly halfway between bf16 values: the
    ties and exponent carries that Triton's own interpreted bf16 cast gets wrong, and NaN."""
    values = torch.tensor([1.0, 1.0078125, 1.9921875, 1.984375, -1.9921875, float("nan")])
    nan = values.isnan().repeat(SIZE // values.numel() + 1)[:SIZE]
    theta = values.repeat(SIZE // values.numel() + 1)[:SIZE].to(torch.bfloat16)
    coefficient = 2.0**-8
    expected = (theta.float() + coefficient * _cpu_values("sign")).to(torch.bfloat16)
    got = kernels.perturbed_copy(theta, KEY, OFFSET, coefficient, "sign")
    # NaN stays NaN (its bit pattern is not part of the contract: torch's own casts differ)
    assert got[nan].isnan().all()
    assert torch.equal(got[~nan].view(torch.int16), expected[~nan].view(torch.int16))
    assert (got == 2.0).any()  # a tie at 1.99609375 carried into the exponent


@pytest.mark.parametrize("distribution", ["gaussian", "rademacher", "sphere"])
def test_fused_sweeps_match_the_unfused_philox_sweeps(distribution):
    torch.manual_seed(2)
    fused = DirectionSampler(distribution, generator="philox", fused=True)
    unfused = DirectionSampler(distribution, generator="philox", fused=False)
    sizes = [("a", 3000), ("b", 17)]
    assert fused.scale(5, sizes) == pytest.approx(unfused.scale(5, sizes), rel=1e-9)
    base = torch.randn(3000)
    pieces = base.clone()
    shards = [
        ParameterShard("a", pieces[:1500], 3000),
        ParameterShard("a", pieces[1500:], 3000, 1500),
    ]
    sweep(shards, fused, 5, 0.25)
    whole = base.clone()
    sweep([ParameterShard("a", whole, 3000)], unfused, 5, 0.25)
    torch.testing.assert_close(pieces, whole, rtol=NORMAL_RTOL, atol=1e-7)
    assert not torch.equal(pieces, base)


def test_fused_samplers_need_philox():
    with pytest.raises(ValueError, match="Philox"):
        DirectionSampler("gaussian", generator="torch-blocks", fused=True)
    assert not DirectionSampler("gaussian", generator="philox").fused  # auto: CUDA only


def _mlp(dtype: torch.dtype) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
    return model.to(dtype).requires_grad_(False)


def _train(dtype: torch.dtype, fused: bool, steps: int = 6) -> tuple[torch.nn.Module, list[float]]:
    model = _mlp(dtype)
    sampler = DirectionSampler("gaussian", generator="philox", fused=fused)
    perturber = make_perturber(model, full_shards(model.named_parameters()), sampler)
    inputs = torch.randn(6, 8, generator=torch.Generator().manual_seed(3)).to(dtype)
    gradients = []
    for step in range(steps):
        record = zo_step(
            step=step,
            seed=step_seed(4, step),
            perturber=perturber,
            batch=inputs,
            batch_size=6,
            loss_fn=lambda batch: model(batch).squeeze(-1).float() ** 2,
            estimator=MeanEstimator(),
            learning_rate=0.05,
            perturbation_scale=1e-2,
        )
        gradients.append(record.projected_gradient)
    return model, gradients


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_fused_training_follows_the_cpu_path(dtype):
    """The same steps through the kernels and through the CPU twin: what a trajectory trained on
    a GPU and replayed on a CPU relies on."""
    fused_model, fused_gradients = _train(dtype, fused=True)
    cpu_model, cpu_gradients = _train(dtype, fused=False)
    assert fused_gradients == pytest.approx(cpu_gradients, rel=1e-3, abs=1e-4)
    start = _mlp(dtype)
    for (name, fused), cpu, before in zip(
        fused_model.named_parameters(), cpu_model.parameters(), start.parameters(), strict=True
    ):
        assert not torch.equal(fused, before), name  # training moved it
        if dtype == torch.float32:  # z's last-bit differences, a few ulps after six steps
            torch.testing.assert_close(fused, cpu, rtol=1e-5, atol=1e-6)
            continue
        # half precision: the same weights but where a last-bit difference of z flipped a
        # rounding decision, and those one ulp apart
        differs = fused != cpu
        assert differs.float().mean() <= 0.02, (name, float(differs.float().mean()))
        ulp = cpu.float().abs() * torch.finfo(dtype).eps
        assert ((fused.float() - cpu.float()).abs() <= ulp * 1.01)[differs].all(), name


_COMPILE = textwrap.dedent(
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from privzo.zo import triton_kernels as K

    def compile(kernel, signature, constexprs):
        constexprs = {"TRANSFORM": 0, "COUNTERS": 256, **constexprs}
        signature = {**signature, **{name: "constexpr" for name in constexprs}}
        source = ASTSource(fn=kernel, signature=signature, constexprs=constexprs)
        triton.compile(source, target=GPUTarget("cuda", 90, 32))

    scalars = {name: "i64" for name in ["count", "offset", "first_counter", "key0", "key1"]}
    for aligned in (False, True):
        compile(
            K.direction_pass_kernel,
            {"source_ptr": "*bf16", "target_ptr": "*bf16", **scalars, "coefficient": "fp32"},
            {"PASS": 2, "ALIGNED": aligned},
        )
        compile(
            K.multi_tensor_pass_kernel,
            {"source_base": "*bf16", "target_base": "*bf16", "table_ptr": "*i64",
             "segments": "i32", "coefficient": "fp32"},
            {"PASS": 2, "ALIGNED": aligned},
        )
    compile(
        K.multi_term_add_kernel,
        {"base": "*fp32", "table_ptr": "*i64", "keys_ptr": "*i64", "coefficients_ptr": "*fp32",
         "segments": "i32", "terms": "i32"},
        {},
    )
    compile(K.direction_squares_kernel, {"partial_ptr": "*fp64", **scalars}, {})
    compile(
        K.multi_tensor_squares_kernel,
        {"partial_ptr": "*fp64", "table_ptr": "*i64", "segments": "i32"},
        {},
    )
    """
)


def test_the_kernels_compile_for_a_gpu():
    """The interpreter runs Python the compiler refuses (globals only annotated as constexpr,
    say), so the kernels are also compiled for an H100 (sm_90), which needs no GPU."""
    backends = pytest.importorskip("triton.backends")
    if "nvidia" not in backends.backends:
        pytest.skip("this Triton has no CUDA backend")
    environment = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE], env=environment, capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
