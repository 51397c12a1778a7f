"""``privzo bench kernels``: the fused kernels on a device against their CPU twin, measured.

A trajectory trained with the fused kernels replays on a CPU only if the kernels compute the
CPU code's values: the Philox words and everything derived from them by integer arithmetic
(signs, rounding uniforms, half-precision roundings) bit for bit, the Gaussian directions to
the stated tolerance (log, sin and cos differ in their last bits between devices). Each check
below runs the kernel on ``device`` tensors and the CPU twin on CPU tensors, and reports how
far apart they are; the half-precision update's projection says whether updates far below an
ulp still land in expectation. On CPU the kernels run under Triton's interpreter.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from privzo.zo import kernels
from privzo.zo.directions import DirectionSampler, resolve_generator, step_seed
from privzo.zo.perturbation import rounded_update
from privzo.zo.philox import STREAM_DIRECTION, STREAM_ROUNDING, element_values, philox_key
from privzo.zo.rounding import stochastic_round
from privzo.zo.sweeps import ParameterShard

CPU = torch.device("cpu")
KEY = philox_key(20261123, "decoder.layers.0.fc1.weight")
OFFSET = 7  # inside a counter: the partition arithmetic is exercised on every check
# The Gaussian directions' tolerance, as torch.testing.assert_close's: |a − b| ≤ atol + rtol·|b|.
NORMAL_RTOL, NORMAL_ATOL = 1e-6, 1e-7
HALF_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
# Replay's tolerance for half-precision weights: where z's last bits flipped a rounding the two
# weights differ (by at most an ulp of the tensor's largest weight), on at most this fraction.
FLIPPED_ROUNDINGS_BOUND = 0.02
# ... and each by at most this many ulps of the tensor's largest weight: one ulp of the weight's
# magnitude at the flip, which may exceed today's largest weight, and rarely a second flip.
FLIPPED_DIFFERENCE_ULPS = 2.0
PROJECTION_MAGNITUDES = (1e-7, 1e-6, 1e-5)
PROJECTION_BOUND = 0.05  # |projection − 1|


@dataclass(frozen=True)
class Agreement:
    """One kernel output against the CPU twin's: how many elements differ beyond the bound."""

    check: str
    dtype: str
    elements: int
    differing: int  # elements outside the tolerance (for exact checks: not bit-equal)
    max_abs_error: float
    tolerance: str  # "bit-exact", or the bound the differing elements are counted against
    allowed_fraction: float = 0.0

    @property
    def passed(self) -> bool:
        return self.differing <= self.allowed_fraction * self.elements


@dataclass(frozen=True)
class Projection:
    """⟨applied, intended⟩ / ‖intended‖² of ``steps`` half-precision updates of ±magnitude·z."""

    dtype: str
    magnitude: float
    elements: int
    steps: int
    value: float

    @property
    def passed(self) -> bool:
        return abs(self.value - 1.0) <= PROJECTION_BOUND


@dataclass(frozen=True)
class KernelCheck:
    """Every agreement and projection measured on one device."""

    device: str
    device_name: str
    triton_version: str
    agreements: list[Agreement]
    projections: list[Projection]

    @property
    def passed(self) -> bool:
        return all(a.passed for a in self.agreements) and all(p.passed for p in self.projections)

    def to_json(self) -> dict[str, object]:
        return {
            "device": self.device,
            "device_name": self.device_name,
            "triton_version": self.triton_version,
            "passed": self.passed,
            "agreements": [{**asdict(a), "passed": a.passed} for a in self.agreements],
            "projections": [{**asdict(p), "passed": p.passed} for p in self.projections],
        }

    def table(self) -> str:
        lines = [
            f"fused kernels on {self.device_name} ({self.device}) against the CPU twin, "
            f"triton {self.triton_version}",
            f"{'check':<34}{'dtype':<10}{'elements':>10}{'differ':>8}{'max |Δ|':>11}  tolerance",
        ]
        for a in self.agreements:
            lines.append(
                f"{a.check:<34}{a.dtype:<10}{a.elements:>10}{a.differing:>8}"
                f"{a.max_abs_error:>11.3g}  {a.tolerance}{'' if a.passed else '  FAILED'}"
            )
        lines.append(f"update projection, target 1 ± {PROJECTION_BOUND}:")
        lines.append(f"{'':<34}{'dtype':<10}{'|ηg|':>10}{'measured':>11}")
        for p in self.projections:
            lines.append(
                f"{'':<34}{p.dtype:<10}{p.magnitude:>10.0e}{p.value:>11.4f}"
                f"{'' if p.passed else '  FAILED'}"
            )
        return "\n".join(lines)


