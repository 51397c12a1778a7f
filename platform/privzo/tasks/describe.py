"""A task's data in a few lines: where the rows come from, how many there are and, for
classification, which label is which word. ``privzo check`` and a run's first lines print them,
so a user sees which rows a run trains on before it starts."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Sequence

from privzo.config.tasks import TaskConfig
from privzo.tasks.classification import EncodedExamples
from privzo.tasks.generation import GenerationExamples
from privzo.tasks.resolve import is_generation
from privzo.tasks.sources import describe_source
from privzo.tasks.splits import TaskSplits

__all__ = ["data_lines", "unknown_token_share", "warn_cut_prompts", "warn_unknown_tokens"]

logger = logging.getLogger(__name__)
# the share of a task's tokens unknown to the tokenizer above which a run warns: each of them
# reads as one symbol, so the model sees little of the text
UNKNOWN_TOKEN_WARNING = 0.02
# the share of a task's prompts cut to its max_length above which a run warns: prompts lose their
# start, so a limit below the data's usual length leaves the model little of each text
CUT_PROMPT_WARNING = 0.02


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


def unknown_token_share(
    examples: EncodedExamples | GenerationExamples, unknown_id: int | None
) -> float:
    """The share of the examples' tokens (template included) that are the unknown token."""
    if unknown_id is None:
        return 0.0
    sequences: Sequence[Sequence[int]]
    if isinstance(examples, EncodedExamples):
        sequences = examples.input_ids
    else:
        sequences = [*examples.prompt_ids, *examples.target_ids]
    total = sum(len(ids) for ids in sequences)
    unknown = sum(sum(1 for token in ids if token == unknown_id) for ids in sequences)
    return unknown / total if total else 0.0


def warn_unknown_tokens(
    examples: EncodedExamples | GenerationExamples, unknown_id: int | None, model: str
) -> None:
    """Warn on the console (the operator's, not a release) when the tokenizer of ``model``
    does not know more than ``UNKNOWN_TOKEN_WARNING`` of the training tokens."""
    share = unknown_token_share(examples, unknown_id)
    if share > UNKNOWN_TOKEN_WARNING:
        logger.warning(
            "%.0f %% of the training prompts' tokens are unknown to %s's tokenizer (each reads "
            "as one <unk> symbol): the model sees little of the text; use a model whose "
            "tokenizer covers the data's words (the built-in models know the demo task's words "
            "only)",
            100 * share,
            model,
        )


def warn_cut_prompts(
    examples: EncodedExamples | GenerationExamples, max_length: int | None
) -> None:
    """Warn on the console (the operator's, not a release) when more than
    ``CUT_PROMPT_WARNING`` of the training prompts lost their start to ``max_length``."""
    cut = [tokens for tokens in examples.cut_tokens if tokens > 0]
    if not examples.cut_tokens or len(cut) <= CUT_PROMPT_WARNING * len(examples.cut_tokens):
        return
    prompts = examples.input_ids if isinstance(examples, EncodedExamples) else examples.prompt_ids
    longest = max(
        len(ids) + tokens for ids, tokens in zip(prompts, examples.cut_tokens, strict=True)
    )
    logger.warning(
        "%.0f %% of the training prompts do not fit max_length=%s tokens and lose their "
        "start, %.0f tokens each on average (the longest prompt has %d): the model sees only "
        "their end; raise task.max_length, or set it to null for the model's limit",
        100 * len(cut) / len(examples.cut_tokens),
        max_length,
        sum(cut) / len(cut),
        longest,
    )
