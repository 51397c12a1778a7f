"""The accountants by name (``ACCOUNTANTS``), and the functions that build, restore and ask
them by name: ``make_accountant``, ``accountant_from_state``, ``compute_epsilon`` and
``calibrate_noise_multiplier``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from privzo.privacy.accountants.base import Accountant, UnsupportedNoiseError
from privzo.privacy.accountants.numeric import NumericAccountant
from privzo.privacy.accountants.pld import PldAccountant
from privzo.privacy.accountants.pure import PureLaplaceAccountant
from privzo.privacy.accountants.rdp import RdpAccountant
from privzo.privacy.checks import check_count

__all__ = [
    "ACCOUNTANTS",
    "accountant_from_state",
    "accountants_for",
    "calibrate_noise_multiplier",
    "compute_epsilon",
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


# --- one-shot functions ------------------------------------------------------------------------


def compute_epsilon(
    *,
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    mechanism: str = "gaussian",
    accountant: str = "pld",
    noise_parameters: dict[str, Any] | None = None,
) -> float:
    """ε of ``steps`` steps at noise multiplier σ and sampling rate p, at ``delta``.

    ``noise_parameters``: a parametrised mechanism's settings (lmo), for the numeric accountant.
    """
    steps = check_count("steps", steps, 1)
    options = {"noise_parameters": noise_parameters} if noise_parameters else {}
    return make_accountant(
        accountant, mechanism, noise_multiplier, sample_rate, **options
    ).epsilon_at(steps, delta)


def calibrate_noise_multiplier(
    *,
    epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    mechanism: str = "gaussian",
    accountant: str = "pld",
    noise_parameters: dict[str, Any] | None = None,
) -> float:
    """The smallest σ (within ``CALIBRATION_RTOL``) for which ``steps`` steps cost ≤ ``epsilon``.

    Raises ValueError if no σ ≤ ``MAX_NOISE_MULTIPLIER`` meets the target, or if even
    σ = ``MIN_NOISE_MULTIPLIER`` already does (the target is too loose to pin σ down cheaply).
    """
    cls = get_accountant(accountant)
    with _naming_the_able():
        return cls.calibrate(
            epsilon=epsilon,
            delta=delta,
            sample_rate=sample_rate,
            steps=steps,
            mechanism=mechanism,
            noise_parameters=noise_parameters,
        )
