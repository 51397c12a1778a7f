"""A run directory's file names and how every file in it is written.

Each file is written whole or not at all (a temporary file, flushed to disk, then renamed over
the old one), so a kill mid-write leaves the previous version and never an empty or half file
that a later command would read as a finished record.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from privzo.section import ConfigError

SUMMARY_FILE = "summary.json"
TRAJECTORY_FILE = "trajectory.parquet"
CONFIG_FILE = "config.yaml"
PRIVACY_FILE = "privacy.json"  # the ledger's state: mechanism, σ, q, steps accounted, ε spent
RESUME_FILE = "resume.json"  # what the same command needs to go on with an unfinished run
# the secret key of the trajectory's keyed checksum (``privzo.rundir.trajectory``): never released
TRAJECTORY_KEY_FILE = "trajectory.key"
MODEL_DIR = "model"
RUN_FILES = (SUMMARY_FILE, TRAJECTORY_FILE, CONFIG_FILE, PRIVACY_FILE)
RAY_STATE_DIR = "ray"  # a distributed run's Ray Train state and checkpoints (default storage)


def write_atomically(path: Path, data: bytes, mode: int = 0o666) -> None:
    """Write, flush to disk, then rename: a kill or a crash mid-write leaves the previous file
    whole. ``mode`` (less the umask) is the file's from its creation on (0o600: a secret). A
    write that fails (a full disk) removes its temporary file and names the record it was."""
    temporary = path.with_name(f".{path.name}.tmp")
    try:
        temporary.unlink(missing_ok=True)  # a kill's leftover keeps its mode on open
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC
        with open(os.open(temporary, flags, mode), "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except OSError as error:
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)
        raise OSError(
            error.errno,
            f"cannot write {str(path)!r} ({error.strerror}); the file is left as it was: "
            "free space or fix the directory, then run the same command again",
        ) from None


def write_text_atomically(path: Path, text: str) -> None:
    write_atomically(path, text.encode())


def write_json_atomically(path: Path, data: Any) -> None:
    """``data`` as indented JSON (values JSON cannot hold, such as paths, as their text)."""
    write_text_atomically(path, json.dumps(data, indent=2, default=str) + "\n")


def read_json_object(path: Path) -> dict[str, Any] | None:
    """The JSON object in ``path``; None when it is missing, empty, cut short or not an object,
    so a record that was never written whole never counts as one."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data else None


def read_record(path: Path) -> dict[str, Any]:
    """The JSON object a run wrote in ``path``, for a reader that goes on from it (a resume);
    a damaged or foreign file is a ConfigError naming it, not a traceback."""
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise malformed_record(path, f"not readable JSON: {error}") from None
    if not isinstance(data, dict):
        raise malformed_record(path, f"a JSON {type(data).__name__}, not an object")
    return data


def malformed_record(path: Path, problem: str) -> ConfigError:
    """The error for a run record privzo did not write: what is wrong and the way out."""
    return ConfigError(
        f"run record {str(path)!r} is malformed ({problem}); privzo did not write it this way: "
        "start the run again in another directory or with --overwrite"
    )


def check_output_dir(output_dir: Path, overwrite: bool) -> None:
    """Refuse to write over an earlier run's records (finished or not) unless asked to."""
    existing = [name for name in RUN_FILES if (output_dir / name).exists()]
    if existing and not overwrite:
        unfinished = (
            ""
            if SUMMARY_FILE in existing
            else (
                " of another config, or one that kept what it cannot go on from (a first-order "
                "run's weights without its summary)"
            )
        )
        raise ConfigError(
            f"--output-dir {str(output_dir)!r} already holds a"
            f"{'n unfinished' if unfinished else ''} run{unfinished} ({', '.join(existing)}); "
            "choose another directory (or pass --overwrite)"
        )


def prepare_output_dir(output_dir: Path) -> None:
    """Create the directory and clear an overwritten run's files, once the inputs are good,
    so a failing new run never sits next to an old summary that makes it look finished (or an
    old resume point that names another tracking run)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for name in (*RUN_FILES, RESUME_FILE, TRAJECTORY_KEY_FILE):
        (output_dir / name).unlink(missing_ok=True)
    # an earlier distributed run's Ray state: its checkpoints hold that run's noised steps
    shutil.rmtree(output_dir / RAY_STATE_DIR, ignore_errors=True)
