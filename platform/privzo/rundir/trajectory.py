"""A run directory's trajectory file and the secret key of its keyed checksum.

The key is drawn from OS entropy when the run first writes its trajectory and stays in the
directory (``trajectory.key``, readable by its owner only); it is never logged or exported.
Every write of the trajectory carries the checksum it makes, so the run's owner can tell a
released copy that came back edited, its plain checksums recomputed, from the one the run wrote.
A directory without a key (a run from before keyed checksums) is read with the plain checks.
"""

from __future__ import annotations

import secrets
from pathlib import Path

import pyarrow as pa

from privzo.rundir.files import TRAJECTORY_FILE, TRAJECTORY_KEY_FILE, write_atomically
from privzo.zo.trajectory import TrajectoryMeta, read_trajectory, with_keyed_checksum

KEY_BYTES = 32


def write_trajectory(output_dir: Path, data: bytes) -> None:
    """The trajectory file's ``data`` with the directory's keyed checksum, atomically."""
    key = trajectory_key(output_dir) or _new_key(output_dir)
    write_atomically(output_dir / TRAJECTORY_FILE, with_keyed_checksum(data, key))


def read_run_trajectory(trajectory_path: Path) -> tuple[pa.Table, TrajectoryMeta]:
    """``read_trajectory``, checked against the key of the run directory it sits in, if any."""
    return read_trajectory(trajectory_path, trajectory_key(Path(trajectory_path).parent))


def trajectory_key(output_dir: Path) -> bytes | None:
    """The directory's trajectory key; None where the directory has none."""
    path = Path(output_dir) / TRAJECTORY_KEY_FILE
    return path.read_bytes() if path.is_file() else None


def _new_key(output_dir: Path) -> bytes:
    key = secrets.token_bytes(KEY_BYTES)
    write_atomically(Path(output_dir) / TRAJECTORY_KEY_FILE, key, mode=0o600)
    return key
