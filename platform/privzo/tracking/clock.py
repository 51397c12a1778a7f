"""The public clock of private work's releases: one fixed time instead of the wall clock.

A private run's duration follows its sampled batches (a batch is padded to its longest record,
an empty Poisson batch skips its forwards), so no time it releases may come from the wall clock.
Every record of private work (a private run, the trials and parent of a private search, the
cells and parent of a study of private algorithms, the audit of a private run) carries this
instead: its MLflow run starts and ends at :data:`PUBLIC_TIME_MS`, a metric of step ``s`` is
stamped ``PUBLIC_TIME_MS + s``, every ``MLmodel`` says it was created at
:data:`PUBLIC_UTC_TIME_CREATED`, and every file and folder it writes into a local artifact store
(and every file ``privzo export-best`` copies) has that time as its access and modification
time. Non-private work (MeZO, AdamW, a study of non-private arms only) keeps real times.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["PUBLIC_TIME_MS", "PUBLIC_UTC_TIME_CREATED", "stamp_mlmodel", "stamp_public_time"]

PUBLIC_TIME_MS = 946_684_800_000
"""2000-01-01T00:00:00Z in ms: fixed, plainly not a real time, and nonzero (MLflow replaces a
zero start time with its own clock)."""

PUBLIC_UTC_TIME_CREATED = str(
    datetime.fromtimestamp(PUBLIC_TIME_MS / 1000, tz=timezone.utc).replace(tzinfo=None)
)
"""The same time as ``MLmodel`` writes ``utc_time_created`` (a naive UTC datetime's ``str``)."""


def stamp_public_time(path: Path, *, recursive: bool = True) -> None:
    """Set the access and modification times of ``path`` and, for a folder unless not
    ``recursive``, of everything under it to :data:`PUBLIC_TIME_MS` (children first, since
    writing into a folder touches it).
    The inode change time cannot be set, and any later read moves the access time: both are
    the file system's own, outside any release."""
    path = Path(path)
    seconds = PUBLIC_TIME_MS / 1000
    if recursive and path.is_dir() and not path.is_symlink():
        for folder, names, files in os.walk(path, topdown=False):
            for name in (*files, *names):
                os.utime(os.path.join(folder, name), (seconds, seconds), follow_symlinks=False)
    os.utime(path, (seconds, seconds), follow_symlinks=False)


def stamp_mlmodel(model_dir: Path) -> None:
    """Rewrite ``model_dir/MLmodel`` (as MLflow writes it) to say it was created at
    :data:`PUBLIC_UTC_TIME_CREATED`: MLflow's ``save_model`` takes no creation time and stamps
    the moment training ended."""
    import yaml

    path = Path(model_dir) / "MLmodel"
    data = yaml.safe_load(path.read_text())
    data["utc_time_created"] = PUBLIC_UTC_TIME_CREATED
    path.write_text(yaml.safe_dump(data, default_flow_style=False))
