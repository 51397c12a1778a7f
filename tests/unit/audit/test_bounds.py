"""Which estimator the audit names tightest: a bound, never the TPR reading, which is an
estimate that treats the canaries as independent trials."""

from __future__ import annotations

from privzo.audit.bounds import tightest_bound
from privzo.audit.record import ESTIMATOR_KINDS, EstimatorResult


def _row(estimator: str, epsilon: float) -> EstimatorResult:
    return EstimatorResult(estimator, epsilon, ESTIMATOR_KINDS[estimator], "white-box-match", 100)


def test_the_tightest_is_the_largest_bound_even_when_the_estimate_is_larger():
    rows = [_row("one-run", 0.683), _row("one-run-f-dp-gaussian", 0.935), _row("tpr-at-fpr", 2.18)]
    assert tightest_bound(rows) == "one-run-f-dp-gaussian"
    rows = [_row("one-run", 1.4), _row("one-run-f-dp-gaussian", 0.9), _row("tpr-at-fpr", 0.1)]
    assert tightest_bound(rows) == "one-run"
