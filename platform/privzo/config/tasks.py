"""The ``task`` section of a run config: a preset or a custom prompt, its data and its sizes.

It lives here rather than in ``privzo.tasks``, whose package imports torch and transformers: a
config must load, and fail on a typo, before they do.
"""

from __future__ import annotations

import string
from collections.abc import Iterable, Mapping
from typing import Any, Literal

from pydantic import Field, model_validator

from privzo.section import Section

__all__ = [
    "DATA_SOURCES",
    "PadTo",
    "TaskConfig",
    "given_data_sources",
    "replace_data_source",
    "template_fields",
]

DATA_SOURCES = ("builtin_dataset", "data_dir", "train_path", "hf_dataset")
"""The task keys that each say where the training rows come from; a config gives one at most (a
preset without any reads its own hub source)."""
# keys that belong to one source and go with it when another source replaces it
_SOURCE_COMPANIONS = {"train_path": ("test_path",), "hf_dataset": ("hf_subset",)}

PadTo = Literal["max_length", "batch"]


class TaskConfig(Section):
    """A prompt-based task scored from the LM head: a named preset or a custom prompt.

    A preset (sst2, sst5, snli, mnli, rte, trec, boolq) fills ``template``, ``label_words``,
    ``label_field`` and the hub source for the model's kind; anything set here wins. The text
    fields are the template's ``{placeholders}`` (``{mask}`` marks a masked LM's scored slot).
    """

    name: str = Field("prompt-classification", description="A preset name or the custom task.")
    builtin_dataset: str | None = Field(
        None, description="A dataset that ships with privzo: 'demo-sentiment' (synthetic)."
    )
    data_dir: str | None = Field(
        None, description="A directory with train / test files (as `privzo data prepare` writes)."
    )
    train_path: str | None = None
    test_path: str | None = None
    hf_dataset: str | None = Field(None, description="HF datasets id, e.g. 'glue'.")
    hf_subset: str | None = Field(None, description="HF datasets config, e.g. 'sst2'.")
    revision: str | None = Field(
        None,
        min_length=1,
        description="Hub datasets only (task.hf_dataset or a preset's source): the branch, tag "
        "or commit for load_dataset; null = the default branch.",
    )
    label_field: str | None = Field(None, description="null = the preset's, else 'label'.")
    template: str | None = Field(
        None,
        description="Prompt with {field} slots; null = the preset's (custom: "
        "'{sentence} It was', plus ' {mask} .' for masked LMs).",
    )
    label_words: list[str] | None = Field(None, min_length=2)
    label_word_prefix: str | None = Field(
        None, description="What joins prompt and label word; null = the preset's (a space)."
    )
    answer_field: str = Field(
        "answers", description="Generation tasks: the field with the list of reference answers."
    )
    max_new_tokens: int = Field(32, ge=1, description="Generation tasks: greedy decoding length.")
    examples_per_class: int | None = Field(
        None, ge=1, description="Few-shot k per class (LM-BFF / MeZO RoBERTa: 16 or 512)."
    )
    train_size: int | None = Field(
        None, ge=1, description="Sample this many training examples (MeZO OPT: 1000)."
    )
    test_size: int | None = Field(1000, ge=1)
    validation_size: int | None = Field(
        None,
        ge=1,
        description="Hold out this many training rows as a validation split (MeZO: 500). It is "
        "private data: in a private run its metric is not released unless "
        "tracking.log_private_diagnostics (a search that selects on it accounts for it).",
    )
    data_seed: int = 0
    skip_invalid_rows: bool = Field(
        False, description="Skip and count rows with a missing field or label instead of failing."
    )
    max_length: int | None = Field(
        None, ge=4, description="Longest prompt in tokens; null = what the model's positions allow."
    )
    pad_to: PadTo | None = Field(
        None,
        description="How a training batch is padded. 'max_length': every forward is "
        "[micro-batch, max_length] and a batch is filled with masked public rows to "
        "privacy.max_batch_size, so shapes, time and memory depend only on settings; 'batch': "
        "to its longest member. null = 'max_length' for private zeroth-order runs, else 'batch'.",
    )

    @model_validator(mode="after")
    def _consistent(self) -> TaskConfig:
        if self.template is not None and not template_fields(self.template):
            raise ValueError(
                f"task.template={self.template!r} must contain at least one {{field}} slot"
            )
        if self.examples_per_class is not None and self.train_size is not None:
            raise ValueError("task.examples_per_class and task.train_size: set one, not both")
        given = given_data_sources(self.model_dump())
        if len(given) > 1:
            named = " and ".join(f"task.{key}={getattr(self, key)!r}" for key in given)
            raise ValueError(f"{named} both give the training rows; keep one of them")
        if self.test_path is not None and self.train_path is None:
            source = f"task.{given[0]}" if given else "a preset's hub source"
            raise ValueError(
                f"task.test_path={self.test_path!r} goes with task.train_path, but the rows come "
                f"from {source}; give task.train_path too, or unset task.test_path"
            )
        return self


def given_data_sources(task: Mapping[str, Any]) -> list[str]:
    """The data-source keys (``DATA_SOURCES``) a task mapping sets to something other than null."""
    return [key for key in DATA_SOURCES if task.get(key) is not None]


def replace_data_source(task: dict[str, Any], given: Iterable[str]) -> dict[str, Any]:
    """``task`` without the sources (and their companion keys) other than ``given``: a source
    named by a later file or an override replaces the earlier one rather than competing with
    it, since a run reads one source and the user named the one they want."""
    kept = set(given)
    if not kept:
        return task
    dropped = [key for key in DATA_SOURCES if key not in kept]
    dropped += [extra for key in dropped for extra in _SOURCE_COMPANIONS.get(key, ())]
    return {key: value for key, value in task.items() if key not in dropped}


def template_fields(template: str) -> list[str]:
    """The row fields a template reads, in order (``{mask}`` is not a field).

    Raises ValueError for a malformed template or a slot that is not a plain field name: rows
    fill templates by name and as plain text.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as error:
        raise ValueError(f"template {template!r} is malformed: {error}") from None
    names = []
    for _, name, spec, conversion in parsed:
        if name is None:
            continue
        if not name.isidentifier() or spec or conversion:
            raise ValueError(
                f"template {template!r}: slot {{{name}}} must be a plain field name, like "
                "{question}"
            )
        names.append(name)
    return [name for name in dict.fromkeys(names) if name != "mask"]
