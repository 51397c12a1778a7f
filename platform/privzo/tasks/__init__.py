"""Tasks: datasets, prompt templates, few-shot sampling, per-example losses and metrics."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from privzo.config.tasks import TaskConfig, template_fields
from privzo.section import ConfigError
from privzo.tasks.classification import (
    EncodedExamples,
    PromptClassificationTask,
    invalid_row_reason,
    sample_examples,
)
from privzo.tasks.data import SUFFIXES, UNREADABLE, Row, hash_order, load_hf_rows, read_rows
from privzo.tasks.generation import GenerationTask, generation_row_reason
from privzo.tasks.presets import PRESETS, HubSource, get_preset
from privzo.tracking import DatasetLineage

CUSTOM_TASK = "prompt-classification"
TASK_NAMES = (CUSTOM_TASK, *PRESETS)
_CUSTOM_TEMPLATES = {"causal": "{sentence} It was", "masked": "{sentence} It was {mask} ."}
_CUSTOM_LABEL_WORDS = ("terrible", "great")


def _demo_sentiment() -> tuple[list[Row], list[Row]]:
    """The embedded demo's private task: 2000 synthetic reviews to train on, 1000 to test."""
    from privzo.demo_data import private_sentiment_task

    return private_sentiment_task(num_train=2000, num_test=1000, seed=0)


BUILTIN_DATASETS = {"demo-sentiment": _demo_sentiment}


def resolve_task_config(config: TaskConfig, kind: str) -> TaskConfig:
    """The task config with the preset's template, label words and label field filled in for
    this model kind ('causal' or 'masked'); what the user set is kept."""
    if config.name not in TASK_NAMES:
        raise ConfigError(f"task.name={config.name!r} is unknown; allowed: {list(TASK_NAMES)}")
    preset = get_preset(config.name)
    templates = preset.templates if preset else _CUSTOM_TEMPLATES
    words = preset.label_words.get(kind) if preset else _CUSTOM_LABEL_WORDS
    if config.template is None and kind not in templates:
        raise ConfigError(
            f"task.name={config.name!r} has no {kind} LM prompt (the papers use it with "
            f"{' and '.join(sorted(templates))} LMs); set task.template and task.label_words"
        )
    if is_generation(config):
        if kind != "causal":
            raise ConfigError(f"task.name={config.name!r} generates answers: it needs a causal LM")
        if config.examples_per_class is not None:
            raise ConfigError(
                f"task.examples_per_class with task.name={config.name!r}: a generation task has "
                "no classes; use task.train_size"
            )
        return config.model_copy(
            update={"template": config.template or templates[kind], **_paper_sampling(config, kind)}
        )
    return config.model_copy(
        update={
            **_paper_sampling(config, kind),
            "template": config.template or templates[kind],
            "label_words": config.label_words or list(words or _CUSTOM_LABEL_WORDS),
            "label_field": config.label_field or (preset.label_field if preset else "label"),
            "label_word_prefix": _first_set(
                config.label_word_prefix, preset.label_word_prefix if preset else None, " "
            ),
        }
    )


def _first_set(*values: str | None) -> str:
    return next(value for value in values if value is not None)


def _paper_sampling(config: TaskConfig, kind: str) -> dict[str, int]:
    """A preset's training-set size when the config sets none: LM-BFF / MeZO's k = 512 per class
    for masked LMs, MeZO's 1000 examples for causal LMs."""
    if get_preset(config.name) is None or config.examples_per_class or config.train_size:
        return {}
    if kind == "masked":
        return {"examples_per_class": 512}
    return {"train_size": 1000}


def is_generation(config: TaskConfig) -> bool:
    preset = get_preset(config.name)
    return preset is not None and preset.task_type == "generation"


@dataclass
class TaskSplits:
    train: list[Row]
    test: list[Row]
    validation: list[Row] = field(default_factory=list)  # part of the private training data
    skipped_rows: int = 0


