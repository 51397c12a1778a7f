"""The task object for a resolved config: encoding, per-example losses and evaluation."""

from __future__ import annotations

from privzo.config.tasks import TaskConfig
from privzo.section import ConfigError
from privzo.tasks.classification import PromptClassificationTask
from privzo.tasks.generation import GenerationTask
from privzo.tasks.resolve import is_generation

__all__ = ["Task", "build_task"]


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
