"""What makes a trajectory trustworthy to replay: a checksum, sane rows, the right base.

The trajectory is a run's only model record by default, so replay must refuse rather than
rebuild wrong weights from a file that was damaged (flipped bytes), edited (a NaN or huge
gradient, missing or repeated steps) or paired with another base model.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import torch

__all__ = [
    "MAX_UPDATE_COEFFICIENT",
    "NonFiniteWeightsError",
    "check_fingerprint",
    "check_finite_weights",
    "check_rows",
    "columns_checksum",
    "rounding_rtol",
    "weights_fingerprint",
]

# |η·g·s| of one step beyond which a row is refused: z has unit-variance elements, so such a
# step moves every weight by about this much. Clipped runs stay far below (clip ≤ 1e6, η ≪ 1).
MAX_UPDATE_COEFFICIENT = 1e3
FINGERPRINT_SAMPLES = 1024  # strided elements per tensor
FINGERPRINT_RTOL = 1e-2  # of a tensor's mean |x|: far above dtype rounding, far below a new model
# values kept exactly per tensor: a base with noise on every weight keeps its statistics within
# FINGERPRINT_RTOL, but not these values
KEPT_VALUES = 16
# of a tensor's mean |x|, beside the dtypes' rounding: what a kept value may differ by
KEPT_VALUES_ATOL = 1e-4


def columns_checksum(columns: Mapping[str, Sequence[Any]]) -> str:
    """SHA-256 of the rows' values (floats by their exact repr), in column order."""
    digest = hashlib.sha256()
    for name, values in columns.items():
        digest.update(json.dumps([name, list(values)], allow_nan=True).encode())
    return digest.hexdigest()


def check_rows(columns: Mapping[str, Sequence[Any]], source: str, *, directions: int = 1) -> None:
    """Steps 0..n−1 in order; ``directions`` − 1 extra directions per row (when the columns
    hold them); finite gradients, learning rate and scales; no absurd update."""
    for row, step in enumerate(columns["step"]):
        if step != row:
            raise ValueError(
                f"{source} row {row}: step {step}, expected {row} (steps missing or repeated)"
            )
    for row in range(len(columns["step"])):
        for values in _row_directions(columns, row, directions, source):
            _check_direction(values, source, row)


def _row_directions(
    columns: Mapping[str, Sequence[Any]], row: int, directions: int, source: str
) -> list[dict[str, Any]]:
    """Each direction's (projected_gradient, learning_rate, direction_scale) of one row."""
    rate = columns["learning_rate"][row]
    first = {
        "projected_gradient": columns["projected_gradient"][row],
        "learning_rate": rate,
        "direction_scale": columns["direction_scale"][row],
    }
    if "extra_projected_gradients" not in columns:
        return [first]
    gradients = columns["extra_projected_gradients"][row] or []
    scales = columns["extra_direction_scales"][row] or []
    if len(gradients) != directions - 1 or len(scales) != directions - 1:
        raise ValueError(
            f"{source} row {row}: {len(gradients) + 1} projected gradients and "
            f"{len(scales) + 1} direction scales for {directions} directions per step"
        )
    extra = [
        {"projected_gradient": g, "learning_rate": rate, "direction_scale": s}
        for g, s in zip(gradients, scales, strict=True)
    ]
    return [first, *extra]


def _check_direction(values: Mapping[str, Any], source: str, row: int) -> None:
    bad = [name for name, value in values.items() if value is None or not math.isfinite(value)]
    if bad:
        raise ValueError(f"{source} row {row}: {bad[0]}={values[bad[0]]!r} is not finite")
    update = values["projected_gradient"] * values["learning_rate"] * values["direction_scale"]
    if abs(update) > MAX_UPDATE_COEFFICIENT:
        raise ValueError(
            f"{source} row {row}: the step's update η·g·s={update:.3g} is beyond "
            f"±{MAX_UPDATE_COEFFICIENT:g}; no training run writes that"
        )


