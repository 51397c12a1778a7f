"""Studies: many runs answering one question (how does private ZO scale with model size?)."""

from privzo.studies.config import STUDY_TYPES, load_study_config, register_study_type
from privzo.studies.runner import run_study
from privzo.studies.scaling import ScalingStudyConfig, run_scaling_study
from privzo.studies.summary import StudyResult, StudySummary, SyntheticSummary

__all__ = [
    "STUDY_TYPES",
    "ScalingStudyConfig",
    "StudyResult",
    "StudySummary",
    "SyntheticSummary",
    "load_study_config",
    "register_study_type",
    "run_scaling_study",
    "run_study",
]
