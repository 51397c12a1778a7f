"""Benchmarks that print measured figures and ratios (``privzo bench``): the ZO step, memory by
algorithm, the distributed layouts and the kernels' check, one module each."""

from __future__ import annotations

from privzo.bench.zo_step import zo_step_benchmark

__all__ = ["zo_step_benchmark"]
