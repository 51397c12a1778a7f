"""A task's splits: its rows checked, the test split held out where no test file is given, the
validation split drawn and the training rows selected, each by salted content hash."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from privzo.config.tasks import TaskConfig, template_fields
from privzo.section import ConfigError
from privzo.tasks.classification import invalid_row_reason, label_index, sample_examples
from privzo.tasks.data import UNREADABLE, Row, hash_order
from privzo.tasks.generation import generation_row_reason
from privzo.tasks.presets import get_preset
from privzo.tasks.resolve import is_generation
from privzo.tasks.sources import check_revision, read_pools

__all__ = ["TaskSplits", "load_splits", "split_salt"]


@dataclass
class TaskSplits:
    train: list[Row]
    test: list[Row]
    validation: list[Row] = field(default_factory=list)  # part of the private training data
    skipped_rows: int = 0


def load_splits(config: TaskConfig) -> TaskSplits:
    """Read, check and sample the train and held-out test rows (``config`` resolved)."""
    check_revision(config)
    pool, test_pool = read_pools(config)
    pool = _adapt_rows(pool, config)
    test_pool = _adapt_rows(test_pool, config) if test_pool is not None else None
    if not pool:
        raise ConfigError(f"{_source(config, 'train')} holds no rows")
    pool, skipped_train = _usable_rows(pool, config, _source(config, "train"))
    skipped_test = 0
    if test_pool is not None:
        test_pool, skipped_test = _usable_rows(test_pool, config, _source(config, "test"))
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


def _usable_rows(rows: list[Row], config: TaskConfig, source: str) -> tuple[list[Row], int]:
    """The valid rows, labels as indices into the label words, and the count skipped."""
    _check_fields(rows, config, source)
    kept, skipped = _valid_rows(rows, config, source)
    if is_generation(config):
        return kept, skipped
    assert config.label_words is not None, "resolve the task config first"
    label_field, words = config.label_field or "label", config.label_words
    return [{**row, label_field: label_index(row[label_field], words)} for row in kept], skipped


def _check_fields(rows: list[Row], config: TaskConfig, source: str) -> None:
    """Refuse a file none of whose rows has a field the task reads, naming the fields it has:
    a column named otherwise is the usual cause, not a bad first row."""
    assert config.template is not None, "resolve the task config first"
    needed = {name: "read by task.template" for name in template_fields(config.template)}
    if is_generation(config):
        needed[config.answer_field] = "task.answer_field: the reference answers"
    else:
        needed[config.label_field or "label"] = "task.label_field: the labels"
    present = {key for row in rows if UNREADABLE not in row for key in row}
    if not present:
        return  # no readable row: the row check names the first one and why
    for name, role in needed.items():
        if name not in present:
            raise ConfigError(
                f"{source}: no row has the field {name!r} ({role}); its rows have the fields "
                f"{sorted(present)}: name one of them in the config, or rename the column"
            )


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
