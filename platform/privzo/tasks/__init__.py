"""Tasks: datasets, prompt templates, few-shot sampling, per-example losses and metrics."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from privzo.config import ConfigError, TaskConfig
from privzo.tasks.classification import (
    EncodedExamples,
    PromptClassificationTask,
    check_rows,
    sample_examples,
)
from privzo.tasks.data import Row, load_hf_rows, read_rows

TASKS = {"prompt-classification": PromptClassificationTask}


def _demo_sentiment() -> tuple[list[Row], list[Row]]:
    """The embedded demo's private task: 2000 synthetic reviews to train on, 1000 to test."""
    from privzo.demo_data import private_sentiment_task

    return private_sentiment_task(num_train=2000, num_test=1000, seed=0)


BUILTIN_DATASETS = {"demo-sentiment": _demo_sentiment}


@dataclass
class TaskSplits:
    train: list[Row]
    test: list[Row]


def load_splits(config: TaskConfig) -> TaskSplits:
    """Read and sample the train and held-out test rows, before any model is loaded."""
    if config.name not in TASKS:
        raise ConfigError(f"task.name={config.name!r} is unknown; allowed: {sorted(TASKS)}")
    if config.builtin_dataset is not None:
        if config.builtin_dataset not in BUILTIN_DATASETS:
            raise ConfigError(
                f"task.builtin_dataset={config.builtin_dataset!r} is unknown; allowed: "
                f"{sorted(BUILTIN_DATASETS)}"
            )
        pool, test_pool = BUILTIN_DATASETS[config.builtin_dataset]()
    elif config.train_path is not None:
        pool = read_rows(config.train_path, "task.train_path")
        test_pool = read_rows(config.test_path, "task.test_path") if config.test_path else None
    elif config.hf_dataset is not None:
        pool, test_pool = load_hf_rows(config.hf_dataset, config.hf_subset)
    else:
        raise ConfigError(
            "task: set task.train_path (a local file), task.hf_dataset or task.builtin_dataset"
        )
    if not pool:
        raise ConfigError(f"task.train_path={config.train_path!r} holds no rows")
    check_rows(pool, config, _source(config, "train"))
    if test_pool is not None:
        check_rows(test_pool, config, _source(config, "test"))
    if test_pool is None:  # hold out a disjoint test split from the training file
        pool, test_pool = _hold_out(pool, config.test_size or max(1, len(pool) // 5), config)
    test = _subsample(test_pool, config.test_size, config.data_seed)
    train = sample_examples(pool, config.label_field, config.examples_per_class, config.data_seed)
    return TaskSplits(train=train, test=test)


def _source(config: TaskConfig, split: str) -> str:
    """How a split is named in error messages: the config field and the file it points at."""
    path = config.train_path if split == "train" else config.test_path
    if path is not None:
        return f"task.{split}_path={path!r}"
    return f"{config.builtin_dataset or config.hf_dataset} ({split} split)"


def _hold_out(pool: list[Row], size: int, config: TaskConfig) -> tuple[list[Row], list[Row]]:
    if size >= len(pool):
        raise ConfigError(
            f"task.test_size={size} leaves no training rows out of {len(pool)}; give "
            "task.test_path or a smaller task.test_size"
        )
    order = np.random.default_rng(config.data_seed + 1).permutation(len(pool))
    return [pool[i] for i in order[size:]], [pool[i] for i in order[:size]]


def _subsample(rows: list[Row], size: int | None, seed: int) -> list[Row]:
    if size is None or size >= len(rows):
        return list(rows)
    chosen = np.random.default_rng(seed).choice(len(rows), size=size, replace=False)
    return [rows[i] for i in sorted(chosen)]


def build_task(
    config: TaskConfig, tokenizer, kind: str, position_limit: int | None = None
) -> PromptClassificationTask:
    return TASKS[config.name](config, tokenizer, kind, position_limit)


__all__ = [
    "TASKS",
    "EncodedExamples",
    "PromptClassificationTask",
    "TaskSplits",
    "build_task",
    "load_splits",
]
