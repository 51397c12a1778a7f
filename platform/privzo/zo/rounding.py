"""Unbiased (stochastic) rounding of fp32 values to bf16 / fp16, driven by given uniforms.

Rounding θ − ηg·z to the nearest half-precision value drops every update smaller than half a unit in
the last place (docs/guides/models-peft.md, "Half precision"). Rounding up with probability equal to
the fraction of the gap covered makes the expected result the fp32 value itself, so updates
accumulate in expectation.

The uniforms come from the counter-based generator keyed by the public step seed (stream 1 of
``privzo.zo.philox``), so replay makes the same rounding decisions. The CUDA kernel
(``privzo.zo.kernels``) implements the same steps on the same bit patterns.
"""

from __future__ import annotations

import torch

HALF_DTYPES = (torch.bfloat16, torch.float16)
_SIGN = 0x8000
_MAGNITUDE = 0x7FFF


def stochastic_round(
    values: torch.Tensor, uniforms: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``values`` (fp32) rounded to ``dtype``: to the neighbour above or below, the far one with
    probability |v − nearest| / gap, decided by ``uniforms`` (fp32 in [0, 1)).

    Stages: round to nearest → the other neighbour on v's side, from the bit pattern (adjacent
    half-precision values of one sign have adjacent magnitudes) → probability → choose.
    Non-finite results of the nearest rounding (overflow) are kept as they are.
    """
    assert dtype in HALF_DTYPES and values.dtype == torch.float32
    nearest = values.to(dtype)
    nearest_value = nearest.float()
    residual = values - nearest_value  # exact in fp32 (Sterbenz: both are within 2x)
    other = _neighbour(nearest, residual)
    gap = (other.float() - nearest_value).abs()
    take_other = (uniforms * gap < residual.abs()) & torch.isfinite(nearest_value)
    return torch.where(take_other, other, nearest)


def _neighbour(nearest: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """The adjacent value of ``nearest`` in the direction of ``residual`` (any sign of zero)."""
    bits = nearest.view(torch.int16).to(torch.int32) & 0xFFFF
    magnitude = bits & _MAGNITUDE
    negative = (bits & _SIGN) != 0
    upward = residual > 0
    away_from_zero = (upward != negative) | (magnitude == 0)
    new_magnitude = torch.where(away_from_zero, magnitude + 1, magnitude - 1)
    new_negative = torch.where(magnitude == 0, ~upward, negative)
    new_bits = new_magnitude | new_negative.to(torch.int32) * _SIGN
    return (
        (new_bits - (new_bits >= _SIGN).to(torch.int32) * 0x10000)
        .to(torch.int16)
        .view(nearest.dtype)
    )
