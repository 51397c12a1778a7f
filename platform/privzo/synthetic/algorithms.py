"""DPZero, DPGD-0th and DP-GD on the synthetic quadratic, full batch, K grid points at once.

Every algorithm runs K independent copies (one per learning-rate × clipping point of the grid)
as the rows of ``x`` (shape (K, d)). The copies share the public direction stream (z_t depends
on the seed only) and the data, never noise: each row gets its own draws from a secret
generator.

Per step, with s_ki = (f_i(x_k + λz) − f_i(x_k − λz)) / 2λ the per-example finite difference:

- DPZero:   g_k = (Σ_i clip(s_ki, ±C_k) + σ C_k ν_k) / n,          x_k ← x_k − η_k g_k z
            (ν_k ~ N(0, 1): one scalar of noise; Algorithm 2 of the paper)
            with J directions per step (DP-AggZO, ``directions_per_step``): each example's
            J differences clipped together to ℓ2 norm C_k, noise σ C_k on each of the J sums,
            x_k ← x_k − (η_k / J) Σ_j g_kj z_j
- DPGD-0th: g_k = (Σ_i clip_ℓ2(s_ki z, C_k) + σ C_k ν_k) / n,     x_k ← x_k − η_k g_k
            (ν_k ~ N(0, I_d): the zeroth-order gradient clipped as a vector; Algorithm 1)
- DP-GD:    g_k = (Σ_i clip_ℓ2(∇f_i(x_k), C_k) + σ C_k ν_k) / n,  x_k ← x_k − η_k g_k

Full batch (sampling rate 1), so "÷ expected batch" is ÷ n. Each release has ℓ2 sensitivity C_k
under add/remove adjacency and noise σ C_k per coordinate, so the same σ (calibrated for T
steps of the Gaussian mechanism at (ε, δ)) gives all three the same guarantee.

Shortcuts that keep the sweep cheap, each exact:

- For a quadratic, the central difference is exact: s_ki = zᵀ A (x_k − ξ_i), whatever λ is,
  so it is computed as zᵀA x_k − (A z)ᵀ ξ_i: one n × d product per step shared by all K rows.
- ‖s z‖ = |s| ‖z‖, so ℓ2-clipping the vector s z to C is clipping the scalar s to ±C/‖z‖.
- ‖A(x − ξ_i)‖² = ‖Ax‖² − 2 (A²x)ᵀ ξ_i + ‖A ξ_i‖²: per-example gradient norms from one
  (K × d)·(d × n) product, and Σ_i c_i A(x − ξ_i) = A (x Σ_i c_i − Σ_i c_i ξ_i) from another.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from privzo.synthetic.quadratic import QuadraticProblem, direction_generator

__all__ = [
    "ALGORITHMS",
    "DIVERGENCE_FACTOR",
    "GridResult",
    "SecretNormal",
    "StepInputs",
    "clip_scalars",
    "dpgd0th_clipped_scalars",
    "dpgd_clip_factors",
    "finite_differences",
    "run_algorithm",
]

# A copy whose final gradient norm exceeds this multiple of its starting norm (or is not finite)
# has diverged: it is reported as diverged, with an infinite final gradient norm and loss.
DIVERGENCE_FACTOR = 1e6


class SecretNormal:
    """Standard normal arrays from a generator seeded with 128 bits of OS entropy.

    privzo.privacy.SecretGenerator draws one scalar at a time; the vector algorithms here need
    K × d draws per step, so this is the same construction with an array interface. It has no
    seed parameter and refuses to be pickled with its state (a copy gets fresh entropy).
    """

    def __init__(self) -> None:
        self._rng = np.random.Generator(np.random.PCG64(secrets.randbits(128)))

    def standard_normal(self, shape: tuple[int, ...]) -> np.ndarray:
        return self._rng.standard_normal(shape)

    def __reduce__(self) -> tuple[type, tuple[()]]:
        return (type(self), ())

    def __repr__(self) -> str:
        return "SecretNormal(<secret>)"


@dataclass(frozen=True)
class StepInputs:
    """What one step of any algorithm needs besides the state x (K, d)."""

    problem: QuadraticProblem
    direction: np.ndarray | None  # (d,) public z_t; None for first-order DP-GD
    learning_rates: np.ndarray  # (K,)
    clip_thresholds: np.ndarray  # (K,)
    noise_multiplier: float
    noise: SecretNormal


# --- per-example stages --------------------------------------------------------------------


def finite_differences(problem: QuadraticProblem, x: np.ndarray, z: np.ndarray) -> np.ndarray:
    """s_ki = (f_i(x_k + λz) − f_i(x_k − λz)) / 2λ = zᵀ A (x_k − ξ_i): shape (K, n)."""
    hessian_direction = problem.hessian_diagonal * z
    return (x @ hessian_direction)[:, None] - (problem.data @ hessian_direction)[None, :]


def clip_scalars(values: np.ndarray, thresholds: np.ndarray) -> np.ndarray:
    """Each row k of ``values`` clipped to [−C_k, C_k]."""
    bound = thresholds[:, None]
    return np.clip(values, -bound, bound)


def dpgd0th_clipped_scalars(
    differences: np.ndarray, z: np.ndarray, thresholds: np.ndarray
) -> np.ndarray:
    """c_ki with clip_ℓ2(s_ki z, C_k) = c_ki z: the vector's norm is |s_ki| ‖z‖."""
    return clip_scalars(differences, thresholds / np.linalg.norm(z))


