"""What ``privzo bench zo-step`` refuses before it builds anything: a device the machine lacks,
a dtype the device cannot compute in, a batch the shape cannot take, a model that does not fit.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from privzo.forward_memory import estimate_activation_bytes
from privzo.memory import available_memory_bytes
from privzo.models.architecture import DecoderArch
from privzo.models.shapes import resolve_dtype, resolve_shape, weight_bytes
from privzo.planner import SAFETY_MARGIN
from privzo.zo.kernels import triton_installed

_GIB = 2**30
DEVICES = ("cpu", "cuda")


@dataclass(frozen=True)
class BenchSetup:
    """A checked request: the shape and where and how it runs."""

    shape: str
    arch: DecoderArch
    device: torch.device
    dtype: str
    batch_size: int
    seq_len: int


def checked_setup(
    shape: str, device: str, dtype: str, batch_size: int, seq_len: int, fit: bool = True
) -> BenchSetup:
    """The request, or a ValueError that says what the machine or the shape cannot do; ``fit``:
    also that the whole model fits the device (not where its weights are offloaded)."""
    _, arch = resolve_shape(shape)
    resolve_dtype(dtype)
    if batch_size < 1:
        raise ValueError(f"--batch-size={batch_size}: allowed: 1 or more")
    if not 2 <= seq_len <= arch.max_positions:
        raise ValueError(
            f"--seq-len={seq_len}: {shape} has {arch.max_positions} positions; allowed: "
            f"2..{arch.max_positions}"
        )
    torch_device = _checked_device(device)
    _check_dtype_runs(torch_device, dtype)
    setup = BenchSetup(shape, arch, torch_device, dtype, batch_size, seq_len)
    if fit:
        _check_fit(setup)
    return setup


def _checked_device(device: str) -> torch.device:
    if device not in DEVICES:
        raise ValueError(f"--device={device!r}: allowed: {', '.join(DEVICES)}")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("--device=cuda, but this machine (or this torch build) has no CUDA")
        if not triton_installed():
            raise ValueError(
                "--device=cuda, but Triton is not installed: privzo's fused direction passes "
                "on CUDA need it (it ships with torch's CUDA builds; pip install triton)"
            )
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_dtype_runs(device: torch.device, dtype: str) -> None:
    """Run the ops a forward and a sweep need (matmul, softmax, layer norm, normal draws) on
    a few elements: a dtype the device cannot compute in fails here, not in the model."""
    if device.type == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        raise ValueError(f"--dtype=bfloat16: {torch.cuda.get_device_name(device)} lacks bf16")
    torch_dtype = resolve_dtype(dtype)
    try:
        x = torch.randn(4, 8, device=device, dtype=torch_dtype)
        y = torch.nn.functional.layer_norm(x @ x.T, (4,)).softmax(-1)
        torch.nn.functional.relu(y).add_(torch.randn_like(y), alpha=1e-3)
    except RuntimeError as error:
        raise ValueError(f"--dtype={dtype} cannot run on {device}: {error}") from None


def needed_bytes(setup: BenchSetup) -> int:
    """Weights, one forward's activations (sdpa attention, no key/value cache: the scoring
    forward's) and three copies of the largest tensor (the token embeddings): MeZO's reference
    step allocates z and a new weight beside the old one, a virtual half-precision step one
    perturbed copy per module."""
    arch = setup.arch
    largest = arch.vocab * arch.embed_dim * resolve_dtype(setup.dtype).itemsize
    activations = estimate_activation_bytes(
        arch, setup.batch_size, setup.seq_len, setup.dtype, attention="sdpa", kv_cache=False
    )
    return weight_bytes(arch, setup.dtype) + activations + 3 * largest


def free_bytes(device: torch.device) -> int | None:
    """Free memory of the device now: the CUDA driver's figure, or the RAM this process can
    still get (None where it cannot be read)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return available_memory_bytes()


def _check_fit(setup: BenchSetup) -> None:
    need, free = needed_bytes(setup), free_bytes(setup.device)
    if free is not None and need > free * (1 - SAFETY_MARGIN):
        raise ValueError(
            f"shape {setup.shape} ({setup.dtype}, batch {setup.batch_size} x {setup.seq_len}) "
            f"needs about {need / _GIB:.1f} GiB on {setup.device.type}; "
            f"{free / _GIB:.1f} GiB are free (less a {SAFETY_MARGIN:.0%} margin)"
        )
