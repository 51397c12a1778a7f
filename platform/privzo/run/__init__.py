"""The run pipeline: one fine-tuning run, end to end (``pipeline.run``); its directory is
``privzo.rundir``'s (finished with a config, resumable, its records written). The training itself is
``privzo.layouts.train.train_and_evaluate``, shared with the Ray Train worker.

Its public names, several defined in the layers below it, are importable from here for callers
(searches, studies, the CLI, the demo, tests).
"""

from privzo.algorithms.loop import TrainingLoop
from privzo.algorithms.registry import make_loop
from privzo.layouts.context import RunContext, RunHooks, build_context
from privzo.models.loading import model_parameters
from privzo.privacy.plan import PrivacyPlan, mechanism_parameters, plan_privacy
from privzo.run.pipeline import finished_run, run
from privzo.rundir import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    RESOURCE_FIGURES,
    RUN_FILES,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    can_resume,
    check_output_dir,
    finished,
    holds_other_run,
    prepare_output_dir,
    refuse_other_run,
    starts_over,
    unfinished_steps,
)

__all__ = [
    "CONFIG_FILE",
    "MODEL_DIR",
    "PRIVACY_FILE",
    "RESOURCE_FIGURES",
    "RUN_FILES",
    "SUMMARY_FILE",
    "TRAJECTORY_FILE",
    "PrivacyPlan",
    "RunContext",
    "RunHooks",
    "TrainingLoop",
    "build_context",
    "can_resume",
    "check_output_dir",
    "finished",
    "finished_run",
    "holds_other_run",
    "make_loop",
    "mechanism_parameters",
    "model_parameters",
    "plan_privacy",
    "prepare_output_dir",
    "refuse_other_run",
    "run",
    "starts_over",
    "unfinished_steps",
]