@torch.no_grad()
def weights_fingerprint(named_parameters: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """name → [element count, mean |x|, signed mean, kept values] over a strided sample of each
    tensor.

    The statistics are taken in fp64 of the sampled values, so the same weights loaded in
    another dtype or on another device match within ``FINGERPRINT_RTOL``; another model (other
    names, shapes, or values) does not. The ``KEPT_VALUES`` values spread over the sample must
    match within the dtypes' rounding, so a copy of the base with every weight moved does not.
    """
    fingerprint = {}
    for name, tensor in named_parameters:
        flat = tensor.detach().reshape(-1)
        stride = max(1, flat.numel() // FINGERPRINT_SAMPLES)
        sample = flat[::stride][:FINGERPRINT_SAMPLES].double().cpu()
        signs = 1.0 - 2.0 * ((torch.arange(sample.numel()) * 2654435761 >> 16) & 1)
        mean_abs = float(sample.abs().mean()) if sample.numel() else 0.0
        signed = float((sample * signs).mean()) if sample.numel() else 0.0
        keep = max(1, sample.numel() // KEPT_VALUES)
        kept = sample[::keep][:KEPT_VALUES].tolist()
        fingerprint[name] = [flat.numel(), mean_abs, signed, kept]
    return fingerprint


def rounding_rtol(first: str, second: str) -> float:
    """How far the same weight may differ, relative to itself, between copies loaded in dtypes
    ``first`` and ``second`` (torch names): none for one dtype, else the coarser one's epsilon."""
    if first == second:
        return 0.0
    epsilons = []
    for name in (first, second):
        dtype = getattr(torch, name, None)
        epsilons.append(torch.finfo(dtype).eps if isinstance(dtype, torch.dtype) else 2.0**-7)
    return max(epsilons)


def check_fingerprint(
    expected: Mapping[str, list], actual: Mapping[str, list], base: str, *, rtol: float = 0.0
) -> None:
    """Refuse a base model whose tensors or values differ from the training run's; ``rtol`` is
    ``rounding_rtol`` of the run's dtype and the one the base was loaded in. A fingerprint taken
    before kept values existed (three entries per tensor) is checked on its statistics."""
    if set(expected) != set(actual):
        missing = sorted(set(expected) - set(actual))[:3]
        extra = sorted(set(actual) - set(expected))[:3]
        raise ValueError(
            f"--base {base!r} is not the model this trajectory was trained from: its tensors "
            f"differ (missing {missing}, unexpected {extra})"
        )
    for name, (count, mean_abs, signed, *kept) in expected.items():
        got_count, got_abs, got_signed, *got_kept = actual[name]
        tolerance = FINGERPRINT_RTOL * max(mean_abs, 1e-12)
        if (
            got_count != count
            or abs(got_abs - mean_abs) > tolerance
            or abs(got_signed - signed) > tolerance
        ):
            raise ValueError(
                f"--base {base!r} is not the model this trajectory was trained from: tensor "
                f"{name!r} differs ({got_count} elements, mean |x| {got_abs:.6g}; the run's base "
                f"had {count}, {mean_abs:.6g})"
            )
        if kept and got_kept:
            _check_kept(name, kept[0], got_kept[0], mean_abs, rtol, base)


def _check_kept(
    name: str, kept: list[float], got: list[float], mean_abs: float, rtol: float, base: str
) -> None:
    atol = KEPT_VALUES_ATOL * max(mean_abs, 1e-12)
    for want, value in zip(kept, got, strict=False):
        if abs(value - want) > rtol * max(abs(want), abs(value)) + atol:
            raise ValueError(
                f"--base {base!r} is not the model this trajectory was trained from: tensor "
                f"{name!r} has the run's shape and statistics but other values ({value:.6g} "
                f"where the run's base had {want:.6g}); replay needs the exact base weights"
            )


class NonFiniteWeightsError(RuntimeError):
    """A step left NaN or infinite weights: the run stops instead of finishing destroyed."""


@torch.no_grad()
def check_finite_weights(named_tensors: Sequence[tuple[str, torch.Tensor]], steps: int) -> None:
    """Raise if any weight is NaN or infinite; one device-to-host copy for all tensors."""
    if not named_tensors:
        return
    flags = torch.stack([_not_finite(tensor) for _name, tensor in named_tensors])
    bad = flags.nonzero().flatten().tolist()
    if bad:
        name = named_tensors[bad[0]][0]
        raise NonFiniteWeightsError(
            f"after step {steps} the weights of {name!r} (and {len(bad) - 1} other tensors) are "
            "not finite; the run stops here (its trajectory so far is kept, for inspection); "
            "lower optimizer.learning_rate (or privacy.clip, optimizer.perturbation_scale) and "
            "start the run again in another directory or with --overwrite"
        )


def _not_finite(tensor: torch.Tensor) -> torch.Tensor:
    """Whether ``tensor`` holds a NaN or an infinity, from its extremes (NaN propagates to
    both): ``isfinite`` makes a mask as large as each weight, and on CPU the freed masks of a
    1.3B-parameter model stayed in the process's heap, 0.7 to 1.8 GiB above the step's peak."""
    if not tensor.numel():
        return torch.zeros((), dtype=torch.bool, device=tensor.device)
    low, high = torch.aminmax(tensor)
    return ~(torch.isfinite(low) & torch.isfinite(high))
