"""An audit's result (``AuditRecord``): what audit.json holds, read back, and how it prints.

audit.json is counts, bounds and score distributions only: no canary and no coin, so the
record can be published beside the run it audits.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from typing import Any

from privzo.audit.power import AuditPower
from privzo.privacy.audit import GuessResult, TprAtFpr
from privzo.results import RecordKeys

# a score's distribution: "in" and "out" canaries → count, mean, std and quantiles
ScoreDistribution = dict[str, dict[str, float]]
RUN_DIR = "run"  # the audited run's directory inside the audit's (``AuditRecord.run_dir``)
AUDIT_FILE = "audit.json"  # the record, in the audit's directory


@dataclass(frozen=True)
class BestGuess:
    """The (score, k) test with the largest ε lower bound."""

    score: str
    k: int
    guesses: int
    correct: int
    correct_in: int
    correct_out: int
    epsilon_lower_bound: float
    fdp_epsilon_lower_bound: float = 0.0

    @classmethod
    def of(cls, score: str, result: GuessResult) -> BestGuess:
        return cls(score=score, **asdict(result))


@dataclass(frozen=True)
class EstimatorResult:
    """One estimator's largest ε over the audit's tests, what it assumes, and the score (and k,
    None for the TPR reading) that gave it."""

    estimator: str
    epsilon: float
    kind: str
    score: str
    k: int | None


# what each estimator's ε means: the verdict rests on the first, valid for any (ε, δ) claim
ESTIMATOR_KINDS = {
    "one-run": "bound, (ε, δ)-DP",
    "one-run-f-dp-gaussian": "bound, Gaussian trade-off",
    "tpr-at-fpr": "estimate",
}


@dataclass(frozen=True)
class AuditBrief:
    """An audit in a study's summary: its verdict, bound and evidence size."""

    verdict: str
    epsilon_claimed: float | None
    epsilon_lower_bound: float
    canaries: int
    k: int

    @property
    def violated(self) -> bool:
        return self.verdict == VIOLATED

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class AuditRecord(RecordKeys):
    """audit.json: the verdict, the best bound and every test behind it. ``audit_time_s`` is
    written only where the run releases its duration, ``tracking_run_id`` (the MLflow child
    run, None without tracking) once that run is recorded (``child_recorded``). ``power`` is
    None where no score aligns canaries with the released scalars (``privzo.audit.power``)."""

    verdict: str
    epsilon_claimed: float | None
    epsilon_lower_bound: float
    tightness: float | None
    delta: float
    alpha: float
    canaries: int
    canaries_in: int
    training_rows: int
    best: BestGuess
    tests: int
    bonferroni_level: float
    results: dict[str, list[GuessResult]]
    score_distributions: dict[str, ScoreDistribution]
    white_box: bool
    note: str | None
    algorithm: str
    model: str
    steps: int
    noise_multiplier: float | None
    sample_rate: float
    audited_run_id: str | None
    estimators: list[EstimatorResult]
    tightest: str
    tpr_at_fpr: dict[str, TprAtFpr]
    run_dir: str
    audit_time_s: float | None = None
    tracking_run_id: str | None = None
    child_recorded: bool = False
    power: AuditPower | None = None

    @property
    def violated(self) -> bool:
        return self.verdict == VIOLATED

    def to_dict(self) -> dict[str, Any]:
        """audit.json's content, in its order."""
        record = {item.name: getattr(self, item.name) for item in fields(self)[:_OPTIONAL]}
        record["best"] = asdict(self.best)
        record["results"] = {
            name: [asdict(row) for row in rows] for name, rows in self.results.items()
        }
        record["estimators"] = [asdict(row) for row in self.estimators]
        record["tpr_at_fpr"] = {name: asdict(row) for name, row in self.tpr_at_fpr.items()}
        if self.audit_time_s is not None:
            record["audit_time_s"] = self.audit_time_s
        if self.child_recorded:
            record["tracking_run_id"] = self.tracking_run_id
        if self.power is not None:
            power = asdict(self.power)  # the measured ratio's fields only where measured
            record["power"] = {key: value for key, value in power.items() if value is not None}
        return record

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> AuditRecord:
        """The record ``to_dict`` wrote; a missing field is a ``KeyError``."""
        values = {item.name: record[item.name] for item in fields(cls)[:_OPTIONAL]}
        values["best"] = BestGuess(**record["best"])
        values["results"] = {
            name: [GuessResult(**row) for row in rows] for name, rows in record["results"].items()
        }
        values["estimators"] = [EstimatorResult(**row) for row in record["estimators"]]
        values["tpr_at_fpr"] = {name: TprAtFpr(**row) for name, row in record["tpr_at_fpr"].items()}
        return cls(
            **values,
            audit_time_s=record.get("audit_time_s"),
            tracking_run_id=record.get("tracking_run_id"),
            child_recorded="tracking_run_id" in record,
            power=AuditPower(**record["power"]) if "power" in record else None,
        )

    @classmethod
    def parse(cls, record: dict[str, Any] | None) -> AuditRecord | None:
        """The record in an audit.json's content, or None when there is none or it is not
        a whole audit's (another file): such a directory holds no finished audit."""
        if record is None:
            return None
        try:
            return cls.from_dict(record)
        except (KeyError, TypeError):
            return None

    def brief(self) -> AuditBrief:
        return AuditBrief(
            self.verdict,
            self.epsilon_claimed,
            self.epsilon_lower_bound,
            self.canaries,
            self.best.k,
        )

    def lines(self) -> list[str]:
        """The record as the console shows it: the verdict, the bound and its evidence."""
        best, claimed = self.best, self.epsilon_claimed
        lines = [
            f"verdict              {self.verdict}",
            f"epsilon claimed      {'-' if claimed is None else f'{claimed:.3f}'}",
            f"epsilon lower bound  {self.epsilon_lower_bound:.3f} "
            f"({1 - self.alpha:.0%} confidence, delta {self.delta:g})",
            f"best guesses         {best.score}, k = {best.k}: {best.correct} of "
            f"{best.guesses} right",
            f"canaries             {self.canaries} ({self.tests} tests, Bonferroni)",
            *self.estimator_lines(),
        ]
        if claimed is None:
            lines.append("(not private: the lower bound is the run's empirical leakage)")
        elif self.tightness is not None:
            lines.append(f"tightness            ε_lb / ε = {self.tightness:.3f}")
        if self.power is not None:
            lines.extend(self.power_lines())
        if self.note:
            lines.append(f"note: {self.note}")
        return lines

    def power_lines(self) -> list[str]:
        """What the aligning scores could show at the run's settings, however good the
        canaries, and what they could be expected to show with these canaries' size."""
        power = self.power
        assert power is not None
        lines = [
            f"power                at this run's T, B, N and n_in aligning scores separate by "
            f"at most {power.separation_ceiling:.2f} standard deviations "
            f"(√(T·B / (N·n_in))), where ε_lb ≈ {power.epsilon_at_ceiling:.3f} is expected"
        ]
        if power.gradient_ratio is not None and power.expected_separation is not None:
            lines.append(
                f"                     the canaries' unshared directional derivatives are "
                f"{math.sqrt(power.gradient_ratio):.2f} times the data's (rms, in the replay): "
                f"separation {power.expected_separation:.2f} expected, where ε_lb ≈ "
                f"{power.epsilon_expected:.3f}"
            )
        return lines

    def estimator_lines(self) -> list[str]:
        """Each estimator's ε with what it assumes and where it came from, and the tightest."""
        lines = []
        for row in self.estimators:
            source = row.score if row.k is None else f"{row.score}, k = {row.k}"
            lines.append(f"  {row.estimator:<22} ε ≥ {row.epsilon:.3f}  ({row.kind}; {source})")
        return ["estimators", *lines, f"tightest             {self.tightest}"]

    def violation_line(self) -> str:
        """Why a VIOLATED verdict fails the command: the proven bound against the claim."""
        claimed = self.epsilon_claimed
        return (
            f"privzo: PRIVACY VIOLATED: the audit proves ε ≥ {self.epsilon_lower_bound:.3f} "
            f"at {1 - self.alpha:.0%} confidence, above the claimed "
            f"ε = {claimed:.3f}: the run is NOT ({claimed:.3g}, {self.delta:g})-DP as recorded"
        )


VIOLATED = "VIOLATED"
# the fields before these are always written; audit_time_s, tracking_run_id and power only when
# known
_OPTIONAL = -4
