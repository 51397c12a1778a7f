"""Tasks: datasets, prompt templates, few-shot sampling, per-example losses and metrics.

The package only re-exports: ``resolve`` fills a task config in for a model kind, ``sources``
reads its rows, ``splits`` checks and splits them, ``describe`` says which rows a run trains on,
``build`` makes the task object.
"""

from privzo.tasks.build import Task, build_task
from privzo.tasks.classification import EncodedExamples, PromptClassificationTask
from privzo.tasks.describe import data_lines, warn_cut_prompts, warn_unknown_tokens
from privzo.tasks.generation import GenerationTask
from privzo.tasks.presets import PRESETS
from privzo.tasks.resolve import CUSTOM_TASK, TASK_NAMES, is_generation, resolve_task_config
from privzo.tasks.sources import BUILTIN_DATASETS, check_revision, data_lineage, describe_source
from privzo.tasks.splits import TaskSplits, load_splits, split_salt

__all__ = [
    "BUILTIN_DATASETS",
    "CUSTOM_TASK",
    "PRESETS",
    "TASK_NAMES",
    "EncodedExamples",
    "GenerationTask",
    "PromptClassificationTask",
    "Task",
    "TaskSplits",
    "build_task",
    "check_revision",
    "data_lineage",
    "data_lines",
    "describe_source",
    "is_generation",
    "load_splits",
    "resolve_task_config",
    "split_salt",
    "warn_cut_prompts",
    "warn_unknown_tokens",
]