def dpgd_clip_factors(
    problem: QuadraticProblem,
    x: np.ndarray,
    thresholds: np.ndarray,
    example_sq_norms: np.ndarray,
) -> np.ndarray:
    """min(1, C_k / ‖A(x_k − ξ_i)‖): shape (K, n). ``example_sq_norms`` holds ‖A ξ_i‖²."""
    a = problem.hessian_diagonal
    ax = a * x
    sq_norms = (
        np.sum(ax * ax, axis=1)[:, None]
        - 2.0 * (ax * a) @ problem.data.T
        + example_sq_norms[None, :]
    )
    norms = np.sqrt(np.maximum(sq_norms, 0.0))
    with np.errstate(divide="ignore"):
        return np.minimum(1.0, thresholds[:, None] / norms)


# --- one step of each algorithm ------------------------------------------------------------


def dpzero_step(x: np.ndarray, step: StepInputs, cache: dict[str, np.ndarray]) -> np.ndarray:
    assert step.direction is not None
    if step.direction.ndim == 2:  # one public direction per row: DP-AggZO
        return aggregated_dpzero_step(x, step)
    differences = finite_differences(step.problem, x, step.direction)
    clipped = clip_scalars(differences, step.clip_thresholds)
    noise = step.noise_multiplier * step.clip_thresholds * step.noise.standard_normal((len(x),))
    scalar = (clipped.sum(axis=1) + noise) / step.problem.dataset_size
    return x - (step.learning_rates * scalar)[:, None] * step.direction[None, :]


