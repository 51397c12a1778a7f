"""The algorithm registry and the config's Literals name the same algorithms, mechanisms and
layouts, and the registry's entries agree with what the config decides at load."""

from __future__ import annotations

from typing import get_args

import pytest

from privzo.algorithms.noise import NOISE
from privzo.algorithms.registry import ALL_LAYOUTS, REGISTRY, get_algorithm, names
from privzo.config import (
    AlgorithmName,
    ConfigError,
    LayoutName,
    MechanismName,
    load_config,
)
from privzo.privacy.accountants import ACCOUNTANTS, MECHANISM_NAMES
from privzo.privacy.mechanisms import MECHANISMS


def test_the_algorithm_literal_names_the_registry_keys():
    assert list(get_args(AlgorithmName)) == list(REGISTRY) == list(NOISE)


def test_the_mechanism_literal_names_the_mechanism_registry_and_every_registered_mechanism():
    accounted = {mechanism for cls in ACCOUNTANTS.values() for mechanism in cls.mechanisms}
    assert set(get_args(MechanismName)) == set(MECHANISMS) == set(MECHANISM_NAMES) == accounted
    used = {mechanism for entry in REGISTRY.values() for mechanism in entry.mechanisms}
    assert used == set(get_args(MechanismName))


def test_the_layout_literal_names_every_layout_an_algorithm_may_support():
    assert set(get_args(LayoutName)) == set(ALL_LAYOUTS)
    assert all(set(entry.layouts) <= set(ALL_LAYOUTS) for entry in REGISTRY.values())
    assert all("single" in entry.layouts for entry in REGISTRY.values())


@pytest.mark.parametrize("name", list(REGISTRY))
def test_each_entry_agrees_with_the_privacy_facts_the_config_uses_at_load(name):
    entry = REGISTRY[name]
    config = load_config(None, [f"optimizer.algorithm={name}"])
    assert entry.private == config.optimizer.is_private == NOISE[name].private
    assert entry.default_mechanism == config.mechanism
    assert bool(entry.mechanisms) == entry.private
    assert not (entry.writes_trajectory and entry.family == "first-order")


def test_distributed_layouts_run_only_steppers_with_an_all_reducing_estimator():
    distributed = names(layouts=ALL_LAYOUTS)
    assert distributed == ["mezo", "dpzero", "dpzo-laplace"]
    assert all(REGISTRY[name].writes_trajectory for name in distributed)


def test_an_unknown_algorithm_is_named_with_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"'sgd' is unknown; allowed: \['mezo'"):
        get_algorithm("sgd")


def test_the_layout_literal_names_the_layout_objects():
    from privzo.layouts.layout import LAYOUTS

    assert list(LAYOUTS) == list(get_args(LayoutName))


def test_each_layout_says_which_ranks_report_evaluate_and_run_empty_forwards():
    """The worker's rank checks, as the layouts answer them (ranks 0 and 1 of two)."""
    from privzo.layouts.layout import get_layout

    replica, zero3 = get_layout("replica"), get_layout("zero3")
    assert [replica.reports(rank) for rank in (0, 1)] == [True, False]
    assert [zero3.reports(rank) for rank in (0, 1)] == [True, False]
    assert [replica.evaluates(rank) for rank in (0, 1)] == [True, False]
    assert [zero3.evaluates(rank) for rank in (0, 1)] == [True, True]  # collective forwards
    assert (replica.forward_on_empty, zero3.forward_on_empty) == (False, True)
    assert get_layout("single").reports(0) and get_layout("single").evaluates(0)
