"""An audit's secret draw on disk: its canaries, their coins, the private rows replayed beside
them and, once trained, the canaries' losses under the fine-tuned model.

An audited run that stops goes on from its own trajectory, as any run does, so it must train on
the same rows again; and an audit stopped after its run finished is scored from what the run
left. Both need the draw, so it is kept in the audit's directory (``canaries.secret.json``,
readable by its owner only, written whole or not at all) and read back by the same command. The
coins decide which canaries are in the private data, and the audit is valid only while they are
secret from the training: the file is never logged, never an artifact and never printed; only
counts leave it. It names the run config and audit settings it was drawn for (by a digest), and
another's is refused.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from privzo.audit.config import AuditConfig
from privzo.config.loading import dump_config
from privzo.config.run import RunConfig
from privzo.rundir import write_atomically
from privzo.section import ConfigError
from privzo.tasks.data import Row

DRAW_FILE = "canaries.secret.json"
SECRET_MODE = 0o600  # its owner reads it; nobody else on the machine


@dataclass(frozen=True)
class CanaryDraw:
    """What the audit drew in secret for one run (see the module docstring)."""

    canaries: list[Row]
    included: np.ndarray  # the coins: True = the canary is in the private training rows
    references: list[int]  # the private rows (their indices) replayed beside the canaries
    training_rows: int  # the private rows before the canaries
    tuned_losses: np.ndarray | None = None  # each canary's loss under the fine-tuned model


def draw_digest(config: RunConfig, audit: AuditConfig) -> str:
    """The run config and audit settings a draw belongs to, as a digest (nothing secret)."""
    settings = json.dumps(audit.model_dump(mode="json"), sort_keys=True)
    return hashlib.sha256(f"{dump_config(config)}\n{settings}".encode()).hexdigest()


def save_draw(directory: Path, digest: str, draw: CanaryDraw) -> None:
    """The draw in ``directory``, atomically and readable by its owner only."""
    data = {
        "digest": digest,
        "canaries": draw.canaries,
        "included": [bool(kept) for kept in draw.included],
        "references": draw.references,
        "training_rows": draw.training_rows,
        "tuned_losses": None if draw.tuned_losses is None else draw.tuned_losses.tolist(),
    }
    write_atomically(Path(directory) / DRAW_FILE, json.dumps(data).encode(), mode=SECRET_MODE)


def load_draw(directory: Path, digest: str, why: str) -> CanaryDraw:
    """The draw saved in ``directory`` for this digest; ``why`` says what needs it (the refusal
    names it). Missing, damaged or another config's draw is a ConfigError with the way out."""
    path = Path(directory) / DRAW_FILE
    if not path.is_file():
        raise _refusal(path, "is missing", why)
    try:
        data = json.loads(path.read_text())
        if not isinstance(data, dict):
            raise TypeError(f"a JSON {type(data).__name__}, not an object")
        saved = data["digest"]
        draw = CanaryDraw(
            canaries=list(data["canaries"]),
            included=np.array(data["included"], dtype=bool),
            references=[int(index) for index in data["references"]],
            training_rows=int(data["training_rows"]),
            tuned_losses=None
            if data["tuned_losses"] is None
            else np.array(data["tuned_losses"], dtype=np.float64),
        )
    except (OSError, ValueError, TypeError, KeyError) as error:
        raise _refusal(path, f"is damaged ({error})", why) from None
    if saved != digest:
        raise _refusal(path, "was drawn for another run config or audit settings", why)
    if len(draw.included) != len(draw.canaries):
        raise _refusal(path, "is damaged (a coin per canary expected)", why)
    return draw


def _refusal(path: Path, problem: str, why: str) -> ConfigError:
    return ConfigError(
        f"the audit's canaries and their secret coins, {str(path)!r}, {problem}: {why} needs "
        f"the ones its run trained with. To audit again from step 0 (a new run, whose steps "
        f"are released again) pass --overwrite to privzo audit, or delete {str(path.parent)!r} "
        "for a study's audit cell"
    )
