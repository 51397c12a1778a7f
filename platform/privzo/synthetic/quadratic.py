"""The synthetic problem of the DPZero paper (§5.1, Appendix B.1), seeded.

Data: n examples ξ_i ∈ R^d with independent N(μ, s²) coordinates (the paper: N(1, 1)). Loss of
example i: f_i(x) = ½ (x − ξ_i)ᵀ A (x − ξ_i) with a fixed diagonal Hessian A, ‖A‖₂ = 1, so the
effective rank of Assumption 3.5, r = tr(A)/‖A‖₂, is tr(A). The patterns set how r grows with d:

- ``rank-d``:      a_j = 1                → r = d
- ``rank-sqrt-d``: a_j = j^(−1/2)         → r ≈ 2√d
- ``rank-log-d``:  a_j = 1/j              → r ≈ ln d + 0.58 (the paper's example after Assump. 3.5)

The paper's rendering of its exact matrices did not survive text extraction; these spectra have
the stated O(d), O(√d), O(log d) effective ranks. A diagonal A loses no generality here: every
algorithm in the study is rotation-equivariant (Gaussian directions, ℓ2 clipping, isotropic
noise), so a rotated A with the same spectrum gives the same distribution of gradient norms.

Average loss F(x) = ½ (x − ξ̄)ᵀ A (x − ξ̄) + const, gradient ∇F(x) = A (x − ξ̄).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

__all__ = [
    "EFFECTIVE_RANK_PATTERNS",
    "QuadraticProblem",
    "direction_generator",
    "eigenvalues",
    "make_problem",
]


def _flat(dimension: int) -> np.ndarray:
    return np.ones(dimension)


def _inverse_sqrt(dimension: int) -> np.ndarray:
    return 1.0 / np.sqrt(np.arange(1, dimension + 1, dtype=np.float64))


def _inverse(dimension: int) -> np.ndarray:
    return 1.0 / np.arange(1, dimension + 1, dtype=np.float64)


# Pattern name → the diagonal of A (largest eigenvalue 1) for a dimension.
EFFECTIVE_RANK_PATTERNS: dict[str, Callable[[int], np.ndarray]] = {
    "rank-d": _flat,
    "rank-sqrt-d": _inverse_sqrt,
    "rank-log-d": _inverse,
}


def eigenvalues(pattern: str, dimension: int) -> np.ndarray:
    """The diagonal of A for ``pattern`` in ``dimension`` dimensions."""
    if pattern not in EFFECTIVE_RANK_PATTERNS:
        raise ValueError(
            f"pattern={pattern!r} is unknown; allowed: {list(EFFECTIVE_RANK_PATTERNS)}"
        )
    return EFFECTIVE_RANK_PATTERNS[pattern](dimension)


@dataclass(frozen=True)
class QuadraticProblem:
    """One dataset and Hessian. Points are rows: ``x`` has shape (d,) or (K, d)."""

    pattern: str
    hessian_diagonal: np.ndarray  # (d,)
    data: np.ndarray  # (n, d): the private examples ξ_i
    data_mean: np.ndarray  # (d,): ξ̄
    loss_offset: float  # ½ mean_i (ξ_i − ξ̄)ᵀ A (ξ_i − ξ̄): F(x) minus its x-dependent part

    @property
    def dimension(self) -> int:
        return int(self.hessian_diagonal.shape[0])

    @property
    def dataset_size(self) -> int:
        return int(self.data.shape[0])

    @property
    def effective_rank(self) -> float:
        return float(self.hessian_diagonal.sum() / self.hessian_diagonal.max())

    def gradient(self, x: np.ndarray) -> np.ndarray:
        """∇F(x) = A (x − ξ̄), row by row."""
        return self.hessian_diagonal * (x - self.data_mean)

    def gradient_norm(self, x: np.ndarray) -> np.ndarray:
        return np.linalg.norm(self.gradient(x), axis=-1)

    def loss(self, x: np.ndarray) -> np.ndarray:
        """F(x) = mean_i f_i(x), exactly, without touching every example."""
        offset = x - self.data_mean
        return 0.5 * np.sum(self.hessian_diagonal * offset * offset, axis=-1) + self.loss_offset

    def example_losses(self, x: np.ndarray) -> np.ndarray:
        """f_i(x) for every i at one point x of shape (d,): shape (n,). O(nd), for checks."""
        residual = x[None, :] - self.data
        return 0.5 * np.sum(self.hessian_diagonal * residual * residual, axis=1)

    def example_gradients(self, x: np.ndarray) -> np.ndarray:
        """∇f_i(x) = A (x − ξ_i) at one point x of shape (d,): shape (n, d)."""
        return self.hessian_diagonal * (x[None, :] - self.data)


def make_problem(
    pattern: str,
    dimension: int,
    dataset_size: int,
    seed: int,
    *,
    mean: float = 1.0,
    std: float = 1.0,
) -> QuadraticProblem:
    """The dataset for (seed, dimension): the same examples under every pattern, so patterns
    are compared on paired data. Public-seeded: this is synthetic, not someone's data."""
    diagonal = eigenvalues(pattern, dimension)
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, dimension)))
    data = rng.normal(mean, std, size=(dataset_size, dimension))
    data_mean = data.mean(axis=0)
    centred = data - data_mean
    loss_offset = 0.5 * float(np.mean(centred * centred @ diagonal))
    return QuadraticProblem(pattern, diagonal, data, data_mean, loss_offset)


def direction_generator(seed: int, dimension: int) -> np.random.Generator:
    """The public stream of perturbation directions for one (seed, dimension)."""
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, dimension)))
