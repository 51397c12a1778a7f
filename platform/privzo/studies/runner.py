"""Study type → the function that runs it (a registry, like the config's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from privzo.config import Section
from privzo.studies.scaling import ScalingStudyConfig, run_scaling_study

StudyRunner = Callable[..., dict[str, Any]]
STUDY_RUNNERS: dict[type[Section], StudyRunner] = {ScalingStudyConfig: run_scaling_study}


def run_study(study: Section, output_dir: Path, **options: Any) -> dict[str, Any]:
    """Run (or resume) ``study`` with the runner registered for its config type."""
    runner = STUDY_RUNNERS.get(type(study))
    if runner is None:
        raise ValueError(f"no runner registered for {type(study).__name__}")
    return runner(study, output_dir, **options)
