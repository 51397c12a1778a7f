"""(a) the fused kernels on CUDA tensors against the CPU twin; (b) the half-precision update's
projection over 2²⁰ weights at |ηg| = 1e-7, 1e-6 and 1e-5."""

from __future__ import annotations

import torch

from privzo.bench.kernel_check import check_kernels


def test_kernels_agree_with_the_cpu_twin_and_updates_land(gpu_record):
    result = check_kernels(torch.device("cuda", torch.cuda.current_device()))
    gpu_record("kernels", **result.to_json())
    print(result.table())
    failed = [a for a in result.agreements if not a.passed]
    assert not failed, failed
    off = [p for p in result.projections if not p.passed]
    assert not off, off
