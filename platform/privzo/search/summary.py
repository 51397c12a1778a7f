"""A search's result (``SearchSummary``): what search_summary.json holds and the table the
search prints at its end."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from privzo.results import RecordKeys

SCORE = "selection_score"
# One trials.parquet row: the trial's id and status, its sampled point (one key per searched
# config key, so the columns are the search's own), its layout and its run's summary figures.
TrialRow = dict[str, Any]


@dataclass(frozen=True)
class SearchBounds:
    """The search's guarantees for the trials it ran (``privzo.search.plan.SearchPlan.bounds``);
    a non-private search has none."""

    private: bool
    per_trial_epsilon: float | None = None
    delta: float | None = None
    records_epsilon: float | None = None
    selection: str | None = None
    end_to_end_epsilon: float | None = None
    adjacency: str | None = None  # what end_to_end_epsilon and delta hold under
    replace_one_epsilon: float | None = None  # the whole search's records, N included
    replace_one_delta: float | None = None
    best_export_epsilon: float | None = None  # a geometric trial count's repeat-and-select
    guarantee: str | None = None

    def to_dict(self) -> dict[str, Any]:
        if not self.private:
            return {"private": False}
        record = asdict(self)
        if self.best_export_epsilon is None:
            del record["best_export_epsilon"]
        return record


@dataclass
class SearchSummary(RecordKeys):
    """search_summary.json: how far the search got, its best trial, its guarantees and every
    trial's row."""

    interrupted: bool
    trials_run: int
    trials_finished: int
    restarts: int  # attempts of trials that started over (counted in the bounds like trials)
    best_trial: str | None
    space: list[str]
    metric: str | None
    bounds: SearchBounds
    best_model_uri: str | None
    trials: list[TrialRow]

    def to_dict(self) -> dict[str, Any]:
        """search_summary.json's content: the counts, the bounds' keys, the best model, the
        trials."""
        record: dict[str, Any] = {
            "interrupted": self.interrupted,
            "trials_run": self.trials_run,
            "trials_finished": self.trials_finished,
            "restarts": self.restarts,
            "best_trial": self.best_trial,
            "space": self.space,
            "metric": self.metric,
        }
        record.update(self.bounds.to_dict())
        record["best_model_uri"] = self.best_model_uri
        record["trials"] = self.trials
        return record

    def best_row(self) -> TrialRow:
        """The best trial's row, or an empty one when no trial finished with a score."""
        return next((row for row in self.trials if row["trial_id"] == self.best_trial), {})

    def lines(self) -> list[str]:
        """The end-of-search table (``format_table``)."""
        return format_table(self.to_dict()).splitlines()


def format_table(summary: Mapping[str, Any]) -> str:
    """The end-of-search table: one line per trial, the best marked, then the guarantee."""
    from tabulate import tabulate

    space = summary["space"]
    header = ["", "trial", *[key.split(".")[-1] for key in space], "σ", "ε", "score", "test", "MB"]
    header.append("time s")
    header.append("status")
    lines = [header]  # every cell already formatted: tabulate must not re-parse numbers
    for row in summary["trials"]:
        mark = "*" if row["trial_id"] == summary["best_trial"] else ""
        values = [_fmt(row.get(key)) for key in space]
        lines.append(
            [
                mark,
                row["trial_id"],
                *values,
                _fmt(row["noise_multiplier"], ".3f"),
                _fmt(row["epsilon"], ".3f"),  # 1.999 next to 2.000, not next to 2
                _fmt(row[SCORE]),
                _fmt(row["metric_after"]),
                _fmt(row["peak_memory_mb"], ".0f"),
                _fmt(row["wall_time_s"], ".0f"),
                row["status"],
            ]
        )
    # the header goes in as a row: tabulate pads a header line by two more spaces a column
    text = [tabulate(lines, tablefmt="plain", stralign="right", disable_numparse=True)]
    metric = summary.get("metric") or "metric"
    text.append(f"(score: selection score; test: {metric} on the test split, for reporting only)")
    if summary.get("guarantee"):
        text.append(f"privacy: {summary['guarantee']}")
        text.append(f"selection: {summary['selection']}")
    return "\n".join(text)


def _fmt(value: Any, spec: str = ".4g") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float):
        return format(value, spec)
    return str(value)
