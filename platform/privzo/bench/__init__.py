"""Benchmarks that print measured figures and ratios: ``privzo bench zo-step``."""

from __future__ import annotations

from privzo.bench.zo_step import zo_step_benchmark

__all__ = ["zo_step_benchmark"]
