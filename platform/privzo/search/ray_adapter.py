"""The one place privzo uses a private part of Ray.

A ``ResultGrid`` gives each trial's result but not the trial itself (its id and sampled
config, in the same order); Ray keeps those in the grid's private ``_experiment_analysis``.
``tests/unit/search/test_search.py`` checks the attribute is still where Ray puts it, so an
upgrade that moves it fails a test with this module's name instead of a search at its end.
"""

from __future__ import annotations

from typing import Any

__all__ = ["result_grid_trials"]

_PRIVATE_ANALYSIS = "_experiment_analysis"


def result_grid_trials(results: Any) -> list[Any]:
    """The Tune trials of a ``ResultGrid``, in the order of its results."""
    analysis = getattr(results, _PRIVATE_ANALYSIS, None)
    if analysis is None:
        raise RuntimeError(
            f"this Ray's ResultGrid has no {_PRIVATE_ANALYSIS}, which privzo reads the trials "
            "from; use a Ray release privzo supports (see pyproject.toml)"
        )
    return list(analysis.trials)