def load_splits(config: TaskConfig) -> TaskSplits:
    """Read, check and sample the train and held-out test rows (``config`` resolved)."""
    check_revision(config)
    pool, test_pool = _read_pools(config)
    pool = _adapt_rows(pool, config)
    test_pool = _adapt_rows(test_pool, config) if test_pool is not None else None
    if not pool:
        raise ConfigError(f"{_source(config, 'train')} holds no rows")
    pool, skipped_train = _valid_rows(pool, config, _source(config, "train"))
    skipped_test = 0
    if test_pool is not None:
        test_pool, skipped_test = _valid_rows(test_pool, config, _source(config, "test"))
    if test_pool is None:  # hold out a disjoint test split from the training file
        pool, test_pool = _hold_out(pool, config.test_size or max(1, len(pool) // 5), config)
    test = _subsample(test_pool, config.test_size, config.data_seed)
    validation: list[Row] = []
    if config.validation_size is not None:  # drawn from the (private) training pool
        pool, validation = _hold_out(pool, config.validation_size, config, "validation_size")
    if config.train_size is not None or is_generation(config):
        train = _select_by_hash(pool, config.train_size, split_salt(config, "train_size"))
    else:
        label_field = config.label_field or "label"
        salt = split_salt(config, "examples_per_class")
        train = sample_examples(pool, label_field, config.examples_per_class, salt)
    skipped = skipped_train + skipped_test
    return TaskSplits(train=train, test=test, validation=validation, skipped_rows=skipped)


def _read_pools(config: TaskConfig) -> tuple[list[Row], list[Row] | None]:
    """(training pool, test pool or None to hold one out) from the configured source."""
    if config.builtin_dataset is not None:
        if config.builtin_dataset not in BUILTIN_DATASETS:
            raise ConfigError(
                f"task.builtin_dataset={config.builtin_dataset!r} is unknown; allowed: "
                f"{sorted(BUILTIN_DATASETS)}"
            )
        return BUILTIN_DATASETS[config.builtin_dataset]()
    if config.data_dir is not None:
        return _read_data_dir(Path(config.data_dir).expanduser())
    if config.train_path is not None:
        train = read_rows(config.train_path, "task.train_path")
        test = read_rows(config.test_path, "task.test_path") if config.test_path else None
        return train, test
    source = _hub_source(config)
    if source is None:
        raise ConfigError(
            "task: set task.data_dir, task.train_path (local files), task.hf_dataset or "
            "task.builtin_dataset (a preset task falls back to its hub dataset)"
        )
    return load_hf_rows(source)


def _read_data_dir(directory: Path) -> tuple[list[Row], list[Row]]:
    if not directory.is_dir():
        raise ConfigError(f"task.data_dir={str(directory)!r}: directory does not exist")
    splits = []
    for split in ("train", "test"):
        found = [directory / f"{split}{suffix}" for suffix in SUFFIXES]
        existing = [path for path in found if path.is_file()]
        if not existing:
            raise ConfigError(
                f"task.data_dir={str(directory)!r} has no {split} file; expected one of "
                f"{[path.name for path in found]}"
            )
        splits.append(read_rows(existing[0], "task.data_dir"))
    return splits[0], splits[1]


def _hub_source(config: TaskConfig) -> HubSource | None:
    if config.hf_dataset is not None:
        return HubSource(config.hf_dataset, config.hf_subset, revision=config.revision)
    preset = get_preset(config.name)
    if preset is None or preset.source is None:
        return None
    return dataclasses.replace(preset.source, revision=config.revision)


def _local_source(config: TaskConfig) -> bool:
    """The rows come from privzo or local files, not from the hub."""
    return any(
        value is not None for value in (config.builtin_dataset, config.data_dir, config.train_path)
    )


def check_revision(config: TaskConfig) -> None:
    """``task.revision`` pins a hub dataset; with local or built-in data it would pin nothing."""
    if config.revision is not None and (_local_source(config) or _hub_source(config) is None):
        raise ConfigError(
            f"task.revision={config.revision!r}: a revision pins a hub dataset (task.hf_dataset "
            "or a preset's hub source), but this task reads built-in or local data; unset it"
        )


def data_lineage(config: TaskConfig) -> list[DatasetLineage]:
    """Where the run's rows came from, by public identifiers only (hub id, subset, split,
    revision, or a file path): never a digest or profile of the rows themselves."""
    if config.builtin_dataset is not None:
        source = {"builtin_dataset": config.builtin_dataset}
        return [DatasetLineage(config.builtin_dataset, "privzo", source, "train")]
    if _local_source(config):
        files = {"train": config.data_dir or config.train_path, "test": config.test_path}
        return [
            DatasetLineage(Path(path).name, "local", {"path": str(path)}, context)
            for context, path in files.items()
            if path is not None
        ]
    hub = _hub_source(config)
    if hub is None:
        return []
    name = hub.dataset if hub.subset is None else f"{hub.dataset}/{hub.subset}"
    return [
        DatasetLineage(
            name,
            "hugging_face",
            {
                "path": hub.dataset,
                "config_name": hub.subset,
                "split": split,
                "revision": hub.revision,
            },
            context,
        )
        for context, split in (("train", hub.train_split), ("test", hub.test_split))
    ]


def _adapt_rows(rows: list[Row], config: TaskConfig) -> list[Row]:
    """Hub rows keep answers nested (SQuAD: answers["text"]); give the task a plain list."""
    preset = get_preset(config.name)
    if preset is None or preset.answers_from is None:
        return rows
    outer, inner = preset.answers_from
    adapted = []
    for row in rows:
        nested = row.get(outer)
        if isinstance(nested, dict) and inner in nested:
            row = {**row, config.answer_field: list(nested[inner])}
        adapted.append(row)
    return adapted


def _row_reason(row: Row, config: TaskConfig) -> str | None:
    if UNREADABLE in row:
        return row[UNREADABLE]
    if is_generation(config):
        assert config.template is not None
        return generation_row_reason(row, template_fields(config.template), config.answer_field)
    return invalid_row_reason(row, config)


def _valid_rows(rows: list[Row], config: TaskConfig, source: str) -> tuple[list[Row], int]:
    """The rows fit for the task; a bad row fails the run unless ``skip_invalid_rows``."""
    kept = []
    for index, row in enumerate(rows):
        reason = _row_reason(row, config)
        if reason is None:
            kept.append(row)
        elif not config.skip_invalid_rows:
            raise ConfigError(
                f"{source} row {index}: {reason} (set task.skip_invalid_rows=true to skip such "
                "rows and count them)"
            )
    if not kept:
        raise ConfigError(f"{source}: no valid rows out of {len(rows)}")
    return kept, len(rows) - len(kept)


def _source(config: TaskConfig, split: str) -> str:
    """How a split is named in error messages: the config field and the file it points at."""
    path = config.train_path if split == "train" else config.test_path
    if path is not None:
        return f"task.{split}_path={path!r}"
    if config.data_dir is not None:
        return f"task.data_dir={config.data_dir!r} ({split} split)"
    origin = config.builtin_dataset or config.hf_dataset or config.name
    return f"{origin} ({split} split)"


def _hold_out(
    pool: list[Row], size: int, config: TaskConfig, setting: str = "test_size"
) -> tuple[list[Row], list[Row]]:
    """(the rest in file order, the ``size`` rows of lowest salted content hash).

    By hash, not by a permutation of the pool, so one added record changes the held-out rows by
    at most the one it displaces (``privzo.tasks.data.record_hash``)."""
    if size >= len(pool):
        raise ConfigError(
            f"task.{setting}={size} leaves no training rows out of {len(pool)}; use a smaller "
            f"task.{setting}" + (" or give task.test_path" if setting == "test_size" else "")
        )
    order = hash_order(pool, split_salt(config, setting))
    held = set(order[:size])
    return [row for i, row in enumerate(pool) if i not in held], [pool[i] for i in order[:size]]


def split_salt(config: TaskConfig, purpose: str) -> str:
    """The public salt of one split or selection: its purpose and the task's data seed."""
    return f"privzo:{purpose}:{config.data_seed}"


def _subsample(rows: list[Row], size: int | None, seed: int) -> list[Row]:
    """``size`` test rows in file order, seeded: the test file is not the private data."""
    if size is None or size >= len(rows):
        return list(rows)
    chosen = np.random.default_rng(seed).choice(len(rows), size=size, replace=False)
    return [rows[i] for i in sorted(chosen)]


def _select_by_hash(rows: list[Row], size: int | None, salt: str) -> list[Row]:
    """The ``size`` private rows of lowest salted content hash (all when None), in hash order:
    one added record changes the selection by at most the one it displaces."""
    order = hash_order(rows, salt)
    return [rows[i] for i in order[:size]]


Task = PromptClassificationTask | GenerationTask


def build_task(config: TaskConfig, tokenizer, kind: str, position_limit: int | None = None) -> Task:
    """The task object for a resolved config: encoding, per-example losses and evaluation."""
    if not is_generation(config):
        return PromptClassificationTask(config, tokenizer, kind, position_limit)
    assert config.template is not None
    too_long = position_limit is not None and (config.max_length or 0) > position_limit
    if too_long:
        raise ConfigError(
            f"task.max_length={config.max_length} exceeds the {position_limit} positions "
            "this model takes"
        )
    return GenerationTask(
        tokenizer,
        template=config.template,
        answer_field=config.answer_field,
        max_length=config.max_length or position_limit,
        max_new_tokens=config.max_new_tokens,
        answer_suffix="\n",  # MeZO's training target: the answer, then a newline
    )


__all__ = [
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
    "load_splits",
    "resolve_task_config",
]
