"""A task's data in a few lines: where the rows come from, how many there are and, for
classification, which label is which word. ``privzo check`` and a run's first lines print them,
so a user sees which rows a run trains on before it starts."""

from __future__ import annotations

from collections import Counter

from privzo.config.tasks import TaskConfig
from privzo.tasks.resolve import is_generation
from privzo.tasks.sources import describe_source
from privzo.tasks.splits import TaskSplits

__all__ = ["data_lines"]


def data_lines(config: TaskConfig, splits: TaskSplits) -> list[str]:
    """Labelled lines (``privzo check``'s layout) for a resolved config and its splits."""
    sizes = f"{len(splits.train)} training, {len(splits.test)} test"
    if splits.validation:
        sizes += f", {len(splits.validation)} validation"
    if splits.skipped_rows:
        sizes += f" ({splits.skipped_rows} invalid rows skipped)"
    lines = [
        f"data        {describe_source(config)}",
        f"rows        {sizes} examples ({config.name})",
    ]
    if is_generation(config):
        lines.append(f"answers     field {config.answer_field!r}, scored by F1 and exact match")
        return lines
    assert config.label_words is not None, "resolve the task config first"
    label_field = config.label_field or "label"
    counts = Counter(row[label_field] for row in splits.train)
    mapping = ", ".join(
        f"{index} or {word!r} ({counts.get(index, 0)} training rows)"
        for index, word in enumerate(config.label_words)
    )
    lines.append(f"labels      field {label_field!r}: {mapping}")
    return lines
