"""Optional integrations: the one place that says which extra provides which package.

Everything the README's commands use is a core dependency; only integrations that reach outside
the product (the Hugging Face Hub, Optuna) stay optional. A command that needs one calls
``require_extra`` while validating its config, so it is refused before it writes or starts
anything, with the install command in the message. A leaf: imports no privzo module.
"""

from __future__ import annotations

import importlib.util

# package imported -> the privzo extra that installs it
EXTRAS = {"datasets": "hub", "optuna": "optuna"}


class MissingExtraError(ValueError):
    """A command needs an optional package that is not installed (a user error, like a bad
    config value: the CLI prints it and exits 2)."""


def require_extra(package: str, needed_for: str) -> None:
    """Raise ``MissingExtraError`` naming the extra when ``package`` is not importable."""
    if package not in EXTRAS:
        raise KeyError(f"{package!r} is not an optional dependency; known: {sorted(EXTRAS)}")
    if importlib.util.find_spec(package) is None:
        extra = EXTRAS[package]
        raise MissingExtraError(
            f"{needed_for} needs the optional package {package!r}: pip install 'privzo[{extra}]'"
            f" (or, in a checkout, pip install -e '.[{extra}]')"
        )
