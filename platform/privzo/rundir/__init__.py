"""A run's directory, owned here alone: its file names and atomic writes (``files``), the typed
summary (``summary``), the per-window save of a single-process run (``progress``), the resume
point (``resume``), the trajectory and its key (``trajectory``), and the config and final records
with the one "finished with this config?" question (``records``).
"""

from privzo.rundir.files import (
    CONFIG_FILE,
    MODEL_DIR,
    PRIVACY_FILE,
    RAY_STATE_DIR,
    RESUME_FILE,
    RUN_FILES,
    SUMMARY_FILE,
    TRAJECTORY_FILE,
    TRAJECTORY_KEY_FILE,
    check_output_dir,
    prepare_output_dir,
    read_json_object,
    write_atomically,
    write_json_atomically,
    write_text_atomically,
)
from privzo.rundir.progress import RunDirectoryProgress
from privzo.rundir.records import (
    finished,
    finished_record,
    holds_other_run,
    holds_run,
    mark_tracked,
    record_tracking_run,
    refuse_other_run,
    released_nothing,
    starts_over,
    untracked,
    write_config,
    write_records,
)
from privzo.rundir.resume import (
    ResumePoint,
    can_resume,
    resume_point,
    unfinished_steps,
    write_resume_point,
)
from privzo.rundir.summary import (
    RESOURCE_FIGURES,
    RunRecords,
    RunSummary,
    read_summary,
    write_summary,
)
from privzo.rundir.trajectory import read_run_trajectory, write_trajectory

__all__ = [
    "CONFIG_FILE",
    "MODEL_DIR",
    "PRIVACY_FILE",
    "RAY_STATE_DIR",
    "RESOURCE_FIGURES",
    "RESUME_FILE",
    "RUN_FILES",
    "SUMMARY_FILE",
    "TRAJECTORY_FILE",
    "TRAJECTORY_KEY_FILE",
    "ResumePoint",
    "RunDirectoryProgress",
    "RunRecords",
    "RunSummary",
    "can_resume",
    "check_output_dir",
    "finished",
    "finished_record",
    "holds_other_run",
    "holds_run",
    "mark_tracked",
    "prepare_output_dir",
    "read_json_object",
    "read_run_trajectory",
    "read_summary",
    "record_tracking_run",
    "refuse_other_run",
    "released_nothing",
    "resume_point",
    "starts_over",
    "unfinished_steps",
    "untracked",
    "write_atomically",
    "write_config",
    "write_json_atomically",
    "write_records",
    "write_resume_point",
    "write_summary",
    "write_text_atomically",
    "write_trajectory",
]
