"""The base of every config section and the error a bad config raises.

A leaf: each package's section (``privzo.models.config``, ``privzo.privacy.config``, ...) builds
on it, and ``privzo.config`` composes the sections, so it cannot live in ``privzo.config``
without each section importing the package that imports it.
"""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

__all__ = ["ConfigError", "Section"]


class ConfigError(ValueError):
    """A user error in a config: names the field, the value and what is allowed."""


class Section(BaseModel):
    """A config section: unknown keys are errors, and assignments are validated too."""

    # inf / nan are never meaningful settings (a learning rate, an ε, a clip): reject them all
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        """Refuse true/false for a number: pydantic reads them as 1 and 0, so a YAML ``true``
        or an override ``steps=true`` would run silently with 1 (or 0)."""
        if not isinstance(value, bool) or info.field_name is None:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        kinds = _accepted_types(annotation)
        if bool in kinds or not kinds & {int, float}:
            return value
        raise ValueError(
            f"true/false is not a number; give a {'whole ' if float not in kinds else ''}number"
        )


def _accepted_types(annotation: Any) -> set[Any]:
    """The plain types an annotation accepts at the top level, through Optional, unions and
    ``Annotated`` (a field's constraints wrap its type in ``Annotated``)."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _accepted_types(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return set().union(*(_accepted_types(arg) for arg in typing.get_args(annotation)))
    if origin is typing.Literal:
        return {type(arg) for arg in typing.get_args(annotation)}
    return {annotation}
