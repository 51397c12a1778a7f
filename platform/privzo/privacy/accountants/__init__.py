"""Privacy accountants for T steps of a Poisson-subsampled 1-D Gaussian or Laplace mechanism.

Every step of DPZero / DP-ZO releases one noisy sum of clipped scalars with sensitivity C under
add/remove adjacency and noise scale σ·C, so the noise multiplier σ is exactly the
``noise_multiplier`` of dp_accounting's ``GaussianDpEvent`` / ``LaplaceDpEvent`` and one step is
``PoissonSampledDpEvent(p, GaussianDpEvent(σ) | LaplaceDpEvent(σ))``.

Accountants (``ACCOUNTANTS``, listed in ``registry``; one module each):

- ``pld``: privacy loss distributions (dp_accounting's PLD code, value discretization 1e-4):
  tight, both mechanisms. Its cost is dominated by building the one-step PLD and
  self-composing it, so the stateful accountant builds the one-step PLD once and caches ε per
  (steps, δ).
- ``rdp``: Rényi DP, Gaussian only (dp_accounting rejects the subsampled Laplace event);
  conservative (≈7-10 % more noise than PLD) but cheap: ε(T) is a conversion of T times one
  cached RDP vector.
- ``pure``: pure ε-DP of the Laplace mechanism, ε = T·log(1 + p(e^{1/σ} − 1)) (amplification by
  subsampling, then basic composition); loose, but valid at δ = 0.
- ``numeric``: a certified numeric PLD of any symmetric 1-D noise with a computable tail
  (Gaussian, Laplace and the LMO mixture).

``query`` states what ε and calibration are asked about (``AccountingQuery``), ``calibration``
holds the one search for the smallest σ meeting an ε target, ``memo`` the memo
of ε evaluations (for the process, and in a cache directory for later processes), ``events``
the run's dp_accounting event, ``settings`` the settings every accountant shares and their
checks, ``refusal`` an accountant's refusal of noise it cannot bound, ``base`` the
``Accountant`` class (which states what each bounds), and ``registry`` the accountants by name.

Discrete noise (``noise_parameters={"grid": K}``, see ``privzo.privacy.mechanisms``): the noise
is γ·k with γ = σC/K, k ~ N_Z(0, K²) or discrete Laplace of scale K, and the clipped sum is
rounded to the grid with sensitivity Δ = ⌈K/σ⌉ grid units. ``pld`` then composes
dp_accounting's discrete Gaussian / discrete Laplace PLDs at (K, Δ) and ``pure`` uses the
discrete Laplace's Δ/K per step; ``rdp`` and ``numeric`` refuse a one-direction grid, except that
``numeric`` accounts LMO on the grid (a rounding of the continuous LMO output, see ``numeric``).
Since Δ/K ≥ 1/σ, the discrete mechanism's ε is at or slightly above the continuous one. A step
of J ≥ 2 directions on the grid (``{"grid": K, "directions": J}``) rounds a J-vector, whose
discrete Gaussian step only ``rdp`` bounds (at integer orders, ``docs/privacy/vector-grid.md``).
"""

from privzo.privacy.accountants.base import Accountant
from privzo.privacy.accountants.calibration import (
    CALIBRATION_RTOL,
    MAX_NOISE_MULTIPLIER,
    MIN_NOISE_MULTIPLIER,
)
from privzo.privacy.accountants.events import quiet_absl
from privzo.privacy.accountants.memo import keep_epsilons_in
from privzo.privacy.accountants.numeric import NumericAccountant
from privzo.privacy.accountants.pld import PldAccountant
from privzo.privacy.accountants.pure import PureLaplaceAccountant
from privzo.privacy.accountants.query import AccountingQuery
from privzo.privacy.accountants.rdp import RdpAccountant
from privzo.privacy.accountants.refusal import UnsupportedNoiseError
from privzo.privacy.accountants.registry import (
    ACCOUNTANTS,
    accountant_from_state,
    accountants_for,
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    epsilon_of,
    get_accountant,
    make_accountant,
)
from privzo.privacy.accountants.settings import (
    MECHANISM_NAMES,
    PLD_VALUE_DISCRETIZATION,
    check_delta,
    check_positive,
)

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATION_RTOL",
    "MAX_NOISE_MULTIPLIER",
    "MECHANISM_NAMES",
    "MIN_NOISE_MULTIPLIER",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "AccountingQuery",
    "NumericAccountant",
    "PldAccountant",
    "PureLaplaceAccountant",
    "RdpAccountant",
    "UnsupportedNoiseError",
    "accountant_from_state",
    "accountants_for",
    "calibrate",
    "calibrate_noise_multiplier",
    "check_delta",
    "check_positive",
    "compute_epsilon",
    "epsilon_of",
    "get_accountant",
    "keep_epsilons_in",
    "make_accountant",
    "quiet_absl",
]
