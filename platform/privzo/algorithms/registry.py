"""The algorithm registry: what each training algorithm is, and how to build its stepper.

Architecture. The run pipeline never asks for an algorithm by name in code: it looks up the
entry of ``optimizer.algorithm`` here and reads what it needs from it:

- **family**: zeroth-order (two forwards, one released scalar per step) or first-order
  (back-propagation);
- **private**, **mechanisms** (the first the default) and **noise**: the noise it adds, read
  from ``privzo.algorithms.noise``, where the run config reads it at load too;
- **layouts**: the process layouts that can run it (``single``, ``replica``, ``zero3``): the
  distributed ones need a scalar, all-reducing estimator, which only the zeroth-order steppers
  have;
- **views**: the trainable views (``model.trainable``) its stepper handles;
- **writes_trajectory**: whether each step is a (seed, scalar) row from which replay and a
  resumed run rebuild θ; an algorithm without one saves its weights instead;
- **directions**: whether its step takes several directions (``optimizer.directions_per_step``,
  DP-AggZO), with the mechanism and grid rules ``check_directions`` names;
- **checks**: its own refusals, of the config (before anything loads) and of the built model
  (before anything is written);
- **stepper**: the factory of its ``privzo.algorithms.stepper.Stepper``, which the one
  ``TrainingLoop`` drives.

Adding an algorithm is one module (its stepper), one entry below and its noise in
``privzo.algorithms.noise``, plus its name in the config Literal
``privzo.algorithms.config.AlgorithmName``; ``tests/unit/algorithms/test_registry.py`` ties the
Literal to the keys.
``check_capabilities`` is the algorithm × layout × mechanism × view check preflight runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from privzo.algorithms.config import ALGORITHMS
from privzo.algorithms.loop import StepperFactory, TrainingLoop, WindowSaver
from privzo.algorithms.noise import NOISE
from privzo.algorithms.stepper import StepMeter, Stepper
from privzo.algorithms.zeroth_order import ZerothOrderStepper
from privzo.baselines.dpgd import DpgdStepper, check_dpgd_size
from privzo.baselines.first_order import FirstOrderStepper
from privzo.config.run import RunConfig
from privzo.layouts.context import RunContext
from privzo.memory import PeakMemory
from privzo.privacy.accountants import accountants_for
from privzo.section import ConfigError
from privzo.tracking import Tracker

Family = Literal["zeroth-order", "first-order"]

ALL_LAYOUTS = ("single", "replica", "zero3")
ALL_VIEWS = ("full", "bitfit", "lora", "prefix")
SCALAR_MECHANISMS = ("gaussian", "laplace", "lmo")


@dataclass(frozen=True)
class Algorithm:
    """One registered algorithm (see the module docstring for each field's meaning)."""

    name: str
    family: Family
    layouts: tuple[str, ...]
    views: tuple[str, ...]
    writes_trajectory: bool
    stepper: Callable[[RunContext, StepMeter], Stepper]
    directions: bool = False
    check_config: Callable[[RunConfig], None] | None = None
    check_context: Callable[[RunContext], None] | None = None

    @property
    def private(self) -> bool:
        return NOISE[self.name].private

    @property
    def mechanisms(self) -> tuple[str, ...]:
        """The noise it can add, the default first; () when not private."""
        return NOISE[self.name].mechanisms

    @property
    def default_mechanism(self) -> str | None:
        return NOISE[self.name].default_mechanism

    @property
    def noise(self) -> str:
        """What it adds, in words (named in refusals)."""
        return NOISE[self.name].words


def _no_noise_multiplier(config: RunConfig) -> None:
    if config.privacy.noise_multiplier is not None:
        raise ConfigError(
            f"privacy.noise_multiplier={config.privacy.noise_multiplier} with optimizer."
            "algorithm='adamw': the non-private baseline adds no noise; use 'dpsgd' or remove it"
        )


_FIRST_ORDER_VIEWS = ("full", "lora", "bitfit")


def _zeroth_order(name: str) -> Algorithm:
    """mezo, dpzero and dpzo-laplace: one stepper on every layout and view, each step kept in
    the trajectory; they differ only in the noise their config adds (``NOISE``)."""
    return Algorithm(
        name,
        "zeroth-order",
        layouts=ALL_LAYOUTS,
        views=ALL_VIEWS,
        writes_trajectory=True,
        stepper=ZerothOrderStepper,
        directions=True,
    )


def _first_order(name: str, check_config: Callable[[RunConfig], None] | None = None) -> Algorithm:
    """dpsgd and adamw: the first-order baselines, on one process and the views whose
    per-example gradients they compute; they save weights, not a trajectory."""
    return Algorithm(
        name,
        "first-order",
        layouts=("single",),
        views=_FIRST_ORDER_VIEWS,
        writes_trajectory=False,
        stepper=FirstOrderStepper,
        check_config=check_config,
    )


REGISTRY: dict[str, Algorithm] = {
    entry.name: entry
    for entry in (
        *(_zeroth_order(name) for name in ("mezo", "dpzero", "dpzo-laplace")),
        _first_order("dpsgd"),
        _first_order("adamw", check_config=_no_noise_multiplier),
        Algorithm(
            "dpgd-0th",
            "zeroth-order",
            layouts=("single",),
            views=ALL_VIEWS,
            writes_trajectory=False,
            stepper=DpgdStepper,
            check_context=check_dpgd_size,
        ),
    )
}
assert tuple(REGISTRY) == ALGORITHMS, "the registry and AlgorithmName differ"


def get_algorithm(name: str) -> Algorithm:
    if name not in REGISTRY:
        raise ConfigError(f"optimizer.algorithm={name!r} is unknown; allowed: {list(REGISTRY)}")
    return REGISTRY[name]


def names(**wanted: object) -> list[str]:
    """The registered names whose entries have every ``field=value`` given (e.g.
    ``names(private=True)``, ``names(family="first-order")``)."""
    return [
        name
        for name, entry in REGISTRY.items()
        if all(getattr(entry, field) == value for field, value in wanted.items())
    ]


def check_capabilities(config: RunConfig) -> None:
    """Refuse, before anything loads, an algorithm asked for what it cannot do: a layout it
    has no workers for, a mechanism it does not add, a view its stepper does not handle."""
    algorithm = get_algorithm(config.optimizer.algorithm)
    name, privacy = algorithm.name, config.privacy
    if not algorithm.private and privacy.mechanism is not None:
        raise ConfigError(
            f"privacy.mechanism={privacy.mechanism!r} with optimizer.algorithm={name!r}: a "
            "non-private algorithm adds no noise; remove privacy.mechanism (null)"
        )
    if algorithm.private and config.mechanism not in algorithm.mechanisms:
        raise ConfigError(
            f"privacy.mechanism={config.mechanism!r} with optimizer.algorithm={name!r}: it adds "
            f"{algorithm.noise}; allowed: {list(algorithm.mechanisms)} (or null)"
        )
    if config.model.trainable not in algorithm.views:
        raise ConfigError(
            f"model.trainable={config.model.trainable!r} with optimizer.algorithm={name!r}: "
            f"its steps support the views {list(algorithm.views)}"
        )
    strategy = config.parallel.strategy
    if strategy not in algorithm.layouts:
        runs = names(layouts=ALL_LAYOUTS)
        raise ConfigError(
            f"optimizer.algorithm={name!r} with parallel.strategy={strategy!r}: the "
            f"distributed strategies run only {runs}; use strategy "
            f"{' or '.join(map(repr, algorithm.layouts))} for this algorithm"
        )
    check_directions(config, algorithm)
    if algorithm.check_config is not None:
        algorithm.check_config(config)


def check_directions(config: RunConfig, algorithm: Algorithm) -> None:
    """Refuse several directions per step where the algorithm or its noise cannot take them.

    The K released sums of a private step are one K-dimensional release whose L2 sensitivity
    is C (each example's K differences clipped together): with independent Gaussian noise σC
    on each it costs exactly the one-direction step's ε. Laplace and LMO noise are bounded
    through the L1 (1-D) sensitivity, which grows to √K·C, so they are refused. On the noise
    grid the rounded K-vector is bounded only by the accountants whose class says so
    (``vector_grid_mechanisms``: RDP at integer orders, ``docs/privacy/vector-grid.md``).
    """
    count = config.optimizer.directions_per_step
    if count == 1:
        return
    name = algorithm.name
    if not algorithm.directions:
        raise ConfigError(
            f"optimizer.directions_per_step={count} with optimizer.algorithm={name!r}: only "
            f"{names(directions=True)} take several directions per step; use 1"
        )
    if not algorithm.private:
        return
    if config.mechanism != "gaussian":
        raise ConfigError(
            f"optimizer.directions_per_step={count} with privacy.mechanism="
            f"{config.mechanism!r}: K directions release a K-vector of L2 sensitivity C, and "
            "only the Gaussian mechanism keeps the one-direction ε for it (the Laplace and LMO "
            "bounds use the L1 sensitivity, √K·C); use privacy.mechanism='gaussian' or "
            "directions_per_step=1"
        )
    accountant = config.privacy.accountant
    able = accountants_for(config.mechanism, grid=True, directions=count)
    if config.noise_grid is not None and accountant not in able:
        raise ConfigError(
            f"optimizer.directions_per_step={count} with privacy.noise_grid="
            f"{config.noise_grid} and privacy.accountant={accountant!r}: it bounds one rounded "
            f"scalar per step, and the rounded K-vector's discrete privacy loss is bounded "
            f"only in RDP at integer orders; allowed: privacy.accountant in {able}, "
            "privacy.noise_grid=null (the continuous Gaussian, not safe from floating-point "
            "attacks) or directions_per_step=1"
        )


def check_built(context: RunContext) -> None:
    """The algorithm's own checks of the built model (e.g. DPGD-0th's noise size), before
    anything is written."""
    check = get_algorithm(context.config.optimizer.algorithm).check_context
    if check is not None:
        check(context)


def writes_trajectory(config: RunConfig) -> bool:
    return get_algorithm(config.optimizer.algorithm).writes_trajectory


def make_loop(
    context: RunContext,
    tracker: Tracker,
    memory: PeakMemory,
    make_stepper: StepperFactory | None = None,
    saver: WindowSaver | None = None,
) -> TrainingLoop:
    """The one training loop driving the algorithm's registered stepper (``make_stepper``
    replaces it: a distributed rank's zeroth-order stepper with its sampler and estimator),
    its steps kept by ``saver`` after every window."""
    algorithm = get_algorithm(context.config.optimizer.algorithm)
    stepper = make_stepper or algorithm.stepper
    return TrainingLoop(context, tracker, memory, stepper, saver=saver)