def check_kernels(
    device: torch.device,
    size: int = 1 << 16,
    projection_size: int = 1 << 20,
    projection_steps: int = 100,
) -> KernelCheck:
    """Every agreement check on ``size`` elements and every projection on
    ``projection_size`` weights; refuses before computing where the kernels cannot run."""
    kernels.require_triton()
    if size < 64:
        raise ValueError(f"size={size}: allowed: 64 or more (the partition checks cut it)")
    import triton

    agreements = [
        *_direction_agreements(device, size),
        *(_half_agreements(device, size, name) for name in HALF_DTYPES),
        _bf16_ties(device, size),
        _sphere_agreement(device, size),
    ]
    projections = [
        Projection(name, magnitude, projection_size, projection_steps, value)
        for name, dtype in HALF_DTYPES.items()
        for magnitude in PROJECTION_MAGNITUDES
        for value in [
            update_projection(device, dtype, magnitude, projection_size, projection_steps)
        ]
    ]
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)"
    return KernelCheck(str(device), name, triton.__version__, agreements, projections)


def _cpu_values(size: int, transform: str, stream: int = STREAM_DIRECTION) -> torch.Tensor:
    return element_values(KEY, stream, OFFSET, OFFSET + size, transform, CPU)


def _kernel_direction(device: torch.device, offset: int, size: int, transform: str) -> torch.Tensor:
    """z itself, through the add pass on zeros (fma(z, 1, 0) = z exactly), brought to CPU."""
    zeros = torch.zeros(size, device=device)
    kernels.add_direction_(zeros, KEY, offset, 1.0, transform)
    return zeros.cpu()


def _exact(check: str, dtype: str, got: torch.Tensor, want: torch.Tensor) -> Agreement:
    """Bit-equality, NaNs compared by being NaN (their payload is not part of the contract)."""
    both_nan = got.isnan() & want.isnan()
    width = {1: torch.int8, 2: torch.int16, 4: torch.int32}[got.element_size()]
    same = (got.view(width) == want.view(width)) | both_nan
    error = (got.double() - want.double()).abs().nan_to_num(0.0)
    return Agreement(check, dtype, got.numel(), int((~same).sum()), float(error.max()), "bit-exact")


def _direction_agreements(device: torch.device, size: int) -> list[Agreement]:
    sign = _kernel_direction(device, OFFSET, size, "sign")
    normal = _kernel_direction(device, OFFSET, size, "normal")
    cpu_normal = _cpu_values(size, "normal")
    error = (normal.double() - cpu_normal.double()).abs()
    outside = error > NORMAL_ATOL + NORMAL_RTOL * cpu_normal.double().abs()
    whole = _kernel_direction(device, 0, OFFSET + size + 9, "normal")
    middle = size // 2 - 3  # a cut inside a counter, away from both ends
    cuts = [(0, 5), (OFFSET, OFFSET + size), (middle, middle + 9), (OFFSET + size, whole.numel())]
    parts = torch.cat([_kernel_direction(device, a, b - a, "normal") for a, b in cuts])
    theta = torch.randn(size, generator=torch.Generator().manual_seed(3))
    moved = theta.to(device, copy=True)
    kernels.add_direction_(moved, KEY, OFFSET, -0.37, "sign")
    fma = torch.addcmul(theta, _cpu_values(size, "sign"), torch.tensor(-0.37))
    return [
        _exact("sign directions", "float32", sign, _cpu_values(size, "sign")),
        Agreement(
            "normal directions",
            "float32",
            size,
            int(outside.sum()),
            float(error.max()),
            f"rtol {NORMAL_RTOL:g}, atol {NORMAL_ATOL:g}",
        ),
        _exact(
            "partition slices (same device)",
            "float32",
            parts,
            torch.cat([whole[a:b] for a, b in cuts]),
        ),
        _exact("add pass = one fma", "float32", moved.cpu(), fma),
    ]


