"""``privzo tune`` and ``privzo export-best``: a hyperparameter search under a fixed privacy
budget, and its best trial on its own."""

from __future__ import annotations

import argparse

from privzo.cli.arguments import (
    Commands,
    add_address,
    add_command,
    add_config,
    directory_argument,
    finish_command,
    path_argument,
    ray_target,
    tracking_uri,
)
from privzo.cli.process import process_cores, quiet_libraries


def add_tune(commands: Commands) -> None:
    tune = add_command(
        commands,
        "tune",
        "a Ray Tune search under a fixed privacy budget (resumes in the same dir)",
        "privzo tune configs/searches/tiny.yaml --output-dir runs/tiny-search",
        description="Search a run's hyperparameters with Ray Tune, every trial within the "
        "search's privacy budget; the same command resumes an interrupted search in the same "
        "directory.",
    )
    add_config(
        tune,
        "search",
        "configs/searches/*.yaml",
        overrides="key.sub=value overrides of the search config",
    )
    tune.add_argument(
        "--output-dir",
        type=directory_argument,
        required=True,
        help="the search's directory (its trials)",
    )
    add_address(tune)
    finish_command(tune, _tune_command, quiet="no Tune progress table")


def _tune_command(args: argparse.Namespace) -> int:
    from privzo.search import load_search_config, run_search

    quiet_libraries(args.verbose)
    search = load_search_config(args.config, args.overrides)
    summary = run_search(
        search,
        args.output_dir,
        cache_dir=args.cache_dir,
        cluster=ray_target(args.address),
        # a local Ray schedules trials on the cores this process may use, not the machine's
        num_cpus=process_cores(),
        tracking_uri=tracking_uri(),
        progress=not args.quiet,
    )
    return 130 if summary.interrupted else 0


def add_export_best(commands: Commands) -> None:
    export = add_command(
        commands,
        "export-best",
        "the best trial of a finished search, alone (its config, trajectory, summary)",
        "privzo export-best runs/tiny-search --output-dir runs/tiny-best",
    )
    export.add_argument("search_dir", type=path_argument, help="a finished search's --output-dir")
    export.add_argument(
        "--output-dir", type=directory_argument, required=True, help="a new, empty directory"
    )
    export.set_defaults(handler=_export_best_command)


def _export_best_command(args: argparse.Namespace) -> int:
    from privzo.search.export import export_best

    exported = export_best(args.search_dir, args.output_dir)
    print("\n".join(exported.lines()))
    return 0
