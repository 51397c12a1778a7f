"""The memo of ε evaluations: one per public parameter set, for the process and, once a caller
names a directory, for every later process that names it too.

A PLD evaluation of the discrete Gaussian takes seconds, and a calibration needs about ten; a
run's preflight, a study's cells, a search's trials, a resumed run and a rerun of the same config
all ask for the same ones. Only floats are kept, keyed by the parameters of the evaluation
(never a PLD's arrays, never data). A stored value counts only for the same code: each entry
carries a fingerprint of privzo's privacy package and the versions of the numerical libraries
it calls, so an edit to an accountant or an upgrade reads nothing stale.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Callable, Hashable
from importlib import metadata
from pathlib import Path

__all__ = ["EPSILONS", "STORE_NAME", "EpsilonMemo", "code_fingerprint", "keep_epsilons_in"]

STORE_NAME = "epsilons.jsonl"  # in the directory a caller names (the model cache's)
# A store past this size starts over (about 60,000 entries): reading it stays well under a second
MAX_STORE_BYTES = 8 * 2**20
_LIBRARIES = ("dp-accounting", "numpy", "scipy", "mpmath")


def code_fingerprint() -> str:
    """A short hash of privzo's privacy package sources and the numerical libraries' versions:
    what an ε evaluation depends on besides its parameters."""
    digest = hashlib.sha256()
    package = Path(__file__).resolve().parents[1]  # privzo/privacy
    for source in sorted(package.rglob("*.py")):
        digest.update(source.relative_to(package).as_posix().encode())
        digest.update(source.read_bytes())
    for name in _LIBRARIES:
        try:
            digest.update(f"{name}=={metadata.version(name)}".encode())
        except metadata.PackageNotFoundError:
            digest.update(f"{name} absent".encode())
    return digest.hexdigest()[:16]


class EpsilonMemo:
    """ε by the public parameters of its evaluation, bounded in memory (the oldest goes first),
    and appended to a JSON-lines store once ``keep_in`` names one.

    Locked because a run's ε-curve thread evaluates while the run steps. The value is computed
    outside the lock: two threads (or processes) may both compute a missing one, which is only
    wasted time, since both get the same float.
    """

    def __init__(self, size: int) -> None:
        self._size = size
        self._values: dict[Hashable, float] = {}
        self._stored: dict[str, float] = {}
        self._store: Path | None = None
        self._fingerprint = ""
        self._lock = threading.Lock()

    @property
    def store(self) -> Path | None:
        """The JSON-lines file new evaluations go to (None: this process only)."""
        return self._store

    def keep_in(self, directory: Path | None) -> None:
        """Read the evaluations stored in ``directory`` by this code, and store new ones there
        (None: stop storing). A store that cannot be read or written is a cache miss, never an
        error."""
        store = None if directory is None else Path(directory) / STORE_NAME
        with self._lock:
            if self._store == store:
                return
            self._store = store
            if store is None:
                self._stored = {}
                return
            self._fingerprint = self._fingerprint or code_fingerprint()
            self._stored = _read_store(store, self._fingerprint)

    def get(self, key: Hashable, compute: Callable[[], float]) -> float:
        with self._lock:
            known = self._values.get(key)
            if known is None:
                known = self._stored.get(repr(key))
        if known is not None:
            return known
        value = float(compute())
        with self._lock:
            if len(self._values) >= self._size:
                self._values.pop(next(iter(self._values)))
            self._values[key] = value
            store, fingerprint = self._store, self._fingerprint
        if store is not None:
            _append(store, {"code": fingerprint, "key": repr(key), "epsilon": value})
        return value


def _read_store(store: Path, fingerprint: str) -> dict[str, float]:
    try:
        if store.stat().st_size > MAX_STORE_BYTES:
            store.unlink()
            return {}
        lines = store.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError):
        return {}
    found = {}
    for line in lines:
        try:
            entry = json.loads(line)
            if entry["code"] == fingerprint and isinstance(entry["epsilon"], float):
                found[str(entry["key"])] = entry["epsilon"]
        except (ValueError, KeyError, TypeError):  # a line cut short by a kill, or foreign
            continue
    return found


def _append(store: Path, entry: dict[str, object]) -> None:
    """One ``write`` of one line in append mode: processes appending at once do not interleave
    within a line (Linux appends a regular file's write atomically at its end)."""
    line = (json.dumps(entry) + "\n").encode()
    try:
        store.parent.mkdir(parents=True, exist_ok=True)
        descriptor = os.open(store, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError:
        return
    try:
        os.write(descriptor, line)
    except OSError:
        pass
    finally:
        os.close(descriptor)


EPSILONS = EpsilonMemo(4096)


def keep_epsilons_in(directory: Path) -> None:
    """Keep this process's ε evaluations in ``directory`` and read those stored there."""
    EPSILONS.keep_in(directory)
