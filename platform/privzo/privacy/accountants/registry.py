"""The accountants by name (``ACCOUNTANTS``), and the functions that build, restore and ask
them by name: ``make_accountant``, ``accountant_from_state``, and for an ``AccountingQuery``
``epsilon_of`` and ``calibrate`` (by keywords: ``compute_epsilon`` and
``calibrate_noise_multiplier``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.numeric import NumericAccountant
from privzo.privacy.accountants.pld import PldAccountant
from privzo.privacy.accountants.pure import PureLaplaceAccountant
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.accountants.rdp import RdpAccountant
from privzo.privacy.accountants.refusal import UnsupportedNoiseError
from privzo.privacy.checks import check_count

__all__ = [
    "ACCOUNTANTS",
    "accountant_from_state",
    "accountants_for",
    "calibrate",
    "calibrate_noise_multiplier",
    "compute_epsilon",
    "epsilon_of",
    "get_accountant",
    "make_accountant",
]


ACCOUNTANTS: dict[str, type[Accountant]] = {
    PldAccountant.name: PldAccountant,
    RdpAccountant.name: RdpAccountant,
    PureLaplaceAccountant.name: PureLaplaceAccountant,
    NumericAccountant.name: NumericAccountant,
}
"""Every accountant, by name: the one list of them (nothing registers itself)."""


def accountants_for(mechanism: str, *, grid: bool = False, directions: int = 1) -> list[str]:
    """The accountants that bound ``mechanism``'s noise (discrete noise if ``grid``, on a
    rounded vector of ``directions`` coordinates), as their classes state it; the run config
    asks this at load."""
    return [
        name
        for name, cls in ACCOUNTANTS.items()
        if cls.bounds(mechanism, grid=grid, directions=directions)
    ]


@contextlib.contextmanager
def _naming_the_able() -> Iterator[None]:
    """Complete an accountant's refusal of noise with the accountants that can bound it (see
    ``UnsupportedNoiseError``: the accountants cannot read this registry, which imports them)."""
    try:
        yield
    except UnsupportedNoiseError as refused:
        raise refused.naming(ACCOUNTANTS) from None


def get_accountant(name: str) -> type[Accountant]:
    """The accountant class registered as ``name``."""
    try:
        return ACCOUNTANTS[name]
    except (KeyError, TypeError):
        raise ValueError(
            f"accountant={name!r} is unknown; allowed: {sorted(ACCOUNTANTS)}"
        ) from None


def make_accountant(
    name: str, mechanism: str, noise_multiplier: float, sample_rate: float, **options: Any
) -> Accountant:
    """A fresh accountant at 0 steps (``options``: e.g. the PLD's value_discretization_interval)."""
    cls = get_accountant(name)
    with _naming_the_able():
        return cls(mechanism, noise_multiplier, sample_rate, **options)


def accountant_from_state(state: dict[str, Any]) -> Accountant:
    """Rebuild an accountant (settings and steps) from ``Accountant.state_dict()``."""
    missing = {"name", "mechanism", "noise_multiplier", "sample_rate", "steps"} - set(state)
    if missing:
        raise ValueError(f"accountant state is missing {sorted(missing)}; got keys {sorted(state)}")
    options = {
        key: state[key]
        for key in ("value_discretization_interval", "noise_parameters")
        if state.get(key) is not None
    }
    accountant = make_accountant(
        state["name"],
        state["mechanism"],
        state["noise_multiplier"],
        state["sample_rate"],
        **options,
    )
    accountant.load_state_dict(state)
    return accountant


# --- one-shot questions ------------------------------------------------------------------------


def epsilon_of(query: AccountingQuery, noise_multiplier: float) -> float:
    """ε of ``query``'s steps at noise multiplier σ."""
    steps = check_count("steps", query.steps, 1)
    options = {"noise_parameters": query.noise_parameters} if query.noise_parameters else {}
    return make_accountant(
        query.accountant, query.mechanism, noise_multiplier, query.sample_rate, **options
    ).epsilon_at(steps, query.delta)


def calibrate(query: AccountingQuery, epsilon: float) -> float:
    """The smallest σ (within ``CALIBRATION_RTOL``) for which ``query``'s steps cost ≤
    ``epsilon``.

    Raises ValueError if no σ ≤ ``MAX_NOISE_MULTIPLIER`` meets the target, or if even
    σ = ``MIN_NOISE_MULTIPLIER`` already does (the target is too loose to pin σ down cheaply).
    """
    cls = get_accountant(query.accountant)
    with _naming_the_able():
        return cls.calibrate(query, epsilon)


def compute_epsilon(*, noise_multiplier: float, **query: Any) -> float:
    """``epsilon_of`` by keywords: ``query`` holds ``AccountingQuery``'s fields (sample_rate,
    steps, delta; mechanism "gaussian", accountant "pld" and noise_parameters None unless
    given)."""
    return epsilon_of(AccountingQuery(**query), noise_multiplier)


def calibrate_noise_multiplier(*, epsilon: float, **query: Any) -> float:
    """``calibrate`` by keywords: ``query`` holds ``AccountingQuery``'s fields, as for
    ``compute_epsilon``."""
    return calibrate(AccountingQuery(**query), epsilon)
