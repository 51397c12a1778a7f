"""The process-wide memo of PLD ε values is keyed by every public parameter of the evaluation.

A calibration probes about ten σ, each a one-step PLD of up to a few seconds, and a run's
preflight, a study's cells and a search's trials repeat the same evaluations; the memo returns
them at once. A key that missed a parameter would hand one mechanism's ε to another: each case
below changes one parameter and must get the ε a fresh evaluation gives, not the memo's.
"""

from __future__ import annotations

import dp_accounting
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld

from privzo.privacy.accountants import make_accountant

BASE = {"mechanism": "gaussian", "noise_multiplier": 1.3, "sample_rate": 0.02}


def _epsilon(steps=50, delta=1e-5, grid=None, **changes):
    settings = {**BASE, **changes}
    options = {"noise_parameters": {"grid": grid}} if grid else {}
    return make_accountant(
        "pld",
        settings["mechanism"],
        settings["noise_multiplier"],
        settings["sample_rate"],
        **options,
    ).epsilon_at(steps, delta)


def _reference(sigma, sample_rate, steps, delta):
    """dp_accounting's own continuous Gaussian PLD, at the accountant's discretization."""
    one_step = pld.from_gaussian_mechanism(
        standard_deviation=sigma,
        value_discretization_interval=1e-4,
        sampling_prob=sample_rate,
        neighboring_relation=dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE,
    )
    return one_step.self_compose(steps).get_epsilon_for_delta(delta)


def test_each_parameter_reaches_the_memo_key():
    base = _epsilon()
    assert _epsilon() == base  # the memo's answer, equal to the first evaluation
    assert base == pytest.approx(_reference(1.3, 0.02, 50, 1e-5), rel=1e-9)
    changed = {
        "steps": _epsilon(steps=60),
        "delta": _epsilon(delta=1e-6),
        "sigma": _epsilon(noise_multiplier=1.4),
        "sample_rate": _epsilon(sample_rate=0.03),
        "grid": _epsilon(grid=64),
        "mechanism": _epsilon(mechanism="laplace"),
    }
    assert all(value != base for value in changed.values()), changed
    assert changed["sigma"] == pytest.approx(_reference(1.4, 0.02, 50, 1e-5), rel=1e-9)
    assert changed["sample_rate"] == pytest.approx(_reference(1.3, 0.03, 50, 1e-5), rel=1e-9)
    assert changed["steps"] == pytest.approx(_reference(1.3, 0.02, 60, 1e-5), rel=1e-9)
    assert changed["delta"] == pytest.approx(_reference(1.3, 0.02, 50, 1e-6), rel=1e-9)
