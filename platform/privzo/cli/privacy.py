"""``privzo privacy calibrate`` and ``privzo privacy epsilon``: the accountants on their own,
for planning a budget before any run."""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from privzo.cli.arguments import (
    Commands,
    add_command,
    add_json,
    add_subcommands,
    options_named,
)

if TYPE_CHECKING:
    from privzo.privacy import AccountingQuery

SAMPLING = "--batch-size 32 --dataset-size 1000 --steps 300"


def add_privacy(commands: Commands) -> None:
    privacy = add_command(
        commands,
        "privacy",
        "privacy accounting: σ for a budget, or the budget a σ spends",
        f"privzo privacy calibrate --epsilon 2 --delta 1e-5 {SAMPLING}",
    )
    accounting = add_subcommands(privacy, "privacy_command")
    calibrate = add_command(
        accounting,
        "calibrate",
        "σ for a target (ε, δ)",
        f"privzo privacy calibrate --epsilon 2 --delta 1e-5 {SAMPLING}",
        description="The smallest noise multiplier σ whose run stays within (ε, δ), and the ε "
        "it spends.",
    )
    calibrate.add_argument("--epsilon", type=float, required=True, help="the target ε")
    _privacy_arguments(calibrate)
    calibrate.set_defaults(handler=_calibrate_command)
    epsilon = add_command(
        accounting,
        "epsilon",
        "ε spent at a given σ",
        f"privzo privacy epsilon --noise-multiplier 1.2 --delta 1e-5 {SAMPLING}",
        description="The ε that a run with noise multiplier σ spends at δ.",
    )
    epsilon.add_argument(
        "--noise-multiplier", type=float, required=True, help="σ: the noise scale over the clip C"
    )
    _privacy_arguments(epsilon)
    epsilon.set_defaults(handler=_epsilon_command)


def _privacy_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--delta", type=float, required=True, help="the target δ")
    parser.add_argument("--sample-rate", type=float, help="Poisson sampling probability p")
    parser.add_argument("--batch-size", type=int, help="expected batch size (with --dataset-size)")
    parser.add_argument(
        "--dataset-size", type=int, help="training examples (with --batch-size: p = B / N)"
    )
    parser.add_argument("--steps", type=int, required=True, help="training steps")
    parser.add_argument(
        "--mechanism",
        choices=("gaussian", "laplace"),
        default="gaussian",
        help="the noise distribution",
    )
    parser.add_argument(
        "--accountant",
        choices=("pld", "rdp", "pure", "numeric"),
        default="pld",
        help="how the steps' privacy is composed",
    )
    parser.add_argument(
        "--noise-grid",
        type=int,
        help="grid points per σC of discrete noise (a zeroth-order run's privacy.noise_grid, "
        "1024 by default there); omitted: the continuous mechanism",
    )
    parser.add_argument(
        "--directions",
        type=int,
        default=1,
        help="directions per step (optimizer.directions_per_step): with --noise-grid, a "
        "rounded vector of this many coordinates, which only the rdp accountant bounds; "
        "continuous noise costs the same for any number",
    )
    add_json(parser)


def _noise_parameters(args: argparse.Namespace) -> dict[str, int] | None:
    if args.directions < 1:
        raise ValueError(f"--directions {args.directions}: allowed: an integer ≥ 1")
    if args.noise_grid is None:
        return None
    if args.directions == 1:
        return {"grid": args.noise_grid}
    return {"grid": args.noise_grid, "directions": args.directions}


def _sample_rate(args: argparse.Namespace) -> float:
    if args.sample_rate is not None:
        if args.batch_size is not None or args.dataset_size is not None:
            raise ValueError("give --sample-rate or --batch-size with --dataset-size, not both")
        return args.sample_rate
    if args.batch_size is None or args.dataset_size is None:
        raise ValueError("give --sample-rate P, or --batch-size B with --dataset-size N")
    if args.dataset_size <= 0 or args.batch_size <= 0 or args.batch_size > args.dataset_size:
        raise ValueError(
            f"--batch-size={args.batch_size} --dataset-size={args.dataset_size}: need "
            "0 < batch size ≤ dataset size"
        )
    return args.batch_size / args.dataset_size


def _accounting(args: argparse.Namespace) -> AccountingQuery:
    """What calibrate and epsilon both ask the accountant about."""
    from privzo.config import MAX_STEPS
    from privzo.privacy import AccountingQuery

    if not 1 <= args.steps <= MAX_STEPS:  # beyond it the accountant's memory and time explode
        why = "fewer than one" if args.steps < 1 else "more steps than the accountant can carry"
        raise ValueError(
            f"--steps {args.steps}: {why}; allowed: 1 ≤ steps ≤ {MAX_STEPS:_} (as "
            "optimizer.steps in a run config)"
        )
    return AccountingQuery(
        sample_rate=_sample_rate(args),
        steps=args.steps,
        delta=args.delta,
        mechanism=args.mechanism,
        accountant=args.accountant,
        noise_parameters=_noise_parameters(args),
    )


# the accountant's argument names (its refusals start with them) → the options that set them
OPTIONS = {
    "noise_multiplier": "--noise-multiplier",
    "delta": "--delta",
    "sample_rate": "--sample-rate",
    "grid": "--noise-grid",
    "epsilon": "--epsilon",
}


def _calibrate_command(args: argparse.Namespace) -> int:
    from privzo.privacy import calibrate, epsilon_of

    with options_named(OPTIONS):
        query = _accounting(args)
        noise_multiplier = calibrate(query, args.epsilon)
        epsilon = epsilon_of(query, noise_multiplier)
    return _privacy_report(args, noise_multiplier, epsilon)


def _epsilon_command(args: argparse.Namespace) -> int:
    from privzo.privacy import epsilon_of

    with options_named(OPTIONS):
        epsilon = epsilon_of(_accounting(args), args.noise_multiplier)
    return _privacy_report(args, args.noise_multiplier, epsilon)


def _privacy_report(args: argparse.Namespace, noise_multiplier: float, epsilon: float) -> int:
    record = {
        "noise_multiplier": noise_multiplier,
        "epsilon": epsilon,
        "delta": args.delta,
        "sample_rate": _sample_rate(args),
        "steps": args.steps,
        "mechanism": args.mechanism,
        "accountant": args.accountant,
        "noise_grid": args.noise_grid,
        "directions": args.directions,
    }
    if args.json:
        print(json.dumps(record))
    else:
        print(
            f"noise multiplier σ = {noise_multiplier:.6g} (noise scale σ·C)\n"
            f"ε = {epsilon:.6g} at δ = {args.delta:g} after {args.steps} steps, sample rate "
            f"{record['sample_rate']:.6g} ({_mechanism_label(args)}, {args.accountant} accountant)"
        )
    return 0


def _mechanism_label(args: argparse.Namespace) -> str:
    if args.noise_grid is None:
        return args.mechanism
    vector = f", {args.directions} directions" if args.directions > 1 else ""
    return f"discrete {args.mechanism} on a grid of {args.noise_grid} per σC{vector}"
