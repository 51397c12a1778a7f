"""``privzo demo``: the embedded offline demo, the first command a new user runs."""

from __future__ import annotations

import argparse
from pathlib import Path

from privzo.cli.arguments import Commands, add_command, directory_argument, finish_command
from privzo.cli.process import process_cores, quiet_libraries


def add_demo(commands: Commands) -> None:
    demo = add_command(
        commands,
        "demo",
        "the embedded offline demo (zero-shot vs DP vs MeZO)",
        ["privzo demo", "privzo demo --quick --arms-only --output-dir runs/demo-quick"],
        description="Offline on a CPU: a small built-in model fine-tuned on a synthetic "
        "sentiment task, zero-shot vs a private run (DPZero) vs a non-private one (MeZO), then "
        "a small search and a scaling study, all recorded in one MLflow store.",
    )
    demo.add_argument(
        "--output-dir",
        type=directory_argument,
        default=Path("runs/demo"),
        help="where the demo's runs go",
    )
    demo.add_argument(
        "--quick",
        action="store_true",
        help="a smoke test: 20 steps per arm and study cell, search trials of 20 or 40 "
        "steps, the study over the two smaller models",
    )
    demo.add_argument(
        "--arms-only", action="store_true", help="skip the small search and the scaling study"
    )
    finish_command(demo, _demo_command)


def _demo_command(args: argparse.Namespace) -> int:
    from privzo.demo import run_demo

    quiet_libraries(args.verbose)
    run_demo(
        args.output_dir,
        cache_dir=args.cache_dir,
        quick=args.quick,
        arms_only=args.arms_only,
        cores=process_cores(),
    )
    return 0
