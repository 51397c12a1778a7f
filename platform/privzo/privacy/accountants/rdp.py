"""``rdp``: Rényi DP, Gaussian only (dp_accounting rejects the subsampled Laplace event) and
continuous noise only; conservative (≈7-10 % more noise than PLD) but cheap: ε(T) is a conversion
of T times one cached RDP vector."""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.calibration import Curve
from privzo.privacy.accountants.events import event_curve, quiet_absl, step_event
from privzo.privacy.accountants.query import AccountingQuery

__all__ = ["RdpAccountant"]


class RdpAccountant(Accountant):
    """Rényi DP with dp_accounting's default orders; Gaussian only.

    RDP composes additively, so ε after T steps converts T times the one-step RDP vector,
    which is computed once: ε costs microseconds at any T.
    """

    name: ClassVar[str] = "rdp"
    title: ClassVar[str] = "RDP"
    mechanisms: ClassVar[tuple[str, ...]] = ("gaussian",)

    def _prepare(self) -> None:
        self._orders: np.ndarray | None = None
        self._one_step_rdp: np.ndarray | None = None

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        # lazy: a config is validated without scipy and dp_accounting loaded
        from dp_accounting import rdp as dp_rdp
        from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp_impl

        if self._one_step_rdp is None:
            with quiet_absl():
                one = dp_rdp.RdpAccountant().compose(
                    step_event(self._mechanism, self._noise_multiplier, self._sample_rate)
                )
            self._orders, self._one_step_rdp = one.orders, one.rdp
        assert self._orders is not None
        epsilon, _ = dp_rdp_impl.compute_epsilon(self._orders, steps * self._one_step_rdp, delta)
        return float(epsilon)

    @classmethod
    def _curves(cls, query: AccountingQuery) -> tuple[Curve, Curve | None]:
        """dp_accounting's RDP accountant composing the run's event; ε is cheap, so no coarse
        curve."""
        from dp_accounting import rdp as dp_rdp

        return event_curve(query, dp_rdp.RdpAccountant), None
