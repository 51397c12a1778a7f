"""Fused direction passes: the Philox directions generated inside the weight sweep itself.

The CPU path (``privzo.zo.sweeps``, ``privzo.zo.perturbation``) draws z in blocks and issues one
small kernel per block from Python: on OPT-13B about 600,000 launches per step (issue 11). Here
each pass over a parameter is one Triton launch that reads θ once and writes it once, computing
z (and the rounding uniforms) in registers from the same counter-based function as
``privzo.zo.philox``, so the two paths compute the same values: integer words bit for bit, the
normals to a few fp32 ulps (the devices' log/sin/cos differ in the last bits).

Triton is imported on first use only (``privzo.zo.triton_kernels``): it ships with torch's CUDA
builds and is an optional test dependency on CPU, where the kernels run under its interpreter.
"""

from __future__ import annotations

import importlib.util
import math
from functools import lru_cache
from types import ModuleType

import torch

from privzo.zo.philox import LANES

COUNTERS_PER_PROGRAM = 256  # 1024 elements per program: one read and one write of each
TRANSFORMS = {"normal": 0, "sign": 1}


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
def _compiled() -> ModuleType:
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
    kernels = _compiled()
    count = source.numel()
    first = offset // LANES
    last = (offset + count - 1) // LANES + 1
    grid = (math.ceil((last - first) / COUNTERS_PER_PROGRAM),)
    kernels.direction_pass_kernel[grid](
        source,
        target,
        count,
        offset,
        first,
        key[0],
        key[1],
        coefficient,
        PASS=mode,
        TRANSFORM=TRANSFORMS[transform],
        COUNTERS=COUNTERS_PER_PROGRAM,
    )


def _check_flat(tensor: torch.Tensor) -> None:
    assert tensor.dim() == 1 and tensor.is_contiguous() and tensor.numel() > 0


@torch.no_grad()
def add_direction_(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> None:
    """θ ← θ + c·z in place (fp32): ``tensor`` holds elements [offset, offset + numel)."""
    _check_flat(tensor)
    assert tensor.dtype == torch.float32
    kernels = _compiled()
    _launch(tensor, tensor, key, offset, coefficient, transform, kernels.PASS_ADD)


@torch.no_grad()
def perturbed_copy(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> torch.Tensor:
    """θ + c·z computed in fp32 and rounded once (to nearest) to θ's dtype, in a new tensor."""
    _check_flat(tensor)
    result = torch.empty_like(tensor)
    _launch(tensor, result, key, offset, coefficient, transform, _compiled().PASS_COPY)
    return result


@torch.no_grad()
def rounded_update_(
    tensor: torch.Tensor, key: tuple[int, int], offset: int, coefficient: float, transform: str
) -> None:
    """θ ← stochastic-round(θ + c·z) in place (bf16 / fp16), uniforms from stream 1 of the same
    key: the fused form of ``privzo.zo.perturbation.rounded_update``."""
    _check_flat(tensor)
    assert tensor.dtype in (torch.bfloat16, torch.float16)
    _launch(tensor, tensor, key, offset, coefficient, transform, _compiled().PASS_UPDATE)


def direction_squares(
    key: tuple[int, int], size: int, transform: str, device: torch.device
) -> torch.Tensor:
    """Σ z² over a parameter's ``size`` elements (the sphere's norm) as a 0-dim fp64 tensor on
    ``device``, summed in a fixed order; left on the device so a step syncs once, not once per
    parameter."""
    kernels = _compiled()
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
