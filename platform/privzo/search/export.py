"""``privzo export-best``: the best trial of a finished search, alone, as a release of its own.

A search directory holds every trial's records, so what it stores is covered by composition over
the trials that ran (the search summary's ``end_to_end_epsilon``). Repeat-and-select (Papernot &
Steinke 2022) gives a smaller ε only for the best trial released alone, with the secret
geometric trial count and the other trials withheld. The export is that release: the best
trial's resolved config, trajectory (and saved model, if any) and its run summary without the
identifiers that would point back into the search (tracking run id, trial id, trial count).
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from privzo.rundir import CONFIG_FILE, MODEL_DIR, TRAJECTORY_FILE, write_json_atomically
from privzo.rundir import SUMMARY_FILE as RUN_SUMMARY_FILE
from privzo.search.record import SUMMARY_FILE
from privzo.search.trial import TRIALS_DIR
from privzo.section import ConfigError
from privzo.tracking.clock import stamp_public_time

__all__ = ["EXPORT_WITHHELD", "ExportedTrial", "export_best"]

# Run-summary keys that identify the trial inside the search (its MLflow child run).
EXPORT_WITHHELD = ("tracking_run_id",)


@dataclass(frozen=True)
class ExportedTrial:
    """A search's best trial, exported: where from and to, and the export's summary.json, the
    trial's run summary as the search recorded it, its identifiers withheld."""

    search_dir: Path
    output_dir: Path
    summary: dict[str, Any]

    @property
    def guarantee(self) -> str | None:
        """What the export alone is (ε, δ)-DP by; None for a non-private search."""
        return self.summary.get("guarantee")

    def lines(self) -> list[str]:
        lines = [f"exported the best trial of {self.search_dir} to {self.output_dir}"]
        if self.guarantee:
            lines.append(f"privacy: {self.guarantee}")
        return lines


def export_best(search_dir: Path, output_dir: Path) -> ExportedTrial:
    """Copy the best trial of the finished search in ``search_dir`` to ``output_dir`` and write
    its export summary; returns that summary. Refused before anything is written when the
    search is unfinished, has no best trial, or ``output_dir`` is not empty."""
    search_dir, output_dir = Path(search_dir), Path(output_dir)
    search = _finished_search(search_dir)
    trial_dir = search_dir / TRIALS_DIR / str(search["best_trial"])
    for name in (CONFIG_FILE, RUN_SUMMARY_FILE):
        if not (trial_dir / name).is_file():
            raise ConfigError(f"{trial_dir / name} is missing: the best trial's files are gone")
    if output_dir.exists() and any(output_dir.iterdir()):
        raise ConfigError(f"--output-dir {str(output_dir)!r} is not empty; choose a new directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    # contents only: the trial's file times (config at its start, trajectory at its end) would
    # give its duration
    for name in (CONFIG_FILE, TRAJECTORY_FILE):
        if (trial_dir / name).is_file():
            shutil.copyfile(trial_dir / name, output_dir / name)
    if (trial_dir / MODEL_DIR).is_dir():
        shutil.copytree(
            trial_dir / MODEL_DIR, output_dir / MODEL_DIR, copy_function=shutil.copyfile
        )
    summary = _export_summary(json.loads((trial_dir / RUN_SUMMARY_FILE).read_text()), search)
    write_json_atomically(output_dir / RUN_SUMMARY_FILE, summary)
    if search.get("private"):  # a non-private export keeps the times of its copying
        stamp_public_time(output_dir)
    return ExportedTrial(search_dir, output_dir, summary)


def _finished_search(search_dir: Path) -> dict[str, Any]:
    path = search_dir / SUMMARY_FILE
    if not path.is_file():
        raise ConfigError(f"{str(search_dir)!r} holds no finished search ({SUMMARY_FILE} missing)")
    search = json.loads(path.read_text())
    if search.get("interrupted"):
        raise ConfigError(
            f"the search in {str(search_dir)!r} was interrupted; resume it (run the same "
            "`privzo tune` command) before exporting: its best trial is not yet the best of all"
        )
    if search.get("best_trial") is None:
        raise ConfigError(f"the search in {str(search_dir)!r} has no finished, scored trial")
    return search


def _export_summary(run_summary: dict[str, Any], search: dict[str, Any]) -> dict[str, Any]:
    """The trial's run summary minus its identifiers, with the export's own guarantee."""
    summary = {key: value for key, value in run_summary.items() if key not in EXPORT_WITHHELD}
    if not search.get("private"):
        return summary | {"exported_from_search": True}
    epsilon = search.get("best_export_epsilon", search["end_to_end_epsilon"])
    how = "repeat-and-select" if "best_export_epsilon" in search else "composition"
    return summary | {
        "exported_from_search": True,
        "epsilon_per_trial": run_summary.get("epsilon"),
        "epsilon": epsilon,
        "delta": search["delta"],
        "guarantee": (
            f"this export alone is ({epsilon:.3g}, {search['delta']:g})-DP ({how} over the "
            "search's trials); publishing anything else of the search directory composes to "
            f"its end-to-end ε {search['end_to_end_epsilon']:.3g}"
        ),
    }
