"""A task config resolved for a model kind: the preset's (or the custom task's) template, label
words, label field and paper sampling filled in where the user set none."""

from __future__ import annotations

from privzo.config.tasks import TaskConfig
from privzo.section import ConfigError
from privzo.tasks.presets import PRESETS, get_preset

__all__ = ["CUSTOM_TASK", "TASK_NAMES", "is_generation", "resolve_task_config"]

CUSTOM_TASK = "prompt-classification"
TASK_NAMES = (CUSTOM_TASK, *PRESETS)
_CUSTOM_TEMPLATES = {"causal": "{sentence} It was", "masked": "{sentence} It was {mask} ."}
_CUSTOM_LABEL_WORDS = ("terrible", "great")


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
