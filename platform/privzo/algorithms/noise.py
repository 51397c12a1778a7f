"""What noise each training algorithm adds: the facts the run config decides its privacy rules
by at load, and the registry's entries read.

A leaf (it imports no privzo module), beneath the optimizer section
(``privzo.algorithms.config``), which validates at load: the registry
(``privzo.algorithms.registry``) cannot be read from there, since it imports the run config,
the layouts and the steppers. The rest of what an algorithm is lives in the registry.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["NOISE", "Noise"]


@dataclass(frozen=True)
class Noise:
    """The noise one algorithm adds to each step."""

    mechanisms: tuple[str, ...]  # those it can add, the default first; () when not private
    scalar: bool  # one scalar per step, which privacy.noise_grid puts on a grid
    words: str  # what it adds, as refusals name it

    @property
    def private(self) -> bool:
        """Whether the run calibrates σ and books ε (``privacy.*`` applies)."""
        return bool(self.mechanisms)

    @property
    def default_mechanism(self) -> str | None:
        return self.mechanisms[0] if self.mechanisms else None


_ZEROTH_ORDER_SCALAR = "scalar noise to the clipped sum of loss differences"

NOISE: dict[str, Noise] = {
    "mezo": Noise((), scalar=False, words="no noise (the mean of the loss differences)"),
    "dpzero": Noise(("gaussian", "laplace", "lmo"), scalar=True, words=_ZEROTH_ORDER_SCALAR),
    "dpzo-laplace": Noise(("laplace", "gaussian", "lmo"), scalar=True, words=_ZEROTH_ORDER_SCALAR),
    "dpsgd": Noise(("gaussian",), scalar=False, words="d-dimensional Gaussian noise (Opacus)"),
    "adamw": Noise((), scalar=False, words="no noise"),
    "dpgd-0th": Noise(("gaussian",), scalar=False, words="d-dimensional Gaussian noise"),
}
"""Each algorithm's noise, by the names of ``privzo.algorithms.config.AlgorithmName``."""
