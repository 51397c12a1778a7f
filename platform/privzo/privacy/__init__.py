"""Differential privacy for zeroth-order training: noise, sampling, accounting and budgets.

See ``accountants`` for what each accountant assumes (Poisson sampling, add/remove adjacency,
sensitivity C with noise scale σ·C).
"""

from privzo.privacy.accountants import (
    ACCOUNTANTS,
    CALIBRATION_RTOL,
    MAX_NOISE_MULTIPLIER,
    MECHANISM_NAMES,
    MIN_NOISE_MULTIPLIER,
    PLD_VALUE_DISCRETIZATION,
    Accountant,
    AccountingQuery,
    NumericAccountant,
    PldAccountant,
    PureLaplaceAccountant,
    RdpAccountant,
    accountant_from_state,
    calibrate,
    calibrate_noise_multiplier,
    compute_epsilon,
    epsilon_of,
    get_accountant,
    keep_epsilons_in,
    make_accountant,
)
from privzo.privacy.curve import EpsilonCurve
from privzo.privacy.ledger import (
    BudgetExceededError,
    BudgetLedger,
    check_feasible,
    feasible_epsilon,
)
from privzo.privacy.mechanisms import (
    MECHANISMS,
    GaussianMechanism,
    LaplaceMechanism,
    Mechanism,
    SecretGenerator,
    get_mechanism,
)
from privzo.privacy.sampling import PoissonSampler, Sampler, ShuffleSampler

__all__ = [
    "ACCOUNTANTS",
    "CALIBRATION_RTOL",
    "MAX_NOISE_MULTIPLIER",
    "MECHANISMS",
    "MECHANISM_NAMES",
    "MIN_NOISE_MULTIPLIER",
    "PLD_VALUE_DISCRETIZATION",
    "Accountant",
    "AccountingQuery",
    "BudgetExceededError",
    "BudgetLedger",
    "EpsilonCurve",
    "GaussianMechanism",
    "LaplaceMechanism",
    "Mechanism",
    "NumericAccountant",
    "PldAccountant",
    "PoissonSampler",
    "PureLaplaceAccountant",
    "RdpAccountant",
    "Sampler",
    "SecretGenerator",
    "ShuffleSampler",
    "accountant_from_state",
    "calibrate",
    "calibrate_noise_multiplier",
    "check_feasible",
    "compute_epsilon",
    "epsilon_of",
    "feasible_epsilon",
    "get_accountant",
    "get_mechanism",
    "keep_epsilons_in",
    "make_accountant",
]
