"""The DPZero paper's synthetic study (§5.1): DPZero vs DPGD-0th vs DP-GD on quadratics whose
Hessian has a controlled effective rank, across dimensions, at one (ε, δ)."""

from privzo.synthetic.config import (
    STUDY_TYPE,
    SyntheticStudyConfig,
    build_synthetic_config,
    load_synthetic_config,
)
from privzo.synthetic.study import run_synthetic_study

__all__ = [
    "STUDY_TYPE",
    "SyntheticStudyConfig",
    "build_synthetic_config",
    "load_synthetic_config",
    "run_synthetic_study",
]
