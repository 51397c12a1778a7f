"""The one place privzo uses a private part of dp-accounting.

dp-accounting computes the Rényi DP of repeat-and-select (Papernot & Steinke, 2022) only for a
``RepeatAndSelectDpEvent`` built from one event; a search bounds a mixture of trials by the
pointwise worst RDP curve, so it needs the transform on a curve, which dp-accounting keeps in a
private function. ``tests/unit/search/test_search.py`` pins this adapter to the public event
API, so an upgrade that changes the private function fails a test instead of a guarantee.
"""

from __future__ import annotations

import numpy as np
from dp_accounting.rdp import rdp_privacy_accountant

__all__ = ["RDP_ORDERS", "repeat_and_select_rdp"]

RDP_ORDERS = np.asarray(rdp_privacy_accountant.DEFAULT_RDP_ORDERS, dtype=np.float64)
_PRIVATE_TRANSFORM = "_compute_rdp_repeat_and_select"


def repeat_and_select_rdp(curve: np.ndarray, mean_trials: float, shape: float) -> np.ndarray:
    """RDP at ``RDP_ORDERS`` of releasing the best of a random number of trials (truncated
    negative binomial with ``shape``; 1 is geometric) that are each bounded by ``curve``."""
    transform = getattr(rdp_privacy_accountant, _PRIVATE_TRANSFORM, None)
    if transform is None:
        raise RuntimeError(
            f"this dp-accounting has no rdp_privacy_accountant.{_PRIVATE_TRANSFORM}, which the "
            "repeat-and-select bound of geometric searches uses; install dp-accounting 0.4 to "
            "0.6, or search with trials: {count: N} (composition)"
        )
    return np.asarray(transform(RDP_ORDERS, curve, mean_trials, shape), dtype=np.float64)
