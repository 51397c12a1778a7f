"""What an accountant is asked about, whatever the noise multiplier: the one statement of the
steps, sampling rate, δ, mechanism, accountant and noise parameters that ε and calibration share.

A caller builds one ``AccountingQuery`` and asks it both ways (ε at a σ, σ for an ε) through
the registry, so no layer restates the list as keyword arguments.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

__all__ = ["AccountingQuery"]


@dataclass(frozen=True)
class AccountingQuery:
    """``steps`` Poisson-subsampled steps of ``mechanism`` at ``sample_rate``, accounted at
    ``delta`` by ``accountant``; ``noise_parameters`` are a parametrised mechanism's settings
    (lmo's) or the grid of discrete noise (``{"grid": K}``).

    Plain data: the accountant validates every field when asked, so an error names the field
    as the accountant sees it.
    """

    sample_rate: float
    steps: int
    delta: float
    mechanism: str = "gaussian"
    accountant: str = "pld"
    noise_parameters: dict[str, Any] | None = None

    def curve_key(self, *how: Hashable) -> tuple[Hashable, ...]:
        """What identifies one ε(σ) curve of this query (the memo's key): every field, plus
        ``how`` the curve is computed."""
        parameters = sorted((self.noise_parameters or {}).items())
        return (
            self.accountant,
            self.mechanism,
            self.delta,
            self.sample_rate,
            self.steps,
            repr(parameters),
            *how,
        )

    def describe(self, epsilon: float) -> str:
        """The calibration problem of meeting ``epsilon``, as messages name it."""
        return (
            f"epsilon={epsilon}, delta={self.delta} with {self.steps} steps of the "
            f"{self.mechanism} mechanism at sample_rate={self.sample_rate}"
        )
