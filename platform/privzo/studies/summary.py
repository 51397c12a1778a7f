"""A study's result: the scaling study's ``StudySummary`` (study_summary.json) and the synthetic
study's ``SyntheticSummary`` (synthetic_summary.json), each with what the command reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from privzo.audit import AuditBrief
from privzo.results import RecordKeys


@dataclass
class StudySummary(RecordKeys):
    """How far the scaling study got, its audit cells' verdicts and, once complete, where its
    report is."""

    study: str
    cells: int
    cells_finished: int
    audit_cells: int
    audit_cells_finished: int
    audits: dict[str, AuditBrief]
    complete: bool
    parent_run_id: str | None
    report: str | None = None  # written once the study is complete

    def to_dict(self) -> dict[str, Any]:
        record = asdict(self)
        record["audits"] = {name: brief.to_dict() for name, brief in self.audits.items()}
        if not self.complete:
            del record["report"]
        return record

    def violated_audits(self) -> list[str]:
        """The audit cells whose audit proved more leakage than their run claims."""
        return [name for name, brief in self.audits.items() if brief.violated]


@dataclass
class SyntheticSummary(RecordKeys):
    """The synthetic study, one MLflow run: its noise multiplier, time, table and figure."""

    study: str
    complete: bool
    parent_run_id: str | None
    noise_multiplier: float
    seconds: float
    table: str
    figure: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> SyntheticSummary:
        return cls(**record)

    def violated_audits(self) -> list[str]:
        return []  # it audits nothing


StudyResult = StudySummary | SyntheticSummary
