"""An accountant's refusal of noise it cannot bound (``UnsupportedNoiseError``), which the
registry completes with the accountants that can."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

__all__ = ["NoiseBounds", "UnsupportedNoiseError"]


class NoiseBounds(Protocol):
    """What the refusal reads of an accountant class: the noise it bounds (``Accountant``
    states it), so that this module needs no accountant."""

    @property
    def grid_mechanisms(self) -> tuple[str, ...]: ...

    def bounds(self, mechanism: str, *, grid: bool = False, directions: int = 1) -> bool: ...


class UnsupportedNoiseError(ValueError):
    """An accountant's refusal of noise it cannot bound (a mechanism, or discrete noise).

    The full message also names the accountants that *can* bound the noise. Only the registry
    knows them, and it imports every accountant, each of which imports this module; so the
    accountant raises this with what it knows, and the registry, around each accountant it
    builds or calibrates, re-raises it completed by ``naming``. (Handing the registry to the
    accountants instead would reach them only on some paths, or reorder their validation.) An
    accountant built directly, not through the registry, refuses without the list. The fields
    are plain data, so the error pickles (a Ray worker may raise it).
    """

    reason: str = ""
    noise: str = ""  # what is refused, as the message names it
    mechanism: str | None = None  # the refused mechanism; None: any mechanism on a grid
    grid: bool = False  # the refused noise is discrete (on a grid)
    directions: int = 1  # the refused noise is a gridded vector of this many directions
    advice: str = ""

    @classmethod
    def refusing(
        cls,
        reason: str,
        noise: str,
        mechanism: str | None,
        advice: str = "",
        able: list[str] | None = None,
        *,
        grid: bool = False,
        directions: int = 1,
    ) -> UnsupportedNoiseError:
        """The refusal, listing ``able`` (the accountants that can) where given."""
        listed = "" if able is None else f"; accountants for {noise}: {able}"
        error = cls(f"{reason}{listed}{advice}")
        error.reason, error.noise, error.mechanism = reason, noise, mechanism
        error.grid, error.advice = grid or mechanism is None, advice
        error.directions = directions
        return error

    def can_bound(self, accountant: NoiseBounds) -> bool:
        """Whether ``accountant`` bounds the refused noise."""
        if self.mechanism is None:
            return bool(accountant.grid_mechanisms)
        return accountant.bounds(self.mechanism, grid=self.grid, directions=self.directions)

    def naming(self, accountants: Mapping[str, NoiseBounds]) -> UnsupportedNoiseError:
        """The same refusal, naming the accountants in ``accountants`` that can bound it."""
        able = [name for name, accountant in accountants.items() if self.can_bound(accountant)]
        return self.refusing(
            self.reason,
            self.noise,
            self.mechanism,
            self.advice,
            able,
            grid=self.grid,
            directions=self.directions,
        )
