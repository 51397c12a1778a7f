"""The base of every config section and the error a bad config raises.

A leaf: each package's section (``privzo.models.config``, ``privzo.privacy.config``, ...) builds
on it, and ``privzo.config`` composes the sections, so it cannot live in ``privzo.config``
without each section importing the package that imports it.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["ConfigError", "Section"]


class ConfigError(ValueError):
    """A user error in a config: names the field, the value and what is allowed."""


class Section(BaseModel):
    """A config section: unknown keys are errors, and assignments are validated too."""

    # inf / nan are never meaningful settings (a learning rate, an ε, a clip): reject them all
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)
