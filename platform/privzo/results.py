"""Key access to a typed result's record: ``result["epsilon"]`` reads what ``to_dict`` writes.

A run's, search's, study's or audit's record on disk is a JSON object whose keys are a public
contract; callers written against that form read a typed result the same way, while code that
knows the type reads its attributes.
"""

from __future__ import annotations

from typing import Any


class RecordKeys:
    """``result[key]``, ``key in result`` and ``result.get(key)`` over ``to_dict()``."""

    def to_dict(self) -> dict[str, Any]:
        raise NotImplementedError

    def __getitem__(self, key: str) -> Any:
        return self.to_dict()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.to_dict()

    def get(self, key: str, default: Any = None) -> Any:
        return self.to_dict().get(key, default)
