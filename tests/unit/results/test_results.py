"""The typed results write exactly the records their JSON files held as dicts: the same keys
in the same order, optional keys only where they were written, and read back whole."""

from __future__ import annotations

import json

from privzo.audit import AuditRecord
from privzo.audit.power import AuditPower
from privzo.audit.record import BestGuess, EstimatorResult
from privzo.privacy.audit import GuessResult, TprAtFpr
from privzo.search.summary import SearchBounds, SearchSummary
from privzo.studies import StudySummary, SyntheticSummary

GUESS = GuessResult(
    k=5, guesses=10, correct=9, correct_in=5, correct_out=4, epsilon_lower_bound=1.5
)


def _audit(**changes) -> AuditRecord:
    values = {
        "verdict": "consistent",
        "epsilon_claimed": 2.0,
        "epsilon_lower_bound": 1.5,
        "tightness": 0.75,
        "delta": 1e-5,
        "alpha": 0.05,
        "canaries": 20,
        "canaries_in": 11,
        "training_rows": 64,
        "best": BestGuess.of("black-box", GUESS),
        "tests": 1,
        "bonferroni_level": 0.05,
        "results": {"black-box": [GUESS]},
        "score_distributions": {"black-box": {"in": {"count": 11.0}, "out": {"count": 9.0}}},
        "white_box": False,
        "note": None,
        "algorithm": "dpzero",
        "model": "tiny-opt",
        "steps": 4,
        "noise_multiplier": 1.2,
        "sample_rate": 0.1,
        "audited_run_id": "abc",
        "estimators": [
            EstimatorResult("one-run", 1.5, "bound, (ε, δ)-DP", "black-box", 5),
            EstimatorResult(
                "one-run-f-dp-gaussian", 2.25, "bound, Gaussian trade-off", "black-box", 5
            ),
            EstimatorResult("tpr-at-fpr", 0.0, "estimate", "black-box", None),
        ],
        "tightest": "one-run-f-dp-gaussian",
        "tpr_at_fpr": {"black-box": TprAtFpr(0.01, 3, 0, 11, 9, 3 / 11, 0.06, 0.34, 0.0)},
        "run_dir": "run",
    }
    return AuditRecord(**(values | changes))


def test_an_audit_record_writes_its_child_run_only_once_recorded():
    record = _audit()
    written = record.to_dict()
    assert list(written)[-1] == "run_dir" and "tracking_run_id" not in written
    assert written["best"] == {"score": "black-box", **GUESS.__dict__}
    record.audit_time_s, record.tracking_run_id, record.child_recorded = 3.5, None, True
    assert list(record.to_dict())[-2:] == ["audit_time_s", "tracking_run_id"]
    again = AuditRecord.from_dict(json.loads(json.dumps(record.to_dict())))
    assert again == record and again.to_dict() == record.to_dict()
    assert AuditRecord.parse({"verdict": "consistent"}) is None


def test_an_audit_records_power_reads_back_and_prints_and_older_records_have_none():
    record = _audit(power=AuditPower(separation_ceiling=0.2, epsilon_at_ceiling=0.013))
    written = record.to_dict()
    assert list(written)[-1] == "power"
    assert written["power"] == {"separation_ceiling": 0.2, "epsilon_at_ceiling": 0.013}
    assert AuditRecord.from_dict(json.loads(json.dumps(written))) == record
    assert "0.20 standard deviations" in record.power_lines()[0] in record.lines()
    assert AuditRecord.from_dict(_audit().to_dict()).power is None


def test_an_audit_records_power_at_its_canaries_size_reads_back_and_prints():
    power = AuditPower(0.2, 0.013, gradient_ratio=4.0, expected_separation=0.15, epsilon_expected=0)
    record = _audit(power=power)
    assert record.to_dict()["power"]["gradient_ratio"] == 4.0
    assert AuditRecord.from_dict(json.loads(json.dumps(record.to_dict()))) == record
    line = record.power_lines()[1]
    assert "2.00 times the data's" in line and "separation 0.15 expected" in line
    assert line in record.lines()


def test_an_audit_record_prints_its_verdict_and_a_violation():
    violated = _audit(verdict="VIOLATED", epsilon_lower_bound=2.5)
    assert violated.violated and violated.brief().violated
    assert violated.lines()[0].split() == ["verdict", "VIOLATED"]
    estimators = violated.lines()[violated.lines().index("estimators") :]
    assert "one-run-f-dp-gaussian" in estimators[2] and "ε ≥ 2.250" in estimators[2]
    assert "black-box, k = 5" in estimators[1] and "(estimate; black-box)" in estimators[3]
    assert estimators[4].split() == ["tightest", "one-run-f-dp-gaussian"]
    assert "NOT (2, 1e-05)-DP" in violated.violation_line()
    assert violated.brief().to_dict() == {
        "verdict": "VIOLATED",
        "epsilon_claimed": 2.0,
        "epsilon_lower_bound": 2.5,
        "canaries": 20,
        "k": 5,
    }


def test_a_search_summary_writes_its_bounds_in_place():
    bounds = {
        "private": True,
        "per_trial_epsilon": 2.0,
        "delta": 1e-5,
        "records_epsilon": 4.0,
        "selection": "public split",
        "end_to_end_epsilon": 4.0,
        "adjacency": "add-remove",
        "replace_one_epsilon": 8.0,
        "replace_one_delta": 0.00056,
        "guarantee": "composition",
    }
    rows = [{"trial_id": "t0", "status": "finished"}]
    summary = SearchSummary(
        False, 1, 1, 0, "t0", ["privacy.clip"], "accuracy", SearchBounds(**bounds), None, rows
    )
    written = summary.to_dict()
    head = ["interrupted", "trials_run", "trials_finished", "restarts", "best_trial", "space"]
    head.append("metric")
    assert list(written) == [*head, *bounds, "best_model_uri", "trials"]
    assert summary.best_row() is rows[0] and summary["guarantee"] == "composition"
    geometric = SearchBounds(**bounds, best_export_epsilon=3.0).to_dict()
    assert list(geometric)[-2:] == ["best_export_epsilon", "guarantee"]
    assert SearchBounds(private=False).to_dict() == {"private": False}


def test_a_study_summary_names_its_report_once_complete():
    summary = StudySummary("s", 2, 1, 0, 0, {}, False, "run")
    assert "report" not in summary and summary.violated_audits() == []
    summary.complete, summary.report = True, "report.md"
    assert list(summary.to_dict())[-1] == "report" and summary["report"] == "report.md"
    synthetic = SyntheticSummary("synthetic-quadratic", True, "run", 1.2, 3.0, "t.md", "f.png")
    assert SyntheticSummary.from_dict(synthetic.to_dict()) == synthetic