def aggregated_dpzero_step(x: np.ndarray, step: StepInputs) -> np.ndarray:
    """DPZero over the J rows of ``step.direction`` (J, d): per example the J differences are
    clipped together to ℓ2 norm C_k, and each of the J sums gets its own noise σ C_k."""
    directions = step.direction
    assert directions is not None
    differences = np.stack(
        [finite_differences(step.problem, x, z) for z in directions], axis=2
    )  # (K, n, J)
    norms = np.linalg.norm(differences, axis=2)
    bound = step.clip_thresholds[:, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        factors = np.where(norms > bound, bound / norms, 1.0)
    clipped_sums = (differences * factors[:, :, None]).sum(axis=1)  # (K, J)
    noise = (step.noise_multiplier * step.clip_thresholds)[:, None] * step.noise.standard_normal(
        clipped_sums.shape
    )
    scalars = (clipped_sums + noise) / step.problem.dataset_size
    return x - (step.learning_rates[:, None] / len(directions)) * (scalars @ directions)


def dpgd0th_step(x: np.ndarray, step: StepInputs, cache: dict[str, np.ndarray]) -> np.ndarray:
    z = step.direction
    assert z is not None
    differences = finite_differences(step.problem, x, z)
    clipped_sum = dpgd0th_clipped_scalars(differences, z, step.clip_thresholds).sum(axis=1)
    noise = (step.noise_multiplier * step.clip_thresholds)[:, None] * step.noise.standard_normal(
        x.shape
    )
    gradient = (clipped_sum[:, None] * z[None, :] + noise) / step.problem.dataset_size
    return x - step.learning_rates[:, None] * gradient


def dpgd_step(x: np.ndarray, step: StepInputs, cache: dict[str, np.ndarray]) -> np.ndarray:
    problem = step.problem
    if "example_sq_norms" not in cache:
        scaled = problem.data * problem.hessian_diagonal
        cache["example_sq_norms"] = np.sum(scaled * scaled, axis=1)
    factors = dpgd_clip_factors(problem, x, step.clip_thresholds, cache["example_sq_norms"])
    clipped_sum = problem.hessian_diagonal * (
        x * factors.sum(axis=1)[:, None] - factors @ problem.data
    )
    noise = (step.noise_multiplier * step.clip_thresholds)[:, None] * step.noise.standard_normal(
        x.shape
    )
    gradient = (clipped_sum + noise) / problem.dataset_size
    return x - step.learning_rates[:, None] * gradient


StepFunction = Callable[[np.ndarray, StepInputs, dict[str, np.ndarray]], np.ndarray]


@dataclass(frozen=True)
class Algorithm:
    name: str
    step: StepFunction
    zeroth_order: bool  # draws a public direction per step


ALGORITHMS: dict[str, Algorithm] = {
    "dpzero": Algorithm("dpzero", dpzero_step, zeroth_order=True),
    "dpgd-0th": Algorithm("dpgd-0th", dpgd0th_step, zeroth_order=True),
    "dp-gd": Algorithm("dp-gd", dpgd_step, zeroth_order=False),
}


# --- a whole run ---------------------------------------------------------------------------


@dataclass(frozen=True)
class GridResult:
    """Final state of the K copies."""

    final_gradient_norm: np.ndarray  # (K,), inf where diverged
    final_loss: np.ndarray  # (K,), inf where diverged
    diverged: np.ndarray  # (K,) bool
    initial_gradient_norm: float


def run_algorithm(
    name: str,
    problem: QuadraticProblem,
    learning_rates: np.ndarray,
    clip_thresholds: np.ndarray,
    *,
    steps: int,
    noise_multiplier: float,
    seed: int,
    directions_per_step: int = 1,
) -> GridResult:
    """``steps`` full-batch steps from x₀ = 0 for every (learning_rates[k], clip_thresholds[k]);
    DPZero takes ``directions_per_step`` directions a step (DP-AggZO above 1)."""
    if name not in ALGORITHMS:
        raise ValueError(f"algorithm={name!r} is unknown; allowed: {list(ALGORITHMS)}")
    if directions_per_step > 1 and name != "dpzero":
        raise ValueError(f"algorithm={name!r} takes one direction per step; only dpzero takes more")
    algorithm = ALGORITHMS[name]
    learning_rates = np.asarray(learning_rates, dtype=np.float64)
    clip_thresholds = np.asarray(clip_thresholds, dtype=np.float64)
    x = np.zeros((len(learning_rates), problem.dimension))
    initial_norm = float(problem.gradient_norm(x[0]))
    directions = direction_generator(seed, problem.dimension)
    noise = SecretNormal()
    cache: dict[str, np.ndarray] = {}
    # A diverging copy overflows to inf / nan and stays there; numpy carries on without traps,
    # so copies are not checked per step (that check cost as much as a ZO step) but at the end.
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for _ in range(steps):
            z = None
            if algorithm.zeroth_order:
                shape = (directions_per_step, problem.dimension)
                z = directions.standard_normal(problem.dimension if shape[0] == 1 else shape)
            inputs = StepInputs(
                problem, z, learning_rates, clip_thresholds, noise_multiplier, noise
            )
            x = algorithm.step(x, inputs, cache)
        gradient_norm = problem.gradient_norm(x)
        diverged = ~(gradient_norm <= DIVERGENCE_FACTOR * max(initial_norm, 1.0))
        gradient_norm = np.where(diverged, np.inf, gradient_norm)
        loss = np.where(diverged, np.inf, problem.loss(x))
    return GridResult(gradient_norm, loss, diverged, initial_norm)
