"""One run per output directory: a lock file held for as long as the run lives.

Two runs writing into one ``--output-dir`` overwrite each other's records, so a run takes
``DIR/.privzo.lock`` before it checks or loads anything and a second run into DIR is refused,
naming the holder's PID and host.

Exclusion comes from ``fcntl.flock`` on the lock file, not from the file's existence: the kernel
drops a flock when its process dies, however it dies (SIGKILL included), so a lock can never
outlive its holder and block the directory for good. The file's content (the holder's PID and
host) is for the refusal message and for a second check: a file left behind by a killed run
whose PID is still alive on this host is either a reused PID or a file system that ignores
flock, and is refused rather than taken over. A file left by a dead process on this host, or
whose flock its host released (on shared storage), is stale and taken over.

A lock only costs a directory the run did not have to create: on release it removes its file
and the directories it created that stayed empty, so a run refused by its config writes
nothing.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

logger = logging.getLogger(__name__)
LOCK_FILE = ".privzo.lock"
_ATTEMPTS = 5  # a holder releasing (unlinking) between our open and flock: try a fresh file

_F = TypeVar("_F", bound=Callable[..., Any])


class DirectoryLockedError(ValueError):
    """Another live process holds the directory (a user error: choose another directory)."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lock, as written in its file."""

    pid: int
    host: str

    def describe(self) -> str:
        return f"PID {self.pid} on host {self.host!r}"


class DirectoryLock:
    """An exclusive, process-wide lock on a directory (a context manager; not re-entrant)."""

    def __init__(self, directory: Path, purpose: str = "run") -> None:
        self.directory = Path(directory)
        self.path = self.directory / LOCK_FILE
        self.purpose = purpose
        self._fd: int | None = None
        self._created: list[Path] = []  # directories made for the lock, innermost last

    def __enter__(self) -> DirectoryLock:
        self.acquire()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lock, or raise DirectoryLockedError naming the live holder."""
        self._created = _make_directories(self.directory)
        try:
            for _ in range(_ATTEMPTS):
                if self._try_acquire():
                    return
            raise DirectoryLockedError(
                f"--output-dir {str(self.directory)!r}: its lock file {LOCK_FILE} kept changing "
                f"hands ({_ATTEMPTS} attempts); another run is starting or ending there"
            )
        except BaseException:
            self._remove_empty_directories()
            raise

    def _try_acquire(self) -> bool:
        """One attempt: True when held; False when the file was replaced under us."""
        import fcntl  # POSIX only: imported here so privzo still imports elsewhere

        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise self._refusal(read_holder(self.path), live=True) from None
        if not _same_file(fd, self.path):  # its holder unlinked it after our open: retry
            os.close(fd)
            return False
        previous = _read_holder_fd(fd)
        if previous is not None and not _stale(previous):
            os.close(fd)  # also drops our flock on it
            raise self._refusal(previous, live=False)
        if previous is not None:
            logger.warning(
                "%s: taking over the stale lock of %s (that process has ended)",
                self.directory,
                previous.describe(),
            )
        _write_holder(fd, Holder(os.getpid(), socket.gethostname()))
        self._fd = fd
        return True

    def _refusal(self, holder: Holder | None, *, live: bool) -> DirectoryLockedError:
        who = holder.describe() if holder else "a process that is starting (no PID written yet)"
        if live:
            return DirectoryLockedError(
                f"--output-dir {str(self.directory)!r} is in use by another {self.purpose} "
                f"({who}); wait for it to end or choose another directory"
            )
        return DirectoryLockedError(
            f"--output-dir {str(self.directory)!r} holds the lock file of {who}, which is still "
            f"alive; if that is not a privzo {self.purpose}, delete {self.path} and run again"
        )

    def release(self) -> None:
        """Remove the lock file (while still holding it), drop the lock, tidy empty dirs."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            if _same_file(fd, self.path):
                self.path.unlink()
        finally:
            os.close(fd)
            self._remove_empty_directories()

    def _remove_empty_directories(self) -> None:
        for directory in reversed(self._created):
            try:
                directory.rmdir()  # only succeeds when empty: a run's records are kept
            except OSError:
                break
        self._created = []


def locks_output_dir(function: _F) -> _F:
    """Decorate ``function(config, output_dir, ...)`` to run holding ``output_dir``'s lock."""
    signature = inspect.signature(function)

    @functools.wraps(function)
    def locked(*args: Any, **kwargs: Any) -> Any:
        output_dir = Path(signature.bind(*args, **kwargs).arguments["output_dir"])
        with DirectoryLock(output_dir.expanduser().resolve()):
            return function(*args, **kwargs)

    return locked  # type: ignore[return-value]


def read_holder(path: Path) -> Holder | None:
    """The holder written in a lock file; None when it is missing, empty or unreadable."""
    try:
        return _parse_holder(path.read_text())
    except OSError:
        return None


def _parse_holder(text: str) -> Holder | None:
    try:
        data = json.loads(text)
        return Holder(int(data["pid"]), str(data["host"]))
    except (ValueError, KeyError, TypeError):
        return None


def _read_holder_fd(fd: int) -> Holder | None:
    os.lseek(fd, 0, os.SEEK_SET)
    return _parse_holder(os.read(fd, 4096).decode("utf-8", errors="replace"))


def _write_holder(fd: int, holder: Holder) -> None:
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, (json.dumps({"pid": holder.pid, "host": holder.host}) + "\n").encode())


def _stale(holder: Holder) -> bool:
    """Whether a lock file whose flock we just obtained may be taken over.

    Another host's process cannot be probed from here; its flock being free is the answer
    (shared storage with working locks releases a dead client's). On this host a live PID means
    a reused PID or a file system that ignores flock: not ours to take.
    """
    if holder.host != socket.gethostname() or holder.pid == os.getpid():
        return True
    return not _alive(holder.pid)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: an existence check, nothing is sent
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by another user
        return True
    return True


def _same_file(fd: int, path: Path) -> bool:
    try:
        opened, named = os.fstat(fd), os.stat(path)
    except FileNotFoundError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)


def _make_directories(directory: Path) -> list[Path]:
    """mkdir -p, returning the directories it created (outermost first)."""
    missing = []
    current = directory
    while not current.exists():
        missing.append(current)
        current = current.parent
    directory.mkdir(parents=True, exist_ok=True)
    return list(reversed(missing))


@contextlib.contextmanager
def waited_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path`` (created if missing), waited for and held for the
    block: processes that share a cache or a store take turns at a one-off build. The kernel
    drops it with its holder, however that process ends. Without ``fcntl`` (not POSIX), no
    lock."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