def _half_agreements(device: torch.device, size: int, name: str) -> Agreement:
    """Round to nearest and stochastic rounding of θ + c·z with sign directions (exact words,
    so any difference is the rounding's), at a fraction of an ulp so both neighbours occur."""
    dtype = HALF_DTYPES[name]
    theta = (torch.randn(size, generator=torch.Generator().manual_seed(1)) * 0.02).to(dtype)
    coefficient = 0.6 * 0.02 * torch.finfo(dtype).eps
    intended = theta.float() + coefficient * _cpu_values(size, "sign")
    copy = kernels.perturbed_copy(theta.to(device), KEY, OFFSET, coefficient, "sign").cpu()
    updated = theta.to(device, copy=True)
    kernels.rounded_update_(updated, KEY, OFFSET, coefficient, "sign")
    uniforms = _cpu_values(size, "uniform", STREAM_ROUNDING)
    want = torch.cat([intended.to(dtype), stochastic_round(intended, uniforms, dtype)])
    return _exact("nearest copy + stochastic update", name, torch.cat([copy, updated.cpu()]), want)


def _bf16_ties(device: torch.device, size: int) -> Agreement:
    """θ ± 2⁻⁸ on bf16 weights near 1 and 2: ties, carries into the exponent, and NaN."""
    values = torch.tensor([1.0, 1.0078125, 1.9921875, 1.984375, -1.9921875, float("nan")])
    theta = values.repeat(size // values.numel() + 1)[:size].to(torch.bfloat16)
    coefficient = 2.0**-8
    want = (theta.float() + coefficient * _cpu_values(size, "sign")).to(torch.bfloat16)
    got = kernels.perturbed_copy(theta.to(device), KEY, OFFSET, coefficient, "sign").cpu()
    return _exact("bf16 ties, carries and NaN", "bfloat16", got, want)


def _sphere_agreement(device: torch.device, size: int) -> Agreement:
    """The sphere's Σz² (fp64, per-program partial sums) against the CPU twin's fp64 sum."""
    got = float(kernels.direction_squares(KEY, size, "normal", device))
    want = float(
        element_values(KEY, STREAM_DIRECTION, 0, size, "normal", CPU).double().square().sum()
    )
    error = abs(got - want)
    bound = 2 * NORMAL_RTOL  # each z² is within twice z's relative tolerance
    return Agreement(
        "sphere norm Σz²", "float64", 1, int(error > bound * want), error, f"rtol {bound:g}"
    )


def update_projection(
    device: torch.device, dtype: torch.dtype, magnitude: float, size: int, steps: int
) -> float:
    """⟨applied, intended⟩ / ‖intended‖² after ``steps`` updates of ±magnitude·z on weights of
    size ~0.02, through the update a run makes on ``device`` (the fused kernel on CUDA); 1 means
    the expected update is the intended one."""
    generator = torch.Generator().manual_seed(0)
    base = (torch.randn(size, generator=generator) * 0.02).to(dtype)
    signs = torch.randint(0, 2, (steps,), generator=generator) * 2 - 1
    shard = ParameterShard("w", base.to(device, copy=True), size)
    sampler = DirectionSampler("gaussian", device, generator=resolve_generator("auto", device))
    intended = torch.zeros(size, dtype=torch.float64, device=device)
    for step in range(steps):
        seed, coefficient = step_seed(5, step), magnitude * float(signs[step])
        rounded_update(shard, sampler, seed, coefficient)
        intended += coefficient * sampler.slice(seed, "w", size, 0, size).double()
    applied = shard.tensor.double() - base.to(device).double()
    return float(applied @ intended / (intended @ intended))


def flipped_roundings(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float]:
    """(fraction of elements that differ, the largest difference in ulps of the tensor's largest
    weight): how two half-precision tensors that took the same updates, with z differing in its
    last bits, are compared. Where z's last bits flip a stochastic rounding, the two copies
    differ by an ulp of the weight's magnitude at that step and keep that difference, so an
    element that shrinks later (a bias near zero) is many of its own ulps away; the tensor's
    scale is the bound that holds."""
    differs = got != want
    scale = float(torch.finfo(want.dtype).eps * want.float().abs().max())
    largest = float((got.float() - want.float()).abs().max())
    return float(differs.float().mean()), (largest / scale if scale > 0 else largest)
