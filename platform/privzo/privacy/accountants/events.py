"""The run's privacy event in dp_accounting's terms, and ε(σ) curves read from dp_accounting's own
accountants composing it (the pld and rdp accountants calibrate on these)."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Hashable, Iterator
from typing import TYPE_CHECKING, Any

from privzo.privacy.accountants.calibration import Curve
from privzo.privacy.accountants.query import AccountingQuery

if TYPE_CHECKING:
    import dp_accounting

__all__ = ["event_curve", "quiet_absl", "run_event", "step_event"]


def step_event(mechanism: str, noise_multiplier: float, sample_rate: float) -> Any:
    """One Poisson-subsampled step with sensitivity 1 and noise σ (scale-free: σ·C over C)."""
    # lazy: a config is validated without scipy and dp_accounting loaded
    import dp_accounting

    if mechanism == "gaussian":
        inner: Any = dp_accounting.GaussianDpEvent(noise_multiplier)
    else:
        inner = dp_accounting.LaplaceDpEvent(noise_multiplier)
    return dp_accounting.PoissonSampledDpEvent(sample_rate, inner)


def run_event(mechanism: str, noise_multiplier: float, sample_rate: float, steps: int) -> Any:
    """``steps`` self-composed steps of ``step_event``."""
    import dp_accounting

    return dp_accounting.SelfComposedDpEvent(
        step_event(mechanism, noise_multiplier, sample_rate), steps
    )


def event_curve(
    query: AccountingQuery,
    make_fresh: Callable[[], dp_accounting.PrivacyAccountant],
    *how: Hashable,
) -> Curve:
    """ε(σ) of ``query`` from a fresh dp_accounting accountant composing the run's event."""

    def epsilon_of(sigma: float) -> float:
        event = run_event(query.mechanism, sigma, query.sample_rate, query.steps)
        with quiet_absl():
            return float(make_fresh().compose(event).get_epsilon(query.delta))

    return Curve(query.curve_key("events", *how), epsilon_of)


@contextlib.contextmanager
def quiet_absl() -> Iterator[None]:
    """Mute dp_accounting's RDP warnings that fractional orders were skipped (harmless).

    Also used where a search composes RDP over its trials (``privzo.search.privacy``).
    """
    logger = logging.getLogger("absl")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)
