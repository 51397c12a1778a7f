"""``rdp``: Rényi DP, Gaussian only (dp_accounting rejects the subsampled Laplace event);
conservative (≈7-10 % more noise than PLD) but cheap: ε(T) is a conversion of T times one cached
RDP vector. It bounds continuous noise, and the discrete Gaussian on the rounded vector of
several directions per step (``docs/privacy/vector-grid.md``)."""

from __future__ import annotations

import math
from typing import ClassVar

import numpy as np

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.calibration import Curve
from privzo.privacy.accountants.events import event_curve, quiet_absl, step_event
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.discrete import vector_grid_bound

__all__ = ["INTEGER_ORDERS", "RdpAccountant", "vector_grid_noise_multiplier"]

# The orders of a gridded vector's bound: its Rényi divergences are proven at integer orders
# only, and D_α ≤ D_⌈α⌉ covers the rest; these are dp_accounting's default orders, rounded up.
INTEGER_ORDERS: tuple[int, ...] = (*range(2, 64), 128, 256, 512, 1024)


def vector_grid_noise_multiplier(grid: int, noise_multiplier: float, directions: int) -> float:
    """K/√N, rounded down: the continuous Gaussian's noise-to-sensitivity ratio whose RDP at
    integer orders bounds the gridded step of ``directions`` rounded coordinates (N is
    ``vector_grid_bound``: the rounded vector's squared norm in grid units)."""
    ratio = grid / math.sqrt(vector_grid_bound(grid, noise_multiplier, directions))
    return math.nextafter(ratio, 0.0)


class RdpAccountant(Accountant):
    """Rényi DP with dp_accounting's default orders; Gaussian only.

    RDP composes additively, so ε after T steps converts T times the one-step RDP vector,
    which is computed once: ε costs microseconds at any T.

    On a grid with J ≥ 2 directions (``noise_parameters`` ``{"grid": K, "directions": J}``)
    the step is the discrete Gaussian N_Z(0, K²) on each of J coordinates, and a record moves
    the integer sum by a vector of squared norm ≤ N. At integer orders its Rényi divergence
    (both directions of add/remove) is at most the continuous Poisson-subsampled Gaussian's
    at ratio K/√N, which is what is composed, at ``INTEGER_ORDERS`` only.
    """

    name: ClassVar[str] = "rdp"
    title: ClassVar[str] = "RDP"
    mechanisms: ClassVar[tuple[str, ...]] = ("gaussian",)
    vector_grid_mechanisms: ClassVar[tuple[str, ...]] = ("gaussian",)

    def _prepare(self) -> None:
        self._orders: np.ndarray | None = None
        self._one_step_rdp: np.ndarray | None = None

    @property
    def effective_noise_multiplier(self) -> float:
        """σ, or on a grid K/√N (see the class docstring)."""
        if self._grid is None:
            return self._noise_multiplier
        return vector_grid_noise_multiplier(self._grid, self._noise_multiplier, self._directions)

    def _compute_epsilon(self, steps: int, delta: float) -> float:
        # lazy: a config is validated without scipy and dp_accounting loaded
        from dp_accounting import rdp as dp_rdp
        from dp_accounting.rdp import rdp_privacy_accountant as dp_rdp_impl

        if self._one_step_rdp is None:
            orders = None if self._grid is None else [float(order) for order in INTEGER_ORDERS]
            event = step_event(self._mechanism, self.effective_noise_multiplier, self._sample_rate)
            with quiet_absl():
                one = dp_rdp.RdpAccountant(orders).compose(event)
            self._orders, self._one_step_rdp = one.orders, one.rdp
        assert self._orders is not None
        epsilon, _ = dp_rdp_impl.compute_epsilon(self._orders, steps * self._one_step_rdp, delta)
        return float(epsilon)

    @classmethod
    def _curves(cls, query: AccountingQuery) -> tuple[Curve, Curve | None]:
        """dp_accounting's RDP accountant composing the run's event (continuous noise) or
        fresh accountants of this class (a gridded vector); ε is cheap, so no coarse curve."""
        from dp_accounting import rdp as dp_rdp

        if cls.grid_of(query.noise_parameters, query.mechanism) is None:
            return event_curve(query, dp_rdp.RdpAccountant), None

        def epsilon_of(sigma: float) -> float:
            fresh = cls(query.mechanism, sigma, query.sample_rate, query.noise_parameters)
            return fresh.epsilon_at(query.steps, query.delta)

        return Curve(query.curve_key("vector grid"), epsilon_of), None
